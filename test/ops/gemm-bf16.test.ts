// The cpu backend's bf16 GEMM: the AVX512_BF16 kernel (native/cpu/kernels/gemm_bf16.cc) and the
// widen-to-f32 + cblas_sgemm fallback, both run in this file (setBf16Gemm), against float64 references
// of the bf16 inputs on many shapes (odd K, K over one k block, M and N off the register tile, 1×N,
// N×1, K = 0), every transpose, bf16 and f32 outputs, alpha/beta, batches with strides, shared and
// accumulating operands; matmul and a bf16 training step through both paths; cross-entropy on bf16
// logits against the f32 kernel; bad input errors.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { dtypeCode } from '../../lib/dtype.js';
import { cpu, packageRoot } from '../../lib/native.js';
import { rng } from '../helpers/gradcheck.js';

const addon = cpu();
const initial = addon.gemmBf16Kernel().mode as string;
afterAll(() => { addon.setBf16Gemm(initial); });
const supported = addon.gemmBf16Kernel().supported as boolean;
const PATHS = ['auto', 'fallback'] as const;

/** Values rounded to bf16 (read back from a bf16 tensor), so the float64 reference sees exactly what the kernel reads. */
function bf16Values(n: number, r: () => number, scale = 1): { t: nt.Tensor; v: Float64Array } {
  const f = Float32Array.from({ length: n }, () => (2 * r() - 1) * scale);
  const t = nt.tensor(f, [n], { dtype: 'bf16' });
  return { t, v: Float64Array.from(t.toArraySync() as ArrayLike<number>) };
}

interface Case { m: number; n: number; k: number; batch?: number }

/**
 * Runs gemm on logical op(A)[b] (m×k) and op(B)[b] (k×n) laid out per transA/transB, with C of
 * `out` dtype, and checks every element against the float64 sum within the f32-accumulation bound
 * 2k·2⁻²⁴·Σ|a·b| (+ half an ulp of bf16 for a bf16 output).
 */
function check(c: Case, ta: boolean, tb: boolean, out: 'bf16' | 'f32', alpha: number, beta: number, seed: number,
  layout: 'separate' | 'sharedB' | 'accumulate' = 'separate'): void {
  const { m, n, k } = c, batch = c.batch ?? 1;
  const r = rng(seed);
  const nb = layout === 'sharedB' ? 1 : batch;
  const A = bf16Values(batch * m * k, r), B = bf16Values(nb * k * n, r);
  const cCount = layout === 'accumulate' ? m * n : batch * m * n;
  const C0 = bf16Values(cCount, r);
  const C = out === 'bf16' ? C0.t.clone() : C0.t.to('f32');
  // element (i, q) of op(A)[b] and (q, j) of op(B)[b] in their storage layouts
  const aAt = (b: number, i: number, q: number) => A.v[b * m * k + (ta ? q * m + i : i * k + q)]!;
  const bAt = (b: number, q: number, j: number) => B.v[(layout === 'sharedB' ? 0 : b) * k * n + (tb ? j * k + q : q * n + j)]!;
  addon.gemm(A.t.storage, B.t.storage, C.storage, dtypeCode('bf16'), batch, m, n, k, ta, tb, alpha, beta, m * k,
    layout === 'sharedB' ? 0 : k * n, layout === 'accumulate' ? 0 : m * n, ...(out === 'f32' ? [dtypeCode('f32')] : []));
  const got = C.toArraySync() as ArrayLike<number>;
  const ref = new Float64Array(cCount), bound = new Float64Array(cCount);
  ref.set(C0.v);
  for (let b = 0; b < batch; b++) {
    const o = layout === 'accumulate' ? 0 : b * m * n;
    for (let i = 0; i < m; i++) for (let j = 0; j < n; j++) {
      let s = 0, abs = 0;
      for (let q = 0; q < k; q++) { const p = aAt(b, i, q) * bAt(b, q, j); s += p; abs += Math.abs(p); }
      const prev = ref[o + i * n + j]!;
      ref[o + i * n + j] = alpha * s + beta * prev;
      bound[o + i * n + j] = Math.abs(beta) * bound[o + i * n + j]! + 2 * (k + 2) * 2 ** -24 * (Math.abs(alpha) * abs + Math.abs(beta * prev));
    }
  }
  let worst = 0, at = -1;
  for (let e = 0; e < cCount; e++) {
    const tol = bound[e]! + (out === 'bf16' ? 2 ** -8 * Math.abs(ref[e]!) : 0) + 1e-30;
    const err = Math.abs(got[e]! - ref[e]!) / tol;
    if (!(err <= worst)) { worst = err; at = e; }
  }
  const what = `${m}x${n}x${k} batch ${batch} ${layout} ta ${ta} tb ${tb} out ${out} alpha ${alpha} beta ${beta}`;
  expect(worst, `${what}: element ${at} got ${got[at]} want ${ref[at]}`).toBeLessThanOrEqual(1);
  A.t.dispose(); B.t.dispose(); C0.t.dispose(); C.dispose();
}

