// The cpu kernels at every SIMD level this CPU supports (baseline x86-64-v2, AVX2, AVX-512; chosen at
// run time, native/cpu/kernels/util.h NT_SIMD): each level's cross-entropy, softmax, GELU (+bias), SwiGLU,
// LayerNorm (+add), RMSNorm, AdamW and attention softmax, forward and backward, against float64
// references; the vectorized exp and tanh at extremes (large logits, -inf masked, NaN as the baseline
// propagates it); setCpuIsa and NODETRON_CPU_ISA validation; the FMA peak routine.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { ArgumentError } from '../../lib/errors.js';
import { cpu, packageRoot } from '../../lib/native.js';
import { expectClose, randomArray, rng } from '../helpers/gradcheck.js';

type Level = 'baseline' | 'avx2' | 'avx512';
const isa = cpu().cpuIsa() as { active: Level; best: Level; supported: Level[] };
const initial = isa.active;
afterAll(() => cpu().setCpuIsa(initial));

function atLevel<T>(level: Level, fn: () => T): T {
  expect(cpu().setCpuIsa(level)).toBe(level);
  try { return fn(); } finally { cpu().setCpuIsa(initial); }
}

const f64 = (t: nt.Tensor) => Array.from(t.toArraySync() as Float32Array, Number);
/** A leaf of f32 values (given, or seeded uniform in [lo, hi)). */
function leaf(data: ArrayLike<number> | number, shape: number[], lo = -1, hi = 1, seed = 1): nt.Tensor {
  const n = shape.reduce((a, b) => a * b, 1);
  const values = typeof data === 'number' ? randomArray(n, rng(data + seed), lo, hi) : data;
  const t = nt.tensor(Float32Array.from(values), shape);
  t.requiresGrad = true;
  return t;
}
/** Σ out·w for seeded w (every output element gets its own weight); returns w in float64. */
function probe(out: nt.Tensor, seed: number): { loss: nt.Tensor; w: number[] } {
  const w = Array.from(Float32Array.from(randomArray(out.size, rng(seed))), Number);
  return { loss: nt.sum(nt.mul(out, nt.tensor(Float32Array.from(w), [...out.shape]))), w };
}

