// Predicted f32 peak memory per rank against the allocator's measured peak, through the launcher.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { launchingInternal } from '../helpers/node-script.js';

// calibrateLayout from dist/ when it is fresh: its launched ranks then start without tsx.
const launching = await launchingInternal();

describe('calibration on this machine', () => {
  for (const spec of ['dp2,zero1', 'tp2,sp', 'pp2,mb4,1f1b']) {
    it(`${spec}: every rank within 10%`, async () => {
      const row = await launching.plan.calibrateLayout(spec);
      for (const r of row.ranks) expect(Math.abs(r.error), `rank ${r.rank}: predicted ${r.predicted}, measured ${r.peak}`).toBeLessThan(0.1);
    }, 180_000);
  }
});

// Middle stages (neither the embedding nor the head): their parameters, gradients (alive from their
// first backward, so during 1F1B's later forwards), optimizer state and in-flight activations. The
// planner once gave them no gradients: 17% low on PP3's middle stage. Each stage within 6% (1 layer
// per middle stage) or 10% (2 layers, where the f32 activation model runs high: +5% measured), and
// never more than 3% low.
describe('calibration of every pipeline stage (PP3, PP4)', () => {
  const wide: plan.CalibrationShape = { ...plan.CALIBRATION_SHAPE, layers: 6, width: 256 };
  const cases: [string, plan.CalibrationShape, number][] = [
    ['pp3,mb4,1f1b', plan.CALIBRATION_SHAPE, 0.06],
    ['pp3,mb4,gpipe', plan.CALIBRATION_SHAPE, 0.06],
    ['pp3,mb2,1f1b', plan.CALIBRATION_SHAPE, 0.06],
    ['pp4,mb4,1f1b', plan.CALIBRATION_SHAPE, 0.06],
    ['pp3,mb4,1f1b', wide, 0.1],
  ];
  for (const [spec, shape, tolerance] of cases) {
    it(`${spec}, ${shape.layers} layers of width ${shape.width}: every stage within ${100 * tolerance}%, none more than 3% low`, async () => {
      const row = await launching.plan.calibrateLayout(spec, shape);
      const layout = plan.parseLayoutSpec(spec);
      expect(row.ranks.map((r) => r.ppRank).sort()).toEqual(Array.from({ length: layout.pp }, (_, s) => s));
      for (const r of row.ranks) {
        const what = `stage ${r.ppRank}: predicted ${(r.predicted / 2 ** 20).toFixed(2)} MiB, measured ${(r.peak / 2 ** 20).toFixed(2)} MiB`;
        expect(Math.abs(r.error), what).toBeLessThan(tolerance);
        expect(r.error, what).toBeGreaterThan(-0.03);
      }
      // Under 1F1B a middle stage runs forwards after its first backward: its prediction holds every
      // gradient of its parameters then (the defect: none).
      const model = plan.calibrationModel(shape);
      const opts = { seq: shape.ctx, microBatchSize: shape.batch / layout.microBatches, dtype: 'f32' as const };
      for (let s = 1; s < layout.pp - 1; s++) {
        if (layout.schedule !== '1f1b' || layout.microBatches <= layout.pp - s) continue;
        const e = plan.estimateStageMemory(model, layout, opts, s);
        expect(e.grads).toBe(4 * e.numParams);
      }
    }, 180_000);
  }
});

// Interleaved 1F1B and ZB-H1 (issue #27): the schedules' own tables give what each stage holds
// (interleaving's extra chunks in flight and the receives it posts first; ZB-H1's micro-batches between
// B and W, and on the last stage their head gradients). Measured 2026-11-26 within 2% but ZB-H1's
// middle stage (-6.1%, one layer).
describe('calibration of the interleaved and zero-bubble schedules', () => {
  const shape: plan.CalibrationShape = { ...plan.CALIBRATION_SHAPE, layers: 4 };
  for (const spec of ['pp2,mb4,v2', 'pp2,mb2,v2', 'pp2,mb4,zb-h1', 'pp3,mb4,zb-h1']) {
    it(`${spec}: every stage within 8%`, async () => {
      const row = await launching.plan.calibrateLayout(spec, shape);
      for (const r of row.ranks) {
        expect(Math.abs(r.error), `stage ${r.ppRank}: predicted ${(r.predicted / 2 ** 20).toFixed(2)} MiB, measured ${(r.peak / 2 ** 20).toFixed(2)} MiB`).toBeLessThan(0.08);
      }
    }, 240_000);
  }
});
