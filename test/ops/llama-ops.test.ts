// Llama's ops: silu and the fused swiglu, rotary position embeddings (rope, rotate-half layout, offsets
// and explicit positions) and grouped-query attention (attention with fewer key/value heads, and
// groupedQueryAttention in the projections' [B, T, H, D] layout), against float64 references and
// finite differences.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));
const sig = (x: number) => 1 / (1 + Math.exp(-x));

describe('silu and swiglu', () => {
  const n = 3 * 11;
  const g = f32(randomArray(n, rng(1), -6, 6)), u = f32(randomArray(n, rng(2), -2, 2));
  it('silu forward and gradient', () => {
    nt.scope(() => expectClose(nt.silu(nt.tensor(Float32Array.from(g), [3, 11])).toArraySync(), g.map((x) => x * sig(x)), 1e-6, 1e-5, 'silu'));
    gradcheck((t) => nt.silu(t!), [{ data: g, shape: [3, 11] }]);
  });
  it('swiglu forward and both gradients', () => {
    nt.scope(() => {
      const out = nt.swiglu(nt.tensor(Float32Array.from(g), [3, 11]), nt.tensor(Float32Array.from(u), [3, 11]));
      expectClose(out.toArraySync(), g.map((x, i) => x * sig(x) * u[i]!), 1e-6, 1e-5, 'swiglu');
    });
    gradcheck((a, b) => nt.swiglu(a!, b!), [{ data: g, shape: [3, 11] }, { data: u, shape: [3, 11] }]);
  });
  it('swiglu equals silu(gate)·up composed from separate ops (gradients too)', () => {
    nt.scope(() => {
      const a = nt.tensor(Float32Array.from(g), [3, 11]), b = nt.tensor(Float32Array.from(u), [3, 11]);
      a.requiresGrad = true; b.requiresGrad = true;
      nt.sum(nt.swiglu(a, b)).backward();
      const ga = a.grad!.toArraySync(), gb = b.grad!.toArraySync();
      const a2 = nt.tensor(Float32Array.from(g), [3, 11]), b2 = nt.tensor(Float32Array.from(u), [3, 11]);
      a2.requiresGrad = true; b2.requiresGrad = true;
      nt.sum(nt.mul(nt.silu(a2), b2)).backward();
      expectClose(ga, a2.grad!.toArraySync(), 1e-6, 1e-5, 'dgate');
      expectClose(gb, b2.grad!.toArraySync(), 1e-6, 1e-5, 'dup');
    });
  });
  it('bf16 swiglu rounds the f32 result once', () => {
    nt.scope(() => {
      const a = nt.tensor(Float32Array.from(g), [n]).to('bf16'), b = nt.tensor(Float32Array.from(u), [n]).to('bf16');
      const out = nt.swiglu(a, b);
      expect(out.dtype).toBe('bf16');
      const as = a.toArraySync(), bs = b.toArraySync();
      expectClose(out.toArraySync(), Array.from(as, (x, i) => x * sig(x) * bs[i]!), 1e-3, 1 / 128, 'bf16 swiglu');
      // Mixed dtypes (as under autocast) compute in f32.
      expect(nt.swiglu(a, nt.tensor(Float32Array.from(u), [n])).dtype).toBe('f32');
    });
  });
  it('bad input: shapes and dtypes', () => {
    expect(() => nt.swiglu(nt.zeros([2, 3]), nt.zeros([3, 2]))).toThrow(nt.ShapeError);
    expect(() => nt.silu(nt.zeros([2], { dtype: 'i32' }))).toThrow(nt.DTypeError);
  });
});

/** float64 rotate-half RoPE of x [B, T, H, D] at positions pos(b, t). */
function refRope(x: Float64Array, B: number, T: number, H: number, D: number, theta: number, pos: (b: number, t: number) => number): Float64Array {
  const out = new Float64Array(x.length), half = D / 2;
  for (let b = 0; b < B; b++) for (let t = 0; t < T; t++) for (let h = 0; h < H; h++) {
    const o = ((b * T + t) * H + h) * D;
    for (let i = 0; i < half; i++) {
      const ang = pos(b, t) / theta ** ((2 * i) / D);
      const x1 = x[o + i]!, x2 = x[o + i + half]!;
      out[o + i] = x1 * Math.cos(ang) - x2 * Math.sin(ang);
      out[o + i + half] = x2 * Math.cos(ang) + x1 * Math.sin(ang);
    }
  }
  return out;
}

