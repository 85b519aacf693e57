// Every binary op code of native/core/op_codes.h (lib/kernel-codes.ts), sent straight to the binary
// kernel: add, sub, mul, div, max, min (fmax/fmin) and pow (a tensor exponent), with broadcasting,
// against float64 references of the same (f32- or bf16-rounded) inputs; on cuda (when there is a
// GPU) against the cpu kernel. Both backends accept exactly these codes.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import type { Tensor } from '../../lib/index.js';
import { BINARY } from '../../lib/kernel-codes.js';
import { cpu, cuda } from '../../lib/native.js';

const DTYPE_CODE = { f32: 0, bf16: 2 } as const;
const REF: Record<keyof typeof BINARY, (x: number, y: number) => number> = {
  add: (x, y) => x + y,
  sub: (x, y) => x - y,
  mul: (x, y) => x * y,
  div: (x, y) => x / y,
  // fmax/fmin: a NaN operand yields the other operand
  max: (x, y) => (Number.isNaN(x) ? y : Number.isNaN(y) ? x : Math.max(x, y)),
  min: (x, y) => (Number.isNaN(x) ? y : Number.isNaN(y) ? x : Math.min(x, y)),
  // C's pow: pow(1, y) = 1 and pow(-1, ±inf) = 1 for every y, NaN included (JavaScript's Math.pow gives NaN)
  pow: (x, y) => (x === 1 || (x === -1 && !Number.isFinite(y) && !Number.isNaN(y)) ? 1 : Math.pow(x, y)),
};

/** Broadcast strides of `shape` (right-aligned) against `out`: 0 on a broadcast or missing dim. */
function stridesIn(shape: number[], out: number[]): Int32Array {
  const s = new Int32Array(out.length);
  let step = 1;
  for (let i = out.length - 1, d = shape.length - 1; i >= 0; i--, d--) {
    if (d < 0 || shape[d] === 1) s[i] = 0;
    else { s[i] = step; step *= shape[d]!; }
  }
  return s;
}

function binaryKernel(op: number, a: Tensor, b: Tensor, outShape: number[], device: 'cpu' | 'cuda'): Float64Array {
  const A = a.to(device), B = b.to(device);
  const out = nt.zeros(outShape, { dtype: a.dtype, device });
  (device === 'cpu' ? cpu() : cuda()).binary(op, A.storage, B.storage, out.storage, DTYPE_CODE[a.dtype as 'f32' | 'bf16'], new Int32Array(outShape),
    stridesIn(a.shape as number[], outShape), stridesIn(b.shape as number[], outShape));
  return Float64Array.from(out.to('cpu').toArraySync() as ArrayLike<number>, Number);
}

/** float64 reference of out[idx] = f(a[...], b[...]) over the broadcast of the two shapes. */
function reference(f: (x: number, y: number) => number, a: Float64Array, as: number[], b: Float64Array, bs: number[], out: number[]): Float64Array {
  const sa = stridesIn(as, out), sb = stridesIn(bs, out);
  const n = out.reduce((x, y) => x * y, 1);
  const r = new Float64Array(n);
  for (let i = 0; i < n; i++) {
    let rem = i, ia = 0, ib = 0;
    for (let d = out.length - 1; d >= 0; d--) { const c = rem % out[d]!; rem = Math.floor(rem / out[d]!); ia += c * sa[d]!; ib += c * sb[d]!; }
    r[i] = f(a[ia]!, b[ib]!);
  }
  return r;
}

/** Relative error after one rounding to the dtype: f32 2^-24, bf16 2^-8 (with slack for powf's ulps). */
const TOL = { f32: 4e-7, bf16: 8e-3 } as const;
function expectRounded(got: Float64Array, want: Float64Array, tol: number, what: string): void {
  expect(got.length).toBe(want.length);
  for (let i = 0; i < want.length; i++) {
    const w = want[i]!, g = got[i]!;
    if (Number.isNaN(w)) { expect(g, `${what} [${i}]`).toBeNaN(); continue; }
    expect(Math.abs(g - w), `${what} [${i}]: got ${g}, want ${w}`).toBeLessThanOrEqual(tol * Math.abs(w) + 1e-30);
  }
}

