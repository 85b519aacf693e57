// The fused LM head (linearCrossEntropy) against the unfused linear + crossEntropy: loss and both
// gradients over odd sizes and chunkings, ignored rows, sum reduction, an upstream gradient; a
// float64 reference and finite differences; no gradient work without grad; 16-bit inputs; the
// logits never allocated whole; typed errors; an optional bias.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { linearCrossEntropyChunkRows } from '../../lib/internal.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

interface Case { n: number; c: number; v: number; seed: number; ignore?: number[]; ignoreIndex?: number }

function data({ n, c, v, seed, ignore = [], ignoreIndex = -100 }: Case) {
  const r = rng(seed);
  const x = randomArray(n * c, r, -2, 2), w = randomArray(v * c, r, -1, 1);
  const t = Int32Array.from({ length: n }, () => Math.floor(r() * v));
  for (const i of ignore) t[i] = ignoreIndex;
  return { x: Float32Array.from(x), w: Float32Array.from(w), t };
}

/** Loss, dX and dW (after backward of upstream·loss) of the fused or the unfused head. */
function run(c: Case, fused: boolean, opts: nt.LinearCrossEntropyOptions = {}, upstream = 1.75, dtype: 'f32' | 'bf16' = 'f32') {
  const { x, w, t } = data(c);
  return nt.scope(() => {
    const xt = nt.tensor(x, [c.n, c.c]).to(dtype), wt = nt.tensor(w, [c.v, c.c]).to(dtype);
    xt.requiresGrad = true; wt.requiresGrad = true;
    const tt = nt.tensor(t, [c.n]);
    const o = { ...opts, ignoreIndex: c.ignoreIndex ?? opts.ignoreIndex };
    const loss = fused ? nt.linearCrossEntropy(xt, wt, tt, o) : nt.crossEntropy(nt.linear(xt, wt), tt, o);
    expect(loss.shape).toEqual([]);
    expect(loss.dtype).toBe(dtype);
    nt.scale(loss, upstream).backward();
    return { loss: loss.to('f32').item(), dx: xt.grad!.to('f32').toArraySync(), dw: wt.grad!.to('f32').toArraySync() };
  });
}

function maxAbs(a: ArrayLike<number>): number { let m = 0; for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!)); return m; }

