// Data-parallel gradient buckets on simulated ranks: averaged gradients vs a float64 mean, buckets
// launching exactly when their last gradient is ready, noSync, unused and foreign parameters.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { GradBuffer } from '../../lib/parallel/data-parallel/buffer.js';
import { runLocalRanks } from '../../lib/parallel/local-group.js';
import { countingGroup, maxAbsDiff, randomArray, randomTensor } from './helpers.js';

const SHAPES = [[7, 3], [5], [1, 11], [13], [2, 2]];

function makeParams(): nt.Tensor[] {
  return SHAPES.map((s, i) => randomTensor(s, 100 + i));
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
      SHAPES.forEach((s, i) => {
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
});
