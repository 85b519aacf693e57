// The fused LM head with a padded vocabulary (padVocab / NODETRON_PAD_VOCAB): its GEMMs run on the
// vocabulary rounded up to a multiple of the padding, the pad columns are masked to −inf before the
// cross-entropy, and the gradients are sliced back to [V, C]. Loss and gradients against the unpadded
// head for odd vocabularies, with chunks, ignored rows, a bias, sum reduction, f32 and bf16 autocast;
// the environment switch and its typed errors.
import { afterEach, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { paddedVocab, padVocabFromEnv } from '../../lib/ops/linear-cross-entropy.js';
import { randomArray, rng } from '../helpers/gradcheck.js';

interface Case { n: number; c: number; v: number; seed: number; ignore?: number[]; bias?: boolean }

function run(k: Case, opts: nt.LinearCrossEntropyOptions, dtype: 'f32' | 'bf16' = 'f32', autocast = false) {
  const r = rng(k.seed);
  const x = Float32Array.from(randomArray(k.n * k.c, r, -2, 2)), w = Float32Array.from(randomArray(k.v * k.c, r, -1, 1));
  const b = Float32Array.from(randomArray(k.v, r, -1, 1));
  const t = Int32Array.from({ length: k.n }, () => Math.floor(r() * k.v));
  for (const i of k.ignore ?? []) t[i] = -100;
  // A target in the last column: the one next to the pad columns.
  t[1] = k.v - 1;
  return nt.scope(() => {
    const xt = nt.tensor(x, [k.n, k.c]).to(dtype), wt = nt.tensor(w, [k.v, k.c]).to(dtype);
    const bt = k.bias ? nt.tensor(b, [k.v]).to(dtype) : null;
    for (const p of [xt, wt, bt]) if (p) p.requiresGrad = true;
    const head = () => nt.linearCrossEntropy(xt, wt, nt.tensor(t, [k.n]), { ...opts, bias: bt });
    const loss = autocast ? nt.autocast({ dtype: 'bf16' }, head) : head();
    nt.scale(loss, 1.5).backward();
    return {
      loss: loss.to('f32').item(), dtype: loss.dtype,
      dx: xt.grad!.to('f32').toArraySync() as Float32Array, dw: wt.grad!.to('f32').toArraySync() as Float32Array,
      db: bt ? bt.grad!.to('f32').toArraySync() as Float32Array : null,
      shapes: [xt.grad!.shape, wt.grad!.shape, bt?.grad?.shape ?? null],
    };
  });
}

function maxRel(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let d = 0, m = 0;
  for (let i = 0; i < b.length; i++) { d = Math.max(d, Math.abs(a[i]! - b[i]!)); m = Math.max(m, Math.abs(b[i]!)); }
  return d / Math.max(m, 1e-30);
}

afterEach(() => { delete process.env.NODETRON_PAD_VOCAB; });

describe('linearCrossEntropy with a padded vocabulary', () => {
  it('rounds the vocabulary up', () => {
    expect(paddedVocab(50257, 64)).toBe(50304);
    expect(paddedVocab(97, 64)).toBe(128);
    expect(paddedVocab(128, 64)).toBe(128);
    expect(paddedVocab(97, 0)).toBe(97);
  });

  // The padded head differs from the unpadded one only where the cpu kernels sum in another order:
  // the log-sum-exp's 16 lanes take the row's tail differently once the width is a multiple of 16
  // (a relative change of a few f32 ulps, ≤ V·2⁻²⁴ in the worst case; V ≤ 1000 gives ≤ 6e-5, and in
  // practice ~1e-7), and the GEMMs over k = Vp instead of V add exact zeros, which may regroup BLAS's
  // k-blocks (again a few ulps of each dot product of length ≤ V). 16-bit runs round the padded and
  // unpadded results to bf16 from f32 values that differ by those ulps, so at most one bf16 ulp
  // (2⁻⁸ relative) apart. The pad columns' fastExp(−inf) is clamped to exp(−87) ≈ 1.6e−38, which
  // vanishes against the row's sum (≥ 1, the maximum's term).
  const cases: [string, Case, nt.LinearCrossEntropyOptions][] = [
    ['V 97, one chunk', { n: 16, c: 8, v: 97, seed: 1 }, {}],
    ['V 97, chunks of 5 rows, ignored rows', { n: 37, c: 13, v: 97, seed: 2, ignore: [0, 9, 36] }, { chunkRows: 5 }],
    ['V 1000, chunks of 7, sum reduction', { n: 30, c: 9, v: 1000, seed: 3 }, { chunkRows: 7, reduction: 'sum' }],
    ['V 97 with a bias, chunks of 4', { n: 18, c: 6, v: 97, seed: 4, bias: true }, { chunkRows: 4 }],
    ['V 61 with a bias, one chunk', { n: 9, c: 5, v: 61, seed: 5, bias: true }, {}],
  ];
  for (const [name, k, opts] of cases) {
    it(`${name}: f32 loss and gradients equal the unpadded head's`, () => {
      const ref = run(k, { ...opts, padVocab: 0 }), got = run(k, { ...opts, padVocab: 64 });
      expect(got.shapes).toEqual(ref.shapes);
      expect(Math.abs(got.loss - ref.loss)).toBeLessThanOrEqual(k.v * 2 ** -24 * Math.max(1, Math.abs(ref.loss)));
      expect(maxRel(got.dx, ref.dx)).toBeLessThanOrEqual(k.v * 2 ** -24);
      expect(maxRel(got.dw, ref.dw)).toBeLessThanOrEqual(k.v * 2 ** -24);
      if (ref.db) expect(maxRel(got.db!, ref.db)).toBeLessThanOrEqual(k.v * 2 ** -24);
      for (const g of [got.dx, got.dw]) expect(g.every(Number.isFinite)).toBe(true);
    });
    it(`${name}: under bf16 autocast, f32 loss and gradients within a bf16 rounding of the unpadded head's`, () => {
      const ref = run(k, { ...opts, padVocab: 0 }, 'f32', true), got = run(k, { ...opts, padVocab: 64 }, 'f32', true);
      expect(got.dtype).toBe('f32');
      expect(Math.abs(got.loss - ref.loss)).toBeLessThanOrEqual(k.v * 2 ** -24 * Math.max(1, Math.abs(ref.loss)));
      expect(maxRel(got.dx, ref.dx)).toBeLessThanOrEqual(2 ** -8);
      expect(maxRel(got.dw, ref.dw)).toBeLessThanOrEqual(2 ** -8);
      if (ref.db) expect(maxRel(got.db!, ref.db)).toBeLessThanOrEqual(2 ** -8);
    });
  }

  it('bf16 inputs (chunks accumulate the weight gradient in f32): within a bf16 rounding', () => {
    const k = { n: 20, c: 8, v: 97, seed: 6, bias: true };
    const ref = run(k, { chunkRows: 6, padVocab: 0 }, 'bf16'), got = run(k, { chunkRows: 6, padVocab: 64 }, 'bf16');
    expect(got.dtype).toBe('bf16');
    expect(Math.abs(got.loss - ref.loss)).toBeLessThanOrEqual(2 ** -8 * Math.max(1, Math.abs(ref.loss)));
    expect(maxRel(got.dx, ref.dx)).toBeLessThanOrEqual(2 ** -8);
    expect(maxRel(got.dw, ref.dw)).toBeLessThanOrEqual(2 ** -8);
    expect(maxRel(got.db!, ref.db!)).toBeLessThanOrEqual(2 ** -8);
  });

  it('the padded head is not a no-op: the padding 64 of V 128 changes nothing, of V 97 runs 128 columns', () => {
    // V already a multiple: bit-identical to the unpadded head (the same code path).
    const k = { n: 12, c: 4, v: 128, seed: 7 };
    const a = run(k, { padVocab: 0 }), b = run(k, { padVocab: 64 });
    expect(b.loss).toBe(a.loss);
    expect(Array.from(b.dw)).toEqual(Array.from(a.dw));
  });

  it('NODETRON_PAD_VOCAB switches it on; the option wins; bad values are ArgumentErrors', () => {
    const k = { n: 10, c: 4, v: 97, seed: 8 };
    const ref = run(k, { padVocab: 0 });
    process.env.NODETRON_PAD_VOCAB = '64';
    expect(padVocabFromEnv()).toBe(64);
    const env = run(k, {}), opt = run(k, { padVocab: 64 });
    expect(env.loss).toBe(opt.loss);
    expect(Array.from(env.dx)).toEqual(Array.from(opt.dx));
    expect(Math.abs(env.loss - ref.loss)).toBeLessThanOrEqual(k.v * 2 ** -24 * Math.max(1, Math.abs(ref.loss)));
    for (const bad of ['x', '-1', '1.5', '1e9']) {
      process.env.NODETRON_PAD_VOCAB = bad;
      expect(() => run(k, {})).toThrow(nt.ArgumentError);
    }
    delete process.env.NODETRON_PAD_VOCAB;
    expect(() => run(k, { padVocab: -3 })).toThrow(/padVocab must be an integer/);
  });
});
