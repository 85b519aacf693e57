// Autocast on the cpu backend: the ops on a GPT's path compute in the dtypes the policy names
// (linear, matmul, attention and the fused LM head in bf16 with f32 accumulation; norms, softmax,
// losses and reductions in f32), against float64 references computed from the bf16-rounded inputs;
// gradients reach f32 leaves in f32; the weight-cast cache casts each weight once per region and
// never serves a stale copy; a tiny GPT trains under bf16 autocast within a measured tolerance of
// f32; f16 with GradScaler works.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { randomArray, rng } from '../helpers/gradcheck.js';

// ---------- float64 helpers ----------

const f32 = new Float32Array(1), u32 = new Uint32Array(f32.buffer);
/** x rounded to bf16 (round to nearest even), computed on the bits independently of the library. */
function bf16(x: number): number {
  f32[0] = x;
  const b = u32[0]!;
  u32[0] = ((b + 0x7fff + ((b >>> 16) & 1)) >>> 0) & 0xffff0000;
  return f32[0]!;
}
const roundAll = (a: ArrayLike<number>): Float64Array => Float64Array.from(a, bf16);

/** A leaf f32 tensor of uniform values in [lo, hi), requiring grad. */
function leaf(n: number[], seed: number, lo = -1, hi = 1, requiresGrad = true): { t: nt.Tensor; v: Float64Array } {
  const size = n.reduce((a, b) => a * b, 1);
  const data = Float32Array.from(randomArray(size, rng(seed), lo, hi));
  const t = nt.tensor(data, n, { requiresGrad });
  return { t, v: Float64Array.from(data) };
}

/** C[m, n] = A[m, k]·B[k, n] (optionally Bᵀ stored [n, k]) in float64. */
function mm(A: ArrayLike<number>, B: ArrayLike<number>, m: number, k: number, n: number, transB = false, transA = false): Float64Array {
  const C = new Float64Array(m * n);
  for (let i = 0; i < m; i++) {
    for (let j = 0; j < n; j++) {
      let s = 0;
      for (let p = 0; p < k; p++) s += (transA ? A[p * m + i]! : A[i * k + p]!) * (transB ? B[j * k + p]! : B[p * n + j]!);
      C[i * n + j] = s;
    }
  }
  return C;
}

/**
 * Asserts |a − e| <= rtol·|e| + atol·max|e| elementwise (atol relative to the largest reference
 * value, for entries near zero that are sums of larger terms).
 */
function expectNear(actual: ArrayLike<number>, expected: ArrayLike<number>, rtol: number, atol: number, what: string): void {
  expect(actual.length, `${what}: length`).toBe(expected.length);
  let scale = 0;
  for (let i = 0; i < expected.length; i++) scale = Math.max(scale, Math.abs(expected[i]!));
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!, e = expected[i]!;
    if (!(Math.abs(a - e) <= rtol * Math.abs(e) + atol * scale)) {
      throw new Error(`${what}[${i}]: got ${a}, expected ${e} (rtol ${rtol}, atol ${atol}·${scale})`);
    }
  }
}

/** The largest |a − b| over the elements. */
function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

// bf16 keeps 8 significant bits (7 stored): one rounding to nearest is within 2^-8 relative (the unit
// roundoff), one ulp is 2^-7..2^-8 of the value.
const BF16_EPS = 2 ** -8;

// ---------- forward values ----------

