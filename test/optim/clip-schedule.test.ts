// clipGradNorm against a float64 global norm; cosineWithWarmup's shape and argument checks.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { clipGradNorm, cosineWithWarmup, gradSumSquares } from '../../lib/optim/index.js';

describe('clipGradNorm', () => {
  it('computes the global norm and scales only when above maxNorm', () => {
    const values = [Float32Array.from({ length: 13 }, (_, i) => Math.cos(i) * 3), Float32Array.from({ length: 6 }, (_, i) => i - 2.5)];
    const make = () => values.map((v) => { const p = nt.zeros([v.length]); p.grad = nt.tensor(v); return p; });
    const norm = Math.sqrt(values.reduce((s, v) => s + v.reduce((a, x) => a + x * x, 0), 0));
    const ps = make();
    expect(gradSumSquares(ps)).toBeCloseTo(norm * norm, 3);
    expect(clipGradNorm(ps, 1000)).toBeCloseTo(norm, 4);
    expect(ps[0]!.grad!.toArraySync()).toEqual(values[0]);
    const clipped = make();
    const maxNorm = norm / 4;
    expect(clipGradNorm(clipped, maxNorm)).toBeCloseTo(norm, 4);
    const after = Math.sqrt(gradSumSquares(clipped));
    expect(after).toBeCloseTo(maxNorm, 4);
    const g0 = clipped[0]!.grad!.toArraySync();
    for (let i = 0; i < g0.length; i++) expect(g0[i]!).toBeCloseTo(values[0]![i]! * maxNorm / (norm + 1e-6), 5);
    expect(() => clipGradNorm(ps, 0)).toThrow(nt.ArgumentError);
    expect(clipGradNorm([nt.zeros([2])], 1)).toBe(0);
  });
});

describe('cosineWithWarmup', () => {
  const o = { warmup: 10, maxSteps: 110, maxLr: 1e-3, minLr: 1e-4 };
  it('warms up linearly, decays by a cosine, then stays at minLr', () => {
    expect(cosineWithWarmup(0, o)).toBeCloseTo(1e-4, 12);
    expect(cosineWithWarmup(9, o)).toBeCloseTo(1e-3, 12);
    expect(cosineWithWarmup(10, o)).toBeCloseTo(1e-3, 12);
    expect(cosineWithWarmup(60, o)).toBeCloseTo((1e-3 + 1e-4) / 2, 12);
    expect(cosineWithWarmup(110, o)).toBe(1e-4);
    expect(cosineWithWarmup(500, o)).toBe(1e-4);
    for (let s = 10; s < 110; s++) expect(cosineWithWarmup(s + 1, o)).toBeLessThanOrEqual(cosineWithWarmup(s, o));
  });
  it('rejects bad arguments', () => {
    expect(() => cosineWithWarmup(-1, o)).toThrow(nt.ArgumentError);
    expect(() => cosineWithWarmup(1, { ...o, maxSteps: 5 })).toThrow(nt.ArgumentError);
    expect(() => cosineWithWarmup(1, { ...o, minLr: 1 })).toThrow(nt.ArgumentError);
  });
});
