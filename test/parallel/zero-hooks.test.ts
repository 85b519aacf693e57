// ZeRO stages 1 and 2 driven by backward on simulated ranks: every bucket's reduce-scatter starts
// from the gradient hooks while backward runs, stage 2 frees each gradient as it is packed and
// reduces every micro-batch, stage 1 once per step; the updated parameters equal a float64 SGD
// step on the mean gradient (over several steps, micro-batches, deferred parameters, overlap off);
// the buckets stay as built (each laid out flat, rank r holding its contiguous range), gradients
// are written into them in place; misuse fails clearly and leaves the optimizer usable.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { ZeroOptimizer, ZeroStage3Optimizer, type ZeroOptions } from '../../lib/parallel/zero/optimizer.js';
import type { CollectiveGroup } from '../../lib/distributed/group.js';
import { ALL, CHAIN_SHAPES, chainLoss, leafParams, maxAbsDiff, meanOverRanks } from './helpers.js';

const LR = 0.5;
// Every parameter of CHAIN_SHAPES is at most 84 bytes: about one parameter per bucket.
const BUCKET_BYTES = 64;
const sgd = (groups: Array<{ params: Iterable<nt.Tensor> }>) => new nt.optim.SGD(groups, { lr: LR });

/** Initial values minus LR times each step's float64 mean gradient (plain SGD). */
function expected(world: number, stepChains: readonly (readonly number[])[], micros: number): Float64Array[] {
  const params = leafParams();
  const out = params.map((p) => Float64Array.from(p.toArraySync() as Float32Array));
  for (const p of params) p.dispose();
  stepChains.forEach((chain, step) => {
    // The parameters move between steps, so each step's gradients come from the expected values so far.
    const mean = meanAt(world, chain, micros, step, out);
    out.forEach((v, i) => v.forEach((x, j) => { v[j] = x - LR * mean[i]![j]!; }));
  });
  return out;
}

// meanOverRanks at given parameter values (the chain's gradients depend on them).
function meanAt(world: number, chain: readonly number[], micros: number, step: number, values: Float64Array[]): Float64Array[] {
  const sum = values.map((v) => new Float64Array(v.length));
  const shapes = leafParams().map((p) => { const s = p.shape as number[]; p.dispose(); return s; });
  for (let r = 0; r < world; r++) {
    const params = values.map((v, i) => nt.tensor(Float32Array.from(v), shapes[i]!, { requiresGrad: true }));
    for (let m = 0; m < micros; m++) chainLoss(params, r, step * micros + m, chain).backward();
    params.forEach((p, i) => { if (p.grad) (p.grad.toArraySync() as Float32Array).forEach((g, j) => { sum[i]![j] += g / world; }); });
    for (const p of params) p.dispose();
  }
  return sum;
}

interface RunOptions {
  stage: 1 | 2;
  micros: number;
  stepChains: readonly (readonly number[])[];
  overlap?: boolean;
  defer?: number[];
}

/** One rank: the steps through a ZeroOptimizer, checking after each backward what the stage promises. */
async function trainRank(g: CollectiveGroup, o: RunOptions): Promise<{ values: Float32Array[]; stats: nt.parallel.zero.ReduceStats }> {
  const params = leafParams();
  const options: ZeroOptions = { group: g, stage: o.stage, bucketBytes: BUCKET_BYTES, overlap: o.overlap ?? true, deferGrads: (o.defer ?? []).map((i) => params[i]!) };
  const zero = new ZeroOptimizer(params, sgd, options);
  const deferred = new Set(options.deferGrads as nt.Tensor[]);
  for (const [step, chain] of o.stepChains.entries()) {
    for (let m = 0; m < o.micros; m++) {
      const backward = () => chainLoss(params, g.rank, step * o.micros + m, chain).backward();
      if (o.stage === 1 && m < o.micros - 1) await zero.noSync(backward);
      else backward();
      // Stage 2 with overlap keeps no full gradient past its hook, except the deferred ones.
      if (o.stage === 2 && (o.overlap ?? true)) for (const p of params) expect(p.grad !== null).toBe(deferred.has(p) && chain.includes(params.indexOf(p)));
      if (o.stage === 1) for (const i of chain) expect(params[i]!.grad).not.toBeNull();
    }
    await zero.step();
    zero.zeroGrad();
  }
  const values = params.map((p) => p.toArraySync() as Float32Array);
  const stats = { ...zero.reduceStats };
  zero.dispose();
  return { values, stats };
}

