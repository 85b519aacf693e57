// Tokens per second of a small MoE GPT (8 SwiGLU experts, top-2, every block) training with AdamW:
// one process (nt.trainStep), or under `nodetron launch` with --ep/--dp (ParallelTrainer), the same
// global batch in every layout. Prints one JSON line on rank 0: layout, median step time, tokens/s,
// peak memory, the load average. scripts/bench/moe_torch.py runs the same model in PyTorch eager.
//   node --import tsx scripts/bench/moe.ts [--steps 12] [--warmup 3] [--cpu-time]
//   (--cpu-time, one process only: one kernel and one BLAS thread, each step timed by the process's CPU
//   time, which other processes on the machine leave nearly intact; moe_torch.py --threads 1 --cpu-time
//   is its peer)
//   node bin/nodetron.js launch --nproc-per-node 2 scripts/bench/moe.ts --ep 2
//   node bin/nodetron.js launch --nproc-per-node 4 scripts/bench/moe.ts --ep 2 --dp 4
import { loadavg } from 'node:os';
import * as nt from '../../lib/index.js';
import { cpu } from '../../lib/native.js';
import { parseOptions } from '../../lib/cmdline/args.js';

const o = parseOptions(process.argv.slice(2), { steps: 'number', warmup: 'number', ep: 'number', dp: 'number', batch: 'number', ctx: 'number', width: 'number', layers: 'number', experts: 'number', 'top-k': 'number', 'cpu-time': 'boolean' });
const steps = (o.steps as number | undefined) ?? 12, warmup = (o.warmup as number | undefined) ?? 3;
const batch = (o.batch as number | undefined) ?? 8, ctx = (o.ctx as number | undefined) ?? 64, width = (o.width as number | undefined) ?? 128;
const experts = (o.experts as number | undefined) ?? 8, topK = (o['top-k'] as number | undefined) ?? 2;
const config: nt.nn.GPTConfig = {
  vocabSize: 2048, blockSize: ctx, nLayer: (o.layers as number | undefined) ?? 2, nHead: 4, nEmbd: width, dropout: 0, bias: false,
  moe: { experts, topK, hidden: 2 * width, auxLossCoef: 0.01, zLossCoef: 0.001 },
};
const tokens = (step: number) => {
  let s = (step + 1) * 7919;
  const seq = Int32Array.from({ length: batch * (ctx + 1) }, () => { s = (s * 1103515245 + 12345) % 2147483648; return s % config.vocabSize; });
  const x = new Int32Array(batch * ctx), y = new Int32Array(batch * ctx);
  for (let b = 0; b < batch; b++) { x.set(seq.subarray(b * (ctx + 1), b * (ctx + 1) + ctx), b * ctx); y.set(seq.subarray(b * (ctx + 1) + 1, (b + 1) * (ctx + 1)), b * ctx); }
  return { x, y };
};
const adamw = (params: nt.Tensor[] | nt.parallel.zero.ZeroParamGroup<nt.optim.AdamWOptions>[]) => new nt.optim.AdamW(params as nt.Tensor[], { lr: 1e-3, weightDecay: 0 });
const cpuTime = o['cpu-time'] === true;
const now = cpuTime ? () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; } : () => performance.now();
const times: number[] = [];
let rank = 0, layout = 'one process';
const world = Number(process.env.WORLD_SIZE ?? 1);
if (cpuTime && world > 1) throw new Error('moe.ts: --cpu-time times one process only');
if (cpuTime) { cpu().setKernelThreads(1); cpu().setBlasThreads(1); }
if (world === 1) {
  const model = new nt.nn.GPT(config, { seed: 1 });
  const opt = adamw(model.parameters());
  for (let i = 0; i < warmup + steps; i++) {
    const { x, y } = tokens(i);
    using xs = nt.tensor(x, [batch, ctx]);
    using ys = nt.tensor(y, [batch, ctx]);
    const t0 = now();
    nt.trainStep(model, opt, xs, ys, { maxGradNorm: 1 });
    if (i >= warmup) times.push(now() - t0);
  }
} else {
  const { layout: l, rank: r, mesh } = await nt.parallel.initParallelTraining({ ep: o.ep as number | undefined, dp: o.dp as number | undefined }, { ...config, moeExperts: experts }, batch);
  rank = r;
  layout = nt.parallel.describeLayout(l);
  const moeParallel = nt.parallel.ep.expertParallel({ experts, epGroup: mesh!.epGroup, countGroup: mesh!.dpGroup });
  const stage = new nt.parallel.pp.GPTStage(new nt.nn.GPT(config, { seed: 1, moeParallel }), 0, 1);
  const trainer = await nt.parallel.ParallelTrainer.create(stage, [{ params: stage.parameters() }], { mesh, maxGradNorm: 1, createOptimizer: (g) => adamw(g) });
  const { start, count } = nt.parallel.batchSlice(batch, mesh!.dpRank, l.dp);
  for (let i = 0; i < warmup + steps; i++) {
    const { x, y } = tokens(i);
    using xs = nt.tensor(x.slice(start * ctx, (start + count) * ctx), [count, ctx]);
    using ys = nt.tensor(y.slice(start * ctx, (start + count) * ctx), [count, ctx]);
    const t0 = performance.now();
    await trainer.step(xs, ys);
    if (i >= warmup) times.push(performance.now() - t0);
  }
}
const median = [...times].sort((a, b) => a - b)[Math.floor(times.length / 2)]!;
if (rank === 0) {
  console.log(JSON.stringify({
    impl: 'nodetron', layout, processes: world, clock: cpuTime ? 'process CPU time (1 thread)' : 'wall', experts, topK, width, batch, ctx, stepMs: +median.toFixed(1), tokensPerSec: +((batch * ctx) / (median / 1000)).toFixed(0),
    peakMiB: +(nt.memoryStats('cpu').peak / 2 ** 20).toFixed(1), rssMiB: +(process.memoryUsage.rss() / 2 ** 20).toFixed(1), load1: +loadavg()[0]!.toFixed(2),
  }));
}
if (nt.distributed.isInitialized()) await nt.distributed.destroy();
