// planShrink (lib/train/shrink.ts): which replicas go on after a loss without a spare, under which
// layout, and which ranks of the current world become which ranks of the next; pure arithmetic over
// the mesh and the layout rule book, checked here against layouts worked out by hand.
import { describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { resolveTrainingLayout, type LayoutFlags } from '../../lib/parallel/layout.js';
import { planShrink } from '../../lib/train/shrink.js';

const shape = { nLayer: 4, nHead: 4, nEmbd: 32, vocabSize: 64, blockSize: 16 };
const BATCH = 8;

function plan(flags: LayoutFlags, lost: number[], members?: number[], batch = BATCH) {
  const worldSize = (flags.tp ?? 1) * (flags.pp ?? 1) * (flags.dp ?? 1) * (flags.cp ?? 1);
  const layout = resolveTrainingLayout(flags, shape, worldSize, batch);
  return planShrink({ layout, flags, members: members ?? Array.from({ length: worldSize }, (_, r) => r), lost, shape, globalBatch: batch });
}

describe('planShrink', () => {
  it('DP2×TP2 ZeRO-3 losing rank 3: replica 0 (ranks 0, 1) goes on as TP2, ZeRO 0, twice the micro-batches', () => {
    const p = plan({ tp: 2, dp: 2, zero: 3 }, [3]);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([0, 1]);
    expect(p.layout).toMatchObject({ tp: 2, dp: 1, zero: 0, microBatches: 2 });
  });

  it('PP2×DP2 1F1B losing rank 0: replica 1 (ranks 2, 3) keeps its stages, 4 micro-batches', () => {
    const p = plan({ pp: 2, dp: 2, microBatches: 2, schedule: '1f1b' }, [0]);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([2, 3]);
    expect(p.layout).toMatchObject({ pp: 2, dp: 1, microBatches: 4, schedule: '1f1b' });
  });

  it('DP4 losing rank 1: 4 micro-batches do not split over the 3 intact replicas, so 2 go on', () => {
    const p = plan({ dp: 4, zero: 1 }, [1]);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([0, 2]);
    expect(p.layout).toMatchObject({ dp: 2, zero: 1, microBatches: 2 });
  });

  it('DP4 with 3 micro-batches of a batch of 24 losing rank 1: all 3 intact replicas go on with 4 each', () => {
    const p = plan({ dp: 4, microBatches: 3 }, [1], undefined, 24);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([0, 2, 3]);
    expect(p.layout).toMatchObject({ dp: 3, microBatches: 4 });
  });

  it('TP2×CP2×DP2 losing rank 5: the world ranks of replica 0 in mesh order', () => {
    const p = plan({ tp: 2, cp: 2, dp: 2 }, [5]);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([0, 1, 2, 3]);
    expect(p.layout).toMatchObject({ tp: 2, cp: 2, dp: 1 });
  });

  it('maps through the current world\'s job ranks (a world that is itself a reshape)', () => {
    const p = plan({ dp: 2 }, [0], [7, 4]);
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([4]);
  });

  it('refuses dp 1, and a loss in every replica', () => {
    expect(plan({ tp: 2, pp: 2 }, [1])).toEqual({ refused: expect.stringMatching(/dp 1/) });
    expect(plan({ dp: 2, tp: 2 }, [1, 2])).toEqual({ refused: 'every data-parallel replica lost a rank' });
  });

  it('rejects a lost rank outside the world', () => {
    expect(() => plan({ dp: 2 }, [2])).toThrow(ArgumentError);
  });
});
