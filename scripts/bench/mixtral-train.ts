// Tokens/s and peak memory of a small Mixtral (nt.nn.Llama with MoE blocks: 8 experts, top-2, its
// load-balancing loss in the objective) training on this CPU with nodetron beside PyTorch eager running
// the same model (transformers' MixtralForCausalLM with output_router_logits, scripts/bench/torch_mixtral.py,
// started with glibc kept warm: MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
// MALLOC_TOP_PAD_=1073741824, the same number of threads; once with OpenMP's default wait policy and once
// with OMP_WAIT_POLICY=PASSIVE). One step = forward with the fused head, backward, AdamW; the median over
// --steps after --warmup. Prints a Markdown row per implementation and one JSON line per implementation;
// --json FILE writes them with the machine's load average before and after (a loaded machine's numbers
// say little about a ranking).
// Run: npx tsx scripts/bench/mixtral-train.ts [--layers 4 --heads 4 --kv-heads 2 --width 128 --ffn 352
//      --experts 8 --top-k 2 --vocab 4096 --ctx 128 --batch 8 --steps 10 --warmup 3] [--no-torch] [--json FILE]
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';

const o = parseOptions(process.argv.slice(2), {
  layers: 'number', heads: 'number', 'kv-heads': 'number', width: 'number', ffn: 'number', experts: 'number', 'top-k': 'number', vocab: 'number',
  ctx: 'number', batch: 'number', steps: 'number', warmup: 'number', 'no-torch': 'boolean', json: 'string',
});
const n = (k: string, d: number) => (o[k] as number | undefined) ?? d;
const shape = {
  layers: n('layers', 4), heads: n('heads', 4), 'kv-heads': n('kv-heads', 2), width: n('width', 128), ffn: n('ffn', 352), experts: n('experts', 8),
  'top-k': n('top-k', 2), vocab: n('vocab', 4096), ctx: n('ctx', 128), batch: n('batch', 8), steps: n('steps', 10), warmup: n('warmup', 3),
};
const AUX = 0.01;
const threads = nt.info().backends.cpu.blasThreads as number;
const loadBefore = loadavg();

const model = new nt.nn.Llama({
  vocabSize: shape.vocab, hiddenSize: shape.width, intermediateSize: shape.ffn, numHiddenLayers: shape.layers, numAttentionHeads: shape.heads,
  numKeyValueHeads: shape['kv-heads'], maxPositionEmbeddings: shape.ctx, numLocalExperts: shape.experts, numExpertsPerTok: shape['top-k'],
  routerAuxLossCoef: AUX, routerZLossCoef: 0,
}, { seed: 0 });
const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], eps: 1e-8, weightDecay: 0.1 });
const tokens = (seed: number) => Int32Array.from({ length: shape.batch * shape.ctx }, (_, i) => (i * 2654435761 + seed * 97) % shape.vocab >>> 0);
const ids = nt.tensor(tokens(1), [shape.batch, shape.ctx]), targets = nt.tensor(tokens(2), [shape.batch, shape.ctx]);
for (let i = 0; i < shape.warmup; i++) nt.trainStep(model, opt, ids, targets);
nt.resetPeakMemory();
const times: number[] = [];
for (let i = 0; i < shape.steps; i++) {
  const t0 = performance.now();
  nt.trainStep(model, opt, ids, targets);
  times.push(performance.now() - t0);
}
times.sort((a, b) => a - b);
const ms = times[Math.floor(times.length / 2)]!;
const rows: Array<{ impl: string; msPerStep: number; tokensPerSec: number; peakRssMiB: number; params: number } & Record<string, unknown>> = [{
  impl: 'nodetron', threads, msPerStep: ms, tokensPerSec: (shape.batch * shape.ctx) / (ms / 1000), peakRssMiB: process.resourceUsage().maxRSS / 1024,
  params: model.numParameters(), activeParams: nt.train.llamaParameterCount(model.config, true), rowsPerExpertOverAllSteps: model.takeMoEStats()?.tokensPerExpert,
}];
if (!o['no-torch']) {
  const args = Object.entries(shape).flatMap(([k, v]) => [`--${k}`, String(v)]);
  for (const passive of [false, true]) {
    const r = spawnSync('python3', [join(import.meta.dirname, 'torch_mixtral.py'), ...args, '--threads', String(threads), '--aux', String(AUX)], {
      encoding: 'utf8', env: {
        ...process.env, MALLOC_MMAP_MAX_: '0', MALLOC_TRIM_THRESHOLD_: '68719476736', MALLOC_TOP_PAD_: '1073741824', ...(passive ? { OMP_WAIT_POLICY: 'PASSIVE' } : {}),
      },
    });
    if (r.status !== 0) console.error(`# torch peer failed: ${r.stderr.slice(-2000)}`);
    else {
      const row = JSON.parse(r.stdout.trim().split('\n').pop()!);
      rows.push({ ...row, impl: passive ? `${row.impl} (OMP_WAIT_POLICY=PASSIVE)` : row.impl });
    }
  }
}
const loadAfter = loadavg();
console.log(`# Mixtral ${shape.layers} layers, ${shape.heads} heads (${shape['kv-heads']} kv), width ${shape.width}, ${shape.experts} experts of ${shape.ffn} (top-${shape['top-k']}), ` +
  `vocab ${shape.vocab}, batch ${shape.batch}×${shape.ctx}, f32, ${threads} threads; median of ${shape.steps} steps after ${shape.warmup}; ` +
  `load average ${loadBefore[0]!.toFixed(1)} → ${loadAfter[0]!.toFixed(1)} on ${cpus().length} cores`);
console.log('| implementation | ms/step | tokens/s | peak RSS (MiB) | parameters |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.impl} | ${r.msPerStep.toFixed(1)} | ${Math.round(r.tokensPerSec)} | ${Math.round(r.peakRssMiB)} | ${r.params} |`);
for (const r of rows) console.log(JSON.stringify(r));
if (o.json) {
  writeFileSync(o.json as string, `${JSON.stringify({
    bench: 'mixtral-train', command: `npx tsx scripts/bench/mixtral-train.ts ${process.argv.slice(2).join(' ')}`.trim(), date: new Date().toISOString(),
    machine: { cpu: cpus()[0]?.model, cores: cpus().length, loadAverageBefore: loadBefore, loadAverageAfter: loadAfter },
    note: 'taken on a shared, loaded machine (other agents building and testing): the numbers are not a ranking',
    shape, auxLossCoef: AUX, rows,
  }, null, 1)}\n`);
}
