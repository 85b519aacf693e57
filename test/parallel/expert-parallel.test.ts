// Expert parallelism's rank arithmetic and layout checks (no processes): the expert-parallel groups
// are blocks of ep consecutive data-parallel ranks, the expert-data-parallel groups the ranks at the
// same place of each block; --ep must divide dp and the experts, and needs MoE layers.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

describe('the mesh with ep', () => {
  it('carves expert-parallel groups out of each data-parallel group', () => {
    const m = new nt.parallel.MeshLayout({ tp: 2, pp: 1, dp: 4, ep: 2 });
    // tp-pp-dp order: dp groups are [0,2,4,6] and [1,3,5,7].
    expect(m.allGroups('dp')).toEqual([[0, 2, 4, 6], [1, 3, 5, 7]]);
    expect(m.expertGroups()).toEqual([[0, 2], [4, 6], [1, 3], [5, 7]]);
    expect(m.expertDataGroups()).toEqual([[0, 4], [2, 6], [1, 5], [3, 7]]);
    expect(m.describe()).toBe('tp=2 pp=1 dp=4 ep=2 order=tp-cp-pp-dp');
    const whole = new nt.parallel.MeshLayout({ tp: 1, pp: 1, dp: 4, ep: 4 });
    expect(whole.expertGroups()).toEqual([[0, 1, 2, 3]]);
    expect(whole.expertDataGroups()).toEqual([]);
    expect(new nt.parallel.MeshLayout({ tp: 1, pp: 1, dp: 4 }).expertGroups()).toEqual([]);
  });

  it('rejects an ep that does not divide dp', () => {
    expect(() => new nt.parallel.MeshLayout({ tp: 1, pp: 1, dp: 4, ep: 3 })).toThrow(/ep \(3\) must divide dp \(4\)/);
    expect(() => new nt.parallel.MeshLayout({ tp: 1, pp: 1, dp: 4, ep: 0 })).toThrow(nt.ArgumentError);
  });
});

describe('resolveTrainingLayout with --ep', () => {
  const model = { nLayer: 2, nHead: 2, nEmbd: 16, vocabSize: 64, blockSize: 16, moeExperts: 8 };
  it('accepts ep dividing dp and the experts', () => {
    expect(nt.parallel.resolveTrainingLayout({ ep: 2 }, model, 4, 8)).toMatchObject({ dp: 4, ep: 2 });
    expect(nt.parallel.describeLayout(nt.parallel.resolveTrainingLayout({ ep: 2 }, model, 4, 8))).toMatch(/dp=4 ep=2 zero=0/);
    expect(nt.parallel.resolveTrainingLayout({}, model, 2, 8).ep).toBeUndefined();
    // ZeRO shards the experts over their expert-data-parallel copies (test/parallel/moe-equivalence.test.ts).
    for (const zero of [1, 2, 3] as const) {
      expect(nt.parallel.resolveTrainingLayout({ ep: 2, zero }, model, 4, 8)).toMatchObject({ dp: 4, ep: 2, zero });
      expect(nt.parallel.resolveTrainingLayout({ ep: 2, zero }, model, 2, 8)).toMatchObject({ dp: 2, ep: 2, zero });
    }
  });
  it.each([
    [{ ep: 3 }, 6, /--ep 3 must divide the model's 8 experts/],
    [{ ep: 4, tp: 2 }, 4, /--ep 4 must divide the data-parallel size dp = 2/],
    [{ ep: 0 }, 2, /--ep must be an integer >= 1/],
  ])('%j on %i ranks: %s', (flags, world, message) => {
    expect(() => nt.parallel.resolveTrainingLayout(flags, model, world, 12)).toThrow(message);
  });
  it('needs MoE layers; no --sp with them', () => {
    const dense = { nLayer: 2, nHead: 2, nEmbd: 16, vocabSize: 64, blockSize: 16 };
    expect(() => nt.parallel.resolveTrainingLayout({ ep: 2 }, dense, 2, 8)).toThrow(/the model has no MoE layers/);
    expect(() => nt.parallel.resolveTrainingLayout({ tp: 2, sequenceParallel: true }, model, 2, 8)).toThrow(/--sp with MoE layers is not supported yet/);
  });
  it('nt.train flags read --ep and NODETRON_EP', () => {
    expect(nt.train.layoutFromArgs(['--ep', '2'], {}).ep).toBe(2);
    expect(nt.train.layoutFromArgs([], { NODETRON_EP: '4' }).ep).toBe(4);
    expect(() => nt.train.layoutFromArgs(['--ep', '0'], {})).toThrow(/--ep must be an integer >= 1/);
  });
});

describe('expertParallel without a group', () => {
  it('holds every expert and scales nothing', () => {
    const p = nt.parallel.ep.expertParallel({ experts: 4, epGroup: null, countGroup: null });
    expect([p.expertStart, p.expertEnd, p.expertGradScale]).toEqual([0, 4, 1]);
    expect(p.dispatch).toBeUndefined();
    expect(p.sumCounts).toBeUndefined();
  });
});
