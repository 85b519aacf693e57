// Mesh rank math against an independent enumeration, group creation over simulated ranks, and the loud failures.
import { afterEach, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { rangeAcrossRanks } from '../../lib/distributed/agree.js';
import { MeshLayout, initializeParallel, destroyParallel, parallelState, tpRank, dpGroup, type ParallelDim } from '../../lib/parallel/mesh.js';
import { localWorld, runLocalRanks } from '../../lib/testing/index.js';

afterEach(() => destroyParallel());

describe('MeshLayout', () => {
  it('tp-pp-dp: TP groups are contiguous ranks, PP strides by tp, DP by tp·pp', () => {
    const m = new MeshLayout({ tp: 2, pp: 2, dp: 2 }, 8);
    expect(m.allGroups('tp')).toEqual([[0, 1], [2, 3], [4, 5], [6, 7]]);
    expect(m.allGroups('pp')).toEqual([[0, 2], [1, 3], [4, 6], [5, 7]]);
    expect(m.allGroups('dp')).toEqual([[0, 4], [1, 5], [2, 6], [3, 7]]);
    expect(m.coords(6)).toEqual({ tp: 0, cp: 0, pp: 1, dp: 1 });
  });

  it('any order and odd sizes: groups partition the world and coordinates round-trip', () => {
    const orders = ['tp-pp-dp', 'tp-dp-pp', 'dp-tp-pp', 'pp-dp-tp'];
    for (const order of orders) for (const [tp, pp, dp] of [[3, 1, 2], [1, 5, 1], [2, 3, 2]] as const) {
      const m = new MeshLayout({ tp, pp, dp, order }, tp * pp * dp);
      const sizes = { tp, pp, dp };
      // Independent enumeration: nested loops, first-named dimension innermost.
      const dims = order.split('-') as ParallelDim[];
      const expected: Record<string, number> = {};
      let r = 0;
      for (let c = 0; c < sizes[dims[2]!]; c++) for (let b = 0; b < sizes[dims[1]!]; b++) for (let a = 0; a < sizes[dims[0]!]; a++) {
        expected[r++] = 0;
        const co = m.coords(r - 1);
        expect([co[dims[0]!], co[dims[1]!], co[dims[2]!]]).toEqual([a, b, c]);
        expect(m.rankOf(co)).toBe(r - 1);
      }
      for (const d of ['tp', 'pp', 'dp'] as ParallelDim[]) {
        const seen = m.allGroups(d).flat().sort((x, y) => x - y);
        expect(seen).toEqual(Array.from({ length: tp * pp * dp }, (_, i) => i));
        for (const g of m.allGroups(d)) { expect(g.length).toBe(sizes[d]); for (const x of g) expect(m.groupRanks(d, x)).toEqual(g); }
      }
    }
  });

  it('embedding groups pair the first and last pipeline stage of every (tp, dp) coordinate', () => {
    const m = new MeshLayout({ tp: 2, pp: 3, dp: 2 }, 12);
    expect(m.embeddingGroups()).toEqual([[0, 4], [1, 5], [6, 10], [7, 11]]);
    for (const [first, last] of m.embeddingGroups()) {
      const [a, b] = [m.coords(first!), m.coords(last!)];
      expect([a.pp, b.pp]).toEqual([0, 2]);
      expect([a.tp, a.dp]).toEqual([b.tp, b.dp]);
    }
    expect(new MeshLayout({ tp: 2, pp: 1, dp: 2 }).embeddingGroups()).toEqual([]);
  });

  it('bad layouts are ArgumentErrors naming the problem', () => {
    expect(() => new MeshLayout({ tp: 2, pp: 2, dp: 1 }, 8)).toThrow(nt.ArgumentError);
    expect(() => new MeshLayout({ tp: 2, pp: 2, dp: 1 }, 8)).toThrow(/world has 8 ranks/);
    expect(() => new MeshLayout({ tp: 0, pp: 1, dp: 1 })).toThrow(nt.ArgumentError);
    expect(() => new MeshLayout({ tp: 1, pp: 1, dp: 1, order: 'tp-tp-dp' })).toThrow(/order/);
    expect(() => new MeshLayout({ tp: 1, pp: 1, dp: 2 }).coords(2)).toThrow(nt.ArgumentError);
  });
});

describe('initializeParallel', () => {
  it('accessors throw StateError before initialization', () => {
    expect(() => tpRank()).toThrow(nt.StateError);
    expect(() => dpGroup()).toThrow(/not initialized/);
  });

  it('builds groups on 4 simulated ranks whose collectives reach exactly their members', async () => {
    const results = await runLocalRanks(4, async (world) => {
      const st = await initializeParallel({ tp: 2, pp: 1, dp: 2 }, { world, install: false });
      const t = nt.tensor(new Float32Array([world.rank + 1]), [1]);
      await st.tpGroup.allReduce(t);
      const tpSum = t.item();
      await st.dpGroup.allReduce(t);
      return { tp: st.tpRank, dp: st.dpRank, tpSum, both: t.item(), tpRanks: st.tpGroup.ranks };
    });
    expect(results.map((r) => r.tpSum)).toEqual([3, 3, 7, 7]);
    expect(results.map((r) => r.both)).toEqual([10, 10, 10, 10]);
    expect(results.map((r) => [r.tp, r.dp])).toEqual([[0, 0], [1, 0], [0, 1], [1, 1]]);
    expect(results[3]!.tpRanks).toEqual([2, 3]);
  });

  it('gives the first and last stage an embedding group and middle stages none', async () => {
    const results = await runLocalRanks(6, async (world) => {
      const st = await initializeParallel({ tp: 1, pp: 3, dp: 2 }, { world, install: false });
      const g = st.embeddingGroup;
      if (!g) return { pp: st.ppRank, sum: null };
      const t = nt.tensor(new Float32Array([world.rank + 1]), [1]);
      await g.allReduce(t);
      return { pp: st.ppRank, sum: t.item() };
    });
    // Ranks 0 and 2 (dp 0), 3 and 5 (dp 1) are the first and last stages; 1 and 4 the middle ones.
    expect(results).toEqual([{ pp: 0, sum: 4 }, { pp: 1, sum: null }, { pp: 2, sum: 4 }, { pp: 0, sum: 10 }, { pp: 1, sum: null }, { pp: 2, sum: 10 }]);
  });

  it('rangeAcrossRanks tells every rank whether all passed the same values', async () => {
    const same = await runLocalRanks(3, (w) => rangeAcrossRanks(w, [7, -2]));
    expect(same).toEqual([null, null, null]);
    const differ = await runLocalRanks(3, (w) => rangeAcrossRanks(w, [7, w.rank]));
    for (const d of differ) expect(d).toEqual({ min: [7, 0], max: [7, 2] });
    await expect(runLocalRanks(1, (w) => rangeAcrossRanks(w, [0.5]))).rejects.toThrow(nt.ArgumentError);
  });

  it('installs a process mesh once', async () => {
    const [w] = await localWorld(1);
    const st = await initializeParallel({ tp: 1, pp: 1, dp: 1 }, { world: w! });
    expect(parallelState()).toBe(st);
    expect(tpRank()).toBe(0);
    await expect(initializeParallel({ tp: 1, pp: 1, dp: 1 }, { world: w! })).rejects.toThrow(nt.StateError);
  });

  it('mismatched layouts between ranks fail on every rank before any group is built', async () => {
    const worlds = await localWorld(2);
    const res = await Promise.allSettled(worlds.map((w) => initializeParallel(w.rank === 0 ? { tp: 2, pp: 1, dp: 1 } : { tp: 1, pp: 1, dp: 2 }, { world: w, install: false })));
    for (const r of res) {
      expect(r.status).toBe('rejected');
      expect((r as PromiseRejectedResult).reason).toBeInstanceOf(nt.ArgumentError);
      expect(String((r as PromiseRejectedResult).reason)).toMatch(/different layouts/);
    }
    expect(nt.ones([2]).toArraySync()).toEqual(new Float32Array([1, 1]));
  });
});
