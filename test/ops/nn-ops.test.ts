// Neural-network ops: gelu, softmax/logSoftmax, layerNorm/rmsNorm, attention (causal, window),
// embedding, cross-entropy and dropout, against float64 references and finite differences.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, gradcheck, randomArray, rng } from '../helpers/gradcheck.js';

const f32 = (a: Float64Array) => Float64Array.from(Float32Array.from(a));

function rows(x: Float64Array, cols: number, f: (row: Float64Array) => Float64Array): Float64Array {
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / cols; r++) out.set(f(x.subarray(r * cols, (r + 1) * cols)), r * cols);
  return out;
}
const refSoftmax = (row: Float64Array) => { const m = Math.max(...row); const e = row.map((v) => Math.exp(v - m)); const s = e.reduce((a, b) => a + b); return e.map((v) => v / s); };
const refLogSoftmax = (row: Float64Array) => { const m = Math.max(...row); const s = row.reduce((a, v) => a + Math.exp(v - m), 0); return row.map((v) => v - m - Math.log(s)); };
const refGelu = (v: number) => 0.5 * v * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (v + 0.044715 * v ** 3)));

describe('gelu and softmax', () => {
  it('gelu forward and gradient', () => {
    const x = f32(randomArray(3 * 7, rng(1), -4, 4));
    nt.scope(() => expectClose(nt.gelu(nt.tensor(Float32Array.from(x), [3, 7])).toArraySync(), x.map(refGelu), 1e-6, 1e-5, 'gelu'));
    gradcheck((t) => t!.gelu(), [{ data: x, shape: [3, 7] }]);
  });
  it('softmax and logSoftmax over the last and a middle dim', () => {
    const x = f32(randomArray(2 * 3 * 9, rng(2), -3, 3));
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), [2, 3, 9]);
      expectClose(nt.softmax(t).toArraySync(), rows(x, 9, refSoftmax), 1e-7, 1e-5, 'softmax');
      expectClose(nt.logSoftmax(t).toArraySync(), rows(x, 9, refLogSoftmax), 1e-5, 1e-5, 'logSoftmax');
      const mid = nt.softmax(t, 1).permute([0, 2, 1]);
      const ref = rows(Float64Array.from(nt.noGrad(() => t.permute([0, 2, 1])).toArraySync()), 3, refSoftmax);
      expectClose(mid.toArraySync(), ref, 1e-7, 1e-5, 'softmax dim 1');
    });
    gradcheck((t) => nt.softmax(t!), [{ data: x, shape: [2, 3, 9] }]);
    gradcheck((t) => nt.logSoftmax(t!), [{ data: x, shape: [2, 3, 9] }]);
    gradcheck((t) => t!.softmax(1), [{ data: x, shape: [2, 3, 9] }]);
  });
});