describe('autocast bf16: low-precision ops compute on bf16-rounded inputs with f32 accumulation', () => {
  it('bf16() here rounds as the library casts', () => {
    const { t, v } = leaf([1000], 1, -100, 100, false);
    using c = t.to('bf16');
    expect(Array.from(c.toArraySync())).toEqual(Array.from(roundAll(v)));
    t.dispose();
  });

  it('linear: bf16 output equal to the float64 product of the rounded inputs, rounded once', () => {
    const M = 24, K = 80, N = 20;
    const x = leaf([M, K], 2), w = leaf([N, K], 3), b = leaf([N], 4);
    const ref = mm(roundAll(x.v), roundAll(w.v), M, K, N, true).map((s, i) => s + bf16(b.v[i % N]!));
    const y = nt.autocast({ dtype: 'bf16' }, () => nt.linear(x.t, w.t, b.t));
    expect(y.dtype).toBe('bf16');
    const got = y.toArraySync();
    // one rounding of an f32-accumulated sum: within 2^-8 relative of the float64 value, plus f32 accumulation error
    expectNear(got, ref, BF16_EPS * 1.01, 1e-6, 'linear');
    const exact = Array.from(got).filter((g, i) => g === bf16(ref[i]!)).length;
    expect(exact / got.length).toBeGreaterThan(0.97);  // the rest are near-ties that f32 accumulation tips
    // the f32 op (autocast ignored) gives other values: the test would notice
    const plain = nt.linear(x.t, w.t, b.t);
    expect(plain.dtype).toBe('f32');
    expect(maxDiff(plain.toArraySync(), got)).toBeGreaterThan(1e-3);
    expectNear(plain.toArraySync(), mm(x.v, w.v, M, K, N, true).map((s, i) => s + b.v[i % N]!), 1e-5, 1e-6, 'f32 linear');
    for (const t of [x.t, w.t, b.t, y, plain]) t.dispose();
  });

  it('matmul (batched, shared operand) and linearGelu run in bf16', () => {
    const B = 3, M = 8, K = 40, N = 12;
    const a = leaf([B, M, K], 5), w = leaf([K, N], 6);
    const y = nt.autocast({ dtype: 'bf16' }, () => nt.matmul(a.t, w.t));
    expect(y.dtype).toBe('bf16');
    const ref = mm(roundAll(a.v), roundAll(w.v), B * M, K, N);
    expectNear(y.toArraySync(), ref, BF16_EPS * 1.01, 1e-6, 'matmul');
    using plain = nt.matmul(a.t, w.t);
    expect(maxDiff(plain.toArraySync(), y.toArraySync())).toBeGreaterThan(1e-3);
    // linearGelu: the GEMM in bf16, the bias and GELU applied in f32 to the bf16 product, rounded to bf16
    const x = leaf([M, K], 7), wl = leaf([N, K], 8), bl = leaf([N], 9);
    const g = nt.autocast({ dtype: 'bf16' }, () => nt.linearGelu(x.t, wl.t, bl.t));
    expect(g.dtype).toBe('bf16');
    const gelu = (u: number) => 0.5 * u * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (u + 0.044715 * u ** 3)));
    const pre = mm(roundAll(x.v), roundAll(wl.v), M, K, N, true).map(bf16);
    // (the kernel may round the biased product to bf16 before GELU: up to two roundings)
    expectNear(g.toArraySync(), pre.map((p, i) => gelu(p + bf16(bl.v[i % N]!))), 2 * BF16_EPS * 1.01, 1e-4, 'linearGelu');
    for (const t of [a.t, w.t, y, x.t, wl.t, bl.t, g]) t.dispose();
  });

  it('attention: bf16 output from bf16 GEMMs around an f32 softmax', () => {
    const B = 1, H = 2, T = 6, D = 8;
    const q = leaf([B, H, T, D], 10, -2, 2), k = leaf([B, H, T, D], 11, -2, 2), v = leaf([B, H, T, D], 12);
    const out = nt.autocast({ dtype: 'bf16' }, () => nt.attention(q.t, k.t, v.t));
    expect(out.dtype).toBe('bf16');
    const ref = attentionRef(roundAll(q.v), roundAll(k.v), roundAll(v.v), B * H, T, D, true).out;
    // the scores and probabilities are held in bf16 between the kernels: a few roundings of 2^-8 each
    expectNear(out.toArraySync(), ref, 4 * BF16_EPS, BF16_EPS, 'attention');
    using plain = nt.attention(q.t, k.t, v.t);
    expect(plain.dtype).toBe('f32');
    expectNear(plain.toArraySync(), attentionRef(q.v, k.v, v.v, B * H, T, D, false).out, 1e-5, 1e-6, 'f32 attention');
    expect(maxDiff(plain.toArraySync(), out.toArraySync())).toBeGreaterThan(1e-3);
    for (const t of [q.t, k.t, v.t, out]) t.dispose();
  });

  it('f32 ops cast bf16 inputs up; other ops keep their dtype; mixed binary ops promote to f32', () => {
    const x = leaf([4, 16], 13, -3, 3);
    using xb = x.t.to('bf16');
    nt.autocast({ dtype: 'bf16' }, () => {
      using s = nt.softmax(xb), ls = nt.logSoftmax(xb), sm = nt.sum(xb), mn = nt.mean(xb, 1), e = nt.exp(xb), p = nt.pow(xb, 2);
      for (const t of [s, ls, sm, mn, e, p]) expect(t.dtype).toBe('f32');
      // softmax of the bf16 values, computed in f32: close to float64 at f32 precision
      const xr = roundAll(x.v);
      const ref = new Float64Array(64);
      for (let r = 0; r < 4; r++) {
        const row = xr.subarray(r * 16, r * 16 + 16), mx = Math.max(...row);
        const z = row.reduce((a, u) => a + Math.exp(u - mx), 0);
        row.forEach((u, j) => { ref[r * 16 + j] = Math.exp(u - mx) / z; });
      }
      expectNear(s.toArraySync(), ref, 1e-5, 1e-7, 'softmax');
      using g = nt.gelu(xb), t = nt.tanh(xb);
      expect(g.dtype).toBe('bf16');
      expect(t.dtype).toBe('bf16');
      using sum = nt.add(x.t, xb);
      expect(sum.dtype).toBe('f32');
      expectNear(sum.toArraySync(), x.v.map((u, i) => u + xr[i]!), 1e-6, 0, 'f32 + bf16');
    });
    // outside autocast too: add promotes (PyTorch's rule); matmul of mixed dtypes stays an error
    using sum2 = nt.add(xb, x.t);
    expect(sum2.dtype).toBe('f32');
    expect(() => nt.matmul(x.t, xb, { transB: true })).toThrow(nt.DTypeError);
    x.t.dispose();
  });
});