const SHAPES: [number[], number[], number[]][] = [
  [[3, 5], [3, 5], [3, 5]],
  [[2, 3, 7], [7], [2, 3, 7]],
  [[4, 1, 3], [1, 5, 1], [4, 5, 3]],
  [[2, 1], [], [2, 1]],
];

function inputs(as: number[], bs: number[], dtype: 'f32' | 'bf16', positiveBase: boolean, seed: number): [Tensor, Tensor] {
  const a0 = nt.randn(as, { seed, dtype }), b = nt.randn(bs, { seed: seed + 1, dtype });
  // pow: positive bases (|a| + 0.25), so every result is finite and real
  const a = positiveBase ? nt.add(nt.sqrt(nt.mul(a0, a0)), 0.25) : a0;
  return [a, b];
}

describe('binary kernel: every op code of op_codes.h', () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    for (const [name, op] of Object.entries(BINARY) as [keyof typeof BINARY, number][]) {
      it(`${name} ${dtype} with broadcasting against float64`, () => {
        SHAPES.forEach(([as, bs, out], k) => {
          const [a, b] = inputs(as, bs, dtype, name === 'pow', 10 + 2 * k);
          const av = Float64Array.from(a.toArraySync() as ArrayLike<number>, Number), bv = Float64Array.from(b.toArraySync() as ArrayLike<number>, Number);
          const want = reference(REF[name], av, as, bv, bs, out);
          expectRounded(binaryKernel(op, a, b, out, 'cpu'), want, name === 'max' || name === 'min' ? 0 : TOL[dtype], `${name} ${dtype} ${as}~${bs}`);
        });
      });
    }
  }

  it('max/min ignore a NaN operand, pow follows powf on negative bases and special exponents', () => {
    const a = nt.tensor(Float32Array.from([NaN, 1, -2, -2, 0, 4, -0.5]), [7]);
    const b = nt.tensor(Float32Array.from([3, NaN, 3, 0.5, 0, -0.5, 2]), [7]);
    const at = Float64Array.from(a.toArraySync() as ArrayLike<number>, Number), bt = Float64Array.from(b.toArraySync() as ArrayLike<number>, Number);
    for (const name of ['max', 'min', 'pow'] as const) {
      const got = binaryKernel(BINARY[name], a, b, [7], 'cpu');
      expectRounded(got, reference(REF[name], at, [7], bt, [7], [7]), 0, name);
    }
    expect([...binaryKernel(BINARY.pow, a, b, [7], 'cpu')].slice(2, 4).map(String)).toEqual(['-8', 'NaN']);
  });

  it('a code past the list is refused by the kernel with an ArgumentError', () => {
    const a = nt.ones([4]);
    expect(() => binaryKernel(Object.keys(BINARY).length, a, a, [4], 'cpu')).toThrow(nt.ArgumentError);
    expect(() => binaryKernel(-1, a, a, [4], 'cpu')).toThrow(/binary: unknown op -1/);
  });
});

const hasGpu = nt.cuda.isAvailable();
describe.skipIf(!hasGpu)(`binary kernel on cuda matches cpu for every op code${hasGpu ? '' : ' (skipped: no usable GPU)'}`, () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    it(`all ops ${dtype}`, () => {
      for (const [name, op] of Object.entries(BINARY) as [keyof typeof BINARY, number][]) {
        SHAPES.forEach(([as, bs, out], k) => {
          const [a, b] = inputs(as, bs, dtype, name === 'pow', 30 + 2 * k);
          const onCpu = binaryKernel(op, a, b, out, 'cpu');
          // powf/expf differ by an ulp between the host and device libraries; the others are exact
          expectRounded(binaryKernel(op, a, b, out, 'cuda'), onCpu, name === 'pow' ? TOL[dtype] : 0, `${name} ${dtype} cuda`);
        });
      }
    });
  }
  it('cuda refuses a code past the list as the cpu does', () => {
    const a = nt.ones([4]);
    expect(() => binaryKernel(Object.keys(BINARY).length, a, a, [4], 'cuda')).toThrow(/binary: unknown op 7/);
  });
});
