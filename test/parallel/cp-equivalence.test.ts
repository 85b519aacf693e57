// Context-parallel GPT training through the real launcher and Gloo: the tiny GPT of gpt-train.ts trained
// 3 steps with its sequences split over cp ranks (ring attention and Ulysses), alone and with DP, ZeRO
// 1/2/3, TP (with SP) and PP, matches the plain single-process run step by step (losses, gradient norms)
// and in its final parameters; with uneven ignored targets the loss is still the token mean. Bad cp
// layouts fail on every rank before training.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError, parallel } from '../../lib/index.js';
import { MeshLayout } from '../../lib/parallel/mesh.js';
import { type RankResult as BaseRankResult, type Trained as BaseTrained, equivalenceRunner, gptTensorParallelSlice, maxAbs, maxDiff, relDiff, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const script = join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-cp-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface RankResult extends BaseRankResult { coords: { tp: number; cp: number; pp: number; dp: number } }
type Trained = BaseTrained<RankResult>;

const launchRun = equivalenceRunner<RankResult>({ script, work });


const single = launchRun('single', 1, ['--reference']);
const singleIgnored = launchRun('single-ignored', 1, ['--reference', '--ignore-targets']);
const layouts: Record<string, [Promise<Trained>, Promise<Trained>]> = {
  'CP2 ring': [single, launchRun('cp2', 2, ['--cp', '2'])],
  'CP2 Ulysses': [single, launchRun('cp2-ulysses', 2, ['--cp', '2', '--cp-mode', 'ulysses'])],
  'CP4 ring': [single, launchRun('cp4', 4, ['--cp', '4'])],
  'CP2×DP2 ring ZeRO-1': [single, launchRun('cp2-dp2', 4, ['--cp', '2', '--dp', '2', '--zero', '1'])],
  'CP2×DP2 Ulysses, 2 micro-batches': [single, launchRun('cp2-dp2-ulysses', 4, ['--cp', '2', '--dp', '2', '--cp-mode', 'ulysses', '--micro-batches', '2'])],
  'CP2 ring ZeRO-2 (sharded over dp×cp)': [single, launchRun('cp2-zero2', 2, ['--cp', '2', '--zero', '2'])],
  'CP2 Ulysses ZeRO-3, recompute': [single, launchRun('cp2-zero3', 2, ['--cp', '2', '--zero', '3', '--cp-mode', 'ulysses', '--recompute'])],
  'CP2×TP2 ring SP': [single, launchRun('cp2-tp2', 4, ['--cp', '2', '--tp', '2', '--sp'])],
  'CP2×PP2 ring 1F1B, 2 micro-batches': [single, launchRun('cp2-pp2', 4, ['--cp', '2', '--pp', '2', '--micro-batches', '2'])],
  'CP2 ring, uneven ignored targets (token-weighted loss)': [singleIgnored, launchRun('cp2-ignored', 2, ['--cp', '2', '--ignore-targets'])],
  'CP2 Ulysses, uneven ignored targets': [singleIgnored, launchRun('cp2-ulysses-ignored', 2, ['--cp', '2', '--cp-mode', 'ulysses', '--ignore-targets'])],
};
const TOLERANCE = 1e-5;
// As gpt-equivalence.test.ts: Adam's update of near-zero gradients magnifies f32 rounding noise.
const PARAM_TOLERANCE = 5e-5;

describe('context-parallel GPT equivalence (launcher + Gloo)', () => {
  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const [refRun, run] = await Promise.all(layouts[name]!);
    expect(refRun.code, refRun.output).toBe(0);
    expect(run.code, run.output).toBe(0);
    const expected = refRun.ranks[0]!;
    const scale = Math.max(...[...expected.params.values()].map(maxAbs));
    const tp = Math.max(...run.ranks.map((r) => r.coords.tp)) + 1;
    const held = new Set<string>();
    for (const r of run.ranks) {
      expect(relDiff(r.losses, expected.losses), `losses on rank ${r.rank}`).toBeLessThan(TOLERANCE);
      expect(relDiff(r.gradNorms, expected.gradNorms), `grad norms on rank ${r.rank}`).toBeLessThan(TOLERANCE);
      for (const [n, values] of r.params) {
        const slice = gptTensorParallelSlice(n, expected.params.get(n)!, expected.shapes.get(n)!, tp, r.coords.tp);
        held.add(slice.length < expected.params.get(n)!.length ? `${n} [tp ${r.coords.tp}]` : n);
        expect(maxDiff(values, slice) / scale, `${n} on rank ${r.rank}`).toBeLessThan(PARAM_TOLERANCE);
        // Context-parallel ranks hold identical copies, bit for bit.
        for (const other of run.ranks) {
          const copy = other.params.get(n);
          if (copy && other.coords.tp === r.coords.tp) expect(maxDiff(values, copy), `${n}: rank ${r.rank} vs rank ${other.rank}`).toBe(0);
        }
      }
    }
    expect(held.size).toBeGreaterThanOrEqual(expected.params.size);
    expect(expected.paramChange).toBeGreaterThan(100 * PARAM_TOLERANCE);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('ignored targets change the loss (the token-weighted case is not the plain one)', async () => {
    const [a, b] = await Promise.all([single, singleIgnored]);
    expect(a.code).toBe(0); expect(b.code).toBe(0);
    expect(Math.abs(a.ranks[0]!.losses[0]! - b.ranks[0]!.losses[0]!)).toBeGreaterThan(1e-3);
  }, QUEUED_TEST_TIMEOUT_MS);

  const misuse = {
    'a sequence not divisible by 2·cp (ring)': { nproc: 2, flags: ['--cp', '2', '--ctx', '14'], everyRank: /--cp 2: ring attention splits the sequence into 2·cp = 4 chunks, but the sequence length 14 is not a multiple of 4/ },
    'Ulysses with heads not divisible by cp': { nproc: 4, flags: ['--cp', '4', '--cp-mode', 'ulysses'], everyRank: /--cp 4 --cp-mode ulysses: each tensor-parallel rank's 2 heads are not divisible by cp = 4 \(use --cp-mode ring\)/ },
    'a sliding window under cp': { nproc: 2, flags: ['--cp', '2', '--window', '4'], everyRank: /--cp 2: sliding-window attention \(window 4\) is not supported under context parallelism/ },
    'dropout under cp': { nproc: 2, flags: ['--cp', '2', '--dropout', '0.1'], everyRank: /--cp 2: dropout 0.1 is not supported under context parallelism/ },
  };
  const misuseRuns = Object.fromEntries(Object.entries(misuse).map(([k, v], i) => [k, launchRun(`bad${i}`, v.nproc, v.flags)]));
  it.each(Object.keys(misuse))('rejects %s on every rank before training', async (name) => {
    const { everyRank, nproc } = misuse[name as keyof typeof misuse];
    const bad = await misuseRuns[name]!;
    expect(bad.code, bad.output).not.toBe(0);
    for (let r = 0; r < nproc; r++) {
      const line = bad.output.split('\n').find((l) => l.startsWith(`[rank ${r}] error: ArgumentError`));
      expect(line, bad.output).toMatch(everyRank);
    }
  }, QUEUED_TEST_TIMEOUT_MS);
});

describe('context-parallel layouts (in process)', () => {
  const shape = { nLayer: 2, nHead: 4, nEmbd: 32, vocabSize: 64, blockSize: 16 };
  it('resolves cp into the world and checks what it needs', () => {
    expect(parallel.resolveTrainingLayout({ cp: 2 }, shape, 4, 4)).toMatchObject({ tp: 1, pp: 1, dp: 2, cp: 2, cpMode: 'ring' });
    expect(parallel.resolveTrainingLayout({ cp: 2, tp: 2, cpMode: 'ulysses' }, shape, 4, 4)).toMatchObject({ dp: 1, cp: 2, cpMode: 'ulysses' });
    // ZeRO shards over dp×cp, so cp alone is enough ranks to shard over.
    expect(parallel.resolveTrainingLayout({ cp: 2, zero: 1 }, shape, 2, 4)).toMatchObject({ dp: 1, cp: 2, zero: 1 });
    expect(parallel.resolveTrainingLayout({}, shape, 2, 4)).not.toHaveProperty('cp');
    expect(parallel.describeLayout(parallel.resolveTrainingLayout({ cp: 2 }, shape, 2, 4))).toBe('tp=1 cp=2 ring pp=1 dp=1 zero=0 micro-batches=1');
    for (const [flags, model, world, message] of [
      [{ cp: 2 }, { ...shape, blockSize: 18 }, 2, /ring attention splits the sequence into 2·cp = 4 chunks, but the sequence length 18 is not a multiple of 4/],
      [{ cp: 3, cpMode: 'ulysses' }, { ...shape, blockSize: 18 }, 3, /each tensor-parallel rank's 4 heads are not divisible by cp = 3/],
      [{ cp: 2, cpMode: 'ulysses' }, { ...shape, blockSize: 15 }, 2, /the sequence length 15 is not a multiple of cp = 2/],
      [{ cp: 2, cpMode: 'zigzag' }, shape, 2, /--cp-mode must be ring or ulysses, got zigzag/],
      [{ cp: 2 }, { ...shape, window: 4 }, 2, /sliding-window attention \(window 4\) is not supported/],
      [{ cp: 2 }, { ...shape, dropout: 0.1 }, 2, /dropout 0.1 is not supported under context parallelism/],
      [{ cp: 2, dp: 2 }, shape, 2, /tp·cp·pp·dp = 1·2·1·2 = 4 but the job has 2 processes/],
      [{ cp: 0 }, shape, 2, /--cp must be an integer >= 1/],
    ] as const) {
      expect(() => parallel.resolveTrainingLayout(flags, model, world, 4)).toThrow(ArgumentError);
      expect(() => parallel.resolveTrainingLayout(flags, model, world, 4)).toThrow(message);
    }
  });

  it('the mesh puts cp right after tp (Megatron\'s order) and groups dp×cp ranks for gradients', () => {
    const m = new MeshLayout({ tp: 2, cp: 2, pp: 1, dp: 2 }, 8);
    expect(m.order).toEqual(['tp', 'cp', 'pp', 'dp']);
    expect(m.allGroups('cp')).toEqual([[0, 2], [1, 3], [4, 6], [5, 7]]);
    expect(m.allGroups('dp')).toEqual([[0, 4], [1, 5], [2, 6], [3, 7]]);
    expect(m.allDataContextGroups()).toEqual([[0, 2, 4, 6], [1, 3, 5, 7]]);
    expect(m.coords(6)).toEqual({ tp: 0, cp: 1, pp: 0, dp: 1 });
    expect(m.rankOf({ tp: 1, pp: 0, dp: 1 })).toBe(5);
    expect(m.describe()).toBe('tp=2 cp=2 pp=1 dp=2 order=tp-cp-pp-dp');
    expect(() => new MeshLayout({ tp: 1, cp: 2, pp: 1, dp: 1 }, 4)).toThrow(/tp·cp·pp·dp = 1·2·1·1 = 2 but the world has 4 ranks/);
  });
});