/** Causal attention in float64 for batch·heads of [T, D]; `roundInner` rounds the scores, probabilities and output to bf16 as the kernels store them. */
function attentionRef(q: Float64Array, k: Float64Array, v: Float64Array, BH: number, T: number, D: number, roundInner: boolean) {
  const r = roundInner ? bf16 : (u: number) => u;
  const scale = 1 / Math.sqrt(D);
  const out = new Float64Array(BH * T * D), probs = new Float64Array(BH * T * T);
  for (let h = 0; h < BH; h++) {
    const o = h * T * D;
    for (let i = 0; i < T; i++) {
      const s = new Float64Array(T).fill(-Infinity);
      for (let j = 0; j <= i; j++) {
        let d = 0;
        for (let c = 0; c < D; c++) d += q[o + i * D + c]! * k[o + j * D + c]!;
        s[j] = r(d) * scale;
      }
      const mx = Math.max(...s);
      let z = 0;
      for (let j = 0; j <= i; j++) z += Math.exp(s[j]! - mx);
      for (let j = 0; j <= i; j++) probs[h * T * T + i * T + j] = r(Math.exp(s[j]! - mx) / z);
      for (let c = 0; c < D; c++) {
        let acc = 0;
        for (let j = 0; j <= i; j++) acc += probs[h * T * T + i * T + j]! * v[o + j * D + c]!;
        out[o + i * D + c] = r(acc);
      }
    }
  }
  return { out, probs };
}