describe('linearCrossEntropy against linear + crossEntropy', () => {
  const cases: [string, Case, nt.LinearCrossEntropyOptions][] = [
    ['one chunk', { n: 16, c: 8, v: 32, seed: 1 }, {}],
    ['odd sizes, rows not divisible by the chunk', { n: 37, c: 13, v: 61, seed: 2 }, { chunkRows: 5 }],
    ['a chunk per row', { n: 9, c: 7, v: 23, seed: 3 }, { chunkRows: 1 }],
    ['chunk larger than the batch', { n: 11, c: 5, v: 17, seed: 4 }, { chunkRows: 64 }],
    ['ignored rows (the default −100), the last chunk partly ignored', { n: 29, c: 6, v: 40, seed: 5, ignore: [0, 7, 27, 28] }, { chunkRows: 8 }],
    ['a custom ignoreIndex that is a vocabulary id', { n: 20, c: 4, v: 9, seed: 6, ignore: [3, 4, 5], ignoreIndex: 2 }, { chunkRows: 6 }],
    ['sum reduction', { n: 25, c: 9, v: 31, seed: 7, ignore: [1] }, { chunkRows: 7, reduction: 'sum' }],
    ['a vocabulary wider than the chunk budget', { n: 40, c: 8, v: 3001, seed: 8 }, { chunkRows: 13 }],
  ];
  for (const [name, c, opts] of cases) {
    it(`${name}: loss, dX and dW to f32 tolerance`, () => {
      const ref = run(c, false, opts), got = run(c, true, opts);
      expect(Math.abs(got.loss - ref.loss)).toBeLessThanOrEqual(2e-6 * Math.max(1, Math.abs(ref.loss)));
      expectClose(got.dx, ref.dx, 1e-6 * Math.max(1, maxAbs(ref.dx)), 1e-4, 'dx');
      expectClose(got.dw, ref.dw, 1e-6 * Math.max(1, maxAbs(ref.dw)), 1e-4, 'dw');
      expect(maxAbs(got.dw)).toBeGreaterThan(0);
    });
  }

  it('the default chunking gives the unfused numbers, chunk size changes only rounding', () => {
    const c = { n: 50, c: 12, v: 45, seed: 9, ignore: [4] };
    const ref = run(c, false);
    for (const chunkRows of [undefined, 2, 3, 49, 50]) {
      const got = run(c, true, { chunkRows });
      expect(Math.abs(got.loss - ref.loss)).toBeLessThan(2e-6);
      expectClose(got.dx, ref.dx, 1e-7, 1e-4, `dx (chunkRows ${chunkRows})`);
      expectClose(got.dw, ref.dw, 1e-7, 1e-4, `dw (chunkRows ${chunkRows})`);
    }
  });

  it('matches a float64 reference of the loss and both gradients', () => {
    const c = { n: 7, c: 3, v: 5, seed: 10, ignore: [2] };
    const { x, w, t } = data(c);
    const UP = 0.5;
    const counted = Array.from(t).filter((v) => v !== -100).length;
    let loss = 0;
    const dx = new Float64Array(c.n * c.c), dw = new Float64Array(c.v * c.c);
    for (let i = 0; i < c.n; i++) {
      if (t[i] === -100) continue;
      const z = Array.from({ length: c.v }, (_, j) => { let s = 0; for (let k = 0; k < c.c; k++) s += x[i * c.c + k]! * w[j * c.c + k]!; return s; });
      const m = Math.max(...z), se = z.reduce((a, v) => a + Math.exp(v - m), 0);
      loss += m + Math.log(se) - z[t[i]!]!;
      for (let j = 0; j < c.v; j++) {
        const g = UP * (Math.exp(z[j]! - m) / se - (j === t[i] ? 1 : 0)) / counted;
        for (let k = 0; k < c.c; k++) { dx[i * c.c + k]! += g * w[j * c.c + k]!; dw[j * c.c + k]! += g * x[i * c.c + k]!; }
      }
    }
    const got = run(c, true, { chunkRows: 3 }, UP);
    expect(Math.abs(got.loss - loss / counted)).toBeLessThan(1e-6);
    expectClose(got.dx, dx, 1e-6, 1e-5, 'dx');
    expectClose(got.dw, dw, 1e-6, 1e-5, 'dw');
  });

  it('passes a finite-difference gradient check (both inputs, several chunks)', () => {
    const r = rng(11);
    const n = 6, c = 4, v = 7;
    const t = nt.tensor(Int32Array.from([3, 0, 6, -100, 2, 5]), [n]);
    gradcheck((x, w) => nt.linearCrossEntropy(x!, w!, t, { chunkRows: 4 }),
      [{ data: randomArray(n * c, r), shape: [n, c] }, { data: randomArray(v * c, r), shape: [v, c] }]);
    gradcheck((x, w) => nt.linearCrossEntropy(x!, w!, t, { chunkRows: 1, reduction: 'sum' }),
      [{ data: randomArray(n * c, r), shape: [n, c] }, { data: randomArray(v * c, r), shape: [v, c] }]);
  });

  it('takes leading dimensions: x [B, T, C] with targets [B, T]', () => {
    const c = { n: 12, c: 5, v: 19, seed: 12 };
    const { x, w, t } = data(c);
    const ref = run(c, false);
    nt.scope(() => {
      const xt = nt.tensor(x, [3, 4, 5]), wt = nt.tensor(w, [19, 5]);
      xt.requiresGrad = true; wt.requiresGrad = true;
      const loss = nt.linearCrossEntropy(xt, wt, nt.tensor(t, [3, 4]), { chunkRows: 5 });
      nt.scale(loss, 1.75).backward();
      expect(Math.abs(loss.item() - ref.loss)).toBeLessThan(2e-6);
      expect(xt.grad!.shape).toEqual([3, 4, 5]);
      expectClose(xt.grad!.toArraySync(), ref.dx, 1e-7, 1e-4, 'dx');
      expectClose(wt.grad!.toArraySync(), ref.dw, 1e-7, 1e-4, 'dw');
    });
  });

  it('all rows ignored: NaN mean (as crossEntropy) and zero gradients; sum 0', () => {
    const t = nt.tensor(Int32Array.from([-100, -100, -100]), [3]);
    nt.scope(() => {
      const x = nt.randn([3, 4], { seed: 1 }), w = nt.randn([6, 4], { seed: 2 });
      x.requiresGrad = true; w.requiresGrad = true;
      const mean = nt.linearCrossEntropy(x, w, t, { chunkRows: 2 });
      expect(Number.isNaN(mean.item())).toBe(true);
      expect(Number.isNaN(nt.crossEntropy(nt.linear(x, w), t).item())).toBe(true);
      const sum = nt.linearCrossEntropy(x, w, t, { reduction: 'sum' });
      expect(sum.item()).toBe(0);
      sum.backward();
      expect(maxAbs(x.grad!.toArraySync())).toBe(0);
      expect(maxAbs(w.grad!.toArraySync())).toBe(0);
      // No rows at all: a zero weight gradient (no GEMM writes it), as the unfused path gives.
      const x0 = nt.zeros([0, 4]), w0 = nt.randn([6, 4], { seed: 3 });
      x0.requiresGrad = true; w0.requiresGrad = true;
      const none = nt.linearCrossEntropy(x0, w0, nt.tensor(new Int32Array(0), [0]), { reduction: 'sum' });
      none.backward();
      expect(none.item()).toBe(0);
      expect(x0.grad!.shape).toEqual([0, 4]);
      expect(maxAbs(w0.grad!.toArraySync())).toBe(0);
    });
  });
});

