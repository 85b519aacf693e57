// Context parallelism on this machine: a long-sequence GPT (default ctx 4096, width 64, 2 layers, 4 heads,
// one sequence per step) trained through nt.train.setup in one process, and over 2 ranks with ring
// attention and with Ulysses; tokens/s over the timed steps (after one warm-up step) and each rank's
// peak of allocated tensor memory during them. The layouts run one after the other, each under the launcher.
//   npx tsx scripts/bench/context-parallel.ts [--ctx 4096] [--width 64] [--layers 2] [--heads 4] [--steps 3] [--cp 2] [--json FILE]
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import * as nt from '../../lib/index.js';

const self = fileURLToPath(import.meta.url);
const { options: o } = nt.train.parseArgs(process.argv.slice(2), {
  ctx: 'number', width: 'number', layers: 'number', heads: 'number', steps: 'number', json: 'string',
});
const ctx = (o.ctx as number | undefined) ?? 4096, width = (o.width as number | undefined) ?? 64;
const layers = (o.layers as number | undefined) ?? 2, heads = (o.heads as number | undefined) ?? 4, steps = (o.steps as number | undefined) ?? 3;

if (process.env.RANK === undefined) {
  // The driver: one launch per layout.
  const cp = nt.train.layoutFromArgs(process.argv.slice(2), {}).cp ?? 2;
  const common = ['--ctx', String(ctx), '--width', String(width), '--layers', String(layers), '--heads', String(heads), '--steps', String(steps)];
  const runs: { name: string; nproc: number; flags: string[] }[] = [
    { name: 'cp1 (one process)', nproc: 1, flags: [] },
    { name: `cp${cp} ring`, nproc: cp, flags: ['--cp', String(cp), '--cp-mode', 'ring'] },
    { name: `cp${cp} ulysses`, nproc: cp, flags: ['--cp', String(cp), '--cp-mode', 'ulysses'] },
  ];
  const launcher = fileURLToPath(new URL('../../test/fixtures/launch/launcher.ts', import.meta.url));
  const rows: Record<string, unknown>[] = [];
  for (const r of runs) {
    const load = loadavg()[0]!;
    const p = spawnSync(process.execPath, ['--import', 'tsx', launcher, '--nproc-per-node', String(r.nproc), self, ...common, ...r.flags],
      { encoding: 'utf8', env: { ...process.env, NODETRON_WARN_LEAKS: '0' } });
    const results = (p.stdout + p.stderr).split('\n').filter((l) => l.includes('CPBENCH ')).map((l) => JSON.parse(l.slice(l.indexOf('CPBENCH ') + 8)) as { rank: number; stepMs: number[]; peak: number; loss: number });
    if (p.status !== 0 || results.length !== r.nproc) { console.error(p.stdout.slice(-3000), p.stderr.slice(-3000)); throw new Error(`${r.name} failed (exit ${p.status})`); }
    // A step ends on every rank together (the losses are averaged), so rank 0's times are the step's.
    const ms = results.find((x) => x.rank === 0)!.stepMs;
    const mean = ms.reduce((a, b) => a + b, 0) / ms.length;
    const peakMiB = Math.max(...results.map((x) => x.peak)) / 2 ** 20;
    rows.push({ layout: r.name, ranks: r.nproc, stepMs: Math.round(mean), tokensPerSec: Math.round(ctx / (mean / 1000)), peakMiBPerRank: Number(peakMiB.toFixed(1)), loss: results[0]!.loss, load1: Number(load.toFixed(2)) });
    console.log(JSON.stringify(rows.at(-1)));
  }
  console.log(`\nGPT ctx ${ctx}, width ${width}, ${layers} layers, ${heads} heads, batch 1, f32 on cpu; mean of ${steps} steps after one warm-up step`);
  console.log('| layout | ranks | step ms | tokens/s | peak MiB per rank | 1-min load at start |\n|---|---|---|---|---|---|');
  for (const r of rows) console.log(`| ${r.layout} | ${r.ranks} | ${r.stepMs} | ${r.tokensPerSec} | ${r.peakMiBPerRank} | ${r.load1} |`);
  if (o.json) writeFileSync(o.json as string, JSON.stringify({ ctx, width, layers, heads, steps, rows }, null, 2));
} else {
  // One rank: nt.train.setup reads the layout (--cp, --cp-mode) from this command line.
  const vocab = 256;
  const config: nt.nn.GPTConfig = { vocabSize: vocab, blockSize: ctx, nLayer: layers, nHead: heads, nEmbd: width, dropout: 0, bias: true };
  let s = 12345;
  const batch = (): nt.train.Batch => {
    const ids = Int32Array.from({ length: ctx + 1 }, () => { s = (s * 1103515245 + 12345) % 2147483648; return s % vocab; });
    return { inputs: nt.tensor(ids.slice(0, ctx), [1, ctx]), targets: nt.tensor(ids.slice(1), [1, ctx]) };
  };
  const run = await nt.train.setup({
    model: (shard) => new nt.nn.GPT(config, shard), optimizer: (g) => new nt.optim.AdamW(g, { lr: 1e-3 }), batchSize: 1, data: () => batch(), progress: false, seqLen: ctx,
  });
  let loss = 0;
  const stepMs: number[] = [];
  loss = (await run.step()).loss;
  nt.resetPeakMemory();
  for (let i = 0; i < steps; i++) {
    const t0 = performance.now();
    loss = (await run.step()).loss;
    stepMs.push(performance.now() - t0);
  }
  const peak = nt.memoryStats().peak;
  console.log(`CPBENCH ${JSON.stringify({ rank: run.rank, stepMs, peak, loss })}`);
  await run.close();
}