function expectClose(results: { values: Float32Array[] }[], want: Float64Array[]): void {
  for (const r of results) want.forEach((w, i) => expect(maxAbsDiff(r.values[i]!, w)).toBeLessThan(2e-6));
}

describe('ZeroOptimizer stages 1 and 2 from the gradient hooks', () => {
  for (const world of [2, 3]) {
    for (const stage of [1, 2] as const) {
      for (const micros of [1, 3]) {
        it(`stage ${stage}, ${world} ranks, ${micros} micro-batch(es), 2 steps: every bucket reduce-scattered during backward; SGD on the mean gradient`, async () => {
          const stepChains = [ALL, ALL];
          const results = await runLocalRanks(world, (g) => trainRank(g, { stage, micros, stepChains }));
          expectClose(results, expected(world, stepChains, micros));
          const rounds = 2 * (stage === 1 ? 1 : micros);
          for (const { stats } of results) {
            expect(stats.buckets).toBeGreaterThanOrEqual(4);
            expect(stats.rounds).toBe(rounds);
            expect(stats.duringBackward).toBe(stats.reduceScatters);
            expect(stats.reduceScatters).toBe(rounds * stats.buckets);
          }
        });
      }
    }
  }

  it('keeps the buckets it was built with (they decide which rank holds which elements): every step launches like the first, another order is refused', async () => {
    // The backward uses the parameters in reverse, so the gradients are ready in creation order, the
    // opposite of the buckets: the first bucket completes only at the last hook, which launches them
    // all, in every step (plain data parallelism would rebuild its buckets after the first).
    const reversed = [...ALL].reverse();
    const results = await runLocalRanks(2, async (g) => {
      const params = leafParams();
      let zero: ZeroOptimizer<{ lr: number }> | null = null, launchedAtEntry: number[] = [];
      // Registered before the optimizer's, so each runs just before the optimizer's hook of the same gradient.
      for (const p of params) nt.registerPostAccumulateGradHook(p, () => { launchedAtEntry.push(zero!.reduceStats.reduceScatters); });
      zero = new ZeroOptimizer(params, sgd, { group: g, stage: 2, bucketBytes: BUCKET_BYTES });
      const order = zero.bucketOrder()!;
      const perStep: number[][] = [];
      for (let step = 0; step < 3; step++) {
        const before = zero.reduceStats.reduceScatters;
        launchedAtEntry = [];
        chainLoss(params, g.rank, step, reversed).backward();
        perStep.push(launchedAtEntry.map((n) => n - before));
        await zero.step();
        zero.zeroGrad();
      }
      expect(zero.bucketOrder()).toEqual(order);
      zero.loadBucketOrder(order);
      expect(() => zero!.loadBucketOrder({ order: [...order.order].reverse(), rebuilt: true })).toThrow(/fixed at construction/);
      const values = params.map((p) => p.toArraySync() as Float32Array);
      const buckets = zero.reduceStats.buckets;
      zero.dispose();
      return { values, perStep, buckets };
    });
    expectClose(results, expected(2, [reversed, reversed, reversed], 1));
    for (const { perStep, buckets } of results) {
      expect(buckets).toBeGreaterThanOrEqual(4);
      // Nothing launched before the last gradient's hook, in every step.
      for (const launched of perStep) expect(launched).toEqual(launched.map(() => 0));
    }
  });

  it('gradients are written into their bucket: each .grad a view of it through noSync micro-batches (stage 1), the view let go once marked (stage 2), a hand-set gradient copied in', async () => {
    for (const stage of [1, 2] as const) {
      const results = await runLocalRanks(2, async (g) => {
        const params = leafParams();
        const zero = new ZeroOptimizer(params, sgd, { group: g, stage, bucketBytes: BUCKET_BYTES });
        const shards = (zero as unknown as { shards: { gradIsView(p: nt.Tensor): boolean } }).shards;
        for (let step = 0; step < 2; step++) {
          await zero.noSync(() => chainLoss(params, g.rank, 2 * step).backward());
          // Accumulating under noSync: every gradient is its bucket's view (nothing was copied).
          for (const p of params) expect(shards.gradIsView(p)).toBe(true);
          chainLoss(params, g.rank, 2 * step + 1).backward();
          for (const p of params) {
            if (stage === 1) expect(shards.gradIsView(p)).toBe(true);
            else expect(p.grad).toBeNull();
          }
          await zero.step();
          zero.zeroGrad();
        }
        // A gradient set by hand (not a view) is copied into the bucket once: stage 1 keeps the view, stage 2 nothing.
        const handSet = params.map((p) => nt.full(p.shape as number[], 0.25));
        params.forEach((p, i) => { p.grad = handSet[i]!; });
        await zero.step();
        for (const [i, p] of params.entries()) {
          expect(handSet[i]!.disposed).toBe(true);
          if (stage === 1) expect(shards.gradIsView(p)).toBe(true);
          else expect(p.grad).toBeNull();
        }
        zero.zeroGrad();
        const values = params.map((p) => p.toArraySync() as Float32Array);
        zero.dispose();
        return { values };
      });
      const want = expected(2, [ALL, ALL], 2).map((v) => v.map((x) => x - LR * 0.25));
      expectClose(results, want);
    }
  });

  it('each rank holds a contiguous range of every bucket laid out flat: the ranks\' holdings partition every parameter, padding held by nobody', async () => {
    for (const world of [2, 3, 4]) {
      const held = await runLocalRanks(world, async (g) => {
        const params = leafParams();
        const zero = new ZeroOptimizer(params, sgd, { group: g, stage: 1, bucketBytes: BUCKET_BYTES });
        const chunks = zero.localChunks().map((c) => ({ param: params.indexOf(c.param), start: c.start, count: c.count, master: c.master, masterOffset: c.masterOffset }));
        // The master holds this rank's elements, nothing more, equal to the parameters' values.
        const masterSize = zero.masters.reduce((s, m) => s + m.size, 0);
        expect(masterSize).toBe(chunks.reduce((s, c) => s + c.count, 0));
        for (const c of chunks) {
          const want = (params[c.param]!.toArraySync() as Float32Array).subarray(c.start, c.start + c.count);
          const got = (zero.masters[c.master]!.toArraySync() as Float32Array).subarray(c.masterOffset, c.masterOffset + c.count);
          expect(got).toEqual(want);
        }
        zero.dispose();
        return chunks;
      });
      // Buckets (reverse creation order, 64 bytes): [4], [3], [2, 1], [0]: each laid out flat, rank r holds [r·S, (r+1)·S).
      const sizes = CHAIN_SHAPES.map((s) => s.reduce((a, b) => a * b, 1));
      for (const bucket of [[4], [3], [2, 1], [0]]) {
        const total = bucket.reduce((s, i) => s + sizes[i]!, 0), shard = Math.ceil(total / world);
        let offset = 0;
        for (const i of bucket) {
          for (let r = 0; r < world; r++) {
            const lo = Math.max(offset, r * shard), hi = Math.min(offset + sizes[i]!, (r + 1) * shard);
            const mine = held[r]!.filter((c) => c.param === i);
            if (hi > lo) expect(mine.map(({ start, count }) => ({ start, count }))).toEqual([{ start: lo - offset, count: hi - lo }]);
            else expect(mine).toEqual([]);
          }
          offset += sizes[i]!;
        }
      }
      // Every element of every parameter is held by exactly one rank.
      sizes.forEach((n, i) => expect(held.flat().filter((c) => c.param === i).reduce((s, c) => s + c.count, 0)).toBe(n));
    }
  });

  it('overlap off: nothing is reduced during backward, one round per step in step(), the same result', async () => {
    for (const stage of [1, 2] as const) {
      const results = await runLocalRanks(2, (g) => trainRank(g, { stage, micros: 2, stepChains: [ALL, ALL], overlap: false }));
      expectClose(results, expected(2, [ALL, ALL], 2));
      for (const { stats } of results) {
        expect(stats.duringBackward).toBe(0);
        expect(stats.rounds).toBe(2);
      }
    }
  });

  it('deferred parameters keep their full gradient through backward and are reduce-scattered in step()', async () => {
    for (const stage of [1, 2] as const) {
      const results = await runLocalRanks(2, (g) => trainRank(g, { stage, micros: 2, stepChains: [ALL, ALL], defer: [0, 4] }));
      expectClose(results, expected(2, [ALL, ALL], 2));
      for (const { stats } of results) {
        expect(stats.deferredBuckets).toBeGreaterThanOrEqual(1);
        expect(stats.duringBackward).toBe(stats.reduceScatters - 2 * stats.deferredBuckets);
      }
    }
  });

  it('a parameter a backward never reaches contributes zeros; the others still match', async () => {
    const chain = [0, 1, 3, 4];
    const results = await runLocalRanks(2, (g) => trainRank(g, { stage: 2, micros: 2, stepChains: [chain, chain] }));
    expectClose(results, expected(2, [chain, chain], 2));
  });

  it('misuse: a second synchronized backward at stage 1, noSync after it, no noSync at stage 3, bad deferred or order lists', async () => {
    await runLocalRanks(2, async (g) => {
      const params = leafParams();
      const zero = new ZeroOptimizer(params, sgd, { group: g, stage: 1, bucketBytes: BUCKET_BYTES });
      chainLoss(params, g.rank, 0).backward();
      expect(() => chainLoss(params, g.rank, 1).backward()).toThrow(/second backward\(\).*noSync/);
      await expect(zero.noSync(() => undefined)).rejects.toThrow(nt.StateError);
      // Recovery: start the step over.
      zero.zeroGrad();
      chainLoss(params, g.rank, 0).backward();
      await zero.step();
      const want = expected(2, [ALL], 1);
      want.forEach((w, i) => expect(maxAbsDiff(params[i]!.toArraySync() as Float32Array, w)).toBeLessThan(2e-6));
      zero.dispose();

      // A backward that throws half-way (here: a hook after the optimizer's) leaves the pass open.
      const two = new ZeroOptimizer(params, sgd, { group: g, stage: 2, bucketBytes: BUCKET_BYTES });
      const late = nt.registerPostAccumulateGradHook(params[2]!, () => { throw new Error('boom'); });
      expect(() => chainLoss(params, g.rank, 0).backward()).toThrow('boom');
      late.remove();
      await expect(two.step()).rejects.toThrow(/never finished.*zeroGrad/);
      two.zeroGrad();
      two.dispose();

      const other = nt.zeros([3], { requiresGrad: true });
      expect(() => new ZeroOptimizer(params, sgd, { group: g, stage: 2, deferGrads: [other] })).toThrow(/deferred parameter .* is not one of the optimizer's parameters/);
      expect(() => new ZeroOptimizer(params, sgd, { group: g, stage: 2, bucketOrder: params.slice(1) })).toThrow(/every parameter of the optimizer exactly once/);
      expect(() => new ZeroOptimizer(params, sgd, { group: g, stage: 2, bucketBytes: 0 })).toThrow(/bucketBytes must be > 0/);
      // Stage 3 has no noSync at all: TypeScript refuses the call (test/parallel/zero-types.test.ts).
      const three = new ZeroOptimizer(leafParams(), sgd, { group: g, stage: 3 });
      expect(three).toBeInstanceOf(ZeroStage3Optimizer);
      expect('noSync' in three).toBe(false);
      three.dispose();
      expect(() => nt.queueBackwardCallback(() => undefined)).toThrow(nt.AutogradError);
      expect(nt.ones([2]).toArraySync()).toEqual(new Float32Array([1, 1]));
    });
  });
});