const SHAPES: Case[] = [
  { m: 1, n: 1, k: 1 }, { m: 1, n: 77, k: 33 }, { m: 45, n: 1, k: 20 }, { m: 13, n: 33, k: 5 }, { m: 12, n: 32, k: 64 },
  { m: 24, n: 64, k: 2 }, { m: 25, n: 70, k: 769 }, { m: 37, n: 129, k: 1537 }, { m: 100, n: 3, k: 1601 }, { m: 1, n: 300, k: 2 },
  { m: 130, n: 97, k: 31 },
];

describe.each(PATHS)('bf16 GEMM, %s path', (path) => {
  it('runs the kernel this path names', () => {
    addon.setBf16Gemm(path);
    const g = addon.gemmBf16Kernel();
    expect(g.mode).toBe(path);
    // The kernel also needs the kernels' SIMD level at avx512 (NODETRON_CPU_ISA=avx2 or baseline widen).
    expect(g.kernel).toBe(path === 'auto' && supported && nt.info().cpu.isa.active === 'avx512' ? 'avx512bf16' : 'sgemm');
    expect(nt.info().cpu.bf16Gemm.kernel).toBe(g.kernel);
  });

  it('every shape and transpose, bf16 and f32 outputs, against float64', () => {
    addon.setBf16Gemm(path);
    let seed = 1;
    for (const s of SHAPES) for (const ta of [false, true]) for (const tb of [false, true]) for (const out of ['bf16', 'f32'] as const) {
      check(s, ta, tb, out, 1, 0, seed++);
    }
  }, 120_000);

  it('alpha and beta, K = 0, batches with strides, a shared B, accumulation into one C', () => {
    addon.setBf16Gemm(path);
    let seed = 100;
    for (const out of ['bf16', 'f32'] as const) {
      for (const [ta, tb] of [[false, false], [true, true], [true, false], [false, true]] as const) {
        check({ m: 19, n: 45, k: 37 }, ta, tb, out, 0.75, 0.5, seed++);
        check({ m: 19, n: 45, k: 900 }, ta, tb, out, -1.5, 1, seed++);
        check({ m: 7, n: 9, k: 0 }, ta, tb, out, 1, 0.5, seed++);
        check({ m: 17, n: 40, k: 24, batch: 3 }, ta, tb, out, 1, 0, seed++);
        check({ m: 17, n: 40, k: 24, batch: 3 }, ta, tb, out, 1, 0, seed++, 'sharedB');
        check({ m: 17, n: 40, k: 801, batch: 3 }, ta, tb, out, 1, 1, seed++, 'accumulate');
      }
      // a batch of GEMMs large enough to split each one over the threads
      check({ m: 96, n: 160, k: 200, batch: 2 }, false, true, out, 1, 0, seed++);
      check({ m: 300, n: 40, k: 100 }, false, false, out, 1, 0, seed++);
    }
  }, 120_000);

  it('matmul, linear and the head in bf16 agree with float64 through this path', () => {
    addon.setBf16Gemm(path);
    const r = rng(7);
    nt.scope(() => {
      const a = bf16Values(64 * 96, r), b = bf16Values(96 * 40, r);
      const out = nt.matmul(a.t.reshape([64, 96]), b.t.reshape([96, 40]));
      expect(out.dtype).toBe('bf16');
      const got = out.toArraySync() as ArrayLike<number>;
      for (let i = 0; i < 64; i++) for (let j = 0; j < 40; j++) {
        let s = 0, abs = 0;
        for (let q = 0; q < 96; q++) { const p = a.v[i * 96 + q]! * b.v[q * 40 + j]!; s += p; abs += Math.abs(p); }
        expect(Math.abs(got[i * 40 + j]! - s)).toBeLessThanOrEqual(2 ** -8 * Math.abs(s) + 200 * 2 ** -24 * abs);
      }
    });
  });
});

