// Elementwise ops: forward against float64 references with broadcasting, gradients against
// finite differences, number operands, bf16 spot checks and typed errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

/** float64 reference of a broadcasting binary op. */
function refBinary(a: Float64Array, as: number[], b: Float64Array, bs: number[], f: (x: number, y: number) => number): { data: Float64Array; shape: number[] } {
  const rank = Math.max(as.length, bs.length);
  const pa = [...Array(rank - as.length).fill(1), ...as], pb = [...Array(rank - bs.length).fill(1), ...bs];
  const shape = pa.map((d, i) => Math.max(d, pb[i]!));
  const n = shape.reduce((x, y) => x * y, 1);
  const out = new Float64Array(n);
  const idx = new Array(rank).fill(0);
  for (let i = 0; i < n; i++) {
    let rem = i;
    for (let d = rank - 1; d >= 0; d--) { idx[d] = rem % shape[d]!; rem = Math.floor(rem / shape[d]!); }
    let ia = 0, ib = 0;
    for (let d = 0; d < rank; d++) {
      ia = ia * pa[d]! + (pa[d] === 1 ? 0 : idx[d]);
      ib = ib * pb[d]! + (pb[d] === 1 ? 0 : idx[d]);
    }
    out[i] = f(a[ia]!, b[ib]!);
  }
  return { data: out, shape };
}

const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));

const cases: [number[], number[]][] = [
  [[3, 5], [3, 5]],
  [[2, 3, 7], [7]],
  [[4, 1, 3], [1, 5, 1]],
  [[5], [2, 3, 5]],
  [[2, 1], []],
  [[1, 6], [3, 1]],
];

describe('binary ops with broadcasting', () => {
  const ops = {
    add: [nt.add, (x: number, y: number) => x + y],
    sub: [nt.sub, (x: number, y: number) => x - y],
    mul: [nt.mul, (x: number, y: number) => x * y],
    div: [nt.div, (x: number, y: number) => x / y],
  } as const;
  for (const [name, [op, ref]] of Object.entries(ops)) {
    for (const [as, bs] of cases) {
      it(`${name} ${JSON.stringify(as)} with ${JSON.stringify(bs)}: forward and gradients`, () => {
        const r = rng(as.length * 31 + bs.length);
        const na = as.reduce((x, y) => x * y, 1), nb = bs.reduce((x, y) => x * y, 1);
        const a = f32(randomArray(na, r, 0.5, 2)), b = f32(randomArray(nb, r, 0.5, 2));
        nt.scope(() => {
          const out = op(nt.tensor(Float32Array.from(a), as), nt.tensor(Float32Array.from(b), bs));
          const want = refBinary(a, as, b, bs, ref);
          expect(out.shape).toEqual(want.shape);
          expectClose(out.toArraySync(), want.data, 1e-6, 1e-6, name);
        });
        gradcheck((x, y) => op(x!, y!), [{ data: a, shape: as }, { data: b, shape: bs }]);
      });
    }
  }

  it('number operands on either side', () => {
    nt.scope(() => {
      const x = nt.tensor([1, 2, 4], [3]);
      expect(Array.from(nt.add(x, 1).toArraySync())).toEqual([2, 3, 5]);
      expect(Array.from(nt.add(1, x).toArraySync())).toEqual([2, 3, 5]);
      expect(Array.from(nt.sub(x, 1).toArraySync())).toEqual([0, 1, 3]);
      expect(Array.from(nt.sub(1, x).toArraySync())).toEqual([0, -1, -3]);
      expect(Array.from(nt.mul(2, x).toArraySync())).toEqual([2, 4, 8]);
      expect(Array.from(nt.div(x, 2).toArraySync())).toEqual([0.5, 1, 2]);
      expect(Array.from(nt.div(4, x).toArraySync())).toEqual([4, 2, 1]);
      expect(Array.from(x.scale(3).toArraySync())).toEqual([3, 6, 12]);
    });
    const r = rng(5);
    const data = randomArray(7, r, 0.5, 2);
    gradcheck((x) => nt.sub(3, x!), [{ data, shape: [7] }]);
    gradcheck((x) => nt.div(3, x!), [{ data, shape: [7] }]);
    gradcheck((x) => nt.add(nt.mul(x!, 2.5), -1), [{ data, shape: [7] }]);
  });
});

