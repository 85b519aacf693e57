// npx tsx scripts/bench/bf16-step.ts [--rounds R (6)] [--no-torch]: the f32 and bf16-autocast training steps of the
// `small` bench GPT (L6 C384 T256 B4, V 50257) on the cpu backend, alternating rounds, beside PyTorch's f32 and
// CPU-autocast bf16 steps of the same model (scripts/bench/torch_train.py, 2 threads) in the same run: one
// PyTorch child per round and dtype, between nodetron's rounds, so that load on the machine falls on both.
// Run it with glibc's allocator kept (MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736
// MALLOC_TOP_PAD_=1073741824), which the PyTorch children inherit. Prints one JSON object: every step's ms,
// best and median per side, the ratios (also per round: f32 over the bf16 step right after it), the bf16
// GEMM kernel, the load average before and after.
import { spawnSync } from 'node:child_process';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { cpu, packageRoot } from '../../lib/native.js';

const argv = process.argv.slice(2);
const rounds = Number(argv[argv.indexOf('--rounds') + 1] ?? 6) || 6;
const withTorch = !argv.includes('--no-torch');
const cfg = { vocabSize: 50257, blockSize: 256, nLayer: 6, nHead: 6, nEmbd: 384, dropout: 0, bias: true };
const B = 4, T = 256;
const load0 = loadavg();
const model = new nt.nn.GPT(cfg, { seed: 1 });
const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
const ids = (k: number) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => ((i + k) * 2654435761 >>> 0) % cfg.vocabSize), [B, T]);
const x = ids(0), y = ids(1);
const f32 = () => nt.trainStep(model, opt, x, y);
const bf16 = () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, y));

/** ms of each timed step of one PyTorch child (2 warm-up steps, then 2 timed). */
function torchSteps(dtype: 'f32' | 'bf16'): number[] {
  const script = join(packageRoot, 'scripts', 'bench', 'torch_train.py');
  const args = [script, '--layers', 6, '--heads', 6, '--width', 384, '--ctx', T, '--batch', B, '--vocab', cfg.vocabSize, '--steps', 2, '--warmup', 2,
    '--threads', 2, '--dtype', dtype, '--no-memory'].map(String);
  const r = spawnSync('python3', args, { encoding: 'utf8', timeout: 10 * 60_000 });
  if (r.status !== 0) throw new Error(`torch_train.py --dtype ${dtype} failed: ${r.stderr.slice(-400)}`);
  return (JSON.parse(r.stdout.trim().split('\n').pop()!) as { stepsMs: number[] }).stepsMs;
}

for (const f of [f32, bf16, f32, bf16]) f();
const t: Record<string, number[]> = { f32: [], bf16: [], torchF32: [], torchBf16: [] };
for (let r = 0; r < rounds; r++) {
  for (const [name, f] of [['f32', f32], ['bf16', bf16]] as const) {
    const t0 = performance.now(); f(); t[name]!.push(performance.now() - t0);
  }
  if (withTorch && r % 2 === 0) { t.torchF32!.push(...torchSteps('f32')); t.torchBf16!.push(...torchSteps('bf16')); }
}
const med = (a: number[]) => [...a].sort((p, q) => p - q)[a.length >> 1]!;
const best = (a: number[]) => Math.min(...a);
const round = (a: number[]) => a.map(Math.round);
const summary: Record<string, unknown> = {
  bf16Gemm: cpu().gemmBf16Kernel().kernel, threads: cpu().kernelThreads(),
  f32: round(t.f32!), bf16: round(t.bf16!), bestF32: best(t.f32!), bestBf16: best(t.bf16!), medianF32: med(t.f32!), medianBf16: med(t.bf16!),
  ratioBest: best(t.f32!) / best(t.bf16!), ratioMedian: med(t.f32!) / med(t.bf16!),
  // each round's f32 step over the bf16 step right after it: the load of one moment falls on both
  pairRatios: t.f32!.map((v, i) => +(v / t.bf16![i]!).toFixed(3)), medianPairRatio: med(t.f32!.map((v, i) => v / t.bf16![i]!)),
};
if (withTorch) {
  Object.assign(summary, {
    torchF32: round(t.torchF32!), torchBf16: round(t.torchBf16!), bestTorchF32: best(t.torchF32!), bestTorchBf16: best(t.torchBf16!),
    medianTorchF32: med(t.torchF32!), medianTorchBf16: med(t.torchBf16!),
    bf16VsTorchBf16Best: best(t.torchBf16!) / best(t.bf16!), bf16VsTorchBf16Median: med(t.torchBf16!) / med(t.bf16!),
  });
}
summary.loadavg = { before: load0.map((v) => +v.toFixed(2)), after: loadavg().map((v) => +v.toFixed(2)) };
console.log(JSON.stringify(summary));
