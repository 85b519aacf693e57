// The fused ops against their unfused compositions (values and gradients, odd sizes, bf16/f16),
// finite-difference gradchecks, and the threaded cpu kernels giving the same bits on 1 and 3 threads.
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cpu } from '../../lib/native.js';
import { geluMlp } from '../../lib/internal.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

const initialThreads = cpu().kernelThreads() as number;
afterAll(() => cpu().setKernelThreads(initialThreads));

function withThreads<T>(n: number, fn: () => T): T {
  cpu().setKernelThreads(n);
  try { return fn(); } finally { cpu().setKernelThreads(initialThreads); }
}

/** A leaf of `dtype` holding seeded values in [lo, hi). */
function input(shape: number[], seed: number, dtype = 'f32', lo = -1, hi = 1): nt.Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const t = nt.tensor(Float32Array.from(randomArray(n, rng(seed), lo, hi)), shape).to(dtype);
  t.requiresGrad = true;
  return t;
}

/** Σ out·w for fixed random w of out's shape (every element matters), as f32. */
function probe(out: nt.Tensor, seed: number): nt.Tensor {
  const w = nt.tensor(Float32Array.from(randomArray(out.size, rng(seed))), [...out.shape]).to(out.dtype);
  return nt.sum(nt.mul(out, w));
}

const grads = (...ts: nt.Tensor[]) => ts.map((t) => Array.from(t.grad!.to('f32').toArraySync()));

describe('linearGelu', () => {
  /** Output and input gradients of the fused op and of gelu(linear(...)) at one shape and dtype. */
  function both(xShape: number[], outF: number, bias: boolean, dtype: string) {
    const inF = xShape[xShape.length - 1]!;
    const run = (fused: boolean) => nt.scope(() => {
      const x = input(xShape, 1, dtype), w = input([outF, inF], 2, dtype, -0.3, 0.3), b = bias ? input([outF], 3, dtype) : null;
      const y = fused ? nt.linearGelu(x, w, b) : nt.gelu(nt.linear(x, w, b));
      probe(y, 4).backward();
      return { y: Array.from(y.to('f32').toArraySync()), shape: y.shape, dtype: y.dtype, g: grads(...(b ? [x, w, b] : [x, w])) };
    });
    return { fused: run(true), plain: run(false) };
  }

  it('matches gelu(linear(x, W, b)) in values and gradients (odd sizes, with and without bias, f32)', () => {
    for (const [xShape, outF, bias] of [[[3, 5, 37], 43, true], [[7, 11], 13, false], [[300, 29], 515, true]] as [number[], number, boolean][]) {
      const { fused, plain } = both(xShape, outF, bias, 'f32');
      expect(fused.shape).toEqual(plain.shape);
      expectClose(fused.y, plain.y, 1e-6, 1e-5, `y ${xShape}`);
      fused.g.forEach((g, i) => expectClose(g, plain.g[i]!, 1e-5, 1e-4, `grad ${i} ${xShape}`));
    }
  });

  it('matches the composition on bf16 and f16 to their precision', () => {
    for (const dtype of ['bf16', 'f16']) {
      const { fused, plain } = both([4, 9, 24], 40, true, dtype);
      expect(fused.dtype).toBe(dtype);
      const tol = dtype === 'bf16' ? 2e-2 : 4e-3;
      expectClose(fused.y, plain.y, tol, tol, `${dtype} y`);
      fused.g.forEach((g, i) => expectClose(g, plain.g[i]!, 4 * tol, 4 * tol, `${dtype} grad ${i}`));
    }
  });

  it('passes a finite-difference gradcheck', () => {
    const r = rng(5);
    gradcheck((x, w, b) => nt.linearGelu(x!, w!, b!), [
      { data: randomArray(2 * 3 * 5, r), shape: [2, 3, 5] },
      { data: randomArray(7 * 5, r, -0.5, 0.5), shape: [7, 5] },
      { data: randomArray(7, r), shape: [7] },
    ]);
  });

  it('rejects bad shapes and mixed dtypes with typed errors', () => {
    nt.scope(() => {
      const x = nt.randn([2, 5]), w = nt.randn([3, 5]);
      expect(() => nt.linearGelu(x, nt.randn([3, 4]))).toThrow(nt.ShapeError);
      expect(() => nt.linearGelu(x, w, nt.randn([4]))).toThrow(nt.ShapeError);
      expect(() => nt.linearGelu(x, nt.randn([15]))).toThrow(/weight must be \[out, in\]/);
      expect(() => nt.linearGelu(x, w.to('bf16'))).toThrow(nt.DTypeError);
    });
  });
});

