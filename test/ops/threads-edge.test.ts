// Kernel paths the small tests do not reach: row-parallel splits (large enough shapes, compared
// against one thread and a float64 reference), extreme softmax inputs, attention with fewer queries
// than keys, and an explicit attention scale.
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cpu } from '../../lib/native.js';
import { expectClose, randomArray, rng } from '../helpers/gradcheck.js';

const initialThreads = cpu().kernelThreads() as number;
afterAll(() => cpu().setKernelThreads(initialThreads));

function withThreads<T>(n: number, fn: () => T): T {
  cpu().setKernelThreads(n);
  try { return fn(); } finally { cpu().setKernelThreads(initialThreads); }
}

describe('row-parallel kernels', () => {
  it('give the same results on 1 and 3 threads, matching float64 on sampled rows', () => {
    const rows = 67, cols = 4099;  // odd sizes so the split is uneven
    const x = randomArray(rows * cols, rng(1), -8, 8);
    const targets = Int32Array.from({ length: rows }, (_, i) => (i * 31) % cols);
    const run = () => nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), [rows, cols]);
      t.requiresGrad = true;
      const sm = nt.softmax(t).toArraySync();
      const ge = nt.gelu(t).toArraySync();
      const loss = nt.crossEntropy(t, nt.tensor(targets, [rows]));
      loss.backward();
      return { sm, ge, loss: loss.item(), grad: t.grad!.toArraySync() };
    });
    const one = withThreads(1, run), three = withThreads(3, run);
    expect(Array.from(three.sm)).toEqual(Array.from(one.sm));
    expect(Array.from(three.ge)).toEqual(Array.from(one.ge));
    expect(Array.from(three.grad)).toEqual(Array.from(one.grad));
    expect(three.loss).toBe(one.loss);
    const xf = Float64Array.from(Float32Array.from(x));
    let total = 0;
    for (let r = 0; r < rows; r++) {
      const row = xf.subarray(r * cols, (r + 1) * cols);
      const m = Math.max(...row);
      const z = row.reduce((a, v) => a + Math.exp(v - m), 0);
      total += m + Math.log(z) - row[targets[r]!]!;
      if (r % 16 === 0) {
        expectClose(one.sm.subarray(r * cols, (r + 1) * cols), row.map((v) => Math.exp(v - m) / z), 1e-8, 1e-5, `softmax row ${r}`);
        const g = row.map((v, j) => (Math.exp(v - m) / z - (j === targets[r] ? 1 : 0)) / rows);
        expectClose(one.grad.subarray(r * cols, (r + 1) * cols), g, 1e-9, 1e-4, `ce grad row ${r}`);
      }
    }
    expect(one.loss).toBeCloseTo(total / rows, 4);
  });
});

describe('column sums over row blocks', () => {
  it('LayerNorm, RMSNorm and bias+GELU backward give the same weight and bias gradients on 1, 2 and 3 threads, matching float64', () => {
    const rows = 333, cols = 129;  // 6 blocks of 64 rows, the last one short
    const x = randomArray(rows * cols, rng(5), -3, 3), up = randomArray(rows * cols, rng(6), -1, 1);
    const w = randomArray(cols, rng(7), 0.5, 1.5), bias = randomArray(cols, rng(8), -0.5, 0.5);
    const run = () => nt.scope(() => {
      const leaf = (a: Float64Array, shape: number[]) => { const t = nt.tensor(Float32Array.from(a), shape); t.requiresGrad = true; return t; };
      const xt = leaf(x, [rows, cols]), g = nt.tensor(Float32Array.from(up), [rows, cols]);
      const lw = leaf(w, [cols]), lb = leaf(bias, [cols]), rw = leaf(w, [cols]);
      const lin = leaf(randomArray(cols * cols, rng(9), -0.1, 0.1), [cols, cols]), linB = leaf(bias, [cols]);
      const weighted = (y: nt.Tensor) => nt.sum(nt.mul(y, g));
      for (const loss of [weighted(nt.layerNorm(xt, lw, lb)), weighted(nt.rmsNorm(xt, rw)), weighted(nt.linearGelu(xt, lin, linB))]) loss.backward();
      return { lw: lw.grad!.toArraySync(), lb: lb.grad!.toArraySync(), rw: rw.grad!.toArraySync(), linB: linB.grad!.toArraySync() };
    });
    const one = withThreads(1, run);
    for (const n of [2, 3]) {
      const other = withThreads(n, run);
      for (const k of ['lw', 'lb', 'rw', 'linB'] as const) expect(Array.from(other[k]), `${k} on ${n} threads`).toEqual(Array.from(one[k]));
    }
    // LayerNorm's bias gradient is the column sum of the upstream gradient; RMSNorm's weight gradient Σ_rows g·x·rstd.
    const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));
    const xf = f32(x), gf = f32(up);
    const lbRef = new Float64Array(cols), rwRef = new Float64Array(cols);
    for (let r = 0; r < rows; r++) {
      let ss = 0;
      for (let j = 0; j < cols; j++) ss += xf[r * cols + j]! ** 2;
      const rstd = 1 / Math.sqrt(ss / cols + 1e-6);
      for (let j = 0; j < cols; j++) {
        lbRef[j] += gf[r * cols + j]!;
        rwRef[j] += gf[r * cols + j]! * xf[r * cols + j]! * rstd;
      }
    }
    expectClose(one.lb, lbRef, 1e-5, 1e-5, 'layerNorm bias grad');
    expectClose(one.rw, rwRef, 1e-4, 1e-4, 'rmsNorm weight grad');
  });
});