describe('rope', () => {
  const [B, T, H, D] = [2, 5, 3, 8];
  const x = f32(randomArray(B * T * H * D, rng(3)));
  const shape = [B, T, H, D];
  it('forward against float64: default positions, an offset, theta', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      expectClose(nt.rope(t).toArraySync(), refRope(x, B, T, H, D, 10000, (_b, p) => p), 1e-6, 1e-5, 'rope');
      expectClose(nt.rope(t, { offset: 37, theta: 500000 }).toArraySync(), refRope(x, B, T, H, D, 500000, (_b, p) => p + 37), 1e-6, 1e-5, 'rope offset');
    });
  });
  it('explicit positions: [T] shared and [B, T] per row; equal to the offset form', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      const p1 = nt.tensor(Int32Array.from([9, 10, 11, 12, 13]), [T], { dtype: 'i32' });
      expect(Array.from(nt.rope(t, { positions: p1 }).toArraySync())).toEqual(Array.from(nt.rope(t, { offset: 9 }).toArraySync()));
      const pos2 = [3, 1, 4, 1, 5, 100, 200, 300, 400, 1000];
      const p2 = nt.tensor(Int32Array.from(pos2), [B, T], { dtype: 'i32' });
      expectClose(nt.rope(t, { positions: p2 }).toArraySync(), refRope(x, B, T, H, D, 10000, (b, p) => pos2[b * T + p]!), 1e-5, 1e-5, 'rope positions');
    });
  });
  it('gradient by finite differences (with an offset and with positions)', () => {
    gradcheck((t) => nt.rope(t!, { offset: 3 }), [{ data: x, shape }]);
    gradcheck((t) => nt.scope(() => nt.keep(nt.rope(t!, { positions: nt.tensor(Int32Array.from([7, 0, 2, 50, 4]), [T], { dtype: 'i32' }), theta: 100 }))), [{ data: x, shape }]);
  });
  it('is a rotation: norms kept, and bf16 rotated in f32', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), shape);
      const r = nt.rope(t, { offset: 1234 }).toArraySync();
      let a = 0, b = 0;
      for (let i = 0; i < x.length; i++) { a += x[i]! ** 2; b += r[i]! ** 2; }
      expect(Math.abs(a - b) / a).toBeLessThan(1e-5);
      const lo = t.to('bf16');
      const ref = refRope(Float64Array.from(lo.toArraySync()), B, T, H, D, 10000, (_b, p) => p);
      const got = nt.rope(lo);
      expect(got.dtype).toBe('bf16');
      expectClose(got.toArraySync(), ref, 1e-3, 1 / 128, 'bf16 rope');
    });
  });
  it('bad input: odd head dim, wrong rank, positions of the wrong shape or dtype, bad theta', () => {
    expect(() => nt.rope(nt.zeros([1, 2, 1, 3]))).toThrow(nt.ShapeError);
    expect(() => nt.rope(nt.zeros([2, 4]))).toThrow(nt.ShapeError);
    expect(() => nt.rope(nt.zeros(shape), { positions: nt.zeros([T + 1], { dtype: 'i32' }) })).toThrow(nt.ShapeError);
    expect(() => nt.rope(nt.zeros(shape), { positions: nt.zeros([T]) })).toThrow(nt.DTypeError);
    expect(() => nt.rope(nt.zeros(shape), { theta: 0 })).toThrow(nt.ArgumentError);
    expect(() => nt.rope(nt.zeros(shape), { offset: -1 })).toThrow(nt.ArgumentError);
  });
});

/** float64 causal attention for q [B, T, H, D], k, v [B, T, KV, D] (query head h reads kv head ⌊h·KV/H⌋). */
function refGqa(q: Float64Array, k: Float64Array, v: Float64Array, B: number, T: number, H: number, KV: number, D: number): Float64Array {
  const out = new Float64Array(B * T * H * D), G = H / KV, scale = 1 / Math.sqrt(D);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let i = 0; i < T; i++) {
    const j0 = Math.floor(h / G);
    const s: number[] = [];
    for (let j = 0; j <= i; j++) {
      let dot = 0;
      for (let d = 0; d < D; d++) dot += q[((b * T + i) * H + h) * D + d]! * k[((b * T + j) * KV + j0) * D + d]!;
      s.push(dot * scale);
    }
    const m = Math.max(...s), e = s.map((z) => Math.exp(z - m)), z = e.reduce((a, c) => a + c);
    for (let d = 0; d < D; d++) {
      let acc = 0;
      for (let j = 0; j <= i; j++) acc += (e[j]! / z) * v[((b * T + j) * KV + j0) * D + d]!;
      out[((b * T + i) * H + h) * D + d] = acc;
    }
  }
  return out;
}