describe('geluMlp', () => {
  /** Output and gradients of geluMlp and of linear(linearGelu(x, w1, b1), w2, b2) at one shape and dtype. */
  function both(xShape: number[], hidden: number, outF: number, bias: boolean, dtype: string) {
    const inF = xShape[xShape.length - 1]!;
    const run = (fused: boolean) => nt.scope(() => {
      const x = input(xShape, 21, dtype), w1 = input([hidden, inF], 22, dtype, -0.3, 0.3), w2 = input([outF, hidden], 23, dtype, -0.3, 0.3);
      const b1 = bias ? input([hidden], 24, dtype) : null, b2 = bias ? input([outF], 25, dtype) : null;
      const y = fused ? geluMlp(x, w1, b1, w2, b2) : nt.linear(nt.linearGelu(x, w1, b1), w2, b2);
      probe(y, 26).backward();
      return { y: Array.from(y.to('f32').toArraySync()), shape: y.shape, dtype: y.dtype, g: grads(...(bias ? [x, w1, b1!, w2, b2!] : [x, w1, w2])) };
    });
    return { fused: run(true), plain: run(false) };
  }

  it('gives the bits of linear(linearGelu(x, W1, b1), W2, b2) on cpu (same GEMMs and kernels), with and without biases', () => {
    for (const [xShape, hidden, outF, bias] of [[[3, 5, 37], 43, 19, true], [[7, 11], 13, 5, false], [[2, 150, 29], 96, 29, true]] as [number[], number, number, boolean][]) {
      const { fused, plain } = both(xShape, hidden, outF, bias, 'f32');
      expect(fused.shape).toEqual(plain.shape);
      expect(fused.y).toEqual(plain.y);
      expect(fused.g.length).toBe(bias ? 5 : 3);
      fused.g.forEach((g, i) => expect(g, `grad ${i} ${xShape}`).toEqual(plain.g[i]!));
    }
  });

  it('matches the composition on bf16 and keeps the dtype', () => {
    const { fused, plain } = both([4, 9, 24], 40, 24, true, 'bf16');
    expect(fused.dtype).toBe('bf16');
    expectClose(fused.y, plain.y, 2e-2, 2e-2, 'bf16 y');
    fused.g.forEach((g, i) => expectClose(g, plain.g[i]!, 8e-2, 8e-2, `bf16 grad ${i}`));
  });

  it('passes a finite-difference gradcheck (every input)', () => {
    const r = rng(27);
    gradcheck((x, w1, b1, w2, b2) => geluMlp(x!, w1!, b1!, w2!, b2!), [
      { data: randomArray(2 * 3 * 5, r), shape: [2, 3, 5] },
      { data: randomArray(8 * 5, r, -0.5, 0.5), shape: [8, 5] },
      { data: randomArray(8, r), shape: [8] },
      { data: randomArray(4 * 8, r, -0.5, 0.5), shape: [4, 8] },
      { data: randomArray(4, r), shape: [4] },
    ]);
  });

  it('only the inputs that want a gradient get one', () => {
    nt.scope(() => {
      const x = input([6, 5], 31), w1 = input([8, 5], 32), w2 = input([3, 8], 33);
      const b1 = nt.randn([8]), b2 = nt.randn([3]);
      x.requiresGrad = false;
      probe(geluMlp(x, w1, b1, w2, b2), 34).backward();
      expect(x.grad).toBeNull();
      expect(b1.grad).toBeNull();
      expect(b2.grad).toBeNull();
      expect(w1.grad!.shape).toEqual([8, 5]);
      expect(w2.grad!.shape).toEqual([3, 8]);
    });
  });

  it('rejects bad shapes and mixed dtypes with typed errors', () => {
    nt.scope(() => {
      const x = nt.randn([2, 5]), w1 = nt.randn([8, 5]), w2 = nt.randn([3, 8]);
      expect(() => geluMlp(x, w1, null, nt.randn([3, 7]), null)).toThrow(/w2 must be \[out, 8\]/);
      expect(() => geluMlp(x, w1, null, w2, nt.randn([4]))).toThrow(nt.ShapeError);
      expect(() => geluMlp(x, w1, nt.randn([7]), w2, null)).toThrow(nt.ShapeError);
      expect(() => geluMlp(x, w1, null, w2.to('bf16'), null)).toThrow(nt.DTypeError);
    });
  });
});

