// The shrink's memory check (lib/train/shrink-memory.ts, shrink.ts's planShrink `memory`): a rank's
// predicted peak under fewer replicas, against sizes worked out by hand, and a plan that passes over a
// smaller world whose member would not fit.
import { describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { resolveTrainingLayout } from '../../lib/parallel/layout.js';
import { planShrink, type ShrinkMemory } from '../../lib/train/shrink.js';
import { predictShrunkPeak, shrinkMemoryLimit, shrinkMemoryOf, type ShardedState } from '../../lib/train/shrink-memory.js';

const one = () => 1;

describe('predictShrunkPeak', () => {
  // Parameters of 1000 and 24 elements, Adam (8 state bytes per element).
  const zero3: ShardedState = { sizes: [1000, 24], stage: 3, ranks: 2, stateBytesPerParam: 8, offload: false };

  it('ZeRO-3 over 2 ranks down to one replica: the whole f32 state comes to the rank (stage 0)', () => {
    // Before: shards of 500 + 12 = 512 elements: params 2048 + grads 2048 + state 4096 = 8192 bytes.
    // After (stage 0, 1024 elements): params 4096 + grads 4096 + state 8192 = 16384 bytes: +8192.
    expect(predictShrunkPeak({ peak: 50_000, held: 20_000, dp: 2, d: 1, microBatches: 1, sharded: [zero3], inFlight: one })).toBe(20_000 + 8192 + 30_000);
  });

  it('ZeRO-1 over 4 ranks down to 2: the state and its master shard double, the full parameters and gradients stay', () => {
    const z: ShardedState = { sizes: [1000, 24], stage: 1, ranks: 4, stateBytesPerParam: 8, offload: false };
    // Shard 256 -> 512 elements: state 8·256 more, master 4·256 more, the shard's reduced gradient 4·256 more.
    expect(predictShrunkPeak({ peak: 1000, held: 1000, dp: 4, d: 2, microBatches: 1, sharded: [z], inFlight: one })).toBe(1000 + 16 * 256);
  });

  it('with --offload only parameters and gradients are on the device, until one replica drops the offload', () => {
    const z = { ...zero3, offload: true };
    // dp 4 -> 2 at stage 3 (ranks 4 -> 2): params and grads shards 256 -> 512 elements: +2048 bytes.
    expect(predictShrunkPeak({ peak: 0, held: 0, dp: 4, d: 2, microBatches: 1, sharded: [{ ...z, ranks: 4 }], inFlight: one })).toBe(2048);
    // dp 2 -> 1: from params + grads of 512 (4096 bytes) to the whole stage-0 state (16384).
    expect(predictShrunkPeak({ peak: 0, held: 0, dp: 2, d: 1, microBatches: 1, sharded: [z], inFlight: one })).toBe(16384 - 4096);
  });

  it('the activations above what is held grow with the micro-batches in flight (GPipe: all of them)', () => {
    const gpipe = (m: number) => m;
    expect(predictShrunkPeak({ peak: 300, held: 100, dp: 2, d: 1, microBatches: 2, sharded: [], inFlight: gpipe })).toBe(100 + 200 * 2);
    // 1F1B on the first of 2 stages holds min(2, m): 2 already, so no more.
    expect(predictShrunkPeak({ peak: 300, held: 100, dp: 2, d: 1, microBatches: 2, sharded: [], inFlight: (m) => Math.min(2, m) })).toBe(300);
    expect(() => predictShrunkPeak({ peak: 0, held: 0, dp: 2, d: 2, microBatches: 1, sharded: [], inFlight: one })).toThrow(ArgumentError);
  });
});

describe('planShrink with the survivors\' memory', () => {
  const shape = { nLayer: 4, nHead: 4, nEmbd: 32, vocabSize: 64, blockSize: 16 };
  const flags = { dp: 4, zero: 1 as const, microBatches: 1 };
  const layout = resolveTrainingLayout(flags, shape, 4, 8);
  const facts = (limit: number, p2: number, p1: number): ShrinkMemory => ({ limit, peaks: { 1: p1, 2: p2, 3: p2 } });

  it('passes over a world one of whose members would not fit, and says which when none fits', () => {
    // Losing rank 1: 2 replicas (ranks 0, 2) would go on, but rank 2 would pass its limit; one replica fits (rank 0 alone).
    const memory = new Map([[0, facts(1000, 900, 950)], [2, facts(1000, 1200, 1300)], [3, facts(1000, 900, 950)]]);
    const p = planShrink({ layout, flags, members: [0, 1, 2, 3], lost: [1], shape, globalBatch: 8, memory });
    if ('refused' in p) throw new Error(p.refused);
    expect(p.members).toEqual([0]);
    expect(p.layout).toMatchObject({ dp: 1, zero: 0, microBatches: 4 });
    // Rank 0 would not fit alone either: refused, naming the rank and the sizes.
    const tight = new Map([...memory, [0, facts(1000, 900, 1100)]]);
    const r = planShrink({ layout, flags, members: [0, 1, 2, 3], lost: [1], shape, globalBatch: 8, memory: tight });
    expect('refused' in r && r.refused).toMatch(/dp 2: job rank 2 would need about 0\.0 MiB, above its device's 0\.0 MiB; dp 1: job rank 0 would need/);
    // A limit of 0 (none known) is not checked; nor is memory without the map.
    const unknown = new Map([...tight].map(([j, m]) => [j, { ...m, limit: 0 }]));
    const u = planShrink({ layout, flags, members: [0, 1, 2, 3], lost: [1], shape, globalBatch: 8, memory: unknown });
    expect('refused' in u ? u.refused : u.members).toEqual([0, 2]);
  });
});

describe('shrinkMemoryOf', () => {
  const shape = { nLayer: 4, nHead: 4, nEmbd: 32, vocabSize: 64, blockSize: 16 };
  const trainer = { checkpointHoldings: () => ({ zero: null }) } as unknown as Parameters<typeof shrinkMemoryOf>[0]['trainer'];

  it('predicts only the worlds whose micro-batches split evenly (a ZB-H1 pipeline over 3 replicas has none), and none before a step', () => {
    const layout = resolveTrainingLayout({ pp: 2, dp: 4, microBatches: 2, schedule: 'zb-h1' }, shape, 8, 16);
    const m = shrinkMemoryOf({ device: 'cpu', trainer, layout, stage: 0, measured: { peak: 3000, held: 1000 } });
    expect(Object.keys(m.peaks).sort()).toEqual(['1', '2']);
    expect(m.peaks['2']).toBeGreaterThanOrEqual(3000);
    expect(shrinkMemoryOf({ device: 'cpu', trainer, layout, stage: 0, measured: null }).peaks).toEqual({});
  });

  it('takes NODETRON_SHRINK_MEMORY_LIMIT as the limit, and names it when it is not a size', () => {
    const layout = resolveTrainingLayout({ dp: 2 }, shape, 2, 8);
    const saved = process.env.NODETRON_SHRINK_MEMORY_LIMIT;
    try {
      process.env.NODETRON_SHRINK_MEMORY_LIMIT = '3M';
      expect(shrinkMemoryOf({ device: 'cpu', trainer, layout, stage: 0, measured: { peak: 1, held: 1 } }).limit).toBe(3 * 2 ** 20);
      expect(shrinkMemoryOf({ device: 'cuda:0', trainer, layout, stage: 0, measured: null }).limit).toBe(3 * 2 ** 20);
      process.env.NODETRON_SHRINK_MEMORY_LIMIT = 'lots';
      expect(() => shrinkMemoryLimit()).toThrow(/NODETRON_SHRINK_MEMORY_LIMIT=lots/);
      delete process.env.NODETRON_SHRINK_MEMORY_LIMIT;
      expect(shrinkMemoryLimit()).toBeUndefined();
      expect(shrinkMemoryOf({ device: 'cuda:0', trainer, layout, stage: 0, measured: null }).limit).toBe(0);
    } finally {
      if (saved === undefined) delete process.env.NODETRON_SHRINK_MEMORY_LIMIT;
      else process.env.NODETRON_SHRINK_MEMORY_LIMIT = saved;
    }
  });
});
