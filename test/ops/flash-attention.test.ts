// Flash attention (flash_attention_forward/backward behind nt.attention and nt.attentionPacked) on the
// cpu backend: forward and gradients against a float64 reference and against the materializing path
// (T×T probabilities), causal / sliding-window / non-causal masks, fewer queries than keys, odd T,
// head dims 32/64/128, f32/bf16/f16, [B, H, T, D] and packed QKV layouts; finite differences; the
// same bits on 1 and 3 threads; the kernels' argument checks; and memory that does not grow with T².
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cpu } from '../../lib/native.js';
import { attentionMaterialized } from '../../lib/ops/attention.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

const initialThreads = cpu().kernelThreads() as number;
afterAll(() => cpu().setKernelThreads(initialThreads));

type Mask = { causal: boolean; window: number };

/**
 * float64 attention for q [B, H, T, D], k/v [B, H, Tk, D] (flat arrays) and its gradients for the
 * output gradient g: query i sees key j iff (!causal || j <= i + Tk − T) and (window == 0 || j > i + Tk − T − window).
 */
function reference(q: Float64Array, k: Float64Array, v: Float64Array, g: Float64Array, B: number, H: number, T: number, Tk: number, D: number,
  { causal, window }: Mask, scale: number) {
  const out = new Float64Array(B * H * T * D), dq = new Float64Array(q.length), dk = new Float64Array(k.length), dv = new Float64Array(v.length);
  const shift = Tk - T;
  for (let bh = 0; bh < B * H; bh++) {
    const qo = bh * T * D, ko = bh * Tk * D;
    for (let i = 0; i < T; i++) {
      const vis = (j: number) => (!causal || j <= i + shift) && (window === 0 || j > i + shift - window);
      const s = new Float64Array(Tk).fill(-Infinity);
      let mx = -Infinity;
      for (let j = 0; j < Tk; j++) {
        if (!vis(j)) continue;
        let d = 0;
        for (let c = 0; c < D; c++) d += q[qo + i * D + c]! * k[ko + j * D + c]!;
        s[j] = d * scale;
        mx = Math.max(mx, s[j]!);
      }
      if (mx === -Infinity) continue;  // sees no key: output 0, no gradient
      const p = new Float64Array(Tk);
      let sum = 0;
      for (let j = 0; j < Tk; j++) { p[j] = vis(j) ? Math.exp(s[j]! - mx) : 0; sum += p[j]!; }
      for (let j = 0; j < Tk; j++) p[j]! /= sum;
      for (let j = 0; j < Tk; j++) for (let c = 0; c < D; c++) out[qo + i * D + c] += p[j]! * v[ko + j * D + c]!;
      // dP_j = g_i·v_j; dS_j = P_j (dP_j − Σ P dP); dq_i += scale Σ dS_j k_j; dk_j += scale dS_j q_i; dv_j += P_j g_i.
      const dp = new Float64Array(Tk);
      let dot = 0;
      for (let j = 0; j < Tk; j++) {
        if (!p[j]) continue;
        for (let c = 0; c < D; c++) dp[j] += g[qo + i * D + c]! * v[ko + j * D + c]!;
        dot += p[j]! * dp[j]!;
      }
      for (let j = 0; j < Tk; j++) {
        if (!vis(j)) continue;
        const ds = p[j]! * (dp[j]! - dot) * scale;
        for (let c = 0; c < D; c++) {
          dq[qo + i * D + c] += ds * k[ko + j * D + c]!;
          dk[ko + j * D + c] += ds * q[qo + i * D + c]!;
          dv[ko + j * D + c] += p[j]! * g[qo + i * D + c]!;
        }
      }
    }
  }
  return { out, dq, dk, dv };
}

const TOL: Record<string, [number, number]> = { f32: [2e-5, 2e-4], f16: [4e-3, 1e-2], bf16: [3e-2, 4e-2] };
const f64 = (t: nt.Tensor) => Float64Array.from(t.to('f32').toArraySync());

/** A leaf of `dtype` with seeded values in [-1, 1). */
function input(shape: number[], seed: number, dtype: string): nt.Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const t = nt.tensor(Float32Array.from(randomArray(n, rng(seed))), shape).to(dtype as nt.DType);
  t.requiresGrad = true;
  return t;
}

/** [B, H, T, D] of a packed [B, T, 3·H·D] tensor's part `which` (0 q, 1 k, 2 v), as float64. */
function unpack(x: Float64Array, B: number, T: number, H: number, D: number, which: number): Float64Array {
  const out = new Float64Array(B * H * T * D), W = 3 * H * D;
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) {
    out[((b * H + h) * T + t) * D + d] = x[(b * T + t) * W + which * H * D + h * D + d]!;
  }
  return out;
}
/** [B, H, T, D] -> heads merged [B, T, H·D]. */
function merge(x: Float64Array, B: number, T: number, H: number, D: number): Float64Array {
  const out = new Float64Array(x.length);
  for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) {
    out[(b * T + t) * H * D + h * D + d] = x[((b * H + h) * T + t) * D + d]!;
  }
  return out;
}