/** Float64 gradients of Σ attention(q, k, v)·G (causal) with respect to q, k, v. */
function attentionGradRef(q: Float64Array, k: Float64Array, v: Float64Array, G: Float64Array, BH: number, T: number, D: number) {
  const { probs } = attentionRef(q, k, v, BH, T, D, false);
  const scale = 1 / Math.sqrt(D);
  const dq = new Float64Array(q.length), dk = new Float64Array(k.length), dv = new Float64Array(v.length);
  for (let h = 0; h < BH; h++) {
    const o = h * T * D, po = h * T * T;
    for (let i = 0; i < T; i++) {
      const dp = new Float64Array(T);
      for (let j = 0; j <= i; j++) {
        let s = 0;
        for (let c = 0; c < D; c++) s += G[o + i * D + c]! * v[o + j * D + c]!;
        dp[j] = s;
        for (let c = 0; c < D; c++) dv[o + j * D + c] += probs[po + i * T + j]! * G[o + i * D + c]!;
      }
      let dot = 0;
      for (let j = 0; j <= i; j++) dot += probs[po + i * T + j]! * dp[j]!;
      for (let j = 0; j <= i; j++) {
        const ds = probs[po + i * T + j]! * (dp[j]! - dot) * scale;
        for (let c = 0; c < D; c++) {
          dq[o + i * D + c] += ds * k[o + j * D + c]!;
          dk[o + j * D + c] += ds * q[o + i * D + c]!;
        }
      }
    }
  }
  return { dq, dk, dv };
}

// ---------- gradients ----------