// ---- float64 references --------------------------------------------------------------------------
function rowsOf(x: number[], cols: number): number[][] {
  return Array.from({ length: x.length / cols }, (_, r) => x.slice(r * cols, (r + 1) * cols));
}
function softmax64(row: number[]): number[] {
  const m = Math.max(...row);
  if (m === -Infinity) return row.map(() => 0);
  const e = row.map((v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}
function lse64(row: number[]): number {
  const m = Math.max(...row);
  return m + Math.log(row.reduce((a, v) => a + Math.exp(v - m), 0));
}
const K = Math.sqrt(2 / Math.PI);
const gelu64 = (v: number) => 0.5 * v * (1 + Math.tanh(K * (v + 0.044715 * v ** 3)));
function geluGrad64(v: number): number {
  const t = Math.tanh(K * (v + 0.044715 * v ** 3));
  return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * K * (1 + 3 * 0.044715 * v * v);
}
/** LayerNorm of one row in float64, and the gradients of Σ w_out·y (dx, dweight row, dbias row). */
function layerNorm64(x: number[], wt: number[], b: number[], g: number[], eps = 1e-5) {
  const n = x.length, m = x.reduce((a, v) => a + v, 0) / n;
  const rs = 1 / Math.sqrt(x.reduce((a, v) => a + (v - m) ** 2, 0) / n + eps);
  const xh = x.map((v) => (v - m) * rs);
  const y = xh.map((v, j) => v * wt[j]! + b[j]!);
  const gw = g.map((v, j) => v * wt[j]!);
  const mg = gw.reduce((a, v) => a + v, 0) / n, mgx = gw.reduce((a, v, j) => a + v * xh[j]!, 0) / n;
  return { y, dx: xh.map((v, j) => rs * (gw[j]! - mg - v * mgx)), dw: g.map((v, j) => v * xh[j]!), db: g };
}
const colSums = (rows: number[][]) => rows[0]!.map((_, j) => rows.reduce((a, r) => a + r[j]!, 0));

// Sizes with vector bodies and odd tails at every width, and row counts large enough to be threaded.
const V = 1037, ROWS = 67, C = 131;

describe.each(isa.supported)('cpu kernels at SIMD level %s against float64', (level) => {
  it('cross-entropy forward and backward (mean, an ignored row, one thread and the pool)', () => {
    atLevel(level, () => nt.scope(() => {
      const x = leaf(11, [ROWS, V], -4, 4);
      const t = Array.from({ length: ROWS }, (_, r) => (r * 7919) % V);
      t[5] = -100;
      const loss = nt.crossEntropy(x, nt.tensor(Int32Array.from(t), [ROWS], { dtype: 'i32' }));
      loss.backward();
      const rows = rowsOf(f64(x), V), kept = t.filter((v) => v !== -100).length;
      const want = rows.reduce((a, row, r) => a + (t[r] === -100 ? 0 : lse64(row) - row[t[r]!]!), 0) / kept;
      expectClose(f64(loss), [want], 1e-6, 2e-6, `${level} loss`);
      const grad = rows.flatMap((row, r) => (t[r] === -100 ? row.map(() => 0) : softmax64(row).map((p, j) => (p - (j === t[r] ? 1 : 0)) / kept)));
      expectClose(f64(x.grad!), grad, 1e-8, 1e-5, `${level} grad`);
    }));
  });

  it('softmax and logSoftmax forward and backward', () => {
    atLevel(level, () => nt.scope(() => {
      for (const log of [false, true]) {
        const x = leaf(21, [ROWS, C], -6, 6);
        const y = log ? nt.logSoftmax(x) : nt.softmax(x);
        const { loss, w } = probe(y, 22);
        loss.backward();
        const rows = rowsOf(f64(x), C), ws = rowsOf(w, C);
        const p = rows.map(softmax64);
        const want = log ? rows.flatMap((row) => { const l = lse64(row); return row.map((v) => v - l); }) : p.flat();
        expectClose(f64(y), want, 1e-6, 2e-6, `${level} ${log ? 'log' : ''}softmax`);
        const grad = p.flatMap((pr, r) => {
          const g = ws[r]!;
          if (log) { const s = g.reduce((a, v) => a + v, 0); return g.map((v, j) => v - pr[j]! * s); }
          const s = g.reduce((a, v, j) => a + v * pr[j]!, 0);
          return pr.map((v, j) => v * (g[j]! - s));
        });
        expectClose(f64(x.grad!), grad, 2e-6, 1e-5, `${level} ${log ? 'log' : ''}softmax grad`);
      }
    }));
  });

  it('gelu and linearGelu (bias + GELU) forward and backward', () => {
    atLevel(level, () => nt.scope(() => {
      const x = leaf(31, [ROWS, C], -5, 5);
      const y = nt.gelu(x);
      const { loss, w } = probe(y, 32);
      loss.backward();
      const xs = f64(x);
      expectClose(f64(y), xs.map(gelu64), 2e-6, 1e-5, `${level} gelu`);
      expectClose(f64(x.grad!), xs.map((v, i) => w[i]! * geluGrad64(v)), 2e-6, 1e-5, `${level} gelu grad`);

      const a = leaf(33, [ROWS, 37]), wt = leaf(34, [C, 37], -0.4, 0.4), b = leaf(35, [C]);
      const h = nt.linearGelu(a, wt, b);
      const pr = probe(h, 36);
      pr.loss.backward();
      const A = rowsOf(f64(a), 37), W = rowsOf(f64(wt), 37), B = f64(b);
      const pre = A.map((ar) => W.map((wr, j) => ar.reduce((s, v, k) => s + v * wr[k]!, 0) + B[j]!));
      expectClose(f64(h), pre.flat().map(gelu64), 1e-5, 1e-4, `${level} linearGelu`);
      const gpre = pre.map((row, r) => row.map((v, j) => pr.w[r * C + j]! * geluGrad64(v)));
      expectClose(f64(b.grad!), colSums(gpre), 1e-4, 1e-4, `${level} linearGelu bias grad`);
    }));
  });

  it('swiglu forward and backward (Llama\'s MLP activation; silu is the same kernel without up)', () => {
    atLevel(level, () => nt.scope(() => {
      const g = leaf(41, [ROWS, C], -8, 8), u = leaf(42, [ROWS, C], -2, 2);
      const y = nt.swiglu(g, u);
      const { loss, w } = probe(y, 43);
      loss.backward();
      const gs = f64(g), us = f64(u), sig = (v: number) => 1 / (1 + Math.exp(-v));
      expectClose(f64(y), gs.map((v, i) => v * sig(v) * us[i]!), 2e-6, 1e-5, `${level} swiglu`);
      expectClose(f64(g.grad!), gs.map((v, i) => w[i]! * us[i]! * sig(v) * (1 + v * (1 - sig(v)))), 2e-6, 1e-5, `${level} swiglu dgate`);
      expectClose(f64(u.grad!), gs.map((v, i) => w[i]! * v * sig(v)), 2e-6, 1e-5, `${level} swiglu dup`);
    }));
  });

  it('layerNorm, addLayerNorm and rmsNorm forward and backward', () => {
    atLevel(level, () => nt.scope(() => {
      const x = leaf(41, [ROWS, C], -3, 3), r = leaf(42, [ROWS, C]), wt = leaf(43, [C], 0.5, 1.5), b = leaf(44, [C]);
      const { sum, out } = nt.addLayerNorm(x, r, wt, b);
      const { loss, w } = probe(out, 45);
      loss.backward();
      const S = rowsOf(f64(x).map((v, i) => v + f64(r)[i]!), C), Wt = f64(wt), Bs = f64(b), G = rowsOf(w, C);
      const ref = S.map((row, i) => layerNorm64(row, Wt, Bs, G[i]!));
      expectClose(f64(sum), S.flat(), 1e-7, 1e-6, `${level} addLayerNorm sum`);
      expectClose(f64(out), ref.flatMap((q) => q.y), 1e-5, 1e-5, `${level} addLayerNorm`);
      expectClose(f64(x.grad!), ref.flatMap((q) => q.dx), 1e-5, 1e-4, `${level} addLayerNorm dx`);
      expectClose(f64(wt.grad!), colSums(ref.map((q) => q.dw)), 1e-4, 1e-4, `${level} addLayerNorm dweight`);
      expectClose(f64(b.grad!), colSums(ref.map((q) => q.db)), 1e-4, 1e-4, `${level} addLayerNorm dbias`);

      const xr = leaf(46, [ROWS, C], -2, 2), wr = leaf(47, [C], 0.5, 1.5);
      const yr = nt.rmsNorm(xr, wr);
      const pr = probe(yr, 48);
      pr.loss.backward();
      const X = rowsOf(f64(xr), C), Wr = f64(wr), Gr = rowsOf(pr.w, C);
      const want = X.map((row) => { const rs = 1 / Math.sqrt(row.reduce((a, v) => a + v * v, 0) / C + 1e-5); return row.map((v, j) => v * rs * Wr[j]!); });
      expectClose(f64(yr), want.flat(), 1e-5, 1e-5, `${level} rmsNorm`);
      const dx = X.map((row, i) => {
        const rs = 1 / Math.sqrt(row.reduce((a, v) => a + v * v, 0) / C + 1e-5);
        const gw = Gr[i]!.map((v, j) => v * Wr[j]!), mgx = gw.reduce((a, v, j) => a + v * row[j]! * rs, 0) / C;
        return row.map((v, j) => rs * (gw[j]! - v * rs * mgx));
      });
      expectClose(f64(xr.grad!), dx.flat(), 1e-5, 1e-4, `${level} rmsNorm dx`);
    }));
  });

  it('causal attention (its softmax between the two GEMMs) forward and backward', () => {
    atLevel(level, () => nt.scope(() => {
      const [B, H, T, D] = [2, 3, 37, 8];
      const q = leaf(51, [B, H, T, D], -2, 2), k = leaf(52, [B, H, T, D], -2, 2), v = leaf(53, [B, H, T, D]);
      const o = nt.attention(q, k, v, { causal: true });
      const { loss, w } = probe(o, 54);
      loss.backward();
      const Q = f64(q), Kk = f64(k), Vv = f64(v), s = 1 / Math.sqrt(D);
      const out: number[] = [], dv = new Array<number>(Vv.length).fill(0);
      for (let bh = 0; bh < B * H; bh++) {
        for (let i = 0; i < T; i++) {
          const sc = Array.from({ length: T }, (_, j) => (j <= i ? s * Array.from({ length: D }, (_, d) => Q[(bh * T + i) * D + d]! * Kk[(bh * T + j) * D + d]!).reduce((a, b) => a + b, 0) : -Infinity));
          const p = softmax64(sc);
          for (let d = 0; d < D; d++) out.push(p.reduce((a, pj, j) => a + pj * Vv[(bh * T + j) * D + d]!, 0));
          for (let j = 0; j < T; j++) for (let d = 0; d < D; d++) dv[(bh * T + j) * D + d]! += p[j]! * w[(bh * T + i) * D + d]!;
        }
      }
      expectClose(f64(o), out, 1e-5, 1e-4, `${level} attention`);
      expectClose(f64(v.grad!), dv, 1e-5, 1e-4, `${level} attention dv`);
    }));
  });

  it('AdamW: one step over a parameter longer than a block, against the float64 update', () => {
    atLevel(level, () => nt.scope(() => {
      const n = 16384 + 1037;
      const p = leaf(61, [n]);
      p.grad = nt.tensor(Float32Array.from(randomArray(n, rng(62))), [n]);
      const p0 = f64(p), g = f64(p.grad);
      const opt = new nt.optim.AdamW([p], { lr: 1e-2, betas: [0.9, 0.95], weightDecay: 0.1, eps: 1e-8 });
      opt.step();
      const want = p0.map((v, i) => {
        const m = 0.1 * g[i]!, vv = 0.05 * g[i]! ** 2;
        return v * (1 - 1e-2 * 0.1) - (1e-2 / 0.1) * m / (Math.sqrt(vv) / Math.sqrt(0.05) + 1e-8);
      });
      expectClose(f64(p), want, 1e-6, 1e-5, `${level} adamw`);
      opt.dispose();
    }));
  });

  it('exp and tanh at extremes: large logits, -inf masked entries, NaN rows as the baseline propagates them', () => {
    const cols = 41;
    // Row r: [a_r, 0, -inf, ...]: softmax's first entry is 1/(1 + e^-a), so exp's relative error over
    // [-87, 0] shows directly; further rows put huge and -inf logits together, and one row holds a NaN.
    const grid = Array.from({ length: 200 }, (_, i) => -87 + (i * 87) / 199);
    const special = [[88, 100, 1e4, 3e38], [-1e4, -1e30, -3e38, -87.5], [0, -Infinity, -Infinity, -Infinity]];
    const rows = [...grid.map((a) => [a, 0]), ...special].map((head) => [...head, ...Array.from({ length: cols - head.length }, (_, j) => (j % 3 === 0 ? -Infinity : -50 + j))]);
    const nanRow = rows[7]!.slice();
    nanRow[9] = NaN;
    rows.push(nanRow);
    const x = rows.flat();
    const run = (l: Level) => atLevel(l, () => nt.scope(() => {
      const t = leaf(x, [rows.length, cols]);
      const y = nt.softmax(t);
      const targets = nt.tensor(Int32Array.from(rows.map(() => 0)), [rows.length], { dtype: 'i32' });
      const ce = nt.crossEntropy(t, targets, { reduction: 'sum' });
      const perRow = rows.map((_, r) => f64(nt.crossEntropy(leaf(rows[r]!, [1, cols]), nt.tensor(Int32Array.from([0]), [1], { dtype: 'i32' }))));
      const g = nt.gelu(leaf([-1e30, -1e4, -20, -9.5, -3, 0, 3, 9.5, 20, 1e4, 1e30, NaN], [12]));
      return { y: f64(y), ce: f64(ce)[0]!, perRow: perRow.map((v) => v[0]!), gelu: f64(g) };
    }));
    const got = run(level), base = run('baseline');
    const finiteRows = rows.slice(0, -1);
    expectClose(got.y.slice(0, finiteRows.length * cols), finiteRows.flatMap(softmax64), 1e-30, 3e-6, `${level} softmax at extremes`);
    expectClose(got.perRow.slice(0, -1), finiteRows.map((row) => lse64(row) - row[0]!), 1e-6, 3e-6, `${level} cross-entropy at extremes`);
    // A NaN logit makes its row's softmax and loss NaN (and the summed loss), on every level as on the baseline.
    const nanAt = (a: number[]) => a.map((v) => Number.isNaN(v));
    expect(nanAt(got.y)).toEqual(nanAt(base.y));
    expect(got.y.slice(-cols).every(Number.isNaN)).toBe(true);
    expect(Number.isNaN(got.perRow[got.perRow.length - 1]!)).toBe(true);
    expect(Number.isNaN(got.ce)).toBe(true);
    const gx = [-1e30, -1e4, -20, -9.5, -3, 0, 3, 9.5, 20, 1e4, 1e30];
    expectClose(got.gelu.slice(0, -1), gx.map((v) => Math.fround(gelu64(Math.fround(v)))), 1e-6, 1e-6, `${level} gelu at extremes`);
    expect(Number.isNaN(got.gelu[11]!)).toBe(true);
  });
});

describe('choosing the SIMD level', () => {
  it('cpuIsa reports the active, best and supported levels; setCpuIsa validates names and what the CPU has', () => {
    expect(isa.supported[0]).toBe('baseline');
    expect(isa.supported[isa.supported.length - 1]).toBe(isa.best);
    expect(isa.supported).toContain(isa.active);
    expect(() => cpu().setCpuIsa('sse9')).toThrow(ArgumentError);
    expect(() => cpu().setCpuIsa('sse9')).toThrow(/unknown instruction-set level 'sse9'; expected one of auto, baseline, avx2, avx512/);
    expect(() => cpu().setCpuIsa(3)).toThrow(ArgumentError);
    for (const level of ['avx2', 'avx512'] as Level[]) {
      if (!isa.supported.includes(level)) expect(() => cpu().setCpuIsa(level)).toThrow(/this CPU does not support/);
    }
    try {
      expect(cpu().setCpuIsa('baseline')).toBe('baseline');
      expect(cpu().cpuIsa().active).toBe('baseline');
      expect(cpu().setCpuIsa('auto')).toBe(isa.best);
      expect(nt.info().cpu.isa.active).toBe(isa.best);
    } finally {
      cpu().setCpuIsa(initial);
    }
  });

  it('NODETRON_CPU_ISA forces a level for the process (nodetron info shows it) and a bad value fails with its name', () => {
    const run = (value: string, ...args: string[]) => spawnSync(process.execPath, [join(packageRoot, 'bin', 'nodetron.js'), 'info', ...args],
      { encoding: 'utf8', env: { ...process.env, NODETRON_CPU_ISA: value } });
    const ok = run('baseline', '--json');
    expect(ok.status, ok.stderr).toBe(0);
    expect(JSON.parse(ok.stdout).cpu.isa).toMatchObject({ active: 'baseline', best: isa.best, env: 'baseline' });
    const text = run('baseline');
    expect(text.stdout).toMatch(/SIMD level baseline \(best here: \w+; supported: baseline.*; NODETRON_CPU_ISA=baseline\)/);
    const bad = run('fast');
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toMatch(/NODETRON_CPU_ISA=fast: unknown instruction-set level 'fast'; expected one of auto, baseline, avx2, avx512/);
  }, 120_000);

  it('NODETRON_KERNEL_THREADS sets the kernels\' thread pool for the process, and a bad value fails with its name', () => {
    const run = (value: string) => spawnSync(process.execPath, ['--input-type=module', '-e',
      `import { cpu } from ${JSON.stringify(pathToFileURL(join(packageRoot, 'dist', 'native.js')).href)}; try { console.log(cpu().kernelThreads()); } catch (e) { console.log(e.name + ': ' + e.message); }`],
    { encoding: 'utf8', env: { ...process.env, NODETRON_KERNEL_THREADS: value } });
    expect(run('1').stdout.trim()).toBe('1');
    expect(run('3').stdout.trim()).toBe('3');
    expect(run('0').stdout.trim()).toBe('ArgumentError: NODETRON_KERNEL_THREADS=0: need 1 to 256 threads, got 0');
    expect(run('two').stdout.trim()).toBe('ArgumentError: NODETRON_KERNEL_THREADS=two: expected a whole number of threads, got \'two\'');
  }, 120_000);

  it('fmaPeak measures positive GFLOP/s at each supported level and rejects bad arguments', () => {
    for (const level of isa.supported) {
      const p = cpu().fmaPeak(level, 0.02);
      expect(p.isa).toBe(level);
      expect(p.lanes).toBe({ baseline: 4, avx2: 8, avx512: 16 }[level]);
      expect(p.threads).toBe(cpu().kernelThreads());
      expect(p.gflopsAllThreads).toBeGreaterThan(0);
      expect(p.gflopsOneThread).toBeGreaterThan(0);
      // The same rounds per second of the thread's own CPU time: never far below the wall-clock rate
      // (CPU time cannot exceed wall time), and untouched by other processes taking turns on the core.
      expect(p.gflopsOneThreadCpuTime).toBeGreaterThan(0.5 * p.gflopsOneThread);
      expect(p.gflops).toBe(Math.max(p.gflopsAllThreads, p.threads * p.gflopsOneThread));
      expect(Number.isFinite(p.checksum)).toBe(true);
    }
    // All threads together are timed on runs long enough that waking the pool does not dominate: a
    // calibration timed on the pool once gave 0.6 GFLOP/s for all threads beside 58 for one on a loaded machine.
    const best = cpu().fmaPeak('auto', 0.2);
    expect(best.gflopsAllThreads).toBeGreaterThan(0.1 * best.gflopsOneThread);
    expect(() => cpu().fmaPeak('auto', 0)).toThrow(/fmaPeak: seconds must be in \(0, 60\]/);
    expect(() => cpu().fmaPeak('avx9', 0.1)).toThrow(ArgumentError);
  });
});