describe('addLayerNorm', () => {
  function both(shape: number[], bias: boolean, dtype: string) {
    const cols = shape[shape.length - 1]!;
    const run = (fused: boolean) => nt.scope(() => {
      const x = input(shape, 11, dtype, -3, 3), r = input(shape, 12, dtype), w = input([cols], 13, dtype, 0.5, 1.5);
      const b = bias ? input([cols], 14, dtype) : null;
      let sum: nt.Tensor, out: nt.Tensor;
      if (fused) ({ sum, out } = nt.addLayerNorm(x, r, w, b));
      else { sum = nt.add(x, r); out = nt.layerNorm(sum, w, b); }
      // Both outputs feed the loss, as in a block (the sum goes on down the residual stream).
      nt.add(probe(sum, 15), probe(out, 16)).backward();
      return { sum: Array.from(sum.to('f32').toArraySync()), out: Array.from(out.to('f32').toArraySync()), g: grads(...(b ? [x, r, w, b] : [x, r, w])) };
    });
    return { fused: run(true), plain: run(false) };
  }

  it('matches add then layerNorm bit for bit (f32, bf16, f16; odd sizes; row split over threads)', () => {
    for (const dtype of ['f32', 'bf16', 'f16']) {
      for (const [shape, bias] of [[[3, 5, 37], true], [[9, 130], false], [[700, 333], true]] as [number[], boolean][]) {
        const { fused, plain } = both(shape, bias, dtype);
        expect(fused.sum, `${dtype} sum ${shape}`).toEqual(plain.sum);
        expect(fused.out, `${dtype} out ${shape}`).toEqual(plain.out);
        fused.g.forEach((g, i) => expectClose(g, plain.g[i]!, 1e-6, 1e-5, `${dtype} grad ${i} ${shape}`));
      }
    }
  });

  it('matches float64 LayerNorm of the sum', () => {
    const rows = 5, cols = 19, r = rng(21);
    const xd = randomArray(rows * cols, r, -2, 2), rd = randomArray(rows * cols, r), wd = randomArray(cols, r), bd = randomArray(cols, r);
    nt.scope(() => {
      const f = (d: Float64Array, s: number[]) => nt.tensor(Float32Array.from(d), s);
      const { sum, out } = nt.addLayerNorm(f(xd, [rows, cols]), f(rd, [rows, cols]), f(wd, [cols]), f(bd, [cols]));
      const s32 = Float32Array.from(xd, (v, i) => Math.fround(Math.fround(v) + Math.fround(rd[i]!)));
      expect(Array.from(sum.toArraySync())).toEqual(Array.from(s32));
      const want = new Float64Array(rows * cols);
      for (let i = 0; i < rows; i++) {
        const row = Float64Array.from(s32.subarray(i * cols, (i + 1) * cols));
        const m = row.reduce((a, v) => a + v, 0) / cols;
        const v = row.reduce((a, x) => a + (x - m) ** 2, 0) / cols;
        row.forEach((x, j) => { want[i * cols + j] = ((x - m) / Math.sqrt(v + 1e-5)) * Math.fround(wd[j]!) + Math.fround(bd[j]!); });
      }
      expectClose(out.toArraySync(), want, 1e-5, 1e-5, 'out');
    });
  });

  it('passes a finite-difference gradcheck through both outputs', () => {
    const r = rng(31);
    gradcheck((x, res, w, b) => {
      const { sum, out } = nt.addLayerNorm(x!, res!, w!, b!);
      return nt.add(nt.mul(sum, 0.5), out);
    }, [
      { data: randomArray(3 * 7, r, -2, 2), shape: [3, 7] },
      { data: randomArray(3 * 7, r), shape: [3, 7] },
      { data: randomArray(7, r, 0.5, 1.5), shape: [7] },
      { data: randomArray(7, r), shape: [7] },
    ]);
  });

  it('rejects mismatched shapes and dtypes with typed errors', () => {
    nt.scope(() => {
      const x = nt.randn([4, 6]), w = nt.ones([6]);
      expect(() => nt.addLayerNorm(x, nt.randn([4, 5]), w)).toThrow(nt.ShapeError);
      expect(() => nt.addLayerNorm(x, nt.randn([1, 6]), w)).toThrow(/must have one shape/);
      expect(() => nt.addLayerNorm(x, x.to('bf16'), w)).toThrow(nt.DTypeError);
      expect(() => nt.addLayerNorm(x, x, nt.ones([5]))).toThrow(nt.ShapeError);
    });
  });
});

