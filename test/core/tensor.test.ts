// Tensors on the cpu backend: creation, dtypes, shapes (0-d, empty), read-back, reshape, to, clone.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { viewOf } from '../../lib/internal.js';
import { accumulateInto } from '../../lib/autograd/engine.js';

const DTYPES = ['f32', 'f16', 'bf16', 'i32', 'u8'] as const;

describe('creation', () => {
  it('tensor() from a typed array with a shape', () => {
    const t = nt.tensor(new Float32Array([1, 2, 3, 4, 5, 6]), [2, 3]);
    expect(t.shape).toEqual([2, 3]);
    expect(t.dtype).toBe('f32');
    expect(t.device).toBe('cpu');
    expect(Array.from(t.toArraySync())).toEqual([1, 2, 3, 4, 5, 6]);
    t.dispose();
  });

  it('tensor() infers shape and dtype from nested arrays and typed arrays', () => {
    const t = nt.tensor([[1, 2, 3], [4, 5, 6]]);
    expect(t.shape).toEqual([2, 3]);
    expect(t.tolist()).toEqual([[1, 2, 3], [4, 5, 6]]);
    expect(nt.tensor(new Int32Array([7, -8])).dtype).toBe('i32');
    expect(nt.tensor(new Uint8Array([7, 8])).dtype).toBe('u8');
    expect(nt.tensor([[[1], [2]]]).shape).toEqual([1, 2, 1]);
  });

  it('0-d and empty tensors of every dtype', () => {
    for (const dtype of DTYPES) {
      const s = nt.tensor(3, { dtype });
      expect(s.shape).toEqual([]);
      expect(s.size).toBe(1);
      expect(s.item()).toBe(3);
      const e = nt.zeros([0, 5], { dtype });
      expect(e.size).toBe(0);
      expect(e.toArraySync().length).toBe(0);
      expect(e.reshape([5, 0]).shape).toEqual([5, 0]);
      s.dispose(); e.dispose();
    }
  });

  it('zeros, ones, full and arange in every dtype', () => {
    for (const dtype of DTYPES) {
      expect(Array.from(nt.zeros([2, 2], { dtype }).toArraySync())).toEqual([0, 0, 0, 0]);
      expect(Array.from(nt.ones([3], { dtype }).toArraySync())).toEqual([1, 1, 1]);
      expect(Array.from(nt.full([2], 5, { dtype }).toArraySync())).toEqual([5, 5]);
      expect(Array.from(nt.arange(1, 7, 2, { dtype }).toArraySync())).toEqual([1, 3, 5]);
    }
    expect(nt.arange(4).dtype).toBe('i32');
    const f = nt.arange(0, 1, 0.25);
    expect(f.dtype).toBe('f32');
    expect(Array.from(f.toArraySync())).toEqual([0, 0.25, 0.5, 0.75]);
    expect(nt.arange(5, 0, -2).tolist()).toEqual([5, 3, 1]);
  });

  it('f16 and bf16 round to nearest even and keep the representable values', () => {
    const vals = [0, -0, 1, -2.5, 65504, 1e-7, 3.140625, 1 + 2 ** -11, 1 + 3 * 2 ** -11];
    const h = nt.tensor(vals, { dtype: 'f16' }).toArraySync();
    expect(h[4]).toBe(65504);
    expect(h[2]).toBe(1);
    expect(Math.abs(h[5]! - 1e-7)).toBeLessThan(6e-8); // subnormal in f16
    expect(h[7]).toBe(1); // halfway between 1 and 1+2^-10 rounds to even (down)
    expect(h[8]).toBe(1 + 2 ** -9); // 1.5 ulp rounds to even (up)
    const b = nt.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.140625], { dtype: 'bf16' }).toArraySync();
    expect(b[0]).toBe(1); // tie to even
    expect(b[1]).toBe(1 + 2 ** -6);
    expect(nt.tensor([1e6], { dtype: 'f16' }).item()).toBe(Infinity);
  });

  it('to(dtype) converts, saturates integers and clone copies', () => {
    const t = nt.tensor([-3.7, 0.5, 300, 2.2]);
    expect(Array.from(t.to('i32').toArraySync())).toEqual([-3, 0, 300, 2]);
    expect(Array.from(t.to('u8').toArraySync())).toEqual([0, 0, 255, 2]);
    const c = t.clone();
    t.dispose();
    expect(c.toArraySync()[0]).toBeCloseTo(-3.7, 5);
    expect(nt.tensor([1, 2]).to({ dtype: 'bfloat16' }).dtype).toBe('bf16');
  });

  it('reshape shares storage, infers -1 and survives disposal of the original', () => {
    const t = nt.arange(12, { dtype: 'f32' });
    const r = t.reshape([3, -1]);
    expect(r.shape).toEqual([3, 4]);
    t.dispose();
    expect(r.tolist()).toEqual([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]);
    r.dispose();
  });

  it('viewOf aliases a range of another storage: writes show through both, the bytes outlive the base, bad ranges are ArgumentErrors', () => {
    const base = nt.arange(10, { dtype: 'f32' });
    const v = viewOf(base, 3, [2, 2]);
    expect(v.tolist()).toEqual([[3, 4], [5, 6]]);
    // In place through the view (autograd's accumulation): the base sees it; and the other way round.
    accumulateInto(v, nt.full([2, 2], 10));
    expect(Array.from(base.toArraySync())).toEqual([0, 1, 2, 13, 14, 15, 16, 7, 8, 9]);
    accumulateInto(base, nt.ones([10]));
    expect(Array.from(v.toArraySync())).toEqual([14, 15, 16, 17]);
    // Disposing the base first leaves the view's bytes allocated and readable.
    base.dispose();
    expect(v.disposed).toBe(false);
    expect(Array.from(v.toArraySync())).toEqual([14, 15, 16, 17]);
    const w = viewOf(v, 1, [3]);
    v.dispose();
    expect(Array.from(w.toArraySync())).toEqual([15, 16, 17]);
    w.dispose();
    const b = nt.zeros([4], { dtype: 'bf16' });
    expect(() => viewOf(b, 2, [3])).toThrow(nt.ArgumentError);
    expect(() => viewOf(b, -1, [1])).toThrow(nt.ArgumentError);
    const e = viewOf(b, 4, [0]);
    expect(e.size).toBe(0);
    e.dispose();
    b.dispose();
    expect(() => viewOf(b, 0, [1])).toThrow(nt.DisposedError);
  });

  it('toArray is async and item() reads a single value', async () => {
    const t = nt.tensor([[2.5]]);
    expect(Array.from(await t.toArray())).toEqual([2.5]);
    expect(t.item()).toBe(2.5);
  });
});

