// Shared pieces of the multi-process equivalence tests (test/parallel/*-equivalence.test.ts): a
// fixture run through the real launcher, queued on a JobPool, whose ranks' result-<r>.json and
// params-<r>.f32 are read back into maps by parameter name; the f32 comparison helpers and the GPT's tensor-parallel slice of a full parameter.
import { mkdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';
import { JobPool, runProcess } from './jobs.js';
import { nodeArgs, scriptPath } from './node-script.js';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');

/** What every rank of an equivalence fixture writes; tests extend it with their fixture's own fields. */
export interface RankResult {
  rank: number;
  coords: { tp: number; pp: number; dp: number };
  losses: number[];
  gradNorms: number[];
  paramChange: number;
  /** This rank's parameters by name (a pipeline stage holds some, a tensor-parallel rank a slice of some). */
  params: Map<string, Float32Array>;
  shapes: Map<string, number[]>;
}
export interface Trained<R extends RankResult = RankResult> { code: number | null; output: string; ranks: R[] }

/** Each launcher run's own limit (from its start, not its queueing): far above the few seconds it takes. */
export const RUN_LIMIT_MS = 240_000;

/**
 * `launchRun(name, nproc, flags)` for one fixture: makes `<work>/<name>` at once, then (queued on its
 * own JobPool) runs `launcher --nproc-per-node <nproc> <script> <leadingArgs> --out <work>/<name>
 * <flags>` and reads back each rank's results. nproc 0 runs the script alone, without the launcher,
 * as one process (rank 0). A failed run has no ranks. `env(name)`: the run's environment (default: this process's).
 */
export function equivalenceRunner<R extends RankResult = RankResult>(opts: { script: string; work: string; leadingArgs?: string[]; env?: (name: string) => NodeJS.ProcessEnv }):
  (name: string, nproc: number, flags: string[]) => Promise<Trained<R>> {
  const { script, work, leadingArgs = [], env } = opts;
  const pool = new JobPool();
  return (name, nproc, flags) => {
    const out = join(work, name);
    mkdirSync(out);
    return pool.run(async () => {
      const rest = [...leadingArgs, '--out', out, ...flags];
      const args = nproc === 0 ? [...nodeArgs(script), ...rest] : [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(script), ...rest];
      const { code, output } = await runProcess(process.execPath, args, { cwd: root, limitMs: RUN_LIMIT_MS, ...(env ? { env: env(name) } : {}) });
      const ranks = code !== 0 ? [] : Array.from({ length: Math.max(1, nproc) }, (_, r) => readRank<R>(out, r));
      return { code, output, ranks };
    });
  };
}

/**
 * A single-process reference of the fixtures (vocabulary 64, 3 steps) trained: it ran, an untrained
 * model predicts roughly uniformly over the 64 tokens (first loss within 1 of ln 64), training lowers
 * the loss, and every gradient norm is finite and positive.
 */
export function expectReferenceTrains(r: Trained): void {
  expect(r.code, r.output).toBe(0);
  const { losses, gradNorms } = r.ranks[0]!;
  expect(losses).toHaveLength(3);
  expect(Math.abs(losses[0]! - Math.log(64))).toBeLessThan(1);
  expect(losses[2]!).toBeLessThan(losses[0]!);
  expect(gradNorms.every((n) => n > 0 && Number.isFinite(n))).toBe(true);
}

/** Rank r's result-<r>.json with its params-<r>.f32 split into parameters by the listed names and shapes. */
function readRank<R extends RankResult>(out: string, r: number): R {
  const res = JSON.parse(readFileSync(join(out, `result-${r}.json`), 'utf8')) as Omit<R, 'params' | 'shapes'> & { params: { name: string; shape: number[] }[] };
  const bytes = readFileSync(join(out, `params-${r}.f32`));
  const flat = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
  const params = new Map<string, Float32Array>(), shapes = new Map<string, number[]>();
  let at = 0;
  for (const { name, shape } of res.params) {
    const size = shape.reduce((a, b) => a * b, 1);
    params.set(name, flat.subarray(at, at + size));
    shapes.set(name, shape);
    at += size;
  }
  expect(at).toBe(flat.length);
  return { ...res, params, shapes } as unknown as R;
}

/** Largest |a - b|. */
export function maxDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff = Math.max(diff, Math.abs(a[i]! - b[i]!));
  return diff;
}

/** Largest |a|. */
export function maxAbs(a: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]!));
  return m;
}

