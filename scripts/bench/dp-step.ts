// One data-parallel rank's training step through ParallelTrainer (GradBuffer's buckets, AdamW, gradient
// clipping): the median step time and the peak bytes allocated during a step above what the rank holds
// between steps (and the median CPU time of a step: all of the rank's threads, less sensitive to a
// loaded machine than wall time). Run under the launcher, e.g.
//   node bin/nodetron.js launch --nproc-per-node 2 scripts/bench/dp-step.ts [--config tiny|small] [--steps 8] [--warmup 2]
// Rank 0 prints one JSON line. Used to measure gradients as views of the buckets against copies into them.
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/cmdline/args.js';
import { gptConfigOf, selectConfigs } from '../../lib/bench/configs.js';

const o = parseOptions(process.argv.slice(2), { config: 'string', steps: 'number', warmup: 'number' });
const c = selectConfigs((o.config as string | undefined) ?? 'tiny')[0]!;
const steps = (o.steps as number | undefined) ?? 8, warmup = (o.warmup as number | undefined) ?? 2;
const config = gptConfigOf(c);
const { layout, mesh } = await nt.parallel.initParallelTraining({}, config, c.batch);
const stage = new nt.parallel.pp.GPTStage(new nt.nn.GPT(config, { seed: 1 }), 0, 1);
const trainer = await nt.parallel.ParallelTrainer.create(stage, [{ params: stage.parameters() }], {
  mesh, maxGradNorm: 1, createOptimizer: (groups) => new nt.optim.AdamW(groups, { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 }),
});
const { start, count } = nt.parallel.batchSlice(c.batch, mesh?.dpRank ?? 0, layout.dp);
const ms: number[] = [], cpuMs: number[] = [], peaks: number[] = [];
let x = 12345 + 7919 * start;
const ids = () => nt.tensor(Int32Array.from({ length: count * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; }), [count, c.ctx], { dtype: 'i32' });
for (let i = 0; i < warmup + steps; i++) {
  using inputs = ids();
  using targets = ids();
  const held = nt.memoryStats().allocated;
  nt.resetPeakMemory();
  const t0 = performance.now(), c0 = process.cpuUsage();
  await trainer.step(inputs, targets);
  const dt = performance.now() - t0, cpu = process.cpuUsage(c0);
  if (i >= warmup) { ms.push(dt); cpuMs.push((cpu.user + cpu.system) / 1000); peaks.push(nt.memoryStats().peak - held); }
}
const med = (a: number[]) => { const s = [...a].sort((p, q) => p - q), h = s.length >> 1; return s.length % 2 ? s[h]! : (s[h - 1]! + s[h]!) / 2; };
const paramBytes = stage.parameters().reduce((n, p) => n + p.nbytes, 0);
if ((mesh?.dpRank ?? 0) === 0) {
  console.log(JSON.stringify({
    config: c.name, dp: layout.dp, paramMiB: paramBytes / 2 ** 20, medianStepMs: med(ms), stepMs: ms.map(Math.round), medianCpuMs: med(cpuMs),
    peakStepMiB: Math.max(...peaks) / 2 ** 20, heldBetweenStepsMiB: nt.memoryStats().allocated / 2 ** 20,
  }));
}
trainer.dispose();
stage.dispose();
await nt.distributed.destroy();
