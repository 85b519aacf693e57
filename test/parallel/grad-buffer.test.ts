// Data-parallel gradient buckets on simulated ranks: averaged gradients vs a float64 mean, buckets
// launching exactly when their last gradient is ready (by hand, and from backward's grad-ready hooks
// while backward runs), noSync accumulation, unused and foreign parameters, double marks.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { GradBuffer } from '../../lib/parallel/data-parallel/buffer.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { ALL, CHAIN_SHAPES, chainLoss, countingGroup, leafParams, maxAbsDiff, meanOverRanks, randomArray, randomTensor } from './helpers.js';

function makeParams(): nt.Tensor[] {
  return CHAIN_SHAPES.map((s, i) => randomTensor(s, 100 + i));
}
const gradSeed = (rank: number, i: number) => 1000 * (rank + 1) + i;

describe('GradBuffer', () => {
  for (const world of [2, 3]) {
    it(`averages odd-sized gradients over ${world} ranks across several buckets`, async () => {
      const results = await runLocalRanks(world, async (g) => {
        const params = makeParams();
        const buf = new GradBuffer(params, { group: g, bucketBytes: 60 });
        expect(buf.buckets.length).toBeGreaterThan(2);
        params.forEach((p, i) => { p.grad = randomTensor(p.shape as number[], gradSeed(g.rank, i)); });
        for (const p of [...params].reverse()) buf.markGradReady(p);
        await buf.finishGradSync();
        return params.map((p) => Array.from(p.grad!.toArraySync()));
      });
      CHAIN_SHAPES.forEach((s, i) => {
        const n = s.reduce((a, b) => a * b, 1);
        const ref = new Float64Array(n);
        for (let r = 0; r < world; r++) randomArray(n, gradSeed(r, i)).forEach((v, j) => { ref[j] += v / world; });
        for (const res of results) expect(maxAbsDiff(res[i]!, ref)).toBeLessThan(1e-6);
      });
    });
  }

  it('a bucket starts its allReduce when its last gradient is ready, in backward order', async () => {
    await runLocalRanks(2, async (g) => {
      const log: string[] = [];
      const params = makeParams();
      const buf = new GradBuffer(params, { group: countingGroup(g, log), bucketBytes: 60 });
      // Reverse order: bucket 0 holds the last parameters.
      expect(buf.buckets[0]!.layout.entries[0]!.param).toBe(params[params.length - 1]);
      for (const p of params) p.grad = nt.ones(p.shape);
      let done = 0;
      for (const p of [...params].reverse()) {
        buf.markGradReady(p);
        done += buf.buckets.filter((b) => b.pending === 0 && b.layout.entries.some((e) => e.param === p)).length;
        expect(buf.launched).toBe(done);
      }
      expect(log.length).toBe(buf.buckets.length);
      await buf.finishGradSync();
      for (const p of params) expect(Array.from(p.grad!.toArraySync()).every((v) => v === 1)).toBe(true);
    });
  });

  it('noSync: no communication on non-final micro-batches; the last one syncs the accumulated gradient', async () => {
    const results = await runLocalRanks(2, async (g) => {
      const log: string[] = [];
      const params = makeParams();
      const buf = new GradBuffer(params, { group: countingGroup(g, log), bucketBytes: 1 << 20 });
      for (const p of params) p.grad = nt.full(p.shape, g.rank + 1);
      await buf.noSync(async () => {
        for (const p of params) buf.markGradReady(p);
        await expect(buf.finishGradSync()).rejects.toThrow(nt.StateError);
      });
      expect(log).toEqual([]);
      for (const p of params) { const old = p.grad!; p.grad = nt.full(p.shape, 2 * (g.rank + 1)); old.dispose(); }
      for (const p of params) buf.markGradReady(p);
      await buf.finishGradSync();
      expect(log).toEqual(['allReduce']);
      return params[0]!.grad!.toArraySync()[0];
    });
    expect(results).toEqual([3, 3]);
  });

  it('parameters without a gradient contribute zeros; foreign parameters and double marks are errors', async () => {
    const results = await runLocalRanks(2, async (g) => {
      const params = makeParams();
      const buf = new GradBuffer(params, { group: g, bucketBytes: 60 });
      params.forEach((p, i) => { if (!(i === 1 && g.rank === 0)) p.grad = nt.full(p.shape, 4); });
      const stranger = nt.zeros([3]);
      expect(() => buf.markGradReady(stranger)).toThrow(nt.ArgumentError);
      buf.markGradReady(params[4]!);
      expect(() => buf.markGradReady(params[4]!)).toThrow(nt.StateError);
      await buf.finishGradSync();
      return params.map((p) => p.grad!.toArraySync()[0]);
    });
    for (const r of results) expect(r).toEqual([4, 2, 4, 4, 4]);
    expect(() => new GradBuffer([nt.zeros([2]), nt.zeros([2], { dtype: 'i32' })], { group: null as never })).toThrow(nt.DTypeError);
  });

  it('overlap: backward launches each bucket as its last gradient becomes final; same averages as without overlap', async () => {
    const world = 2;
    const run = (overlap: boolean) => runLocalRanks(world, async (g) => {
      const log: string[] = [];
      const params = leafParams();
      const buf = new GradBuffer(params, { group: countingGroup(g, log), bucketBytes: 60, overlap });
      // Hooks registered after the buffer's run after it: they see what it has launched so far.
      const launchedAtHook: number[] = [], readyOrder: number[] = [];
      params.forEach((p, i) => p.registerPostAccumulateGradHook(() => { launchedAtHook.push(buf.launched); readyOrder.push(i); }));
      chainLoss(params, g.rank, 0).backward();
      const launchedByBackward = log.length;
      // Marked gradients live in their buckets only: each .grad is the view of its bucket's range.
      expect(params.every((p) => buf.gradIsView(p))).toBe(true);
      await buf.finishGradSync();
      expect(buf.buckets.every((b) => b.flat === null && b.work === null)).toBe(true);
      const grads = params.map((p) => p.grad!.toArraySync() as Float32Array);
      buf.dispose();
      return { buckets: buf.buckets.length, launchedAtHook, readyOrder, launchedByBackward, launched: buf.launched, grads };
    });
    const [on, off] = [await run(true), await run(false)];
    const ref = meanOverRanks(world, 1);
    for (const r of on) {
      // One parameter per bucket at 60 bytes; backward finishes them last-to-first, so the k-th
      // gradient to become final launches the k-th bucket before backward goes on.
      expect(r.buckets).toBe(5);
      expect(r.readyOrder).toEqual([4, 3, 2, 1, 0]);
      expect(r.launchedAtHook).toEqual([1, 2, 3, 4, 5]);
      expect(r.launchedByBackward).toBe(5);
    }
    for (const r of off) {
      expect(r.launchedAtHook).toEqual([0, 0, 0, 0, 0]);
      expect(r.launchedByBackward).toBe(0);
      expect(r.launched).toBe(5);
    }
    on.forEach((r, rank) => r.grads.forEach((gr, i) => {
      expect(Array.from(gr)).toEqual(Array.from(off[rank]!.grads[i]!));
      expect(maxAbsDiff(gr, ref[i]!)).toBeLessThan(1e-6);
    }));
  });

  it('gradients are views of the buckets: backward writes and accumulates micro-batches in place, the allReduce averages in place (no gradient copied or replaced)', async () => {
    const world = 2, micros = 2;
    const results = await runLocalRanks(world, async (g) => {
      const params = leafParams();
      const buf = new GradBuffer(params, { group: g, bucketBytes: 60 });
      const steps: Float32Array[][] = [];
      // Three steps: the first step's buckets are rebuilt in readiness order, later ones reuse freed memory.
      for (let step = 0; step < 3; step++) {
        await buf.noSync(() => chainLoss(params, g.rank, 0).backward());
        const views = params.map((p) => p.grad!);
        expect(params.every((p) => buf.gradIsView(p))).toBe(true);
        chainLoss(params, g.rank, 1).backward();
        await buf.finishGradSync();
        // The very tensors the first micro-batch's backward wrote hold the averages of both.
        params.forEach((p, i) => expect(p.grad).toBe(views[i]));
        steps.push(params.map((p) => p.grad!.toArraySync() as Float32Array));
        nt.zeroGrad(params);
      }
      // Parameters that get no gradient contribute zeros, not what their bucket's memory held.
      for (const p of params) buf.markGradReady(p);
      await buf.finishGradSync();
      expect(params.every((p) => buf.gradIsView(p) && Array.from(p.grad!.toArraySync()).every((x) => x === 0))).toBe(true);
      nt.zeroGrad(params);
      // Views keep their bytes after the buffer is gone.
      await buf.noSync(() => chainLoss(params, g.rank, 0).backward());
      chainLoss(params, g.rank, 1).backward();
      await buf.finishGradSync();
      buf.dispose();
      const after = params.map((p) => p.grad!.toArraySync() as Float32Array);
      nt.zeroGrad(params);
      // After dispose() backward keeps its own gradients again.
      chainLoss(params, g.rank, 0).backward();
      expect(params.some((p) => buf.gradIsView(p))).toBe(false);
      nt.zeroGrad(params);
      return { steps, after };
    });
    const ref = meanOverRanks(world, micros);
    for (const { steps, after } of results) {
      expect(steps).toHaveLength(3);
      for (const grads of [...steps, after]) grads.forEach((gr, i) => expect(maxAbsDiff(gr, ref[i]!)).toBeLessThan(1e-6));
    }
  });

  it('overlap with noSync: micro-batches accumulate without communication, the last one syncs their sum', async () => {
    const world = 2, micros = 3;
    const results = await runLocalRanks(world, async (g) => {
      const log: string[] = [];
      const params = leafParams();
      const buf = new GradBuffer(params, { group: countingGroup(g, log), bucketBytes: 100 });
      await buf.noSync(() => {
        for (let m = 0; m < micros - 2; m++) chainLoss(params, g.rank, m).backward();
      });
      // A synchronous noSync is over when it returns, even unawaited (as a pipeline schedule may call it).
      void buf.noSync(() => chainLoss(params, g.rank, micros - 2).backward());
      expect(buf.syncEnabled).toBe(true);
      expect(log).toEqual([]);
      expect(params.every((p) => p.grad !== null)).toBe(true);
      chainLoss(params, g.rank, micros - 1).backward();
      expect(log.length).toBe(buf.buckets.length);
      expect(params.every((p) => buf.gradIsView(p))).toBe(true);  // moved into the buckets
      await buf.finishGradSync();
      const grads = params.map((p) => p.grad!.toArraySync() as Float32Array);
      buf.dispose();
      return grads;
    });
    const ref = meanOverRanks(world, micros);
    for (const grads of results) grads.forEach((gr, i) => expect(maxAbsDiff(gr, ref[i]!)).toBeLessThan(1e-6));
  });

  it('overlap: an unused parameter holds back its bucket and the later ones until finishGradSync (then moves last); a second backward is a StateError; dispose removes the hooks', async () => {
    const world = 2, unused = 2, chain = ALL.filter((i) => i !== unused);
    const results = await runLocalRanks(world, async (g) => {
      const params = leafParams();
      const buf = new GradBuffer(params, { group: g, bucketBytes: 60 });
      chainLoss(params, g.rank, 0, chain).backward();
      // Buckets [p4] [p3] [p2] [p1] [p0]: launches keep bucket order, so p2's waits for finishGradSync and holds back p1's and p0's.
      expect(buf.launched).toBe(2);
      expect(() => chainLoss(params, g.rank, 0, chain).backward()).toThrow(nt.StateError);
      await buf.finishGradSync();
      expect(Array.from(params[unused]!.grad!.toArraySync()).every((v) => v === 0)).toBe(true);
      // The next step works, and after dispose() backward only accumulates locally.
      nt.zeroGrad(params);
      expect(buf.buckets.map((b) => params.indexOf(b.layout.entries[0]!.param))).toEqual([4, 3, 1, 0, 2]);
      chainLoss(params, g.rank, 0, chain).backward();
      expect(buf.launched).toBe(9);
      await buf.finishGradSync();
      const grads = params.map((p) => p.grad!.toArraySync() as Float32Array);
      buf.dispose();
      nt.zeroGrad(params);
      chainLoss(params, g.rank, 0, chain).backward();
      expect(buf.launched).toBe(10);
      expect(params[0]!.grad).not.toBeNull();
      return grads;
    });
    const ref = meanOverRanks(world, 1, () => chain);
    for (const grads of results) grads.forEach((gr, i) => expect(maxAbsDiff(gr, ref[i]!)).toBeLessThan(1e-6));
  });

  it('overlap: after the first step the buckets follow the order gradients were ready in, rank 0\'s on every rank', async () => {
    const world = 2;
    // Rank 0's backward readies 3, 1, 4, 2, 0; rank 1's the reverse parameter order the buffer starts from.
    const chainOf = (rank: number) => (rank === 0 ? [0, 2, 4, 1, 3] : ALL);
    const results = await runLocalRanks(world, async (g) => {
      const params = leafParams();
      const buf = new GradBuffer(params, { group: g, bucketBytes: 70 });
      const launchedAtHook: number[][] = [];
      const bucketsBefore = buf.buckets.map((b) => b.layout.entries.map((e) => params.indexOf(e.param)));
      const grads: Float32Array[][] = [];
      for (let step = 0; step < 2; step++) {
        const probe: number[] = [];
        const handles = params.map((p) => p.registerPostAccumulateGradHook(() => { probe.push(buf.launched); }));
        chainLoss(params, g.rank, step, chainOf(g.rank)).backward();
        await buf.finishGradSync();
        handles.forEach((h) => h.remove());
        launchedAtHook.push(probe.map((n) => n - 3 * step));
        grads.push(params.map((p) => p.grad!.toArraySync() as Float32Array));
        nt.zeroGrad(params);
      }
      const bucketsAfter = buf.buckets.map((b) => b.layout.entries.map((e) => params.indexOf(e.param)));
      buf.dispose();
      return { bucketsBefore, bucketsAfter, launchedAtHook, grads };
    });
    const [r0, r1] = results as [typeof results[0], typeof results[0]];
    expect(r0.bucketsBefore).toEqual([[4, 3], [2, 1], [0]]);
    // Rank 0, first step: buckets wait for late gradients. Second step: one launch per ready bucket.
    expect(r0.launchedAtHook[0]).toEqual([0, 0, 1, 2, 3]);
    expect(r0.bucketsAfter).toEqual([[3], [1, 4], [2], [0]]);
    expect(r0.launchedAtHook[1]).toEqual([1, 1, 2, 3, 4]);
    expect(r1.bucketsAfter).toEqual(r0.bucketsAfter);
    for (let step = 0; step < 2; step++) {
      const ref = meanOverRanks(world, 1, chainOf, step);
      for (const r of results) r.grads[step]!.forEach((gr, i) => expect(maxAbsDiff(gr, ref[i]!)).toBeLessThan(1e-6));
    }
  });

  it('a GPT with recomputed blocks: hooks inside checkpoint() start buckets during backward; same averages as plain backward without overlap', async () => {
    const config: nt.nn.GPTConfig = { vocabSize: 48, blockSize: 8, nLayer: 3, nHead: 2, nEmbd: 16, dropout: 0, bias: true };
    const run = (recompute: boolean, overlap: boolean) => runLocalRanks(2, async (g) => {
      const model = new nt.nn.GPT({ ...config, recompute }, { seed: 3 });
      const params = model.parameters();
      // About one block per bucket, so blocks' buckets can start before the embeddings' gradients are final.
      const buf = new GradBuffer(params, { group: g, bucketBytes: 4096, overlap });
      const ids = (k: number) => nt.tensor(Int32Array.from({ length: 2 * 8 }, (_, i) => (i * 7 + 3 * g.rank + k) % 48), [2, 8], { dtype: 'i32' });
      // Hooks registered after the buffer's see how many buckets had started at each gradient's readiness.
      let probe: number[] = [];
      for (const p of params) p.registerPostAccumulateGradHook(() => { probe.push(buf.launched); });
      const perStep: { buckets: number; launchedAtReady: number[] }[] = [];
      for (let step = 0; step < 2; step++) {
        const before = buf.launched, buckets = buf.buckets.length;
        probe = [];
        nt.scope(() => { model.forward(ids(step), ids(step + 1)).loss!.backward(); });
        perStep.push({ buckets, launchedAtReady: probe.map((n) => n - before) });
        await buf.finishGradSync();
        if (step === 0) nt.zeroGrad(params);
      }
      const grads = params.map((p) => p.grad!.toArraySync() as Float32Array);
      buf.dispose();
      model.dispose();
      return { grads, perStep };
    });
    const [withHooks, plain] = [await run(true, true), await run(false, false)];
    for (const r of withHooks) {
      for (const { buckets, launchedAtReady } of r.perStep) {
        expect(buckets).toBeGreaterThan(8);
        expect(launchedAtReady).toHaveLength(config.nLayer * 12 + 4);
        // Buckets start one after another while backward runs: some by the time half the gradients
        // are final, all by the last one.
        const half = launchedAtReady[launchedAtReady.length >> 1]!;
        expect(half).toBeGreaterThan(0);
        expect(half).toBeLessThan(buckets);
        expect(launchedAtReady.at(-1)).toBe(buckets);
        launchedAtReady.forEach((n, i) => expect(n).toBeGreaterThanOrEqual(launchedAtReady[i - 1] ?? 0));
      }
    }
    for (const r of plain) for (const { launchedAtReady } of r.perStep) expect(launchedAtReady.every((n) => n === 0)).toBe(true);
    withHooks.forEach((r, rank) => r.grads.forEach((gr, i) => expect(maxAbsDiff(gr, plain[rank]!.grads[i]!)).toBeLessThan(1e-6)));
  });
});