/** Largest |a - b| over the largest |b|: f32 agreement of whole vectors (scale-free, robust to tiny entries). */
export function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  return maxDiff(a, b) / maxAbs(b);
}

/**
 * Tensor-parallel rank r's part of a full parameter, by Megatron's split of the GPT: the fused QKV by
 * output rows within each of q, k and v; the MLP's first layer and the vocabulary table by output
 * rows; both output projections by input columns; everything else (LayerNorms, positions,
 * row-parallel biases) whole. Written out in the tests, independently of the library's layers.
 */
export function gptTensorParallelSlice(name: string, full: Float32Array, shape: number[], tp: number, r: number): Float32Array {
  if (tp === 1) return full;
  const rowsOf = (runs: [number, number][]) => {
    const cols = shape.length === 2 ? shape[1]! : 1;
    return Float32Array.from(runs.flatMap(([start, count]) => Array.from(full.subarray(start * cols, (start + count) * cols))));
  };
  if (/attn\.qkv\.(weight|bias)$/.test(name)) {
    const block = shape[0]! / 3, local = block / tp;
    return rowsOf([0, 1, 2].map((b) => [b * block + r * local, local]));
  }
  if (/mlp\.fc\.(weight|bias)$/.test(name) || name === 'wte.weight') {
    const local = shape[0]! / tp;
    return rowsOf([[r * local, local]]);
  }
  if (/(attn|mlp)\.proj\.weight$/.test(name)) {
    const [rows, cols] = shape as [number, number], local = cols / tp;
    return Float32Array.from({ length: rows * local }, (_, i) => full[Math.floor(i / local) * cols + r * local + (i % local)]!);
  }
  return full;
}

/**
 * Checks a parallel run's ranks against the single-process reference `expected`, as the GPT layout
 * suites do: every rank's losses and gradient norms within `tolerance` of the reference's (relative to
 * the whole vector); every parameter a rank holds (its tensor-parallel part, gptTensorParallelSlice)
 * within `paramTolerance` of the model's scale; copies of a parameter on several ranks identical bit
 * for bit; every parameter (every slice of a split one) held by some rank; and the reference's
 * parameters moved far more than the tolerance (so agreement is not two copies of the initialization).
 */
export function expectMatchesReference(expected: RankResult, ranks: RankResult[], tolerance: number, paramTolerance: number): void {
  // Parameters are compared at the scale of the whole model's (as one vector): a zero-initialized
  // bias is tiny after 3 steps, and Adam's sign-like update for near-zero gradients magnifies f32 noise.
  const scale = Math.max(...[...expected.params.values()].map(maxAbs));
  const tp = Math.max(...ranks.map((r) => r.coords.tp)) + 1;
  const held = new Set<string>();
  for (const r of ranks) {
    expect(relDiff(r.losses, expected.losses), `losses on rank ${r.rank}`).toBeLessThan(tolerance);
    expect(relDiff(r.gradNorms, expected.gradNorms), `grad norms on rank ${r.rank}`).toBeLessThan(tolerance);
    for (const [n, values] of r.params) {
      const full = expected.params.get(n);
      expect(full, `${n} on rank ${r.rank}`).toBeDefined();
      const want = gptTensorParallelSlice(n, full!, expected.shapes.get(n)!, tp, r.coords.tp);
      const isSlice = want.length < full!.length;
      held.add(isSlice ? `${n} [tp ${r.coords.tp}]` : n);
      expect(maxDiff(values, want) / scale, `${n} on rank ${r.rank}`).toBeLessThan(paramTolerance);
      // Copies stay identical bit for bit (data-parallel replicas, the tied embedding on the first and
      // last stage, parameters every tensor-parallel rank holds whole).
      for (const other of ranks) {
        const copy = other.params.get(n);
        if (copy && (!isSlice || other.coords.tp === r.coords.tp)) expect(maxDiff(values, copy), `${n}: rank ${r.rank} vs rank ${other.rank}`).toBe(0);
      }
    }
  }
  const slices = (n: string) => gptTensorParallelSlice(n, expected.params.get(n)!, expected.shapes.get(n)!, tp, 0).length < expected.params.get(n)!.length;
  const wanted = [...expected.params.keys()].flatMap((n) => (slices(n) ? Array.from({ length: tp }, (_, t) => `${n} [tp ${t}]`) : [n]));
  expect([...held].sort()).toEqual(wanted.sort());
  expect(expected.paramChange).toBeGreaterThan(100 * paramTolerance);
}