describe('flash attention against float64', () => {
  const masks: Mask[] = [{ causal: true, window: 0 }, { causal: true, window: 5 }, { causal: false, window: 0 }, { causal: false, window: 3 }];

  it('[B, H, T, D]: odd T, T < Tk, head dims 32/64/128, every mask, f32/bf16/f16, values and gradients', () => {
    const shapes: [number, number, number, number, number][] = [
      [1, 2, 1, 1, 32], [2, 1, 7, 7, 64], [1, 2, 33, 33, 32], [1, 1, 129, 129, 64], [2, 2, 5, 12, 32], [1, 1, 70, 131, 128], [1, 1, 33, 33, 128],
    ];
    let seed = 1;
    for (const dtype of ['f32', 'bf16', 'f16']) {
      for (const [B, H, T, Tk, D] of shapes) {
        for (const mask of masks) {
          if (dtype !== 'f32' && D === 128 && mask.window === 3) continue;  // keep the run short
          nt.scope(() => {
            const q = input([B, H, T, D], seed++, dtype), k = input([B, H, Tk, D], seed++, dtype), v = input([B, H, Tk, D], seed++, dtype);
            const g = input([B, H, T, D], seed++, dtype);
            const scale = 1 / Math.sqrt(D);
            const o = nt.attention(q, k, v, mask);
            nt.sum(nt.mul(o, g)).backward();
            const ref = reference(f64(q), f64(k), f64(v), f64(g), B, H, T, Tk, D, mask, scale);
            const [atol, rtol] = TOL[dtype]!;
            const what = `${dtype} [${B},${H},${T},${Tk},${D}] causal=${mask.causal} window=${mask.window}`;
            expect(o.dtype).toBe(dtype);
            expectClose(f64(o), ref.out, atol, rtol, `${what} out`);
            expectClose(f64(q.grad!), ref.dq, atol, rtol, `${what} dq`);
            expectClose(f64(k.grad!), ref.dk, atol, rtol, `${what} dk`);
            expectClose(f64(v.grad!), ref.dv, atol, rtol, `${what} dv`);
          });
        }
      }
    }
  }, 120_000);

  it('packed QKV [B, T, 3·H·D] -> merged heads [B, T, H·D]: odd T, head dims 32/64/128, f32/bf16/f16, values and the qkv gradient', () => {
    let seed = 500;
    for (const dtype of ['f32', 'bf16', 'f16']) {
      for (const [B, T, H, D] of [[2, 7, 3, 32], [1, 33, 2, 64], [1, 129, 1, 64], [1, 17, 2, 128]] as const) {
        for (const mask of [masks[0]!, masks[1]!, masks[2]!]) {
          nt.scope(() => {
            const qkv = input([B, T, 3 * H * D], seed++, dtype), g = input([B, T, H * D], seed++, dtype);
            const o = nt.attentionPacked(qkv, H, mask);
            expect(o.shape).toEqual([B, T, H * D]);
            nt.sum(nt.mul(o, g)).backward();
            const x = f64(qkv), gm = f64(g);
            // g merged -> [B, H, T, D]
            const gh = new Float64Array(gm.length);
            for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) {
              gh[((b * H + h) * T + t) * D + d] = gm[(b * T + t) * H * D + h * D + d]!;
            }
            const ref = reference(unpack(x, B, T, H, D, 0), unpack(x, B, T, H, D, 1), unpack(x, B, T, H, D, 2), gh, B, H, T, T, D, mask, 1 / Math.sqrt(D));
            const [atol, rtol] = TOL[dtype]!;
            const what = `packed ${dtype} [${B},${T},${H},${D}] causal=${mask.causal} window=${mask.window}`;
            expectClose(f64(o), merge(ref.out, B, T, H, D), atol, rtol, `${what} out`);
            const want = new Float64Array(x.length), W = 3 * H * D;
            [ref.dq, ref.dk, ref.dv].forEach((d4, which) => {
              for (let b = 0; b < B; b++) for (let h = 0; h < H; h++) for (let t = 0; t < T; t++) for (let d = 0; d < D; d++) {
                want[(b * T + t) * W + which * H * D + h * D + d] = d4[((b * H + h) * T + t) * D + d]!;
              }
            });
            expectClose(f64(qkv.grad!), want, atol, rtol, `${what} dqkv`);
          });
        }
      }
    }
  }, 120_000);

  it('queries over no keys (non-causal, Tk = 0) give zero rows and zero gradients', () => {
    nt.scope(() => {
      // Every query sees at least one key whenever Tk > 0 (causal needs T <= Tk; non-causal sees the last key), so Tk = 0 is the empty case.
      const q = input([1, 2, 5, 32], 7, 'f32'), k = input([1, 2, 0, 32], 8, 'f32'), v = input([1, 2, 0, 32], 9, 'f32'), g = input([1, 2, 5, 32], 10, 'f32');
      const o = nt.attention(q, k, v, { causal: false });
      nt.sum(nt.mul(o, g)).backward();
      expect(Array.from(o.toArraySync()).every((x) => x === 0)).toBe(true);
      expect(Array.from(q.grad!.toArraySync()).every((x) => x === 0)).toBe(true);
    });
  });
});

