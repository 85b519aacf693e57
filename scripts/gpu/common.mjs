// Shared by the staged GPU run's stages (scripts/gpu/stages/*.mjs): the recorder that rewrites a stage's
// JSON after every check (a crash or hang keeps what was done), comparisons, python/torch discovery.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** One stage's record: checks (ok + worst error), benchmarks (with torch's number where measured), info. */
export class Recorder {
  constructor(file, stage, name) {
    this.file = file;
    this.data = { stage, name, status: 'running', startedAt: new Date().toISOString(), info: {}, checks: [], bench: [] };
    this.flush();
  }
  flush() { writeFileSync(this.file, JSON.stringify(this.data, null, 2)); }
  info(k, v) { this.data.info[k] = v; this.flush(); }
  check(c) { this.data.checks.push(c); this.flush(); if (!c.ok) console.log(`FAIL ${c.name}: ${c.error ?? c.maxRelErr}`); }
  bench(b) { this.data.bench.push(b); this.flush(); console.log(`bench ${b.name}: ${JSON.stringify(b)}`); }
  skip(reason) { this.data.status = 'skipped'; this.data.reason = reason; this.finish(); console.log(`skipped: ${reason}`); }
  finish() {
    if (this.data.status === 'running') this.data.status = this.data.checks.every((c) => c.ok) ? 'passed' : 'failed';
    this.data.finishedAt = new Date().toISOString();
    this.flush();
    return this.data.status;
  }
}

/** Largest |got - want| / (1 + |want|), and how many entries exceed tol. NaN counts as infinite error. */
export function relErr(got, want, tol) {
  let maxRelErr = 0, bad = 0;
  for (let i = 0; i < want.length; i++) {
    const e = Math.abs(Number(got[i]) - Number(want[i])) / (1 + Math.abs(Number(want[i])));
    if (!(e <= tol)) bad++;
    if (Number.isNaN(e) || e > maxRelErr) maxRelErr = Number.isNaN(e) ? Infinity : e;
  }
  if (got.length !== want.length) bad++;
  return { maxRelErr, bad };
}

/** A python that imports torch: NODETRON_PYTHON, the first python3/python on PATH, then venvs and conda. */
export function findPython() {
  const candidates = [process.env.NODETRON_PYTHON, 'python3', 'python'];
  for (const base of [process.env.VIRTUAL_ENV, process.env.CONDA_PREFIX, '/opt/conda', '/usr/local', '/usr', join(root, '.venv'), join(process.env.HOME ?? '/root', '.venv')]) {
    if (base) candidates.push(join(base, 'bin', 'python3'));
  }
  for (const dir of ['/opt', '/workspace', process.env.HOME ?? '/root']) {
    let names = [];
    try { names = readdirSync(dir); } catch { /* absent */ }
    for (const n of names) if (existsSync(join(dir, n, 'bin', 'python3'))) candidates.push(join(dir, n, 'bin', 'python3'));
  }
  let fallback = null;
  for (const py of [...new Set(candidates.filter(Boolean))]) {
    const r = spawnSync(py, ['-c', 'import torch,json;print(json.dumps({"torch":torch.__version__}))'], { encoding: 'utf8', timeout: 20_000 });
    if (r.status === 0) return { python: py, torch: JSON.parse(r.stdout.trim().split('\n').pop()).torch };
    if (r.error === undefined && fallback === null) fallback = py;
  }
  return { python: fallback, torch: null };
}

/** Runs a torch script (default scripts/gpu/torch_peer.py) with args; returns its last stdout line parsed, or { error }. */
export function torchPeer(python, args, timeoutMs = 300_000, script = join(root, 'scripts', 'gpu', 'torch_peer.py')) {
  if (!python) return { error: 'no python with torch' };
  const r = spawnSync(python, [script, ...args], { encoding: 'utf8', timeout: timeoutMs, maxBuffer: 64 << 20 });
  if (r.status !== 0) return { error: (r.error ? String(r.error) : '') + (r.stderr ?? '').slice(-800) };
  try { return JSON.parse(r.stdout.trim().split('\n').pop()); } catch (e) { return { error: `bad output: ${r.stdout.slice(-300)}` }; }
}