describe('autocast bf16: gradients against float64 at bf16 tolerance, f32 at f32 leaves', () => {
  it('linear and matmul', () => {
    const M = 12, K = 32, N = 10;
    const x = leaf([M, K], 20), w = leaf([N, K], 21), b = leaf([N], 22);
    const G = roundAll(randomArray(M * N, rng(23)));  // the upstream gradient, as its bf16 cast holds it
    nt.scope(() => {
      const y = nt.autocast({ dtype: 'bf16' }, () => nt.linear(x.t, w.t, b.t));
      y.backward(nt.tensor(Float32Array.from(G), [M, N]));
    });
    for (const t of [x.t, w.t, b.t]) expect(t.grad!.dtype).toBe('f32');
    const xr = roundAll(x.v), wr = roundAll(w.v);
    // each gradient is one bf16 GEMM (f32 accumulation, one rounding), then cast back to f32
    expectNear(x.t.grad!.toArraySync(), mm(G, wr, M, N, K), BF16_EPS * 1.01, 1e-6, 'dx');
    expectNear(w.t.grad!.toArraySync(), mm(G, xr, N, M, K, false, true), BF16_EPS * 1.01, 1e-6, 'dW');
    const db = new Float64Array(N);
    for (let i = 0; i < M * N; i++) db[i % N] += G[i]!;
    expectNear(b.t.grad!.toArraySync(), db, BF16_EPS, 1e-6, 'db');

    const a = leaf([M, K], 24), c = leaf([K, N], 25);
    nt.scope(() => {
      const y = nt.autocast({ dtype: 'bf16' }, () => nt.matmul(a.t, c.t));
      y.backward(nt.tensor(Float32Array.from(G), [M, N]));
    });
    expect(a.t.grad!.dtype).toBe('f32');
    expectNear(a.t.grad!.toArraySync(), mm(G, roundAll(c.v), M, N, K, true), BF16_EPS * 1.01, 1e-6, 'matmul dA');
    expectNear(c.t.grad!.toArraySync(), mm(roundAll(a.v), G, K, M, N, false, true), BF16_EPS * 1.01, 1e-6, 'matmul dB');
    for (const t of [x.t, w.t, b.t, a.t, c.t]) t.dispose();
  });

  it('attention', () => {
    const BH = 2, T = 5, D = 8;
    const q = leaf([1, BH, T, D], 30, -2, 2), k = leaf([1, BH, T, D], 31, -2, 2), v = leaf([1, BH, T, D], 32);
    const G = roundAll(randomArray(BH * T * D, rng(33)));
    nt.scope(() => {
      const y = nt.autocast({ dtype: 'bf16' }, () => nt.attention(q.t, k.t, v.t));
      y.backward(nt.tensor(Float32Array.from(G), [1, BH, T, D]));
    });
    const ref = attentionGradRef(roundAll(q.v), roundAll(k.v), roundAll(v.v), G, BH, T, D);
    for (const t of [q.t, k.t, v.t]) expect(t.grad!.dtype).toBe('f32');
    // backward holds probabilities, their gradient and the scores' gradient in bf16 (several roundings of 2^-8)
    expectNear(q.t.grad!.toArraySync(), ref.dq, 4 * BF16_EPS, 2 * BF16_EPS, 'dq');
    expectNear(k.t.grad!.toArraySync(), ref.dk, 4 * BF16_EPS, 2 * BF16_EPS, 'dk');
    expectNear(v.t.grad!.toArraySync(), ref.dv, 4 * BF16_EPS, 2 * BF16_EPS, 'dv');
    // the same backward in f32 (autocast ignored) lands elsewhere: bf16 roundings are visible
    const bf = [q.t, k.t, v.t].map((t) => t.grad!.toArraySync());
    nt.zeroGrad([q.t, k.t, v.t]);
    nt.scope(() => nt.attention(q.t, k.t, v.t).backward(nt.tensor(Float32Array.from(G), [1, BH, T, D])));
    expect(Math.max(...[q.t, k.t, v.t].map((t, i) => maxDiff(t.grad!.toArraySync(), bf[i]!)))).toBeGreaterThan(1e-3);
    for (const t of [q.t, k.t, v.t]) t.dispose();
  });

  it('linearCrossEntropy: bf16 GEMMs, the loss in f32', () => {
    const N = 20, C = 16, V = 40;
    const x = leaf([N, C], 40, -2, 2), w = leaf([V, C], 41, -2, 2);
    const tg = Int32Array.from({ length: N }, (_, i) => (i * 7 + 3) % V);
    using targets = nt.tensor(tg, [N]);
    const loss = nt.autocast({ dtype: 'bf16' }, () => nt.linearCrossEntropy(x.t, w.t, targets, { chunkRows: 8 }));
    expect(loss.dtype).toBe('f32');
    const xr = roundAll(x.v), wr = roundAll(w.v);
    const logits = mm(xr, wr, N, C, V, true);
    let refLoss = 0;
    const dLogits = new Float64Array(N * V);
    for (let i = 0; i < N; i++) {
      const row = logits.subarray(i * V, (i + 1) * V), mx = Math.max(...row);
      const z = row.reduce((a, u) => a + Math.exp(u - mx), 0);
      refLoss += (Math.log(z) + mx - row[tg[i]!]!) / N;
      for (let j = 0; j < V; j++) dLogits[i * V + j] = (Math.exp(row[j]! - mx) / z - (j === tg[i] ? 1 : 0)) / N;
    }
    // the logits are held in bf16 (each within 2^-8 relative): the loss moves by at most that times |logit|
    expect(Math.abs(loss.item() - refLoss)).toBeLessThan(BF16_EPS * 4);
    loss.backward();
    expect(x.t.grad!.dtype).toBe('f32');
    expect(w.t.grad!.dtype).toBe('f32');
    expectNear(x.t.grad!.toArraySync(), mm(dLogits, wr, N, V, C), 4 * BF16_EPS, 2 * BF16_EPS, 'dx');
    expectNear(w.t.grad!.toArraySync(), mm(dLogits, xr, V, N, C, false, true), 4 * BF16_EPS, 2 * BF16_EPS, 'dW');
    // ignoring autocast would give the f32 loss, which differs
    using plain = nt.noGrad(() => nt.linearCrossEntropy(x.t, w.t, targets));
    expect(Math.abs(plain.item() - loss.item())).toBeGreaterThan(1e-6);
    for (const t of [x.t, w.t]) t.dispose();
  });

  it('layerNorm of a bf16 activation runs in f32; gradients in each leaf dtype', () => {
    const R = 6, C = 24;
    const x0 = leaf([R, C], 50, -3, 3, false), w = leaf([C], 51, 0.5, 1.5), b = leaf([C], 52);
    const xb = x0.t.to('bf16');
    xb.requiresGrad = true;
    const G = randomArray(R * C, rng(53));
    const y = nt.autocast({ dtype: 'bf16' }, () => nt.layerNorm(xb, w.t, b.t));
    expect(y.dtype).toBe('f32');
    y.backward(nt.tensor(Float32Array.from(G), [R, C]));
    expect(xb.grad!.dtype).toBe('bf16');
    expect(w.t.grad!.dtype).toBe('f32');
    expect(b.t.grad!.dtype).toBe('f32');
    const xr = roundAll(x0.v);
    const out = new Float64Array(R * C), dx = new Float64Array(R * C), dw = new Float64Array(C), db = new Float64Array(C);
    for (let r = 0; r < R; r++) {
      const row = xr.subarray(r * C, (r + 1) * C);
      const mu = row.reduce((a, u) => a + u, 0) / C;
      const rstd = 1 / Math.sqrt(row.reduce((a, u) => a + (u - mu) ** 2, 0) / C + 1e-5);
      const xh = Array.from(row, (u) => (u - mu) * rstd);
      let m1 = 0, m2 = 0;
      for (let c = 0; c < C; c++) {
        const g = G[r * C + c]!;
        out[r * C + c] = xh[c]! * w.v[c]! + b.v[c]!;
        dw[c] += g * xh[c]!; db[c] += g;
        m1 += g * w.v[c]!; m2 += g * w.v[c]! * xh[c]!;
      }
      for (let c = 0; c < C; c++) dx[r * C + c] = rstd * (G[r * C + c]! * w.v[c]! - m1 / C - xh[c]! * m2 / C);
    }
    expectNear(y.toArraySync(), out, 1e-5, 1e-6, 'layerNorm out');  // f32 compute on the bf16 values
    expectNear(w.t.grad!.toArraySync(), dw, 1e-5, 1e-6, 'dw');
    expectNear(b.t.grad!.toArraySync(), db, 1e-5, 1e-6, 'db');
    expectNear(xb.grad!.toArraySync(), dx, BF16_EPS * 1.01, 1e-5, 'dx (bf16 leaf)');
    for (const t of [x0.t, w.t, b.t, xb, y]) t.dispose();
  });
});

