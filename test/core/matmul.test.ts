// matmul on OpenBLAS against a float64 reference: 2-D, batched, broadcast, transposes, half types.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

function ref(a: Float32Array, b: Float32Array, batch: number, m: number, n: number, k: number, ta: boolean, tb: boolean, sA: number, sB: number): Float64Array {
  const out = new Float64Array(batch * m * n);
  for (let p = 0; p < batch; p++)
    for (let i = 0; i < m; i++)
      for (let j = 0; j < n; j++) {
        let s = 0;
        for (let q = 0; q < k; q++) {
          const av = a[p * sA + (ta ? q * m + i : i * k + q)]!;
          const bv = b[p * sB + (tb ? j * k + q : q * n + j)]!;
          s += av * bv;
        }
        out[p * m * n + i * n + j] = s;
      }
  return out;
}

function expectClose(got: ArrayLike<number>, want: ArrayLike<number>, tol: number): void {
  expect(got.length).toBe(want.length);
  let worst = 0;
  for (let i = 0; i < want.length; i++) worst = Math.max(worst, Math.abs(got[i]! - want[i]!) / (1 + Math.abs(want[i]!)));
  expect(worst).toBeLessThan(tol);
}

const rnd = (n: number, seed: number) => nt.randn([n], { seed }).toArraySync() as Float32Array;

describe('matmul', () => {
  const cases: [number, number, number][] = [[1, 1, 1], [3, 5, 7], [17, 1, 9], [33, 65, 31], [64, 48, 128]];
  for (const [m, n, k] of cases) {
    for (const [ta, tb] of [[false, false], [true, false], [false, true], [true, true]] as const) {
      it(`2-D ${m}x${n}x${k} transA=${ta} transB=${tb}`, () => {
        const a = rnd(m * k, m + k), b = rnd(k * n, n + 17);
        const A = nt.tensor(a, ta ? [k, m] : [m, k]);
        const B = nt.tensor(b, tb ? [n, k] : [k, n]);
        const C = nt.matmul(A, B, { transA: ta, transB: tb });
        expect(C.shape).toEqual([m, n]);
        expectClose(C.toArraySync(), ref(a, b, 1, m, n, k, ta, tb, 0, 0), 1e-5);
      });
    }
  }

  it('batched, with the right operand broadcast across the batch, and 1-D operands', () => {
    const [bt, m, n, k] = [3, 4, 5, 6];
    const a = rnd(bt * m * k, 1), b = rnd(bt * k * n, 2);
    const C = nt.matmul(nt.tensor(a, [bt, m, k]), nt.tensor(b, [bt, k, n]));
    expect(C.shape).toEqual([bt, m, n]);
    expectClose(C.toArraySync(), ref(a, b, bt, m, n, k, false, false, m * k, k * n), 1e-5);
    const w = rnd(k * n, 3);
    const D = nt.tensor(a, [bt, m, k]).matmul(nt.tensor(w, [k, n]));
    expectClose(D.toArraySync(), ref(a, w, bt, m, n, k, false, false, m * k, 0), 1e-5);
    const v = nt.matmul(nt.tensor(a.slice(0, k), [k]), nt.tensor(w, [k, n]));
    expect(v.shape).toEqual([n]);
    expectClose(v.toArraySync(), ref(a, w, 1, 1, n, k, false, false, 0, 0), 1e-5);
  });

  it('k = 0 gives zeros and empty outputs work', () => {
    const C = nt.matmul(nt.zeros([3, 0]), nt.zeros([0, 2]));
    expect(Array.from(C.toArraySync())).toEqual([0, 0, 0, 0, 0, 0]);
    expect(nt.matmul(nt.zeros([0, 4]), nt.zeros([4, 2])).shape).toEqual([0, 2]);
  });

  it('bf16 and f16 inputs are computed in f32', () => {
    const [m, n, k] = [9, 7, 33];
    const a = rnd(m * k, 5), b = rnd(k * n, 6);
    for (const dtype of ['bf16', 'f16'] as const) {
      const A = nt.tensor(a, [m, k], { dtype }), B = nt.tensor(b, [k, n], { dtype });
      const ar = A.toArraySync() as Float32Array, br = B.toArraySync() as Float32Array;
      const C = nt.matmul(A, B);
      expect(C.dtype).toBe(dtype);
      // Reference from the rounded inputs; the output rounding of the dtype is the only error left.
      expectClose(C.toArraySync(), ref(ar, br, 1, m, n, k, false, false, 0, 0), dtype === 'bf16' ? 8e-3 : 1e-3);
    }
  });
});