describe('edge cases', () => {
  it('softmax is stable for huge and tiny logits', () => {
    nt.scope(() => {
      const t = nt.tensor([1000, 999, -1000, 0, -200, 5], [2, 3]);
      const got = nt.softmax(t).toArraySync();
      const e1 = 1 / (1 + Math.exp(-1));
      expectClose(got, [e1, 1 - e1, 0, 1 / (1 + Math.exp(-5) + Math.exp(-205)) * Math.exp(-5), 0, 1 / (1 + Math.exp(-5))], 1e-7, 1e-5, 'softmax');
      const ls = nt.logSoftmax(t).toArraySync();
      // log-softmax of −1000 next to 1000 and 999: −2000 − log(1 + e⁻¹), finite, not −inf
      expect(ls[2]).toBeCloseTo(-2000 - Math.log(1 + Math.exp(-1)), 2);
    });
  });

  it('attention with fewer queries than keys aligns queries to the last positions', () => {
    const [B, H, T, Tk, D] = [1, 2, 2, 5, 3];
    const r = rng(9);
    const q = Float64Array.from(Float32Array.from(randomArray(B * H * T * D, r)));
    const k = Float64Array.from(Float32Array.from(randomArray(B * H * Tk * D, r)));
    const v = Float64Array.from(Float32Array.from(randomArray(B * H * Tk * D, r)));
    const scale = 0.7;
    nt.scope(() => {
      const out = nt.attention(nt.tensor(Float32Array.from(q), [B, H, T, D]), nt.tensor(Float32Array.from(k), [B, H, Tk, D]),
        nt.tensor(Float32Array.from(v), [B, H, Tk, D]), { causal: true, scale }).toArraySync();
      const want = new Float64Array(B * H * T * D);
      for (let h = 0; h < H; h++) for (let i = 0; i < T; i++) {
        const last = i + Tk - T;  // query i sits at key position i + (Tk − T)
        const s: number[] = [];
        for (let j = 0; j <= last; j++) {
          let dot = 0;
          for (let d = 0; d < D; d++) dot += q[(h * T + i) * D + d]! * k[(h * Tk + j) * D + d]!;
          s.push(dot * scale);
        }
        const m = Math.max(...s), z = s.reduce((a, c) => a + Math.exp(c - m), 0);
        for (let d = 0; d < D; d++) {
          want[(h * T + i) * D + d] = s.reduce((a, c, j) => a + (Math.exp(c - m) / z) * v[(h * Tk + j) * D + d]!, 0);
        }
      }
      expectClose(out, want, 1e-6, 1e-5, 'attention T < Tk');
    });
  });

  it('setKernelThreads rejects nonsense', () => {
    expect(() => cpu().setKernelThreads(0)).toThrow(nt.ArgumentError);
    expect(cpu().kernelThreads()).toBe(initialThreads);
  });
});