describe('linearCrossEntropy: what it computes and keeps', () => {
  it('without gradients (evaluation) computes the same loss and records nothing', () => {
    const c = { n: 33, c: 6, v: 27, seed: 13, ignore: [5] };
    const { x, w, t } = data(c);
    const ref = run(c, false);
    nt.scope(() => {
      const xt = nt.tensor(x, [c.n, c.c]), wt = nt.tensor(w, [c.v, c.c]);
      xt.requiresGrad = true; wt.requiresGrad = true;
      const loss = nt.noGrad(() => nt.linearCrossEntropy(xt, wt, nt.tensor(t, [c.n]), { chunkRows: 4 }));
      expect(loss.gradFn).toBeNull();
      expect(loss.requiresGrad).toBe(false);
      expect(Math.abs(loss.item() - ref.loss)).toBeLessThan(2e-6);
    });
  });

  it('computes only the gradients asked for: a frozen weight gets none, x still its own', () => {
    const c = { n: 10, c: 4, v: 13, seed: 14 };
    const { x, w, t } = data(c);
    const ref = run(c, false);
    nt.scope(() => {
      const xt = nt.tensor(x, [c.n, c.c]), wt = nt.tensor(w, [c.v, c.c]);
      xt.requiresGrad = true;
      const loss = nt.linearCrossEntropy(xt, wt, nt.tensor(t, [c.n]), { chunkRows: 3 });
      nt.scale(loss, 1.75).backward();
      expect(wt.grad).toBeNull();
      expectClose(xt.grad!.toArraySync(), ref.dx, 1e-7, 1e-4, 'dx');
    });
  });

  it('the logits are never allocated whole: the peak stays far below [N, V] floats', () => {
    const n = 256, c = 16, v = 4000;
    nt.scope(() => {
      const x = nt.randn([n, c], { seed: 3 }), w = nt.randn([v, c], { seed: 4 });
      x.requiresGrad = true; w.requiresGrad = true;
      const t = nt.tensor(Int32Array.from({ length: n }, (_, i) => (i * 31) % v), [n]);
      const logitsBytes = 4 * n * v;   // 4 MB, beside 256 KB of weight and its gradient
      nt.resetPeakMemory();
      const before = nt.memoryStats().allocated;
      const loss = nt.linearCrossEntropy(x, w, t, { chunkRows: 16 });
      loss.backward();
      const grown = nt.memoryStats().peak - before;
      expect(grown).toBeLessThan(logitsBytes / 4);
      expect(grown).toBeGreaterThan(4 * 16 * v);   // one chunk's block did exist
      // The unfused path for comparison allocates the logits and their gradient.
      x.grad = null; w.grad = null;
      nt.resetPeakMemory();
      const before2 = nt.memoryStats().allocated;
      nt.crossEntropy(nt.linear(x, w), t).backward();
      expect(nt.memoryStats().peak - before2).toBeGreaterThan(logitsBytes);
    });
  });

  it('bf16 inputs: bf16 loss and gradients close to the f32 ones (weight gradient accumulated in f32 over chunks)', () => {
    const c = { n: 40, c: 8, v: 50, seed: 15, ignore: [3] };
    const f = run(c, true, { chunkRows: 7 }, 1);
    const h = run(c, true, { chunkRows: 7 }, 1, 'bf16');
    const u = run(c, false, {}, 1, 'bf16');
    expect(Math.abs(h.loss - f.loss)).toBeLessThan(2e-2 * Math.abs(f.loss));
    expectClose(h.dx, f.dx, 2e-2 * maxAbs(f.dx), 2e-2, 'bf16 dx vs f32');
    expectClose(h.dw, f.dw, 2e-2 * maxAbs(f.dw), 2e-2, 'bf16 dw vs f32');
    expectClose(h.dw, u.dw, 2e-2 * maxAbs(u.dw), 2e-2, 'bf16 dw vs unfused bf16');
  });

  it('a second backward through the same graph is an AutogradError (the gradients were handed over)', () => {
    nt.scope(() => {
      const x = nt.randn([4, 3], { seed: 1 }), w = nt.randn([5, 3], { seed: 2 });
      x.requiresGrad = true;
      const loss = nt.linearCrossEntropy(x, w, nt.tensor(Int32Array.from([0, 1, 2, 3]), [4]));
      loss.backward(undefined, { retainGraph: true });
      expect(x.grad).not.toBeNull();
      expect(() => loss.backward()).toThrow(nt.AutogradError);
    });
  });

  it('rejects bad arguments with typed errors', () => {
    nt.scope(() => {
      const x = nt.zeros([3, 4]), w = nt.zeros([5, 4]), t = nt.tensor(Int32Array.from([0, 1, 4]), [3]);
      expect(() => nt.linearCrossEntropy(x, w, nt.tensor(Int32Array.from([0, 5, 1]), [3]))).toThrow(/target 5 at row 1 is outside the vocabulary \[0, 5\)/);
      expect(() => nt.linearCrossEntropy(x, w, nt.tensor(Int32Array.from([0, -1, 1]), [3]))).toThrow(nt.ArgumentError);
      expect(() => nt.linearCrossEntropy(x, nt.zeros([5, 3]), t)).toThrow(nt.ShapeError);
      expect(() => nt.linearCrossEntropy(x, w, nt.tensor(Int32Array.from([0, 1]), [2]))).toThrow(nt.ShapeError);
      expect(() => nt.linearCrossEntropy(x, w, nt.zeros([3]))).toThrow(nt.DTypeError);
      expect(() => nt.linearCrossEntropy(x, w.to('bf16'), t)).toThrow(nt.DTypeError);
      expect(() => nt.linearCrossEntropy(x, w, t, { chunkRows: 0 })).toThrow(nt.ArgumentError);
      expect(() => nt.linearCrossEntropy(x, w, t, { chunkRows: 1.5 })).toThrow(nt.ArgumentError);
      expect(() => nt.linearCrossEntropy(x, w, t, { reduction: 'max' as 'sum' })).toThrow(nt.ArgumentError);
      expect(() => nt.linearCrossEntropy(x, w, t, { ignoreIndex: 0.5 })).toThrow(nt.ArgumentError);
      expect(nt.linearCrossEntropy(x, w, t).item()).toBeCloseTo(Math.log(5), 5);
    });
  });

  it('chunk rows: balanced chunks within the byte budget', () => {
    expect(linearCrossEntropyChunkRows(1024, 50257, 4)).toBe(256);
    expect(linearCrossEntropyChunkRows(10, 100, 4)).toBe(10);
    expect(linearCrossEntropyChunkRows(10, 100, 4, 4 * 100 * 3)).toBe(3);   // 4 chunks of 3, 3, 3, 1 → balanced 3
    expect(linearCrossEntropyChunkRows(5, 10 ** 9, 4)).toBe(1);
  });
});