describe('normalization', () => {
  const cols = 7;
  const x = f32(randomArray(3 * cols, rng(3), -2, 2)), w = f32(randomArray(cols, rng(4), 0.5, 1.5)), b = f32(randomArray(cols, rng(5)));
  it('layerNorm forward and gradients (x, weight, bias)', () => {
    const ref = rows(x, cols, (r) => {
      const m = r.reduce((a, v) => a + v, 0) / cols;
      const v = r.reduce((a, u) => a + (u - m) ** 2, 0) / cols;
      return r.map((u, j) => ((u - m) / Math.sqrt(v + 1e-5)) * w[j]! + b[j]!);
    });
    nt.scope(() => {
      const out = nt.layerNorm(nt.tensor(Float32Array.from(x), [3, cols]), nt.tensor(Float32Array.from(w), [cols]), nt.tensor(Float32Array.from(b), [cols]));
      expectClose(out.toArraySync(), ref, 1e-5, 1e-4, 'layerNorm');
    });
    gradcheck((a, ww, bb) => nt.layerNorm(a!, ww!, bb), [{ data: x, shape: [3, cols] }, { data: w, shape: [cols] }, { data: b, shape: [cols] }]);
    gradcheck((a, ww) => nt.layerNorm(a!, ww!, null, 1e-3), [{ data: x, shape: [3, cols] }, { data: w, shape: [cols] }]);
  });
  it('rmsNorm forward and gradients', () => {
    const ref = rows(x, cols, (r) => {
      const ms = r.reduce((a, v) => a + v * v, 0) / cols;
      return r.map((u, j) => (u / Math.sqrt(ms + 1e-6)) * w[j]!);
    });
    nt.scope(() => {
      const out = nt.rmsNorm(nt.tensor(Float32Array.from(x), [3, cols]), nt.tensor(Float32Array.from(w), [cols]));
      expectClose(out.toArraySync(), ref, 1e-5, 1e-4, 'rmsNorm');
    });
    gradcheck((a, ww) => nt.rmsNorm(a!, ww!), [{ data: x, shape: [3, cols] }, { data: w, shape: [cols] }]);
  });
  it('bf16 layerNorm spot check', () => {
    nt.scope(() => {
      const t = nt.tensor(Float32Array.from(x), [3, cols]).to('bf16');
      const out = nt.layerNorm(t, nt.tensor(Float32Array.from(w), [cols]).to('bf16'));
      const xs = Float64Array.from(t.toArraySync()), ws = Float64Array.from(nt.tensor(Float32Array.from(w), [cols]).to('bf16').toArraySync());
      const ref = rows(xs, cols, (r) => {
        const m = r.reduce((a, v) => a + v, 0) / cols;
        const v = r.reduce((a, u) => a + (u - m) ** 2, 0) / cols;
        return r.map((u, j) => ((u - m) / Math.sqrt(v + 1e-5)) * ws[j]!);
      });
      expect(out.dtype).toBe('bf16');
      expectClose(out.toArraySync(), ref, 1e-2, 1 / 64, 'bf16 layerNorm');
    });
  });
  it('shape mismatches throw ShapeError', () => {
    const t = nt.zeros([2, 4]);
    expect(() => nt.layerNorm(t, nt.ones([3]))).toThrow(nt.ShapeError);
    expect(() => nt.layerNorm(t, nt.ones([4]), nt.ones([5]))).toThrow(nt.ShapeError);
    expect(() => nt.rmsNorm(t, nt.ones([4, 1]))).toThrow(nt.ShapeError);
    expect(nt.rmsNorm(t, nt.ones([4])).shape).toEqual([2, 4]);
  });
});

/** float64 attention for [B, H, T, D] with causal/window masks. */
function refAttention(q: Float64Array, k: Float64Array, v: Float64Array, B: number, H: number, T: number, D: number, causal: boolean, window: number): Float64Array {
  const out = new Float64Array(B * H * T * D);
  const scale = 1 / Math.sqrt(D);
  for (let bh = 0; bh < B * H; bh++) for (let i = 0; i < T; i++) {
    const s: number[] = [];
    for (let j = 0; j < T; j++) {
      const visible = (!causal || j <= i) && (window === 0 || j > i - window);
      let dot = 0;
      for (let d = 0; d < D; d++) dot += q[(bh * T + i) * D + d]! * k[(bh * T + j) * D + d]!;
      s.push(visible ? dot * scale : -Infinity);
    }
    const m = Math.max(...s);
    const e = s.map((x) => (x === -Infinity ? 0 : Math.exp(x - m)));
    const z = e.reduce((a, c) => a + c);
    for (let d = 0; d < D; d++) {
      let acc = 0;
      for (let j = 0; j < T; j++) acc += (e[j]! / z) * v[(bh * T + j) * D + d]!;
      out[(bh * T + i) * D + d] = acc;
    }
  }
  return out;
}

