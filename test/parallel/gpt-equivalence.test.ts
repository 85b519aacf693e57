// Parallel GPT training through the real launcher and Gloo: a tiny GPT trained 3 steps under DP, ZeRO,
// PP (GPipe, 1F1B), TP and their combinations matches the plain single-process run step by step (losses,
// gradient norms) and in its final parameters, compared per parameter on the ranks that hold it;
// bad layouts and misuse fail on every rank before training.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError, parallel } from '../../lib/index.js';
import { type RankResult as BaseRankResult, type Trained as BaseTrained, equivalenceRunner, expectMatchesReference, expectReferenceTrains, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const script = join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-gpt-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface RankResult extends BaseRankResult {
  /** ZeRO 1/2: what the gradient reduce-scatters did over the run (null otherwise). */
  reduceStats: (parallel.zero.ReduceStats & { modelBytes: number }) | null;
}
type Trained = BaseTrained<RankResult>;


// Every launch is queued at once, each into its own output folder; the pool runs a few at a time.
const launchRun = equivalenceRunner<RankResult>({ script, work });
const single = launchRun('single', 1, ['--reference']);
// Interleaved layouts need pp × virtual stages <= layers: a 4-layer model and its own reference.
const single4 = launchRun('single4', 1, ['--reference', '--layers', '4']);
const FOUR_LAYERS = new Set<string>();
const deep = (name: string, run: Promise<Trained>) => { FOUR_LAYERS.add(name); return run; };
const layouts = {
  'one process, 2 micro-batches': launchRun('m2', 1, ['--micro-batches', '2']),
  'DP2': launchRun('dp2', 2, ['--dp', '2']),
  'ZeRO-1 DP2': launchRun('zero1', 2, ['--zero', '1']),
  'ZeRO-1 DP2 offload': launchRun('zero1-offload', 2, ['--zero', '1', '--offload']),
  'ZeRO-2 DP2': launchRun('zero2-plain', 2, ['--zero', '2']),
  'ZeRO-2 DP2 offload recompute': launchRun('zero2', 2, ['--zero', '2', '--offload', '--recompute']),
  'DP4 ZeRO-1': launchRun('dp4', 4, ['--zero', '1']),
  'DP4 ZeRO-2 offload': launchRun('dp4-zero2-offload', 4, ['--zero', '2', '--offload']),
  'DP4 ZeRO-1 offload': launchRun('dp4-zero1-offload', 4, ['--zero', '1', '--offload']),
  'DP4 ZeRO-2': launchRun('dp4-zero2', 4, ['--zero', '2']),
  'PP2 GPipe, 2 micro-batches': launchRun('pp2-gpipe', 2, ['--pp', '2', '--micro-batches', '2', '--schedule', 'gpipe']),
  'PP2 1F1B, 4 micro-batches, recompute': launchRun('pp2-1f1b', 2, ['--pp', '2', '--micro-batches', '4', '--schedule', '1f1b', '--recompute']),
  'PP2×DP2 1F1B ZeRO-1, 2 micro-batches': launchRun('pp2-dp2', 4, ['--pp', '2', '--dp', '2', '--zero', '1', '--micro-batches', '2']),
  'PP3 1F1B, 4 micro-batches (a middle stage)': launchRun('pp3', 3, ['--pp', '3', '--micro-batches', '4']),
  'TP2': launchRun('tp2', 2, ['--tp', '2']),
  'TP2×DP2 ZeRO-2': launchRun('tp2-dp2', 4, ['--tp', '2', '--dp', '2', '--zero', '2']),
  'TP2×PP2 GPipe, 2 micro-batches, recompute': launchRun('tp2-pp2', 4, ['--tp', '2', '--pp', '2', '--micro-batches', '2', '--schedule', 'gpipe', '--recompute']),
  'ZeRO-3 DP2': launchRun('zero3-dp2', 2, ['--zero', '3']),
  'ZeRO-3 DP2 offload, 2 micro-batches, recompute': launchRun('zero3-dp2-offload', 2, ['--zero', '3', '--offload', '--micro-batches', '2', '--recompute']),
  'ZeRO-3 DP4 offload': launchRun('zero3-dp4', 4, ['--zero', '3', '--offload']),
  'ZeRO-3 DP4': launchRun('zero3-dp4-plain', 4, ['--zero', '3']),
  'PP2×DP2 1F1B ZeRO-3, 2 micro-batches': launchRun('zero3-pp2-dp2', 4, ['--pp', '2', '--dp', '2', '--zero', '3', '--micro-batches', '2']),
  'ZeRO-2 DP2, 2 micro-batches': launchRun('zero2-m2', 2, ['--zero', '2', '--micro-batches', '2']),
  'PP2×DP2 GPipe ZeRO-2, 2 micro-batches': launchRun('zero2-pp2-dp2', 4, ['--pp', '2', '--dp', '2', '--zero', '2', '--micro-batches', '2', '--schedule', 'gpipe']),
  'TP2 SP': launchRun('tp2-sp', 2, ['--tp', '2', '--sp']),
  'TP2×DP2 SP ZeRO-1': launchRun('tp2-dp2-sp', 4, ['--tp', '2', '--dp', '2', '--sp', '--zero', '1']),
  'TP2×PP2 SP 1F1B, 2 micro-batches, recompute': launchRun('tp2-pp2-sp', 4, ['--tp', '2', '--pp', '2', '--sp', '--micro-batches', '2', '--recompute']),
  'TP2×DP2 SP ZeRO-3, 2 micro-batches': launchRun('tp2-dp2-sp-zero3', 4, ['--tp', '2', '--dp', '2', '--sp', '--zero', '3', '--micro-batches', '2']),
  // Issue #27: interleaved 1F1B (virtual stages) and zero bubble (ZB-H1).
  'PP2 interleaved, 2 virtual stages, 4 micro-batches': deep('PP2 interleaved, 2 virtual stages, 4 micro-batches',
    launchRun('pp2-interleaved', 2, ['--layers', '4', '--pp', '2', '--virtual-stages', '2', '--micro-batches', '4'])),
  'PP2×DP2 interleaved ZeRO-1, 2 micro-batches, recompute': deep('PP2×DP2 interleaved ZeRO-1, 2 micro-batches, recompute',
    launchRun('pp2-dp2-interleaved', 4, ['--layers', '4', '--pp', '2', '--dp', '2', '--zero', '1', '--virtual-stages', '2', '--schedule', 'interleaved', '--micro-batches', '2', '--recompute'])),
  'TP2×PP2 interleaved SP, 2 micro-batches': deep('TP2×PP2 interleaved SP, 2 micro-batches',
    launchRun('tp2-pp2-interleaved', 4, ['--layers', '4', '--tp', '2', '--pp', '2', '--sp', '--virtual-stages', '2', '--micro-batches', '2'])),
  'PP2×DP2 interleaved ZeRO-3, 2 micro-batches': deep('PP2×DP2 interleaved ZeRO-3, 2 micro-batches',
    launchRun('pp2-dp2-interleaved-zero3', 4, ['--layers', '4', '--pp', '2', '--dp', '2', '--zero', '3', '--virtual-stages', '2', '--micro-batches', '2'])),
  'PP2 ZB-H1, 4 micro-batches': launchRun('pp2-zb', 2, ['--pp', '2', '--schedule', 'zb-h1', '--micro-batches', '4']),
  'PP3 ZB-H1, 4 micro-batches (a middle stage)': launchRun('pp3-zb', 3, ['--pp', '3', '--schedule', 'zb-h1', '--micro-batches', '4']),
  'PP2×DP2 ZB-H1, 2 micro-batches (bucket hooks after W)': launchRun('pp2-dp2-zb', 4, ['--pp', '2', '--dp', '2', '--schedule', 'zb-h1', '--micro-batches', '2']),
  'PP2×DP2 ZB-H1 ZeRO-1, 2 micro-batches': launchRun('pp2-dp2-zb-zero1', 4, ['--pp', '2', '--dp', '2', '--zero', '1', '--schedule', 'zb-h1', '--micro-batches', '2']),
  // ZeRO 2 and 3 under zero bubble: a micro-batch's gradients are reduced after its W.
  'PP2×DP2 ZB-H1 ZeRO-2, 2 micro-batches': launchRun('pp2-dp2-zb-zero2', 4, ['--pp', '2', '--dp', '2', '--zero', '2', '--schedule', 'zb-h1', '--micro-batches', '2']),
  'PP2×DP2 ZB-H1 ZeRO-3, 2 micro-batches': launchRun('pp2-dp2-zb-zero3', 4, ['--pp', '2', '--dp', '2', '--zero', '3', '--schedule', 'zb-h1', '--micro-batches', '2']),
  // ZB-V: 2 chunks per rank in a V (4 layers: one per chunk), the first rank holding both ends.
  'PP2 ZB-V, 4 micro-batches': deep('PP2 ZB-V, 4 micro-batches', launchRun('pp2-zbv', 2, ['--layers', '4', '--pp', '2', '--schedule', 'zb-v', '--micro-batches', '4'])),
  'PP2×DP2 ZB-V ZeRO-3, 2 micro-batches': deep('PP2×DP2 ZB-V ZeRO-3, 2 micro-batches',
    launchRun('pp2-dp2-zbv-zero3', 4, ['--layers', '4', '--pp', '2', '--dp', '2', '--zero', '3', '--schedule', 'zb-v', '--micro-batches', '2'])),
};
const TOLERANCE = 1e-5;
// Parameters after 3 AdamW steps: Adam's update of a near-zero gradient (|g| ~ eps) magnifies f32
// rounding noise, so two single-process runs that differ only in FMA contraction (the cpu kernels at
// NODETRON_CPU_ISA=baseline and avx2) already differ by 1.2e-5 of the parameters' scale on
// h.1.mlp.proj.weight; a layout's different summation order moves it as much.
const PARAM_TOLERANCE = 5e-5;
/** The gradient bucket size gpt-train.ts trains with (BUCKET_BYTES there). */
const FIXTURE_BUCKET_BYTES = 16 * 1024;

describe('parallel GPT equivalence (launcher + Gloo)', () => {
  it('single-process reference trains', async () => {
    expectReferenceTrains(await single);
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const [ref, run] = await Promise.all([FOUR_LAYERS.has(name) ? single4 : single, layouts[name as keyof typeof layouts]]);
    expect(run.code, run.output).toBe(0);
    expectMatchesReference(ref.ranks[0]!, run.ranks, TOLERANCE, PARAM_TOLERANCE);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('ZeRO 1 and 2 reduce-scatter every gradient bucket from the hooks during backward: stage 1 once per step, stage 2 once per micro-batch', async () => {
    const cases: [keyof typeof layouts, 1 | 2, number][] = [
      ['ZeRO-1 DP2', 1, 1], ['PP2×DP2 1F1B ZeRO-1, 2 micro-batches', 1, 2], ['TP2×DP2 ZeRO-2', 2, 1],
      ['ZeRO-2 DP2, 2 micro-batches', 2, 2], ['PP2×DP2 GPipe ZeRO-2, 2 micro-batches', 2, 2],
    ];
    for (const [name, stage, microBatches] of cases) {
      const run = await layouts[name];
      expect(run.code, run.output).toBe(0);
      for (const r of run.ranks) {
        const s = r.reduceStats!;
        const rounds = 3 * (stage === 1 ? 1 : microBatches);
        expect(s.buckets, name).toBeGreaterThan(1);
        expect(s.rounds, name).toBe(rounds);
        // Each bucket's reduce-scatter was started by the hook of its last gradient, not by the end of
        // the pass or by step(); only the pipeline's tied embedding waits for step() (after the stages' sum).
        expect(s.deferredBuckets > 0, name).toBe(name.startsWith('PP2'));
        expect(s.duringBackward, name).toBe(s.reduceScatters - 3 * s.deferredBuckets);
        expect(s.duringBackward, name).toBeGreaterThanOrEqual(rounds * 2);
        // Stage 2 never holds the model's full gradients: at most the buckets in flight (two), the one
        // being filled and gradients still accumulating (the tied embedding's); stage 1 keeps them all.
        if (stage === 2) expect(s.peakFullGradBytes, name).toBeLessThanOrEqual(4 * FIXTURE_BUCKET_BYTES);
        else expect(s.peakFullGradBytes, name).toBeGreaterThanOrEqual(s.modelBytes);
      }
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it('ZB-V stages hold a V: the first rank both ends of the model (one copy of the tied table), the last rank the middle', async () => {
    const run = await layouts['PP2 ZB-V, 4 micro-batches'];
    expect(run.code, run.output).toBe(0);
    const [first, last] = [...run.ranks].sort((a, b) => a.coords.pp - b.coords.pp).map((r) => [...r.params.keys()]);
    expect(first!.filter((n) => !/^h\.[03]\./.test(n))).toEqual(['wte.weight', 'wpe.weight', 'lnF.weight', 'lnF.bias']);
    expect(first!.some((n) => n.startsWith('h.0.')) && first!.some((n) => n.startsWith('h.3.'))).toBe(true);
    expect(last!.every((n) => /^h\.[12]\./.test(n))).toBe(true);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('pipeline stages hold their own layers: embeddings first, LayerNorm and tied head last', async () => {
    const run = await layouts['PP2 GPipe, 2 micro-batches'];
    expect(run.code, run.output).toBe(0);
    const [first, last] = [...run.ranks].sort((a, b) => a.coords.pp - b.coords.pp).map((r) => [...r.params.keys()]);
    // partitionLayers(3, 2): layers 0 and 1 on the first stage, layer 2 on the last.
    expect(first!.filter((n) => !/^h\.[01]\./.test(n))).toEqual(['wte.weight', 'wpe.weight']);
    expect(last!.filter((n) => !n.startsWith('h.2.'))).toEqual(['wte.weight', 'lnF.weight', 'lnF.bias']);
  }, QUEUED_TEST_TIMEOUT_MS);

  const misuse = {
    'a layout the job does not fit': { flags: ['--dp', '2', '--tp', '2'], everyRank: /tp·pp·dp = 2·1·2 = 4 but the job has 2 processes/, oneRank: null },
    'ranks started with different flags': { flags: ['--dp', '2', '--mismatch-on-rank', '1'], everyRank: /ranks were started with different settings/, oneRank: null },
    'a parameter outside the optimizer (last stage only)': {
      flags: ['--pp', '2', '--drop-param-on-rank', '1'], oneRank: /lnF\.bias are in no parameter group/, everyRank: /ParallelTrainer: /,
      // The rank without the problem names the one with it.
      elsewhere: /\[rank 0\] error: ArgumentError: ParallelTrainer: model or optimizer rejected on rank 1 \(see the error there\); every rank stops/,
    },
    'sequence parallelism without tensor parallelism': { flags: ['--dp', '2', '--sp'], everyRank: /--sp splits the sequence over the tensor-parallel ranks, but tp = 1/, oneRank: null },
  };
  const misuseRuns = Object.fromEntries(Object.entries(misuse).map(([k, v], i) => [k, launchRun(`bad${i}`, 2, v.flags)]));
  it.each(Object.keys(misuse))('rejects %s on every rank before training', async (name) => {
    const { everyRank, oneRank } = misuse[name as keyof typeof misuse];
    const bad = await misuseRuns[name]!;
    expect(bad.code, bad.output).not.toBe(0);
    for (const r of [0, 1]) {
      const line = bad.output.split('\n').find((l) => l.startsWith(`[rank ${r}] error: ArgumentError`));
      expect(line, bad.output).toMatch(everyRank);
    }
    if (oneRank) expect(bad.output).toMatch(oneRank);
    const elsewhere = (misuse[name as keyof typeof misuse] as { elsewhere?: RegExp }).elsewhere;
    if (elsewhere) expect(bad.output).toMatch(elsewhere);
    expect(bad.output).not.toMatch(/result-/);
  }, QUEUED_TEST_TIMEOUT_MS);
});

describe('training layout validation', () => {
  const shape = { nLayer: 2, nHead: 2, nEmbd: 32, vocabSize: 64 };
  const defaults = { tp: 1, pp: 1, dp: 1, sequenceParallel: false, zero: 0, offload: false, microBatches: 1, schedule: '1f1b', virtualStages: 1 };
  it('fills dp from the world and accepts valid layouts', () => {
    expect(parallel.resolveTrainingLayout({}, shape, 4, 4)).toEqual({ ...defaults, dp: 4 });
    expect(parallel.resolveTrainingLayout({ tp: 2, zero: 1, offload: true }, shape, 4, 4)).toEqual({ ...defaults, tp: 2, dp: 2, zero: 1, offload: true });
    expect(parallel.resolveTrainingLayout({ zero: 3, offload: true }, shape, 2, 4)).toEqual({ ...defaults, dp: 2, zero: 3, offload: true });
    expect(parallel.resolveTrainingLayout({ pp: 2, microBatches: 2, schedule: 'gpipe' }, shape, 4, 4)).toEqual({ ...defaults, pp: 2, dp: 2, microBatches: 2, schedule: 'gpipe' });
    // --virtual-stages > 1 selects the interleaved schedule.
    expect(parallel.resolveTrainingLayout({ pp: 2, microBatches: 2, virtualStages: 2 }, { ...shape, nLayer: 4 }, 2, 4)).toEqual({ ...defaults, pp: 2, microBatches: 2, schedule: 'interleaved', virtualStages: 2 });
    expect(parallel.resolveTrainingLayout({ pp: 2, microBatches: 2, schedule: 'zb-h1', zero: 1 }, shape, 4, 4)).toEqual({ ...defaults, pp: 2, dp: 2, zero: 1, microBatches: 2, schedule: 'zb-h1' });
    // Every ZeRO stage with the zero-bubble schedules; zb-v always 2 chunks per rank.
    expect(parallel.resolveTrainingLayout({ pp: 2, microBatches: 2, schedule: 'zb-h1', zero: 3 }, shape, 4, 4)).toEqual({ ...defaults, pp: 2, dp: 2, zero: 3, microBatches: 2, schedule: 'zb-h1' });
    expect(parallel.resolveTrainingLayout({ pp: 2, microBatches: 2, schedule: 'zb-v', zero: 2 }, { ...shape, nLayer: 4 }, 4, 4)).toEqual({ ...defaults, pp: 2, dp: 2, zero: 2, microBatches: 2, schedule: 'zb-v', virtualStages: 2 });
  });
  it.each([
    [{ dp: 3 }, 2, 6, /job has 2 processes/],
    [{ tp: 4 }, 4, 4, /--tp 4: tensor parallelism over 4 ranks must divide the 2 attention heads/],
    [{ tp: 3 }, 3, 3, /must divide the 2 attention heads, the width 32, the vocabulary of 64 tokens \(pad it: padVocab\(64, 3\) = 66\)/],
    [{ pp: 3, dp: 1 }, 3, 4, /--pp 3 is more pipeline stages than the model's 2 layers/],
    [{ dp: 3 }, 3, 4, /does not divide the global batch of 4/],
    [{ dp: 2, microBatches: 4 }, 2, 4, /dp·micro-batches = 2·4 does not divide the global batch of 4/],
    [{ microBatches: 0 }, 1, 4, /--micro-batches must be an integer >= 1/],
    [{ pp: 2, schedule: 'zigzag' }, 2, 4, /--schedule must be gpipe, 1f1b, interleaved, zb-h1, zb-v, got zigzag/],
    [{ pp: 2, schedule: 'interleaved' }, 2, 4, /--schedule interleaved needs --virtual-stages >= 2/],
    [{ pp: 2, virtualStages: 2, microBatches: 1 }, 2, 4, /--micro-batches to be a multiple of --pp .*: 1 micro-batches over 2 stages/],
    [{ pp: 2, virtualStages: 2, microBatches: 2 }, 2, 4, /--pp 2 × --virtual-stages 2 = 4 model chunks, more than the model's 2 layers/],
    [{ pp: 2, virtualStages: 2, schedule: '1f1b' }, 2, 4, /--virtual-stages 2 needs --schedule interleaved, not 1f1b/],
    [{ virtualStages: 2, microBatches: 2 }, 1, 4, /--schedule interleaved needs --pp >= 2/],
    [{ pp: 2, schedule: 'zb-v', microBatches: 2 }, 2, 4, /--schedule zb-v cuts the model into 2·pp = 4 chunks, more than the model's 2 layers/],
    [{ pp: 2, schedule: 'zb-v', virtualStages: 3 }, 2, 4, /--schedule zb-v holds exactly 2 model chunks per rank/],
    [{ schedule: 'zb-v', microBatches: 2 }, 1, 4, /--schedule zb-v needs --pp >= 2/],
    [{ pp: 2, dp: 2, ep: 2, zero: 2, schedule: 'zb-h1', microBatches: 2 }, 4, 4, /--schedule zb-h1 with --ep 2 and --zero 2 is not supported yet/],
    [{ zero: 4 }, 2, 4, /--zero must be 0, 1, 2 or 3/],
    [{ zero: 1 }, 1, 4, /--zero 1 shards over the data-parallel ranks, but dp = 1/],
    [{ offload: true }, 1, 4, /--offload .* needs --zero 1, 2 or 3/],
  ] as const)('rejects %o on %d ranks (batch %d)', (flags, world, batch, message) => {
    expect(() => parallel.resolveTrainingLayout(flags, shape, world, batch)).toThrow(ArgumentError);
    expect(() => parallel.resolveTrainingLayout(flags, shape, world, batch)).toThrow(message);
    expect(parallel.resolveTrainingLayout({}, shape, 2, 4).dp).toBe(2);
  });
  it('batchSlice gives each data-parallel rank its rows', () => {
    expect([0, 1, 2].map((r) => parallel.batchSlice(6, r, 3))).toEqual([{ start: 0, count: 2 }, { start: 2, count: 2 }, { start: 4, count: 2 }]);
    expect(() => parallel.batchSlice(5, 0, 2)).toThrow(ArgumentError);
  });
});
