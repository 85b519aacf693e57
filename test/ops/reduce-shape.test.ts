// Reductions and shape ops: forward against float64/index references, gradients against finite
// differences, odd shapes, typed errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));

/** Reference reduction over dim of a row-major array. */
function refReduce(x: Float64Array, shape: number[], dim: number, f: (vals: number[]) => number): Float64Array {
  const outer = shape.slice(0, dim).reduce((a, b) => a * b, 1), red = shape[dim]!, inner = shape.slice(dim + 1).reduce((a, b) => a * b, 1);
  const out = new Float64Array(outer * inner);
  for (let o = 0; o < outer; o++) for (let i = 0; i < inner; i++) {
    const vals: number[] = [];
    for (let r = 0; r < red; r++) vals.push(x[(o * red + r) * inner + i]!);
    out[o * inner + i] = f(vals);
  }
  return out;
}
const sumF = (v: number[]) => v.reduce((a, b) => a + b, 0);

describe('reductions', () => {
  const shape = [3, 4, 5];
  const x = f32(randomArray(60, rng(1)));
  // max is not differentiable at ties: its gradient check uses values at least 0.05 apart
  const r = rng(4);
  const distinct = f32(Float64Array.from(Array.from({ length: 60 }, (_, i) => i * 0.05 - 1.5).sort(() => r() - 0.5)));
  for (const dim of [0, 1, 2, -1]) {
    it(`sum/mean/max over dim ${dim} (keepdim both ways) and gradients`, () => {
      const d = dim < 0 ? dim + 3 : dim;
      nt.scope(() => {
        const t = nt.tensor(Float32Array.from(x), shape);
        expectClose(nt.sum(t, dim).toArraySync(), refReduce(x, shape, d, sumF), 1e-5, 1e-5, 'sum');
        expectClose(t.mean(dim).toArraySync(), refReduce(x, shape, d, (v) => sumF(v) / v.length), 1e-6, 1e-5, 'mean');
        expectClose(nt.max(t, dim).toArraySync(), refReduce(x, shape, d, (v) => Math.max(...v)), 0, 0, 'max');
        expect(nt.sum(t, dim, { keepdim: true }).shape).toEqual(shape.map((s, i) => (i === d ? 1 : s)));
        expect(nt.sum(t, dim).shape).toEqual(shape.filter((_, i) => i !== d));
      });
      gradcheck((t) => nt.sum(t!, dim), [{ data: x, shape }]);
      gradcheck((t) => nt.mean(t!, dim, { keepdim: true }), [{ data: x, shape }]);
      gradcheck((t) => nt.max(t!, dim), [{ data: distinct, shape }]);
    });
  }
  it('full reductions', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      expect(nt.sum(t).shape).toEqual([]);
      expect(nt.sum(t).item()).toBeCloseTo(sumF(Array.from(x)), 4);
      expect(nt.mean(t).item()).toBeCloseTo(sumF(Array.from(x)) / 60, 5);
      expect(nt.max(t).item()).toBe(Math.max(...x));
    });
    gradcheck((t) => nt.mean(t!), [{ data: x, shape }]);
    gradcheck((t) => nt.max(t!), [{ data: distinct, shape }]);
  });
  it('bad dims throw ArgumentError', () => {
    const t = nt.zeros([2, 3]);
    expect(() => nt.sum(t, 2)).toThrow(nt.ArgumentError);
    expect(() => nt.max(t, -3)).toThrow(nt.ArgumentError);
    expect(() => nt.max(nt.zeros([2, 0]), 1)).toThrow(nt.ShapeError);
    expect(nt.sum(t).item()).toBe(0);
  });
});

/** Reference permute of a row-major array. */
function refPermute(x: Float64Array, shape: number[], dims: number[]): Float64Array {
  const outShape = dims.map((d) => shape[d]!);
  const strides = shape.map((_, i) => shape.slice(i + 1).reduce((a, b) => a * b, 1));
  const out = new Float64Array(x.length);
  const idx = new Array(shape.length).fill(0);
  for (let i = 0; i < x.length; i++) {
    let rem = i;
    for (let d = outShape.length - 1; d >= 0; d--) { idx[d] = rem % outShape[d]!; rem = Math.floor(rem / outShape[d]!); }
    let src = 0;
    dims.forEach((d, k) => { src += idx[k] * strides[d]!; });
    out[i] = x[src]!;
  }
  return out;
}