describe('bf16 GEMM: the two paths side by side', () => {
  it('a bf16 training step under autocast gives the same loss and nearly the same gradients on both paths', () => {
    const cfg = { vocabSize: 96, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
    const run = (path: 'auto' | 'fallback') => {
      addon.setBf16Gemm(path);
      const model = new nt.nn.GPT(cfg, { seed: 3 });
      try {
        const ids = nt.tensor(Int32Array.from({ length: 4 * 16 }, (_, i) => (i * 37 + 5) % 96), [4, 16]);
        const tg = nt.tensor(Int32Array.from({ length: 4 * 16 }, (_, i) => (i * 11 + 3) % 96), [4, 16]);
        const loss = nt.autocast({ dtype: 'bf16' }, () => model.forward(ids, tg).loss!);
        loss.backward();
        const grads = model.parameters().map((p) => Float64Array.from(p.grad!.toArraySync() as ArrayLike<number>));
        const value = loss.item();
        loss.dispose(); ids.dispose(); tg.dispose();
        return { value, grads };
      } finally {
        model.dispose();
      }
    };
    const a = run('auto'), f = run('fallback');
    expect(Math.abs(a.value - f.value)).toBeLessThan(2e-2 * Math.abs(f.value));
    // bf16 rounding of activations differs where the f32 sums differ in their last bits: compare by norm.
    for (let p = 0; p < a.grads.length; p++) {
      let d = 0, s = 0;
      for (let i = 0; i < a.grads[p]!.length; i++) { d += (a.grads[p]![i]! - f.grads[p]![i]!) ** 2; s += f.grads[p]![i]! ** 2; }
      expect(Math.sqrt(d), `parameter ${p}`).toBeLessThanOrEqual(0.05 * Math.sqrt(s) + 1e-6);
    }
  }, 60_000);

  it('cross-entropy on bf16 logits (widened row by row) computes what the f32 kernel computes on the same values', () => {
    const rows = 6, vocab = 3001, r = rng(31);
    const L = bf16Values(rows * vocab, r, 8);
    const l32 = L.t.to('f32');
    const t = nt.tensor(Int32Array.from([5, 3000, 0, -100, 17, 2999]), [rows], { dtype: 'i32' });
    const f = (n: number) => nt.zeros([n]);
    const [loss16, lse16, loss32, lse32] = [f(rows), f(rows), f(rows), f(rows)];
    addon.cross_entropy_forward(L.t.storage, t.storage, loss16.storage, lse16.storage, rows, vocab, -100, dtypeCode('bf16'));
    addon.cross_entropy_forward(l32.storage, t.storage, loss32.storage, lse32.storage, rows, vocab, -100, dtypeCode('f32'));
    expect(loss16.toArraySync()).toEqual(loss32.toArraySync());
    expect(lse16.toArraySync()).toEqual(lse32.toArraySync());
    // backward in place (as the head runs it): the bf16 gradient is the f32 one rounded to bf16
    const one16 = nt.ones([1], { dtype: 'bf16' }), one32 = nt.ones([1]);
    const g32 = nt.zeros([rows * vocab]);
    addon.cross_entropy_backward(l32.storage, t.storage, lse32.storage, one32.storage, g32.storage, rows, vocab, -100, 0.25, dtypeCode('f32'));
    addon.cross_entropy_backward(L.t.storage, t.storage, lse16.storage, one16.storage, L.t.storage, rows, vocab, -100, 0.25, dtypeCode('bf16'));
    const want = g32.to('bf16').toArraySync() as ArrayLike<number>, got = L.t.toArraySync() as ArrayLike<number>;
    expect(Array.from(got)).toEqual(Array.from(want));
    expect(Math.abs(got[5]! - (0.25 * Math.exp(L.v[5]! - (lse32.toArraySync() as ArrayLike<number>)[0]!) - 0.25))).toBeLessThan(1e-3);
    for (const x of [L.t, l32, t, loss16, lse16, loss32, lse32, one16, one32, g32]) x.dispose();
  });

  it('bad inputs are typed errors', () => {
    const a = nt.zeros([4, 4], { dtype: 'bf16' }), c32 = nt.zeros([4, 4]), ci = nt.zeros([4, 4], { dtype: 'i32' }), small = nt.zeros([3]);
    const g = (c: nt.Tensor, dt: string, out?: string) => () => addon.gemm(a.storage, a.storage, c.storage, dtypeCode(dt as 'bf16'), 1, 4, 4, 4, false, false, 1, 0, 0, 0, 0,
      ...(out ? [dtypeCode(out as 'f32')] : []));
    expect(g(ci, 'bf16', 'i32')).toThrow(nt.DTypeError);
    expect(g(ci, 'bf16', 'i32')).toThrow(/gemm: output dtype i32 for bf16 inputs is not supported/);
    expect(g(a, 'f32', 'bf16')).toThrow(/gemm: output dtype bf16 for f32 inputs is not supported/);
    // an f32 output needs 4 bytes per element: a bf16-sized C is too small
    expect(g(a, 'bf16', 'f32')).toThrow(/gemm/);
    expect(() => addon.gemm(a.storage, a.storage, small.storage, dtypeCode('bf16'), 1, 4, 4, 4, false, false, 1, 0, 0, 0, 0, dtypeCode('f32'))).toThrow(/gemm/);
    expect(() => addon.setBf16Gemm('fast')).toThrow(nt.ArgumentError);
    expect(() => addon.setBf16Gemm('fast')).toThrow(/setBf16Gemm: unknown mode 'fast'; expected auto or fallback/);
    expect(g(c32, 'bf16', 'f32')).not.toThrow();
    for (const t of [a, c32, ci, small]) t.dispose();
  });

  it('NODETRON_BF16_GEMM=fallback forces the fallback (nodetron info shows it) and a bad value fails with its name', () => {
    const run = (value: string, ...args: string[]) => spawnSync(process.execPath, [join(packageRoot, 'bin', 'nodetron.js'), 'info', ...args],
      { encoding: 'utf8', env: { ...process.env, NODETRON_BF16_GEMM: value } });
    const ok = run('fallback', '--json');
    expect(ok.status, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout).cpu.bf16Gemm).toMatchObject({ mode: 'fallback', kernel: 'sgemm', active: false, supported, env: 'fallback' });
    expect(run('fallback').stdout).toMatch(/bf16 GEMM: sgemm \(mode fallback; AVX512_BF16 (not )?supported here; NODETRON_BF16_GEMM=fallback\)/);
    const bad = run('fast');
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/NODETRON_BF16_GEMM=fast: unknown mode 'fast'; expected auto or fallback/);
  }, 60_000);
});