describe('unary ops', () => {
  const ops: [string, (x: nt.Tensor) => nt.Tensor, (x: number) => number][] = [
    ['neg', nt.neg, (x) => -x],
    ['exp', nt.exp, Math.exp],
    ['log', nt.log, Math.log],
    ['sqrt', nt.sqrt, Math.sqrt],
    ['tanh', nt.tanh, Math.tanh],
    ['pow 3', (x) => nt.pow(x, 3), (x) => x ** 3],
    ['pow 2', (x) => x.pow(2), (x) => x ** 2],
    ['pow -0.5', (x) => nt.pow(x, -0.5), (x) => x ** -0.5],
  ];
  for (const [name, op, ref] of ops) {
    it(`${name}: forward on odd shapes and gradient`, () => {
      const r = rng(name.length);
      const data = f32(randomArray(2 * 3 * 5, r, 0.3, 2));
      nt.scope(() => {
        const out = op(nt.tensor(Float32Array.from(data), [2, 3, 5]));
        expectClose(out.toArraySync(), data.map(ref), 1e-6, 2e-6, name);
      });
      gradcheck((x) => op(x!), [{ data, shape: [2, 3, 5] }]);
    });
  }
});

describe('bf16 forward', () => {
  it('add and mul compute in f32 and round to bf16', () => {
    const r = rng(3);
    const a = randomArray(33, r), b = randomArray(33, r);
    nt.scope(() => {
      const ta = nt.tensor(Float32Array.from(a), [3, 11]).to('bf16'), tb = nt.tensor(Float32Array.from(b), [3, 11]).to('bf16');
      const sum = nt.add(ta, tb), prod = nt.mul(ta, tb);
      expect(sum.dtype).toBe('bf16');
      const ra = ta.toArraySync(), rb = tb.toArraySync();
      expectClose(sum.toArraySync(), Array.from(ra, (x, i) => x + rb[i]!), 0, 1 / 128, 'bf16 add');
      expectClose(prod.toArraySync(), Array.from(ra, (x, i) => x * rb[i]!), 0, 1 / 128, 'bf16 mul');
    });
  });
});

describe('bad input', () => {
  it('mismatched shapes, dtypes, disposed tensors and non-float inputs throw typed errors', () => {
    const a = nt.zeros([2, 3]), b = nt.zeros([4]);
    expect(() => nt.add(a, b)).toThrow(nt.ShapeError);
    expect(() => nt.mul(a, nt.zeros([3, 2]))).toThrow(nt.ShapeError);
    // f32 with bf16 promotes to f32 (PyTorch's rule); a float with an integer tensor is an error
    const h = nt.zeros([2, 3], { dtype: 'bf16' });
    expect(nt.sub(a, h).dtype).toBe('f32');
    expect(() => nt.sub(h, nt.zeros([4]))).toThrow(nt.ShapeError);
    const i = nt.zeros([2, 3], { dtype: 'i32' });
    expect(() => nt.sub(a, i)).toThrow(nt.DTypeError);
    expect(() => nt.exp(i)).toThrow(nt.DTypeError);
    const d = nt.ones([2, 3]);
    d.dispose();
    expect(() => nt.add(a, d)).toThrow(nt.DisposedError);
    expect(() => nt.add(a, NaN)).toThrow(nt.ArgumentError);
    expect(() => nt.div(a, 0)).toThrow(nt.ArgumentError);
    expect(() => nt.add(1 as never, 2 as never)).toThrow(nt.ArgumentError);
    // the process is healthy: a following op works
    expect(Array.from(nt.add(a, 1).toArraySync())).toEqual([1, 1, 1, 1, 1, 1]);
    for (const t of [a, b, h, i]) t.dispose();
  });
});
