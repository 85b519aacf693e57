// Tokens/s and peak memory of a small Llama, or with --experts E a small Mixtral (nt.nn.Llama with MoE
// blocks: E experts, --top-k of them per token, its load-balancing loss in the objective), training on
// this CPU with nodetron beside PyTorch eager running the same model (transformers' LlamaForCausalLM or
// MixtralForCausalLM with output_router_logits, scripts/bench/torch_llama.py, started with glibc kept
// warm: MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824, the same number
// of threads; once with OpenMP's default wait policy and once with OMP_WAIT_POLICY=PASSIVE). One step =
// forward with the fused head, backward, AdamW; the median over --steps after --warmup. Prints a
// Markdown row per implementation and one JSON line per implementation; --json FILE writes them with
// the machine's load average before and after.
// --cpu-time: both sides on one thread, each step timed by the process's CPU time instead of the wall
// clock (a comparison other processes on the machine leave nearly intact).
// Run: npx tsx scripts/bench/llama-train.ts [--layers 4 --heads 4 --kv-heads 2 --width 128 --ffn 352
//      --vocab 4096 --ctx 128 --batch 8 --steps 10 --warmup 3] [--experts 8 --top-k 2] [--no-torch]
//      [--cpu-time] [--json FILE]
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';
import { cpu } from '../../lib/native.js';

const o = parseOptions(process.argv.slice(2), {
  layers: 'number', heads: 'number', 'kv-heads': 'number', width: 'number', ffn: 'number', vocab: 'number', ctx: 'number', batch: 'number',
  experts: 'number', 'top-k': 'number', steps: 'number', warmup: 'number', 'no-torch': 'boolean', 'cpu-time': 'boolean', json: 'string',
});
const n = (k: string, d: number) => (o[k] as number | undefined) ?? d;
const shape = {
  layers: n('layers', 4), heads: n('heads', 4), 'kv-heads': n('kv-heads', 2), width: n('width', 128), ffn: n('ffn', 352), vocab: n('vocab', 4096),
  ctx: n('ctx', 128), batch: n('batch', 8), steps: n('steps', 10), warmup: n('warmup', 3), experts: n('experts', 0), 'top-k': n('top-k', 2),
};
const moe = shape.experts > 0;
const AUX = 0.01;
const cpuTime = o['cpu-time'] === true;
if (cpuTime) { cpu().setKernelThreads(1); cpu().setBlasThreads(1); }
const threads = cpuTime ? 1 : nt.info().backends.cpu.blasThreads as number;
const now = cpuTime ? () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; } : () => performance.now();
const loadBefore = loadavg();

const model = new nt.nn.Llama({
  vocabSize: shape.vocab, hiddenSize: shape.width, intermediateSize: shape.ffn, numHiddenLayers: shape.layers, numAttentionHeads: shape.heads,
  numKeyValueHeads: shape['kv-heads'], maxPositionEmbeddings: shape.ctx,
  ...(moe ? { numLocalExperts: shape.experts, numExpertsPerTok: shape['top-k'], routerAuxLossCoef: AUX, routerZLossCoef: 0 } : {}),
}, { seed: 0 });
const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], eps: 1e-8, weightDecay: 0.1 });
const tokens = (seed: number) => Int32Array.from({ length: shape.batch * shape.ctx }, (_, i) => (i * 2654435761 + seed * 97) % shape.vocab >>> 0);
const ids = nt.tensor(tokens(1), [shape.batch, shape.ctx]), targets = nt.tensor(tokens(2), [shape.batch, shape.ctx]);
for (let i = 0; i < shape.warmup; i++) nt.trainStep(model, opt, ids, targets);
nt.resetPeakMemory();
const times: number[] = [];
for (let i = 0; i < shape.steps; i++) {
  const t0 = now();
  nt.trainStep(model, opt, ids, targets);
  times.push(now() - t0);
}
times.sort((a, b) => a - b);
const ms = times[Math.floor(times.length / 2)]!;
const rows: Array<{ impl: string; msPerStep: number; tokensPerSec: number; peakRssMiB: number; params: number } & Record<string, unknown>> = [{
  impl: 'nodetron', threads, clock: cpuTime ? 'process CPU time' : 'wall', msPerStep: ms, tokensPerSec: (shape.batch * shape.ctx) / (ms / 1000),
  peakRssMiB: process.resourceUsage().maxRSS / 1024, params: model.numParameters(),
  ...(moe ? { activeParams: nt.nn.llamaParameterCount(model.config, true), rowsPerExpertOverAllSteps: model.takeMoEStats()?.tokensPerExpert } : {}),
}];
if (!o['no-torch']) {
  const args = Object.entries(shape).flatMap(([k, v]) => [`--${k}`, String(v)]);
  // Twice: with OpenMP's default wait policy (threads spin between parallel regions), and with
  // OMP_WAIT_POLICY=PASSIVE (they sleep), which matters when other processes share the cores.
  for (const passive of [false, true]) {
    const r = spawnSync('python3', [join(import.meta.dirname, 'torch_llama.py'), ...args, '--threads', String(threads), '--aux', String(AUX),
      ...(cpuTime ? ['--cpu-time'] : [])], {
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
console.log(`# ${moe ? 'Mixtral' : 'Llama'} ${shape.layers} layers, ${shape.heads} heads (${shape['kv-heads']} kv), width ${shape.width}, ` +
  `${moe ? `${shape.experts} experts of ${shape.ffn} (top-${shape['top-k']})` : `ffn ${shape.ffn}`}, vocab ${shape.vocab}, batch ${shape.batch}×${shape.ctx}, f32, ` +
  `${threads} threads${cpuTime ? ', ms of process CPU time' : ''}; median of ${shape.steps} steps after ${shape.warmup}; ` +
  `load average ${loadBefore[0]!.toFixed(1)} → ${loadAfter[0]!.toFixed(1)} on ${cpus().length} cores`);
console.log('| implementation | ms/step | tokens/s | peak RSS (MiB) | parameters |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.impl} | ${r.msPerStep.toFixed(1)} | ${Math.round(r.tokensPerSec)} | ${Math.round(r.peakRssMiB)} | ${r.params} |`);
for (const r of rows) console.log(JSON.stringify(r));
if (o.json) {
  writeFileSync(o.json as string, `${JSON.stringify({
    bench: moe ? 'mixtral-train' : 'llama-train', command: `npx tsx scripts/bench/llama-train.ts ${process.argv.slice(2).join(' ')}`.trim(), date: new Date().toISOString(),
    machine: { cpu: cpus()[0]?.model, cores: cpus().length, loadAverageBefore: loadBefore, loadAverageAfter: loadAfter },
    shape, cpuTime, threads, ...(moe ? { auxLossCoef: AUX } : {}), rows,
  }, null, 1)}\n`);
}
