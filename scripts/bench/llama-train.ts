// Tokens/s of a small Llama training on this CPU with nodetron beside PyTorch eager running the same
// model (transformers' LlamaForCausalLM, scripts/bench/torch_llama.py, started with glibc kept warm:
// MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736 MALLOC_TOP_PAD_=1073741824, the same number of
// threads). One step = forward with the fused head, backward, AdamW; the median over --steps after
// --warmup. Prints a Markdown row per implementation and one JSON line per implementation.
// --cpu-time: both sides on one thread, each step timed by the process's CPU time instead of the wall
// clock (a comparison other processes on the machine leave nearly intact); --json FILE writes the rows.
// Run: npx tsx scripts/bench/llama-train.ts [--layers 4 --heads 4 --kv-heads 2 --width 128 --ffn 352
//      --vocab 4096 --ctx 128 --batch 8 --steps 10 --warmup 3] [--no-torch] [--cpu-time] [--json FILE]
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';
import { cpu } from '../../lib/native.js';

const o = parseOptions(process.argv.slice(2), {
  layers: 'number', heads: 'number', 'kv-heads': 'number', width: 'number', ffn: 'number', vocab: 'number', ctx: 'number', batch: 'number',
  steps: 'number', warmup: 'number', 'no-torch': 'boolean', 'cpu-time': 'boolean', json: 'string',
});
const n = (k: string, d: number) => (o[k] as number | undefined) ?? d;
const shape = {
  layers: n('layers', 4), heads: n('heads', 4), 'kv-heads': n('kv-heads', 2), width: n('width', 128), ffn: n('ffn', 352), vocab: n('vocab', 4096),
  ctx: n('ctx', 128), batch: n('batch', 8), steps: n('steps', 10), warmup: n('warmup', 3),
};
const cpuTime = o['cpu-time'] === true;
if (cpuTime) { cpu().setKernelThreads(1); cpu().setBlasThreads(1); }
const threads = cpuTime ? 1 : nt.info().backends.cpu.blasThreads as number;
const now = cpuTime ? () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; } : () => performance.now();

const model = new nt.nn.Llama({
  vocabSize: shape.vocab, hiddenSize: shape.width, intermediateSize: shape.ffn, numHiddenLayers: shape.layers, numAttentionHeads: shape.heads,
  numKeyValueHeads: shape['kv-heads'], maxPositionEmbeddings: shape.ctx,
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
const ours = {
  impl: 'nodetron', threads, clock: cpuTime ? 'process CPU time' : 'wall', msPerStep: ms, tokensPerSec: (shape.batch * shape.ctx) / (ms / 1000),
  peakRssMiB: process.resourceUsage().maxRSS / 1024, params: model.numParameters(),
};
const rows: (typeof ours & Record<string, unknown>)[] = [ours];
if (!o['no-torch']) {
  const args = Object.entries(shape).flatMap(([k, v]) => [`--${k}`, String(v)]);
  // Twice: with OpenMP's default wait policy (threads spin between parallel regions), and with
  // OMP_WAIT_POLICY=PASSIVE (they sleep), which matters when other processes share the cores.
  for (const passive of [false, true]) {
    const r = spawnSync('python3', [join(import.meta.dirname, 'torch_llama.py'), ...args, '--threads', String(threads), ...(cpuTime ? ['--cpu-time'] : [])], {
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
console.log(`# Llama ${shape.layers} layers, ${shape.heads} heads (${shape['kv-heads']} kv), width ${shape.width}, ffn ${shape.ffn}, vocab ${shape.vocab}, ` +
  `batch ${shape.batch}×${shape.ctx}, f32, ${threads} threads${cpuTime ? ', ms of process CPU time' : ''}; median of ${shape.steps} steps after ${shape.warmup}; load average ${loadavg().map((l) => l.toFixed(1)).join(' ')}`);
console.log('| implementation | ms/step | tokens/s | peak RSS (MiB) | parameters |');
console.log('|---|---|---|---|---|');
for (const r of rows) console.log(`| ${r.impl} | ${r.msPerStep.toFixed(1)} | ${Math.round(r.tokensPerSec)} | ${Math.round(r.peakRssMiB)} | ${r.params} |`);
for (const r of rows) console.log(JSON.stringify(r));
if (o.json) writeFileSync(o.json as string, JSON.stringify({ shape, cpuTime, threads, loadavg: loadavg(), date: new Date().toISOString(), rows }, null, 2) + '\n');