describe('attentionPacked', () => {
  /** The composition the GPT block used: split qkv into heads, attention, merge the heads. */
  function unpacked(qkv: nt.Tensor, heads: number, opts: nt.AttentionOptions): nt.Tensor {
    const [b, t, w] = qkv.shape as [number, number, number];
    const d = w / (3 * heads);
    const [q, k, v] = qkv.reshape([b, t, 3, heads, d]).permute([2, 0, 3, 1, 4]).chunk(3, 0).map((h) => h.reshape([b, heads, t, d]));
    return nt.attention(q!, k!, v!, opts).permute([0, 2, 1, 3]).reshape([b, t, heads * d]);
  }

  it('matches split, attention and merge bit for bit, values and gradients (f32, bf16; causal, window, non-causal)', () => {
    for (const dtype of ['f32', 'bf16']) {
      for (const [shape, heads, opts] of [[[2, 7, 3 * 3 * 5], 3, { causal: true }], [[3, 13, 3 * 2 * 8], 2, { causal: true, window: 4 }],
        [[1, 9, 3 * 4 * 3], 4, { causal: false, scale: 0.7 }], [[2, 67, 3 * 5 * 16], 5, {}]] as [number[], number, nt.AttentionOptions][]) {
        const run = (packed: boolean) => nt.scope(() => {
          const qkv = input(shape, 71, dtype, -2, 2);
          const y = packed ? nt.attentionPacked(qkv, heads, opts) : unpacked(qkv, heads, opts);
          probe(y, 72).backward();
          return { y: Array.from(y.to('f32').toArraySync()), shape: y.shape, g: grads(qkv)[0]! };
        });
        const a = run(true), b = run(false);
        expect(a.shape).toEqual(b.shape);
        expect(a.y, `${dtype} ${shape} y`).toEqual(b.y);
        expect(a.g, `${dtype} ${shape} grad`).toEqual(b.g);
      }
    }
  });

  it('passes a finite-difference gradcheck', () => {
    gradcheck((qkv) => nt.attentionPacked(qkv!, 2, { causal: true }), [{ data: randomArray(2 * 5 * 12, rng(73), -1, 1), shape: [2, 5, 12] }]);
  });

  it('rejects a qkv that does not split into the heads', () => {
    nt.scope(() => {
      expect(() => nt.attentionPacked(nt.randn([2, 5, 12]), 5)).toThrow(nt.ShapeError);
      expect(() => nt.attentionPacked(nt.randn([10, 12]), 2)).toThrow(/\[B, T, 3·heads·D\]/);
      expect(() => nt.attentionPacked(nt.randn([2, 5, 12]), 0)).toThrow(nt.ArgumentError);
      expect(() => nt.attentionPacked(nt.randn([2, 5, 12]), 2, { window: -1 })).toThrow(/attentionPacked: window/);
    });
  });
});