describe('grouped-query attention', () => {
  const [B, T, H, D] = [2, 6, 4, 4];
  for (const KV of [4, 2, 1]) {
    it(`groupedQueryAttention with ${KV} kv heads for ${H} heads: forward against float64, gradients by finite differences`, () => {
      const r = rng(10 + KV);
      const q = f32(randomArray(B * T * H * D, r)), k = f32(randomArray(B * T * KV * D, r)), v = f32(randomArray(B * T * KV * D, r));
      nt.scope(() => {
        const out = nt.groupedQueryAttention(nt.tensor(Float32Array.from(q), [B, T, H, D]), nt.tensor(Float32Array.from(k), [B, T, KV, D]), nt.tensor(Float32Array.from(v), [B, T, KV, D]));
        expect(out.shape).toEqual([B, T, H, D]);
        expectClose(out.toArraySync(), refGqa(q, k, v, B, T, H, KV, D), 1e-5, 1e-4, 'gqa');
      });
      gradcheck((a, b, c) => nt.groupedQueryAttention(a!, b!, c!), [{ data: q, shape: [B, T, H, D] }, { data: k, shape: [B, T, KV, D] }, { data: v, shape: [B, T, KV, D] }]);
    });
  }
  it('attention [B, H, T, D] with shared kv heads equals attention on repeated kv heads; the shared heads get the summed gradients', () => {
    const KV = 2, G = H / KV, r = rng(20);
    const q = f32(randomArray(B * H * T * D, r)), k = f32(randomArray(B * KV * T * D, r)), v = f32(randomArray(B * KV * T * D, r));
    nt.scope(() => {
      const leaf = (a: Float64Array, s: number[]) => { const t = nt.tensor(Float32Array.from(a), s); t.requiresGrad = true; return t; };
      const q1 = leaf(q, [B, H, T, D]), k1 = leaf(k, [B, KV, T, D]), v1 = leaf(v, [B, KV, T, D]);
      const w = nt.tensor(Float32Array.from(randomArray(B * H * T * D, r)), [B, H, T, D]);
      const o1 = nt.attention(q1, k1, v1);
      nt.sum(nt.mul(o1, w)).backward();
      // The reference repeats each kv head G times with differentiable ops (unsqueeze/cat/reshape).
      const q2 = leaf(q, [B, H, T, D]), k2 = leaf(k, [B, KV, T, D]), v2 = leaf(v, [B, KV, T, D]);
      const rep = (t: nt.Tensor) => nt.cat(Array.from({ length: G }, () => nt.unsqueeze(t, 2)), 2).reshape([B, H, T, D]);
      const o2 = nt.attention(q2, rep(k2), rep(v2));
      nt.sum(nt.mul(o2, w)).backward();
      expectClose(o1.toArraySync(), o2.toArraySync(), 1e-6, 1e-5, 'out');
      expectClose(q1.grad!.toArraySync(), q2.grad!.toArraySync(), 1e-6, 1e-5, 'dq');
      expectClose(k1.grad!.toArraySync(), k2.grad!.toArraySync(), 1e-6, 1e-5, 'dk');
      expectClose(v1.grad!.toArraySync(), v2.grad!.toArraySync(), 1e-6, 1e-5, 'dv');
    });
  });
  it('bad input: kv heads that do not divide the heads', () => {
    expect(() => nt.groupedQueryAttention(nt.zeros([1, 2, 4, 2]), nt.zeros([1, 2, 3, 2]), nt.zeros([1, 2, 3, 2]))).toThrow(/3 key\/value heads must divide the 4 query heads/);
    expect(() => nt.attention(nt.zeros([1, 4, 2, 2]), nt.zeros([1, 3, 2, 2]), nt.zeros([1, 3, 2, 2]))).toThrow(nt.ShapeError);
  });
});