describe('random numbers', () => {
  it('are reproducible from a seed and independent of how a draw is split', () => {
    const a = nt.randn([1000], { seed: 42 }).toArraySync();
    const b = nt.randn([1000], { seed: 42 }).toArraySync();
    expect(Array.from(a)).toEqual(Array.from(b));
    // A rank drawing elements [333, 777) of the same draw gets exactly those elements.
    const shard = nt.randomShard('normal', [444], 333, 1000, { seed: 42 }).toArraySync();
    expect(Array.from(shard)).toEqual(Array.from(a.slice(333, 777)));
    const u = nt.rand([1001], { seed: 7 }).toArraySync();
    const us = nt.randomShard('uniform', [3], 998, 1001, { seed: 7 }).toArraySync();
    expect(Array.from(us)).toEqual(Array.from(u.slice(998)));
  });

  it('have the right moments and range', () => {
    const n = 200_000;
    const x = nt.randn([n], { seed: 1 }).toArraySync();
    let s = 0, s2 = 0;
    for (const v of x) { s += v; s2 += v * v; }
    expect(Math.abs(s / n)).toBeLessThan(0.01);
    expect(Math.abs(s2 / n - 1)).toBeLessThan(0.02);
    const u = nt.rand([n], { seed: 2 }).toArraySync();
    let min = 1, max = 0, su = 0;
    for (const v of u) { min = Math.min(min, v); max = Math.max(max, v); su += v; }
    expect(min).toBeGreaterThanOrEqual(0);
    expect(max).toBeLessThan(1);
    expect(Math.abs(su / n - 0.5)).toBeLessThan(0.005);
  });

  it('the default generator advances so consecutive draws differ, and manualSeed restarts it', () => {
    nt.manualSeed(5);
    const a = nt.randn([8]).toArraySync();
    const b = nt.randn([8]).toArraySync();
    expect(Array.from(a)).not.toEqual(Array.from(b));
    nt.manualSeed(5);
    expect(Array.from(nt.randn([8]).toArraySync())).toEqual(Array.from(a));
    // A draw of one kind does not reuse the blocks of the previous draw of another kind.
    nt.manualSeed(9);
    const n1 = nt.randn([4]).toArraySync();
    const u1 = nt.rand([4]).toArraySync();
    nt.manualSeed(9);
    const u0 = nt.rand([4]).toArraySync();
    expect(Array.from(u1)).not.toEqual(Array.from(u0));
    expect(n1.length).toBe(4);
  });

  it('draws the same numbers in every float dtype up to rounding', () => {
    const f = nt.randn([64], { seed: 3 }).toArraySync();
    const h = nt.randn([64], { seed: 3, dtype: 'bf16' }).toArraySync();
    for (let i = 0; i < 64; i++) expect(Math.abs(h[i]! - f[i]!)).toBeLessThanOrEqual(Math.abs(f[i]!) * 2 ** -8 + 1e-30);
  });
});