// ---------- the weight-cast cache ----------

describe('autocast weight-cast cache', () => {
  it('casts a weight once per region however often it is used, and frees the copy at the end', () => {
    const w = leaf([8, 8], 60), x = leaf([4, 8], 61, -1, 1, false);
    const live = nt.memoryStats().liveTensors;
    nt.resetAutocastStats();
    const loss = nt.autocast({ dtype: 'bf16' }, () => {
      const h1 = nt.linear(x.t, w.t), h2 = nt.linear(h1, w.t), h3 = nt.matmul(h2, w.t, { transB: true });
      nt.autocast({ dtype: 'bf16' }, () => expect(nt.autocastStats().weightCasts).toBe(1));  // nested regions share the cache
      const s = nt.sum(h3);
      h1.dispose(); h2.dispose(); h3.dispose();
      return s;
    });
    // x cast down for the first linear, h3 cast up for sum (an f32 op); w cast once, then served twice
    expect(nt.autocastStats()).toEqual({ weightCasts: 1, weightCacheHits: 2, activationCasts: 2 });
    loss.backward();  // outside the region: the graph holds what it needs of the freed cache
    expect(w.t.grad!.dtype).toBe('f32');
    loss.dispose();
    expect(nt.memoryStats().liveTensors).toBe(live + 1);  // w's gradient; the cached bf16 copy is gone
    // a new region casts again
    nt.autocast({ dtype: 'bf16' }, () => nt.linear(x.t, w.t).dispose());
    expect(nt.autocastStats().weightCasts).toBe(2);
    w.t.dispose(); x.t.dispose();
  });

  it('an optimizer step inside the region makes the next use re-cast (no stale weight)', () => {
    // evaluation (noGrad) before and after a step in one region: only the version tells the copy is stale
    {
      const w = leaf([6, 6], 68), x = leaf([3, 6], 69, -1, 1, false);
      const opt = new nt.optim.SGD([w.t], { lr: 0.5 });
      nt.autocast({ dtype: 'bf16' }, () => nt.noGrad(() => {
        using before = nt.linear(x.t, w.t);
        w.t.grad = nt.ones([6, 6]);
        opt.step();
        using after = nt.linear(x.t, w.t);
        using wNow = w.t.to('bf16'), xNow = x.t.to('bf16');
        using expected = nt.linear(xNow, wNow);
        expect(Array.from(after.toArraySync())).toEqual(Array.from(expected.toArraySync()));
        expect(maxDiff(after.toArraySync(), before.toArraySync())).toBeGreaterThan(0.1);
      }));
      opt.dispose(); w.t.dispose(); x.t.dispose();
    }
    const w = leaf([6, 6], 62), x = leaf([3, 6], 63, -1, 1, false);
    const opt = new nt.optim.SGD([w.t], { lr: 0.5 });
    nt.resetAutocastStats();
    nt.autocast({ dtype: 'bf16' }, () => {
      const v0 = w.t.version;
      nt.scope(() => nt.sum(nt.linear(x.t, w.t)).backward());
      opt.step();
      opt.zeroGrad();
      expect(w.t.version).toBeGreaterThan(v0);
      using after = nt.linear(x.t, w.t);
      // what the updated weight gives, cast afresh
      using wNow = w.t.to('bf16'), xNow = x.t.to('bf16');
      using expected = nt.linear(xNow, wNow);
      expect(Array.from(after.toArraySync())).toEqual(Array.from(expected.toArraySync()));
      expect(nt.autocastStats().weightCasts).toBe(2);
    });
    // between regions: the next region sees the new values (the cache was dropped at the end)
    nt.autocast({ dtype: 'bf16' }, () => nt.scope(() => nt.sum(nt.linear(x.t, w.t)).backward()));
    opt.step();
    nt.autocast({ dtype: 'bf16' }, () => {
      using y = nt.linear(x.t, w.t);
      using wNow = w.t.to('bf16'), xNow = x.t.to('bf16');
      using expected = nt.linear(xNow, wNow);
      expect(Array.from(y.toArraySync())).toEqual(Array.from(expected.toArraySync()));
    });
    opt.dispose(); w.t.dispose(); x.t.dispose();
  });

  it('a copy cast under noGrad, or whose graph a backward freed, is not reused where a gradient is needed', () => {
    const w = leaf([5, 5], 64), x = leaf([2, 5], 65, -1, 1, false);
    nt.resetAutocastStats();
    nt.autocast({ dtype: 'bf16' }, () => {
      nt.noGrad(() => nt.linear(x.t, w.t).dispose());
      nt.scope(() => nt.sum(nt.linear(x.t, w.t)).backward());  // recast with a graph
      expect(w.t.grad).not.toBeNull();
      const g1 = Array.from(w.t.grad!.toArraySync());
      nt.scope(() => nt.sum(nt.linear(x.t, w.t)).backward());  // the first backward freed the cast's node: recast
      const g2 = Array.from(w.t.grad!.toArraySync());
      g2.forEach((g, i) => expect(g).toBeCloseTo(2 * g1[i]!, 5));
    });
    expect(nt.autocastStats().weightCasts).toBe(3);
    w.t.dispose(); x.t.dispose();
  });

  it('an async region keeps its cache until its promise settles', async () => {
    const w = leaf([4, 4], 66), x = leaf([2, 4], 67, -1, 1, false);
    nt.resetAutocastStats();
    await nt.autocast({ dtype: 'bf16' }, async () => {
      nt.linear(x.t, w.t).dispose();
      await new Promise((r) => setTimeout(r, 1));
      nt.linear(x.t, w.t).dispose();
    });
    expect(nt.autocastStats()).toMatchObject({ weightCasts: 1, weightCacheHits: 1 });
    w.t.dispose(); x.t.dispose();
  });
});