describe('attention', () => {
  const [B, H, T, D] = [2, 2, 5, 3];
  const n = B * H * T * D;
  const r = rng(6);
  const q = f32(randomArray(n, r)), k = f32(randomArray(n, r)), v = f32(randomArray(n, r));
  const shape = [B, H, T, D];
  for (const [causal, window] of [[true, 0], [true, 2], [false, 0]] as const) {
    it(`causal=${causal} window=${window}: forward and gradients of q, k, v`, () => {
      nt.scope(() => {
        const t = (a: Float64Array) => nt.tensor(Float32Array.from(a), shape);
        const out = nt.attention(t(q), t(k), t(v), { causal, window });
        expectClose(out.toArraySync(), refAttention(q, k, v, B, H, T, D, causal, window), 1e-5, 1e-4, 'attention');
      });
      gradcheck((a, b, c) => nt.attention(a!, b!, c!, { causal, window }), [{ data: q, shape }, { data: k, shape }, { data: v, shape }]);
    });
  }
  it('mismatched shapes throw ShapeError', () => {
    expect(() => nt.attention(nt.zeros([1, 2, 4, 3]), nt.zeros([1, 2, 4, 2]), nt.zeros([1, 2, 4, 3]))).toThrow(nt.ShapeError);
    expect(() => nt.attention(nt.zeros([2, 4, 3]), nt.zeros([2, 4, 3]), nt.zeros([2, 4, 3]))).toThrow(nt.ShapeError);
    expect(() => nt.attention(nt.zeros([1, 1, 2, 2]), nt.zeros([1, 1, 2, 2]), nt.zeros([1, 1, 2, 2]), { window: -1 })).toThrow(nt.ArgumentError);
    expect(nt.attention(nt.zeros([1, 1, 2, 2]), nt.zeros([1, 1, 2, 2]), nt.zeros([1, 1, 2, 2])).shape).toEqual([1, 1, 2, 2]);
  });
});

describe('embedding', () => {
  it('gathers rows and scatter-adds gradients (repeated ids)', () => {
    const w = f32(randomArray(5 * 3, rng(7)));
    const ids = [4, 0, 4, 2, 1, 4];
    nt.scope(() => {
      const out = nt.embedding(nt.tensor(Int32Array.from(ids), [2, 3]), nt.tensor(Float32Array.from(w), [5, 3]));
      expect(out.shape).toEqual([2, 3, 3]);
      expectClose(out.toArraySync(), ids.flatMap((i) => Array.from(w.subarray(i * 3, i * 3 + 3))), 0, 0, 'embedding');
    });
    const idT = nt.tensor(Int32Array.from(ids), [2, 3]);
    gradcheck((ww) => nt.embedding(idT, ww!), [{ data: w, shape: [5, 3] }]);
    idT.dispose();
  });
  it('out-of-range ids and float ids throw typed errors', () => {
    const w = nt.zeros([4, 2]);
    expect(() => nt.embedding(nt.tensor(Int32Array.from([0, 4]), [2]), w)).toThrow(nt.ArgumentError);
    expect(() => nt.embedding(nt.tensor(Int32Array.from([-1]), [1]), w)).toThrow(nt.ArgumentError);
    expect(() => nt.embedding(nt.zeros([2]), w)).toThrow(nt.DTypeError);
    expect(nt.embedding(nt.tensor(Int32Array.from([3]), [1]), w).shape).toEqual([1, 2]);
  });
});

describe('crossEntropy', () => {
  const N = 6, V = 11;
  const logits = f32(randomArray(N * V, rng(8), -3, 3));
  const targets = [3, 0, 10, -100, 7, 7];
  const ref = (reduction: 'mean' | 'sum') => {
    let total = 0, count = 0;
    for (let r = 0; r < N; r++) {
      if (targets[r] === -100) continue;
      const ls = refLogSoftmax(logits.subarray(r * V, (r + 1) * V));
      total -= ls[targets[r]!]!;
      count++;
    }
    return reduction === 'sum' ? total : total / count;
  };
  for (const reduction of ['mean', 'sum'] as const) {
    it(`${reduction} with an ignored row: loss and gradient`, () => {
      const tT = nt.tensor(Int32Array.from(targets), [N]);
      nt.scope(() => {
        const loss = nt.crossEntropy(nt.tensor(Float32Array.from(logits), [N, V]), tT, { reduction });
        expect(loss.shape).toEqual([]);
        expect(loss.item()).toBeCloseTo(ref(reduction), 5);
      });
      gradcheck((l) => nt.crossEntropy(l!, tT, { reduction }), [{ data: logits, shape: [N, V] }]);
      // leading dims [2, 3] and a custom ignoreIndex (7 appears twice)
      const t2 = nt.tensor(Int32Array.from(targets.map((t) => (t < 0 ? 1 : t))), [2, 3]);
      gradcheck((l) => nt.crossEntropy(l!.reshape([2, 3, V]), t2, { reduction, ignoreIndex: 7 }), [{ data: logits, shape: [N, V] }]);
      tT.dispose();
      t2.dispose();
    });
  }
  it('bad targets throw typed errors', () => {
    const l = nt.zeros([2, 4]);
    expect(() => nt.crossEntropy(l, nt.tensor(Int32Array.from([0, 4]), [2]))).toThrow(nt.ArgumentError);
    expect(() => nt.crossEntropy(l, nt.tensor(Int32Array.from([0, 1, 2]), [3]))).toThrow(nt.ShapeError);
    expect(() => nt.crossEntropy(l, nt.zeros([2]))).toThrow(nt.DTypeError);
    expect(nt.crossEntropy(l, nt.tensor(Int32Array.from([0, 3]), [2])).item()).toBeCloseTo(Math.log(4), 6);
  });
});