describe('head dims above FLASH_MAX_DIM', () => {
  it('take the materializing path, which matches float64 too', () => {
    nt.scope(() => {
      const [B, H, T, D] = [1, 2, 9, 260];
      const q = input([B, H, T, D], 31, 'f32'), k = input([B, H, T, D], 32, 'f32'), v = input([B, H, T, D], 33, 'f32'), g = input([B, H, T, D], 34, 'f32');
      const mask = { causal: true, window: 4 };
      const o = nt.attention(q, k, v, mask);
      nt.sum(nt.mul(o, g)).backward();
      const ref = reference(f64(q), f64(k), f64(v), f64(g), B, H, T, T, D, mask, 1 / Math.sqrt(D));
      expectClose(f64(o), ref.out, 2e-5, 2e-4, 'out');
      expectClose(f64(q.grad!), ref.dq, 2e-5, 2e-4, 'dq');
      expectClose(f64(k.grad!), ref.dk, 2e-5, 2e-4, 'dk');
      expectClose(f64(v.grad!), ref.dv, 2e-5, 2e-4, 'dv');
      const qkv = input([B, T, 3 * H * D], 35, 'f32');
      const op = nt.attentionPacked(qkv, H, mask);
      nt.sum(op).backward();
      expect(op.shape).toEqual([B, T, H * D]);
      expect(qkv.grad!.shape).toEqual([B, T, 3 * H * D]);
    });
  });
});

describe('flash attention against the materializing path', () => {
  it('agrees with per-head GEMMs around the T×T softmax (f32 tightly, bf16/f16 within storage rounding), custom scale', () => {
    let seed = 900;
    for (const dtype of ['f32', 'bf16', 'f16']) {
      for (const [B, H, T, Tk, D, causal, window] of [[2, 3, 65, 65, 64, true, 0], [1, 2, 40, 97, 32, true, 17], [1, 2, 31, 31, 128, false, 0]] as const) {
        nt.scope(() => {
          const opts = { causal, window, scale: 0.3 };
          const mk = () => [input([B, H, T, D], seed, dtype), input([B, H, Tk, D], seed + 1, dtype), input([B, H, Tk, D], seed + 2, dtype)];
          const g = input([B, H, T, D], seed + 3, dtype);
          seed += 4;
          const a = mk(), b = mk();
          const oa = nt.attention(a[0]!, a[1]!, a[2]!, opts), ob = attentionMaterialized(b[0]!, b[1]!, b[2]!, opts);
          nt.sum(nt.mul(oa, g)).backward();
          nt.sum(nt.mul(ob, g)).backward();
          const [atol, rtol] = dtype === 'f32' ? [1e-5, 1e-4] : TOL[dtype]!;
          expectClose(f64(oa), f64(ob), atol, rtol, `${dtype} out`);
          for (let i = 0; i < 3; i++) expectClose(f64(a[i]!.grad!), f64(b[i]!.grad!), atol, rtol, `${dtype} grad ${i}`);
        });
      }
    }
  }, 120_000);
});

describe('flash attention gradients by finite differences', () => {
  it('causal, windowed with fewer queries than keys, and packed', () => {
    const data = (n: number, s: number) => randomArray(n, rng(s), -1, 1);
    gradcheck((q, k, v) => nt.attention(q!, k!, v!, { causal: true, window: 2 }),
      [{ data: data(2 * 3 * 4, 1), shape: [1, 2, 3, 4] }, { data: data(2 * 5 * 4, 2), shape: [1, 2, 5, 4] }, { data: data(2 * 5 * 4, 3), shape: [1, 2, 5, 4] }]);
    gradcheck((q, k, v) => nt.attention(q!, k!, v!, { causal: false, scale: 0.7 }),
      [{ data: data(6 * 4, 4), shape: [1, 1, 6, 4] }, { data: data(6 * 4, 5), shape: [1, 1, 6, 4] }, { data: data(6 * 4, 6), shape: [1, 1, 6, 4] }]);
    gradcheck((qkv) => nt.attentionPacked(qkv!, 2, { causal: true, window: 3 }), [{ data: data(2 * 7 * 12, 7), shape: [2, 7, 12] }]);
  });
});

