// Test helpers for ops: seeded random data, float64 comparisons and a finite-difference gradient
// check that perturbs each input element in float64 and runs the op itself.
import { expect } from 'vitest';
import * as nt from '../../lib/index.js';

/** A small deterministic PRNG (mulberry32) so tests draw the same values every run. */
export function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Values uniform in [lo, hi). */
export function randomArray(n: number, r: () => number, lo = -1, hi = 1): Float64Array {
  const a = new Float64Array(n);
  for (let i = 0; i < n; i++) a[i] = lo + (hi - lo) * r();
  return a;
}

/** An f32 leaf tensor holding `data` (rounded to f32), requiring grad unless told not to. */
export function leaf(data: ArrayLike<number>, shape: number[], requiresGrad = true): nt.Tensor {
  const t = nt.tensor(Float32Array.from(data), shape);
  t.requiresGrad = requiresGrad;
  return t;
}

/** Asserts |actual − expected| <= atol + rtol·|expected| elementwise, naming the first failure. */
export function expectClose(actual: ArrayLike<number>, expected: ArrayLike<number>, atol = 1e-5, rtol = 1e-4, what = 'value'): void {
  expect(actual.length, `${what}: length`).toBe(expected.length);
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!, e = expected[i]!;
    if (!(Math.abs(a - e) <= atol + rtol * Math.abs(e))) {
      throw new Error(`${what}[${i}]: got ${a}, expected ${e} (atol ${atol}, rtol ${rtol})`);
    }
  }
}

/**
 * Checks the analytic gradients of fn at `inputs` against central differences. fn maps f32
 * tensors to a tensor; the scalar probed is Σ out·w for a fixed random w (so every output
 * element matters). Differences are taken on the op itself in f32 with step h, so tolerances
 * account for f32 rounding: err <= atol + rtol·|numeric|.
 */
export function gradcheck(fn: (...xs: nt.Tensor[]) => nt.Tensor, inputs: { data: Float64Array | number[]; shape: number[] }[],
  opts: { h?: number; atol?: number; rtol?: number; seed?: number; check?: boolean[] } = {}): void {
  const h = opts.h ?? 1e-2, atol = opts.atol ?? 2e-3, rtol = opts.rtol ?? 2e-2;
  const r = rng(opts.seed ?? 99);
  nt.scope(() => {
    const leaves = inputs.map((x, i) => leaf(x.data, x.shape, opts.check?.[i] ?? true));
    const out = fn(...leaves);
    const w = randomArray(out.size, r);
    const wT = nt.tensor(Float32Array.from(w), [...out.shape]);
    const s = nt.sum(nt.mul(out, wT));
    s.backward();
    const probe = (datas: Float64Array[]): number => nt.noGrad(() => nt.scope(() => {
      const ts = datas.map((d, i) => leaf(d, inputs[i]!.shape, false));
      const o = Float64Array.from(fn(...ts).toArraySync());
      let acc = 0;
      for (let i = 0; i < o.length; i++) acc += o[i]! * w[i]!;
      return acc;
    }));
    inputs.forEach((x, i) => {
      if (opts.check && !opts.check[i]) return;
      const base = Float64Array.from(Float32Array.from(x.data));
      const analytic = leaves[i]!.grad ? leaves[i]!.grad!.toArraySync() : new Float32Array(base.length);
      const numeric = new Float64Array(base.length);
      for (let j = 0; j < base.length; j++) {
        const plus = inputs.map((y) => Float64Array.from(Float32Array.from(y.data)));
        const minus = inputs.map((y) => Float64Array.from(Float32Array.from(y.data)));
        plus[i]![j] = base[j]! + h;
        minus[i]![j] = base[j]! - h;
        numeric[j] = (probe(plus) - probe(minus)) / (2 * h);
      }
      expectClose(analytic, numeric, atol, rtol, `grad of input ${i}`);
    });
  });
}