describe('dropout', () => {
  it('zeroes about p of the elements, scales the rest, same mask for the same seed, gradient through the mask', () => {
    nt.scope(() => {
      const x = nt.ones([4000]);
      x.requiresGrad = true;
      const y = nt.dropout(x, 0.25, { seed: 5 });
      const vals = y.toArraySync();
      const kept = vals.filter((v) => v !== 0);
      expect(kept.every((v) => Math.abs(v - 1 / 0.75) < 1e-6)).toBe(true);
      expect(Math.abs(kept.length / 4000 - 0.75)).toBeLessThan(0.03);
      const again = nt.dropout(x, 0.25, { seed: 5 }).toArraySync();
      expect(Array.from(again)).toEqual(Array.from(vals));
      nt.sum(y).backward();
      expect(Array.from(x.grad!.toArraySync())).toEqual(Array.from(vals));
      expect(nt.dropout(x, 0.5, { training: false })).toBe(x);
      expect(() => nt.dropout(x, 1.5)).toThrow(nt.ArgumentError);
    });
  });

  it('a part of a tensor gets that part of the whole tensor\'s mask, and the generator advances as for the whole', () => {
    nt.scope(() => {
      // [3, 6, 5] split along dimension 1 into chunks of 2 (sequence parallelism), and a [2, 4] part of [2, 7] along the last dimension.
      for (const [shape, dim, chunk] of [[[3, 6, 5], 1, 2], [[2, 7], 1, 4], [[4, 3], 0, 1]] as const) {
        const whole = new nt.Generator(21);
        const full = nt.dropout(nt.ones([...shape]), 0.5, { generator: whole }).toArraySync();
        const outer = shape.slice(0, dim).reduce((a, b) => a * b, 1), inner = shape.slice(dim + 1).reduce((a, b) => a * b, 1), extent = shape[dim]!;
        for (let start = 0; start < extent; start += chunk) {
          const held = Math.min(chunk, extent - start);
          const gen = new nt.Generator(21);
          const partShape = shape.map((d, i) => (i === dim ? held : d));
          const x = nt.ones(partShape); x.requiresGrad = true;
          const y = nt.dropout(x, 0.5, { generator: gen, part: { dim, start, extent } });
          const want = Array.from({ length: outer * held * inner }, (_, k) => {
            const o = Math.floor(k / (held * inner)), j = Math.floor(k / inner) % held, i = k % inner;
            return full[(o * extent + start + j) * inner + i]!;
          });
          expect(Array.from(y.toArraySync()), `${shape} part ${start}`).toEqual(want);
          expect(gen.offsetBlocks).toBe(whole.offsetBlocks);
          nt.sum(y).backward();
          expect(Array.from(x.grad!.toArraySync())).toEqual(want);
        }
      }
      const gen = new nt.Generator(3);
      for (const part of [{ dim: 2, start: 0, extent: 4 }, { dim: 1, start: 3, extent: 4 }, { dim: 0, start: -1, extent: 4 }, { dim: 1, start: 0, extent: 1.5 }]) {
        expect(() => nt.dropout(nt.ones([2, 2]), 0.5, { generator: gen, part })).toThrow(nt.ArgumentError);
      }
      expect(gen.offsetBlocks).toBe(0);
      expect(nt.dropout(nt.ones([2, 2]), 0.5, { generator: gen }).size).toBe(4);
    });
  });
});