describe('f16 mean', () => {
  it('sums in f32: the mean of 2^20 ones is 1, not Infinity (the f16 sum would pass 65504), over everything and over a dim', () => {
    nt.scope(() => {
      const ones = nt.ones([1024, 1024], { dtype: 'f16' });
      expect(Array.from(nt.mean(ones).toArraySync())).toEqual([1]);
      expect(Array.from(nt.mean(ones.reshape([1, 1 << 20]), 1).toArraySync())).toEqual([1]);
      expect(nt.mean(ones).dtype).toBe('f16');
      // the sum itself still overflows in f16, as an f16 sum must
      expect(nt.sum(ones).toArraySync()[0]).toBe(Infinity);
    });
  });
  it('its gradient stays 1/n in f16', () => {
    nt.scope(() => {
      const x = nt.ones([4, 8], { dtype: 'f16', requiresGrad: true });
      nt.mean(x).backward();
      expect(Array.from(x.grad!.toArraySync())).toEqual(new Array(32).fill(1 / 32));
    });
  });
});

describe('shape ops', () => {
  const shape = [2, 3, 5];
  const x = f32(randomArray(30, rng(2)));
  it('permute and transpose', () => {
    for (const dims of [[2, 0, 1], [1, 0, 2], [0, 2, 1]]) {
      nt.scope(() => {
        const out = nt.permute(nt.tensor(Float32Array.from(x), shape), dims);
        expect(out.shape).toEqual(dims.map((d) => shape[d]));
        expectClose(out.toArraySync(), refPermute(x, shape, dims), 0, 0, 'permute');
      });
      gradcheck((t) => t!.permute(dims), [{ data: x, shape }]);
    }
    nt.scope(() => {
      const out = nt.tensor(Float32Array.from(x), shape).transpose(0, -1);
      expectClose(out.toArraySync(), refPermute(x, shape, [2, 1, 0]), 0, 0, 'transpose');
    });
  });
  it('slice, split, chunk, cat round trip with gradients', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      const s = nt.slice(t, 2, 1, 4);
      expect(s.shape).toEqual([2, 3, 3]);
      const want: number[] = [];
      for (let a = 0; a < 6; a++) for (let c = 1; c < 4; c++) want.push(x[a * 5 + c]!);
      expectClose(s.toArraySync(), want, 0, 0, 'slice');
      expect(nt.slice(t, -1, -2).shape).toEqual([2, 3, 2]);
      const parts = nt.split(t, [1, 2], 1);
      expect(parts.map((p) => p.shape)).toEqual([[2, 1, 5], [2, 2, 5]]);
      expect(t.chunk(2, 2).map((p) => p.shape[2])).toEqual([3, 2]);
      const back = nt.cat(parts, 1);
      expectClose(back.toArraySync(), x, 0, 0, 'cat(split)');
    });
    gradcheck((t) => nt.slice(t!, 1, 1, 3), [{ data: x, shape }]);
    gradcheck((t) => nt.cat(nt.split(t!, 2, 2).reverse(), 2), [{ data: x, shape }]);
    gradcheck((a, b) => nt.cat([a!, b!], 0), [{ data: x, shape }, { data: x.slice(0, 15), shape: [1, 3, 5] }]);
  });
  it('reshape/view/squeeze/unsqueeze share storage and carry gradients', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      expect(t.reshape([6, -1]).shape).toEqual([6, 5]);
      expect(t.view([30]).shape).toEqual([30]);
      expect(t.unsqueeze(1).shape).toEqual([2, 1, 3, 5]);
      expect(t.unsqueeze(-1).shape).toEqual([2, 3, 5, 1]);
      expect(t.unsqueeze(0).squeeze().shape).toEqual([2, 3, 5]);
      expect(nt.squeeze(t.unsqueeze(0), 0).shape).toEqual([2, 3, 5]);
    });
    gradcheck((t) => nt.mul(t!.reshape([5, 6]), t!.reshape([5, 6])), [{ data: x, shape }]);
  });
  it('bad shapes throw typed errors', () => {
    const t = nt.zeros([2, 3]);
    expect(() => nt.cat([t, nt.zeros([3, 3])], 1)).toThrow(nt.ShapeError);
    expect(() => nt.cat([t, nt.zeros([2, 3], { dtype: 'bf16' })])).toThrow(nt.DTypeError);
    expect(() => nt.cat([])).toThrow(nt.ArgumentError);
    expect(() => nt.permute(t, [0])).toThrow(nt.ShapeError);
    expect(() => nt.permute(t, [0, 0])).toThrow(nt.ArgumentError);
    expect(() => nt.split(t, [1, 3], 0)).toThrow(nt.ShapeError);
    expect(() => t.reshape([4, 2])).toThrow(nt.ShapeError);
    expect(() => nt.slice(t, 5, 0)).toThrow(nt.ArgumentError);
    expect(nt.cat([t, t]).shape).toEqual([4, 3]);
  });
});