describe('flash attention kernels', () => {
  it('give the same bits on 1 and 3 threads (forward and backward, many query tiles)', () => {
    const run = (threads: number) => nt.scope(() => {
      cpu().setKernelThreads(threads);
      try {
        const qkv = input([2, 200, 3 * 2 * 32], 41, 'f32'), g = input([2, 200, 64], 42, 'f32');
        const o = nt.attentionPacked(qkv, 2, { causal: true, window: 70 });
        nt.sum(nt.mul(o, g)).backward();
        return [Array.from(o.toArraySync()), Array.from(qkv.grad!.toArraySync())];
      } finally {
        cpu().setKernelThreads(initialThreads);
      }
    });
    const a = run(1), b = run(3);
    expect(b[0]).toEqual(a[0]);
    expect(b[1]).toEqual(a[1]);
  });

  it('reject bad layouts, short storages and causal tq > tk with typed errors', () => {
    const be = cpu();
    const s = new be.Storage(4 * 2 * 8 * 4, true), lse = new be.Storage(4 * 8, true);
    const L = new Int32Array([0, 64, 32, 4]);
    const call = (layout: Int32Array, tq = 8, tk = 8, causal = true, D = 4, dt = 0) =>
      be.flash_attention_forward(s, s, s, s, lse, layout, layout, layout, layout, 1, 1, tq, tk, D, 0.5, causal, 0, dt);
    expect(() => call(L)).not.toThrow();
    expect(() => call(new Int32Array([0, 64, 32]))).toThrow(nt.ArgumentError);
    expect(() => call(new Int32Array([0, 64, 32, -4]))).toThrow(/negative/);
    expect(() => call(new Int32Array([100, 64, 32, 4]))).toThrow();  // past the storage
    expect(() => call(L, 8, 4)).toThrow(nt.ShapeError);
    expect(() => call(L, 8, 8, true, 4, 3)).toThrow(nt.DTypeError);
    s.dispose();
    lse.dispose();
  });
});

describe('flash attention memory', () => {
  it('peak of forward + backward at T = 1024 stays far below the T×T probabilities (which the materializing path does allocate)', () => {
    const [B, H, T, D] = [1, 4, 1024, 32];
    const probsBytes = B * H * T * T * 4;
    const peakOf = (fn: (q: nt.Tensor, k: nt.Tensor, v: nt.Tensor) => nt.Tensor) => nt.scope(() => {
      const q = input([B, H, T, D], 1, 'f32'), k = input([B, H, T, D], 2, 'f32'), v = input([B, H, T, D], 3, 'f32');
      const g = input([B, H, T, D], 4, 'f32');
      g.requiresGrad = false;
      const before = nt.memoryStats('cpu').allocated;
      nt.resetPeakMemory('cpu');
      nt.sum(nt.mul(fn(q, k, v), g)).backward();
      return nt.memoryStats('cpu').peak - before;
    });
    const flash = peakOf((q, k, v) => nt.attention(q, k, v, { causal: true }));
    const materialized = peakOf((q, k, v) => attentionMaterialized(q, k, v, { causal: true, window: 0, scale: 1 / Math.sqrt(D) }));
    expect(materialized).toBeGreaterThan(probsBytes);  // the measurement sees T×T buffers when there are some
    expect(flash).toBeLessThan(probsBytes / 4);
  });
});

describe('one tensor passed as q, k and v', () => {
  it('gets the sum of the three gradients (the same as three separate copies)', () => {
    nt.scope(() => {
      const x = nt.randn([1, 2, 9, 32], { seed: 11 });
      const g = nt.randn([1, 2, 9, 32], { seed: 12 });
      const shared = x.clone(); shared.requiresGrad = true;
      nt.sum(nt.mul(nt.attention(shared, shared, shared, { causal: true }), g)).backward();
      const [q, k, v] = [0, 1, 2].map(() => { const t = x.clone(); t.requiresGrad = true; return t; }) as [nt.Tensor, nt.Tensor, nt.Tensor];
      nt.sum(nt.mul(nt.attention(q, k, v, { causal: true }), g)).backward();
      const want = nt.add(nt.add(q.grad!, k.grad!), v.grad!).toArraySync();
      expectClose(shared.grad!.toArraySync(), want, 1e-6, 1e-6, 'shared q=k=v gradient');
    });
  });
});