describe('linearCrossEntropy with a bias', () => {
  function withBias(fused: boolean, dtype: 'f32' | 'bf16', chunkRows?: number) {
    const c = { n: 23, c: 6, v: 29, seed: 16, ignore: [4] };
    const { x, w, t } = data(c);
    const b = Float32Array.from(randomArray(c.v, rng(17), -2, 2));
    return nt.scope(() => {
      const xt = nt.tensor(x, [c.n, c.c]).to(dtype), wt = nt.tensor(w, [c.v, c.c]).to(dtype), bt = nt.tensor(b, [c.v]).to(dtype);
      for (const p of [xt, wt, bt]) p.requiresGrad = true;
      const tt = nt.tensor(t, [c.n]);
      const loss = fused ? nt.linearCrossEntropy(xt, wt, tt, { bias: bt, chunkRows }) : nt.crossEntropy(nt.linear(xt, wt, bt), tt);
      nt.scale(loss, 0.75).backward();
      return { loss: loss.to('f32').item(), grads: [xt, wt, bt].map((p) => p.grad!.to('f32').toArraySync()) };
    });
  }
  it('loss and the gradients of x, weight and bias equal linear(x, w, b) + crossEntropy, in chunks or not', () => {
    const ref = withBias(false, 'f32');
    for (const chunkRows of [undefined, 4, 1]) {
      const got = withBias(true, 'f32', chunkRows);
      expect(Math.abs(got.loss - ref.loss)).toBeLessThan(2e-6 * Math.abs(ref.loss));
      got.grads.forEach((g, i) => expectClose(g, ref.grads[i]!, 1e-6 * Math.max(1, maxAbs(ref.grads[i]!)), 1e-4, `grad ${i} (chunkRows ${chunkRows})`));
    }
    expect(maxAbs(ref.grads[2]!)).toBeGreaterThan(1e-3);
  });
  it('bf16: close to the f32 values (bias gradient summed in f32 over chunks)', () => {
    const ref = withBias(true, 'f32', 4), got = withBias(true, 'bf16', 4);
    expect(Math.abs(got.loss - ref.loss)).toBeLessThan(2e-2 * Math.abs(ref.loss));
    got.grads.forEach((g, i) => expectClose(g, ref.grads[i]!, 2e-2 * maxAbs(ref.grads[i]!), 2e-2, `bf16 grad ${i}`));
  });
  it('a finite-difference check of all three inputs', () => {
    const r = rng(18);
    const t = nt.tensor(Int32Array.from([1, 4, -100, 0, 2]), [5]);
    gradcheck((x, w, b) => nt.linearCrossEntropy(x!, w!, t, { bias: b!, chunkRows: 2 }),
      [{ data: randomArray(5 * 3, r), shape: [5, 3] }, { data: randomArray(6 * 3, r), shape: [6, 3] }, { data: randomArray(6, r), shape: [6] }]);
  });
  it('a bias of the wrong shape or dtype is a typed error', () => {
    nt.scope(() => {
      const x = nt.zeros([2, 3]), w = nt.zeros([4, 3]), t = nt.tensor(Int32Array.from([0, 1]), [2]);
      expect(() => nt.linearCrossEntropy(x, w, t, { bias: nt.zeros([5]) })).toThrow(nt.ShapeError);
      expect(() => nt.linearCrossEntropy(x, w, t, { bias: nt.zeros([4, 1]) })).toThrow(nt.ShapeError);
      expect(() => nt.linearCrossEntropy(x, w, t, { bias: nt.zeros([4]).to('bf16') })).toThrow(nt.DTypeError);
    });
  });
});