/** The git commit: NODETRON_COMMIT (env.sh sets it from the bundle's stamp), else git. */
export function commit() {
  if (process.env.NODETRON_COMMIT) return process.env.NODETRON_COMMIT;
  const r = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : 'unknown';
}

/**
 * The device run's plan, in order of value: each step runs in its own child process with its own time
 * limit. `phase` caps when a step may still start or run: a phase ends `phaseEndS` seconds after the run
 * began (cumulative, so time a phase leaves unused goes to the next). `sync` sets NODETRON_CUDA_SYNC=1
 * (every launch synchronized, so a fault is reported by the op that made it). `sections` picks the
 * blocks of correctness.mjs the step runs; `fn` is the exported function of `file` it calls.
 */
export const PHASES = [
  { name: 'preflight', endS: 45 },
  { name: 'correctness', endS: 285 },
  { name: 'gpt2', endS: 435 },
  { name: 'gemm', endS: 495 },
  { name: 'rest', endS: 540 },
];
export const PLAN = [
  { id: 'preflight', phase: 'preflight', file: 'preflight', fn: 'run', limitS: 45 },
  { id: 'nccl', phase: 'correctness', file: 'correctness', sections: ['nccl'], limitS: 60, sync: true },
  { id: 'gemm', phase: 'correctness', file: 'correctness', sections: ['gemm'], limitS: 60, sync: true },
  { id: 'ops-f32', phase: 'correctness', file: 'correctness', sections: ['ops-f32'], limitS: 60, sync: true },
  { id: 'ops-bf16', phase: 'correctness', file: 'correctness', sections: ['ops-bf16'], limitS: 45, sync: true },
  { id: 'ops-f16', phase: 'correctness', file: 'correctness', sections: ['ops-f16'], limitS: 45, sync: true },
  { id: 'kernels', phase: 'correctness', file: 'correctness', sections: ['kernels'], limitS: 45, sync: true },
  { id: 'optim-amp', phase: 'correctness', file: 'correctness', sections: ['optim', 'amp', 'gpt'], limitS: 60, sync: true },
  { id: 'memory', phase: 'correctness', file: 'correctness', sections: ['streams', 'allocator', 'oom'], limitS: 45, sync: true },
  { id: 'gpt2-step', phase: 'gpt2', file: 'performance', fn: 'gpt2Step', limitS: 120, minS: 30 },
  { id: 'gpt2-torch-eager', phase: 'gpt2', file: 'performance', fn: 'gpt2Torch', args: { mode: 'eager' }, limitS: 90, minS: 25 },
  { id: 'gpt2-torch-compile', phase: 'gpt2', file: 'performance', fn: 'gpt2Torch', args: { mode: 'compile' }, limitS: 150, minS: 60 },
  { id: 'gemm-perf', phase: 'gemm', file: 'performance', fn: 'gemmPerf', limitS: 90, minS: 20 },
  { id: 'membw', phase: 'rest', file: 'performance', fn: 'membw', limitS: 40, minS: 10 },
  { id: 'dispatch', phase: 'rest', file: 'performance', fn: 'dispatch', limitS: 20, minS: 5 },
  { id: 'gpt2-graph', phase: 'rest', file: 'performance', fn: 'gpt2Graph', limitS: 45, minS: 15 },
  { id: 'parallel', phase: 'rest', file: 'parallel', fn: 'run', limitS: 150, minS: 40 },
  { id: 'sanitizer', phase: 'rest', file: 'correctness', sections: ['sanitizer'], limitS: 150, minS: 40 },
];
/** The whole run's budget: one device command may run 600 s; the rest is unpacking and the reply. */
export const BUDGET_S = 540;

/** Test hook: what NODETRON_GPU_RUN_SIMULATE="nccl:hang,gemm:crash" makes step `id` do ('hang', 'crash', 'throw', 'fail'), or undefined. */
export function simulatedFate(id) {
  return (process.env.NODETRON_GPU_RUN_SIMULATE ?? '').split(',').map((p) => p.split(':')).find(([s]) => s === id)?.[1];
}