describe('threaded cpu kernels', () => {
  it('give the same bits on 1 and 3 threads (norms, bias+GELU, adds, embedding backward, small batched GEMMs, AdamW)', () => {
    const run = () => nt.scope(() => {
      const rows = 517, cols = 389;
      const x = input([rows, cols], 41, 'f32', -2, 2), res = input([rows, cols], 42), w = input([cols], 43), b = input([cols], 44);
      const { sum, out } = nt.addLayerNorm(x, res, w, b);
      const wl = input([401, cols], 45, 'f32', -0.1, 0.1), bl = input([401], 46);
      const h = nt.linearGelu(out, wl, bl);
      // Attention's batched GEMMs are small enough to run one per pool thread.
      const q = input([3, 5, 67, 16], 47), k = input([3, 5, 67, 16], 48), v = input([3, 5, 67, 16], 49);
      const att = nt.attention(q, k, v);
      const table = input([1000, 96], 50);
      const ids = nt.tensor(Int32Array.from({ length: 4000 }, (_, i) => (i * 7919) % 1000), [4000]);
      const emb = nt.embedding(ids, table);
      const loss = nt.add(nt.add(probe(h, 51), probe(sum, 52)), nt.add(probe(att, 53), probe(emb, 54)));
      loss.backward();
      const opt = new nt.optim.AdamW([wl, table], { lr: 1e-2 });
      opt.step();
      const out32 = [h, sum, out, att, emb].map((t) => Array.from(t.toArraySync()));
      const result = { out32, g: grads(x, res, w, b, wl, bl, q, k, v, table), p: [wl, table].map((t) => Array.from(t.toArraySync())) };
      opt.dispose();
      return result;
    });
    const one = withThreads(1, run), three = withThreads(3, run);
    one.out32.forEach((o, i) => expect(three.out32[i], `output ${i}`).toEqual(o));
    one.g.forEach((g, i) => expect(three.g[i], `gradient ${i}`).toEqual(g));
    one.p.forEach((p, i) => expect(three.p[i], `parameter ${i} after AdamW`).toEqual(p));
  });

  it('AdamW over a large parameter matches a float64 reference of the update', () => {
    const n = 100_003, r = rng(61);
    const p0 = Float32Array.from(randomArray(n, r)), g0 = Float32Array.from(randomArray(n, r));
    nt.scope(() => {
      const p = nt.tensor(Float32Array.from(p0), [n]);
      p.requiresGrad = true;
      p.grad = nt.tensor(Float32Array.from(g0), [n]);
      const opt = new nt.optim.AdamW([p], { lr: 1e-2, betas: [0.9, 0.95], eps: 1e-8, weightDecay: 0.1 });
      opt.step();
      opt.step();
      const got = p.toArraySync();
      const want = new Float64Array(n);
      for (let i = 0; i < n; i++) {
        let pp = p0[i]!, m = 0, v = 0;
        for (let t = 1; t <= 2; t++) {
          m = 0.9 * m + 0.1 * g0[i]!;
          v = 0.95 * v + 0.05 * g0[i]! ** 2;
          pp = pp * (1 - 1e-2 * 0.1) - (1e-2 / (1 - 0.9 ** t)) * m / (Math.sqrt(v / (1 - 0.95 ** t)) + 1e-8);
        }
        want[i] = pp;
      }
      expectClose(got, want, 1e-6, 1e-5, 'adamw');
      opt.dispose();
    });
  });
});
