// ZeRO stages 1 and 2 on simulated data-parallel ranks: three AdamW steps must match an unsharded
// AdamW on the averaged gradients (odd sizes, uneven shards, two parameter groups, ± offload), and
// the bytes each rank holds must match the memory formula (rank 0, the fullest) and the flat split.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { AdamW } from '../../lib/optim/adamw.js';
import { Lamb } from '../../lib/optim/lamb.js';
import type { Optimizer } from '../../lib/optim/optimizer.js';
import { SGD } from '../../lib/optim/sgd.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { ZeroOptimizer, zeroMemoryFormula } from '../../lib/parallel/zero/optimizer.js';
import { maxAbsDiff, randomArray, randomTensor } from './helpers.js';

const GROUP_A = [[7, 3], [5]];
const GROUP_B = [[1, 11], [13], [2, 2]];
const SHAPES = [...GROUP_A, ...GROUP_B];
const STEPS = 3;
const numel = (s: number[]) => s.reduce((a, b) => a * b, 1);
const gradSeed = (step: number, rank: number, i: number) => 7919 * step + 104729 * (rank + 1) + i;
const makeParams = () => SHAPES.map((s, i) => randomTensor(s, 11 + i));
const groupsOf = (ps: nt.Tensor[]) => [{ params: ps.slice(0, 2), weightDecay: 0.1 }, { params: ps.slice(2), weightDecay: 0 }];

// AdamW barely reacts to a wrong gradient scale (m/√v), so SGD with momentum is checked as well.
type Kind = 'adamw' | 'sgd';
const STATE_BYTES: Record<Kind, number> = { adamw: 8, sgd: 4 };
const build = (kind: Kind, groups: Array<{ params: Iterable<nt.Tensor>; weightDecay?: number }>): Optimizer<{ lr: number }> =>
  (kind === 'adamw' ? new AdamW(groups, { lr: 0.05 }) : new SGD(groups, { lr: 0.05, momentum: 0.9 })) as unknown as Optimizer<{ lr: number }>;

/** The unsharded optimizer on the float64 mean of every rank's gradients. */
function reference(world: number, kind: Kind): Float32Array[] {
  const params = makeParams();
  const opt = build(kind, groupsOf(params));
  for (let step = 0; step < STEPS; step++) {
    params.forEach((p, i) => {
      const n = p.size, mean = new Float32Array(n);
      const acc = new Float64Array(n);
      for (let r = 0; r < world; r++) randomArray(n, gradSeed(step, r, i)).forEach((v, j) => { acc[j] += v; });
      acc.forEach((v, j) => { mean[j] = v / world; });
      p.grad?.dispose();
      p.grad = nt.tensor(mean, p.shape as number[]);
    });
    opt.step();
  }
  return params.map((p) => p.toArraySync() as Float32Array);
}

describe('ZeroOptimizer', () => {
  const cases: [number, 1 | 2, boolean, Kind][] = [];
  for (const world of [2, 3, 4]) for (const stage of [1, 2] as const) for (const offload of [false, true]) cases.push([world, stage, offload, 'adamw']);
  for (const world of [2, 4]) for (const stage of [1, 2] as const) cases.push([world, stage, false, 'sgd']);
  for (const [world, stage, offload, kind] of cases) {
    it(`stage ${stage}, ${world} ranks${offload ? ', offload' : ''}, ${kind}: matches the unsharded optimizer after ${STEPS} steps`, async () => {
      const expected = reference(world, kind);
      const results = await runLocalRanks(world, async (g) => {
        const params = makeParams();
        const zero = new ZeroOptimizer(groupsOf(params), (groups) => build(kind, groups as never), { group: g, stage, offload });
        for (let step = 0; step < STEPS; step++) {
          params.forEach((p, i) => { p.grad?.dispose(); p.grad = randomTensor(p.shape as number[], gradSeed(step, g.rank, i)); });
          await zero.step();
          if (stage === 2) expect(params.every((p) => p.grad === null)).toBe(true);
        }
        const measured = zero.memoryBytes();
        // One bucket laid out flat: rank r holds [r·S, (r+1)·S) of Ψ elements (S = ceil(Ψ/N)), rank 0 the most.
        const psi = SHAPES.map(numel).reduce((a, b) => a + b, 0), s = Math.ceil(psi / world);
        const held = Math.max(0, Math.min(s, psi - g.rank * s)), k = STATE_BYTES[kind];
        const grads = stage === 1 ? 4 * psi + 4 * held : 4 * held;
        expect(measured).toEqual({ params: 4 * psi, grads, optimizerState: k * held, masterShard: 4 * held, total: 4 * psi + grads + k * held + 4 * held });
        if (g.rank === 0) expect(measured).toEqual(zeroMemoryFormula(SHAPES.map(numel), world, stage, STATE_BYTES[kind]));
        const out = params.map((p) => p.toArraySync());
        zero.dispose();
        return out;
      });
      for (const res of results) expected.forEach((e, i) => expect(maxAbsDiff(res[i]!, e)).toBeLessThan(2e-6));
      // The update moved the parameters (a step that did nothing would fail here).
      const init = makeParams().map((p) => p.toArraySync());
      expect(maxAbsDiff(results[0]![0]!, init[0]!)).toBeGreaterThan(1e-2);
    });
  }

  it('the optimizer state is sharded: the ranks hold disjoint ranges of the flat bucket, Ψ elements in all, ceil(Ψ/N) on each but the last', async () => {
    const sizes = await runLocalRanks(4, async (g) => {
      const params = makeParams();
      const zero = new ZeroOptimizer(params, (groups) => new AdamW(groups), { group: g, stage: 1 });
      params.forEach((p) => { p.grad = nt.ones(p.shape); });
      await zero.step();
      const bytes = zero.memoryBytes().optimizerState;
      zero.dispose();
      return bytes;
    });
    const psi = SHAPES.reduce((s, x) => s + numel(x), 0), shard = Math.ceil(psi / 4);
    expect(sizes).toEqual([0, 1, 2, 3].map((r) => 2 * 4 * Math.min(shard, psi - r * shard)));
    expect(sizes.reduce((a, b) => a + b, 0)).toBe(2 * 4 * psi);
  });

  it('rejects LAMB, stage 4, non-f32 parameters, and a factory that ignores the shards', async () => {
    await runLocalRanks(2, async (g) => {
      const params = makeParams();
      expect(() => new ZeroOptimizer(params, (gr) => new Lamb(gr), { group: g, stage: 1 })).toThrow(/LAMB/);
      expect(() => new ZeroOptimizer(params, (gr) => new AdamW(gr), { group: g, stage: 4 as never })).toThrow(nt.ArgumentError);
      expect(() => new ZeroOptimizer([nt.zeros([4], { dtype: 'bf16' })], (gr) => new AdamW(gr), { group: g, stage: 1 })).toThrow(nt.ArgumentError);
      expect(() => new ZeroOptimizer(params, () => new AdamW(params), { group: g, stage: 1 })).toThrow(/exactly the shard groups/);
      expect(nt.ones([2]).toArraySync()).toEqual(new Float32Array([1, 1]));
    });
  });
});
