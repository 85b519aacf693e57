// The planner with context parallelism: cp layouts are enumerated, checked and launched with --cp;
// their activations fall by cp and their attention traffic is ring's or Ulysses'; and, on this machine,
// the measured peak per rank of cp 2 and 4 (ring and Ulysses) falls from one process's as predicted.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { launchingInternal } from '../helpers/node-script.js';

// calibrateLayout from dist/ when it is fresh: its launched ranks then start without tsx.
const launching = await launchingInternal();
const GiB = 2 ** 30;

describe('planner with cp', () => {
  const base: plan.PlanLayout = { dp: 1, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };
  const m = plan.PLAN_MODELS['7b']!;
  it('activations and the head\'s rows fall by cp; ZeRO shards over dp × cp', () => {
    const opts = { seq: 32768, microBatchSize: 1, dtype: 'bf16' as const };
    const one = plan.estimateMemory(m, base, opts);
    for (const cp of [2, 4, 8]) for (const cpMode of ['ring', 'ulysses'] as const) {
      const e = plan.estimateMemory(m, { ...base, cp, cpMode }, opts);
      // Korthikanti's layer at s/cp (its s² attention-core term falls by cp²) plus one [s/cp, b, h] tensor per layer.
      const atLocal = plan.estimateMemory(m, base, { ...opts, seq: 32768 / cp });
      expect(e.activations).toBeGreaterThan(atLocal.activations);
      expect(e.activations).toBeLessThan(atLocal.activations * 1.05);
      expect(e.activations).toBeLessThan(one.activations / cp);
      expect(e.params).toBe(one.params);
    }
    const z = plan.estimateMemory(m, { ...base, zero: 1, cp: 4, cpMode: 'ring', dp: 2 }, opts);
    expect(z.optimizerState).toBe(12 * Math.ceil(z.numParams / 8));
  });

  it('ring moves more bytes than Ulysses at cp 4 (O(s) against O(s/cp) per rank), none without cp', () => {
    const dev = plan.resolveDevice('h100');
    const o = { seq: 32768, microBatchSize: 1, dtype: 'bf16' as const, gpusPerNode: 8 };
    const none = plan.predictStepTime(m, base, dev, o);
    const ring = plan.predictStepTime(m, { ...base, cp: 4, cpMode: 'ring' }, dev, o);
    const uly = plan.predictStepTime(m, { ...base, cp: 4, cpMode: 'ulysses' }, dev, o);
    expect(none.contextParallel).toBeUndefined();
    // Per layer and rank: ring (2·act/cp)(3cp − 2) = 5·act, Ulysses 8·act/cp·(cp − 1)/cp = 1.5·act.
    expect(ring.contextParallel! / uly.contextParallel!).toBeCloseTo(5 / 1.5, 6);
    expect(ring.total).toBeCloseTo(ring.compute + ring.contextParallel!, 9);
    // The same step's FLOPs over 4 times the devices.
    expect(ring.compute).toBeCloseTo(none.compute / 4, 9);
  });

  it('enumerates cp layouts with their command; a sequence too long for one device fits under cp', () => {
    const dev = plan.resolveDevice('h100');
    const c = plan.planLayouts(plan.PLAN_MODELS['gpt2-xl']!, { gpus: 8, gpuMemory: 80 * GiB, seq: 65536, globalBatch: 8, dtype: 'bf16', device: dev });
    const withCp = c.filter((x) => !x.skipped && (x.layout.cp ?? 1) > 1);
    expect(withCp.length).toBeGreaterThan(0);
    expect(withCp.every((x) => x.command!.includes(`--cp ${x.layout.cp} --cp-mode ${x.layout.cpMode}`))).toBe(true);
    // gpt2-xl's 25 heads: Ulysses needs them divisible by cp.
    expect(c.some((x) => x.skipped === '--cp 2 --cp-mode ulysses: each tensor-parallel rank\'s 25 heads are not divisible by cp = 2 (use --cp-mode ring)')).toBe(true);
    // Without cp (and without tp, whose sp also splits the sequence) nothing fits at 64K tokens; with cp 8 some layout does.
    expect(c.filter((x) => !x.skipped && x.fits && x.layout.tp === 1 && (x.layout.cp ?? 1) === 1)).toHaveLength(0);
    expect(c.some((x) => x.fits && x.layout.cp === 8)).toBe(true);
    expect(plan.layoutProblem(m, { ...base, cp: 4, cpMode: 'ring' }, 4100, 8, 1)).toBe('--cp 4: ring attention splits the sequence into 2·cp = 8 chunks, but the sequence length 4100 is not a multiple of 8');
  });
});

// An activation-heavy shape (context 512, vocabulary 512), so the activations are most of the peak.
describe('calibration with cp on this machine', () => {
  const shape: plan.CalibrationShape = { ...plan.CALIBRATION_SHAPE, ctx: 512, vocab: 512, batch: 4 };
  it('the measured peak per rank under cp 2 and 4 (ring, Ulysses) falls from one process\'s as predicted (within 8%)', async () => {
    const one = (await launching.plan.calibrateLayout('dp1', shape)).ranks[0]!;
    for (const spec of ['cp2', 'cp2,ulysses', 'cp4']) {
      const row = await launching.plan.calibrateLayout(spec, shape);
      for (const r of row.ranks) {
        const measured = r.peak / one.peak, predicted = r.predicted / one.predicted;
        expect(Math.abs(predicted / measured - 1), `${spec} rank ${r.rank}: measured ${measured.toFixed(3)} of one process, predicted ${predicted.toFixed(3)}`).toBeLessThan(0.08);
      }
      if (spec === 'cp4') for (const r of row.ranks) expect(r.peak).toBeLessThan(0.45 * one.peak);
    }
  }, 600_000);
});
