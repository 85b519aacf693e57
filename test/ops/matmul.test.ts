// matmul and linear with autograd: forward against float64 references (batched, shared operands,
// transposes, vectors), gradients against finite differences, typed errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

/** float64 reference: a[batch?, ...] @ b with optional transposes; 2-D or 3-D operands. */
function refMatmul(a: Float64Array, as: number[], b: Float64Array, bs: number[], tA: boolean, tB: boolean): Float64Array {
  const batch = as.length === 3 ? as[0]! : bs.length === 3 ? bs[0]! : 1;
  const [ar, ac] = as.slice(-2) as [number, number], [br, bc] = bs.slice(-2) as [number, number];
  const m = tA ? ac : ar, k = tA ? ar : ac, n = tB ? br : bc;
  const out = new Float64Array(batch * m * n);
  for (let p = 0; p < batch; p++) {
    const ao = as.length === 3 ? p * ar * ac : 0, bo = bs.length === 3 ? p * br * bc : 0;
    for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
      let s = 0;
      for (let q = 0; q < k; q++) s += a[ao + (tA ? q * ac + i : i * ac + q)]! * b[bo + (tB ? j * bc + q : q * bc + j)]!;
      out[p * m * n + i * n + j] = s;
    }
  }
  return out;
}

const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));

describe('matmul', () => {
  const cases: [number[], number[], boolean, boolean][] = [
    [[3, 5], [5, 4], false, false],
    [[5, 3], [5, 4], true, false],
    [[3, 5], [4, 5], false, true],
    [[5, 3], [4, 5], true, true],
    [[2, 3, 5], [2, 5, 7], false, false],
    [[2, 3, 5], [5, 7], false, false],
    [[2, 3, 5], [7, 5], false, true],
    [[3, 5], [2, 5, 7], false, false],
    [[2, 5, 3], [5, 7], true, false],
  ];
  for (const [as, bs, tA, tB] of cases) {
    it(`${JSON.stringify(as)}${tA ? 'ᵀ' : ''} @ ${JSON.stringify(bs)}${tB ? 'ᵀ' : ''}`, () => {
      const r = rng(as.length * 7 + bs[0]!);
      const a = f32(randomArray(as.reduce((x, y) => x * y), r)), b = f32(randomArray(bs.reduce((x, y) => x * y), r));
      nt.scope(() => {
        const out = nt.matmul(nt.tensor(Float32Array.from(a), as), nt.tensor(Float32Array.from(b), bs), { transA: tA, transB: tB });
        expectClose(out.toArraySync(), refMatmul(a, as, b, bs, tA, tB), 1e-5, 1e-5, 'matmul');
      });
      gradcheck((x, y) => nt.matmul(x!, y!, { transA: tA, transB: tB }), [{ data: a, shape: as }, { data: b, shape: bs }]);
    });
  }
  it('vector operands and alpha', () => {
    const r = rng(11);
    const a = randomArray(5, r), b = randomArray(5 * 3, r);
    gradcheck((x, y) => nt.matmul(x!, y!, { alpha: 0.5 }), [{ data: a, shape: [5] }, { data: b, shape: [5, 3] }]);
    gradcheck((x, y) => nt.matmul(y!, x!), [{ data: a.slice(0, 3), shape: [3] }, { data: b, shape: [5, 3] }]);
  });
});

describe('linear', () => {
  it('x·Wᵀ + b on [B, T, in], with and without bias, and its gradients', () => {
    const r = rng(21);
    const x = f32(randomArray(2 * 3 * 5, r)), w = f32(randomArray(4 * 5, r)), b = f32(randomArray(4, r));
    nt.scope(() => {
      const out = nt.linear(nt.tensor(Float32Array.from(x), [2, 3, 5]), nt.tensor(Float32Array.from(w), [4, 5]), nt.tensor(Float32Array.from(b), [4]));
      expect(out.shape).toEqual([2, 3, 4]);
      const ref = refMatmul(x, [6, 5], w, [4, 5], false, true).map((v, i) => v + b[i % 4]!);
      expectClose(out.toArraySync(), ref, 1e-5, 1e-5, 'linear');
    });
    gradcheck((xx, ww, bb) => nt.linear(xx!, ww!, bb), [{ data: x, shape: [2, 3, 5] }, { data: w, shape: [4, 5] }, { data: b, shape: [4] }]);
    gradcheck((xx, ww) => xx!.linear(ww!), [{ data: x, shape: [6, 5] }, { data: w, shape: [4, 5] }]);
  });
  it('bad shapes and dtypes throw typed errors; the next op works', () => {
    const x = nt.zeros([3, 5]), w = nt.zeros([4, 6]), b = nt.zeros([5]);
    expect(() => nt.linear(x, w)).toThrow(nt.ShapeError);
    expect(() => nt.linear(x, nt.zeros([4, 5]), b)).toThrow(nt.ShapeError);
    expect(() => nt.linear(x, nt.zeros([5]))).toThrow(nt.ShapeError);
    expect(() => nt.matmul(x, w)).toThrow(nt.ShapeError);
    expect(() => nt.matmul(x, nt.zeros([5, 2], { dtype: 'bf16' }))).toThrow(nt.DTypeError);
    expect(() => nt.matmul(nt.zeros([2, 3, 5]), nt.zeros([4, 5, 2]))).toThrow(nt.ShapeError);
    expect(nt.matmul(x, nt.ones([5, 2])).shape).toEqual([3, 2]);
  });
});
