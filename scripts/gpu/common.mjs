// Shared by the staged GPU run's stages (scripts/gpu/stages/*.mjs): the recorder that rewrites a stage's
// JSON after every check (a crash or hang keeps what was done), comparisons, python/torch discovery.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
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

/**
 * relErr over two tensors (any device, any float or integer dtype), computed by nodetron's kernels on the
 * cpu backend in f32 instead of a JS loop over Float64Arrays (a 1024 x 50257 logits gradient is 51M
 * entries: ~2 s of JS conversion per side, ~0.1 s here). f32 arithmetic: |got - want| is exact when the two
 * agree and nonzero when they differ (IEEE subtraction with subnormals), and its rounding (2^-24 relative)
 * is far below every tolerance compared with (1e-6 and up), so the verdicts equal relErr's. |x| is
 * binary max(x, -x) (fmax: a NaN stays NaN); a NaN or infinite error makes the sum non-finite, reported as
 * infinite error with every entry counted bad (relErr counts NaNs one by one; both fail).
 */
export function tensorRelErr(nt, C, got, want, tol) {
  if (got.size !== want.size) return { maxRelErr: Infinity, bad: Math.max(got.size, want.size) };
  if (want.size === 0) return { maxRelErr: 0, bad: 0 };
  return nt.scope(() => {
    const flat = (t) => nt.reshape(t.to({ device: 'cpu', dtype: 'f32' }), [t.size]);
    const n = want.size, g = flat(got), w = flat(want);
    const abs = (x) => {
      const out = nt.zeros([n]), m = nt.neg(x);
      C.binary(BINARY_MAX, x.storage, m.storage, out.storage, 0, new Int32Array([n]), new Int32Array([1]), new Int32Array([1]));
      return out;
    };
    const d = nt.div(abs(nt.sub(g, w)), nt.add(abs(w), 1));
    const total = nt.sum(d).item();
    if (!Number.isFinite(total)) return { maxRelErr: Infinity, bad: n };
    const maxRelErr = nt.max(d).item();
    if (maxRelErr <= tol) return { maxRelErr, bad: 0 };
    // The count of entries past tol: (d - tol) clamped to [0, 1] after scaling by 1e60 (two steps, each
    // finite in f32), so every positive excess, down to a subnormal, counts 1.
    const one = nt.ones([1]), zero = nt.zeros([1]), step = nt.zeros([n]);
    const ex = nt.zeros([n]);
    C.binary(BINARY_MAX, nt.add(d, -tol).storage, zero.storage, ex.storage, 0, new Int32Array([n]), new Int32Array([1]), new Int32Array([0]));
    C.binary(BINARY_MIN, nt.scale(nt.scale(ex, 1e30), 1e30).storage, one.storage, step.storage, 0, new Int32Array([n]), new Int32Array([1]), new Int32Array([0]));
    return { maxRelErr, bad: Math.round(nt.sum(step).item()) };
  });
}
const BINARY_MAX = 4, BINARY_MIN = 5;  // native/core/op_codes.h (lib/kernel-codes.ts BINARY)

/**
 * The environment of a python (torch) child: the project's LD_LIBRARY_PATH is node's alone. On the
 * device, runtime/env.sh keeps the machine's own LD_LIBRARY_PATH in NODETRON_SYSTEM_LD_LIBRARY_PATH and
 * device.sh puts the bundle's libraries and the nvidia wheels' folders in front of it for node only: torch
 * loads the CUDA libraries it was built with, not the ones the cuda addon found. Elsewhere (no such
 * variable) the environment is node's.
 */
export function pythonEnv(extra = {}) {
  const env = { ...process.env, ...extra };
  if ('NODETRON_SYSTEM_LD_LIBRARY_PATH' in process.env) {
    if (process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH) env.LD_LIBRARY_PATH = process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH;
    else delete env.LD_LIBRARY_PATH;
  }
  return env;
}

/**
 * A python that imports torch: NODETRON_PYTHON, the first python3/python on PATH, then venvs and conda.
 * The answer is kept in $NODETRON_GPU_RUN_WORK/python.json for the run's later steps (each import of
 * torch costs seconds; a loaded machine's first try may take most of preflight's limit).
 */
export function findPython() {
  const cache = process.env.NODETRON_GPU_RUN_WORK ? join(process.env.NODETRON_GPU_RUN_WORK, 'python.json') : null;
  if (cache) {
    try { const c = JSON.parse(readFileSync(cache, 'utf8')); if (c.torch || c.python === null || existsSync(c.python)) return c; } catch { /* not yet */ }
  }
  const found = findPythonUncached();
  if (cache) try { writeFileSync(cache, JSON.stringify(found)); } catch { /* scratch gone */ }
  return found;
}

function findPythonUncached() {
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
    const r = spawnSync(py, ['-c', 'import torch,json;print(json.dumps({"torch":torch.__version__}))'], { encoding: 'utf8', timeout: 60_000, env: pythonEnv() });
    if (r.status === 0) return { python: py, torch: JSON.parse(r.stdout.trim().split('\n').pop()).torch };
    if (r.error === undefined && fallback === null) fallback = py;
  }
  return { python: fallback, torch: null };
}

/** Runs a torch script (default scripts/gpu/torch_peer.py) with args; returns its last stdout line parsed, or { error }. */
export function torchPeer(python, args, timeoutMs = 300_000, script = join(root, 'scripts', 'gpu', 'torch_peer.py'), env = {}) {
  if (!python) return { error: 'no python with torch' };
  const r = spawnSync(python, [script, ...args], { encoding: 'utf8', timeout: timeoutMs, maxBuffer: 64 << 20, env: pythonEnv(env) });
  if (r.status !== 0) return { error: (r.error ? String(r.error) : '') + (r.stderr ?? '').slice(-800) };
  try { return JSON.parse(r.stdout.trim().split('\n').pop()); } catch (e) { return { error: `bad output: ${r.stdout.slice(-300)}` }; }
}

/**
 * Whether this machine has an NVIDIA GPU, asked of the driver (nvidia-smi -L), not of nodetron: where the
 * cuda addon does not load, a GPU that is there still runs the PyTorch baselines. Test hook:
 * NODETRON_GPU_RUN_FAKE_GPU=1 says yes (a machine without a GPU then takes the "cuda unusable" path).
 */
export function gpuPresent() {
  if (process.env.NODETRON_GPU_RUN_FAKE_GPU === '1') return true;
  const r = spawnSync('nvidia-smi', ['-L'], { encoding: 'utf8', timeout: 15_000 });
  return r.status === 0 && /^GPU \d+:/m.test(r.stdout);
}

/** Why nodetron cannot use the GPU, as a step's reason: "no GPU: ..." where there is none, "cuda unusable: ..." where there is one. */
export function unusableReason(why) {
  return `${gpuPresent() ? 'cuda unusable' : 'no GPU'}: ${why}`;
}

/** The git commit: NODETRON_COMMIT (env.sh sets it from the bundle's stamp), else git. */
export function commit() {
  if (process.env.NODETRON_COMMIT) return process.env.NODETRON_COMMIT;
  const r = spawnSync('git', ['rev-parse', '--short', 'HEAD'], { cwd: root, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : 'unknown';
}

/**
 * The device run's plan, in order of value (what nobody knows yet first): each step runs in its own child
 * process with its own time limit. `phase` caps when a step may still start or run: a phase ends `endS`
 * seconds after the run began (cumulative, so time a phase leaves unused goes to the next), scaled by
 * --budget; a command that names its steps (--only) has no phases, only the budget. `sync` sets
 * NODETRON_CUDA_SYNC=1 (every launch synchronized, so a fault is reported by the op that made it).
 * `sections` picks the blocks of correctness.mjs the step runs; `fn` is the exported function of `file`
 * it calls. `torch`: the step has a PyTorch part that runs where nodetron's cuda addon does not load.
 * `retry`: the variant (VARIANTS) run at once when the step does not pass; `variants`: those the second
 * command runs when it still does not (default `sync`; '' is a plain rerun). `second`: left out of the first
 * command (run.mjs without --only) and put in the second one it prints.
 *
 * The first command (BUDGET_S = 420 s) leaves ~5 minutes of the 15 for a second one on the still-warm
 * machine (start-up 1-2 min): correctness, the GPT-2 step beside PyTorch eager, GEMM, bandwidth, dispatch
 * and CUDA graphs first; torch.compile (a known baseline that needs ~1-2 min of compiling), the two-rank
 * parallel run and compute-sanitizer go to the second, with the failed steps' variants.
 */
export const PHASES = [
  { name: 'preflight', endS: 30 },
  { name: 'correctness', endS: 205 },
  { name: 'gpt2', endS: 320 },
  { name: 'gemm', endS: 360 },
  { name: 'rest', endS: 420 },
];
// Correctness limits: the cpu side measured at the device run's shapes (NODETRON_GPU_RUN_SIZES=full, CPU
// time: ops-f32 14.6 s, ops-f16 13.0, ops-bf16 9.4, kernels 6.0, gemm 2.4, optim-amp 1.6, memory 0.5,
// nccl 0.04; docs/gpu.md) plus ~5 s of process start and CUDA initialization, about doubled.
export const PLAN = [
  { id: 'preflight', phase: 'preflight', file: 'preflight', fn: 'run', limitS: 30, variants: [''] },
  { id: 'nccl', phase: 'correctness', file: 'correctness', sections: ['nccl'], limitS: 15, sync: true, variants: ['nosync'] },
  { id: 'gemm', phase: 'correctness', file: 'correctness', sections: ['gemm'], limitS: 20, sync: true, variants: ['noepi'] },
  { id: 'ops-f32', phase: 'correctness', file: 'correctness', sections: ['ops-f32'], limitS: 30, sync: true, variants: ['simt', 'noepi'] },
  { id: 'ops-bf16', phase: 'correctness', file: 'correctness', sections: ['ops-bf16'], limitS: 25, sync: true, variants: ['simt', 'noepi'] },
  { id: 'ops-f16', phase: 'correctness', file: 'correctness', sections: ['ops-f16'], limitS: 25, sync: true, variants: ['simt', 'noepi'] },
  { id: 'kernels', phase: 'correctness', file: 'correctness', sections: ['kernels'], limitS: 25, sync: true, variants: ['simt', 'noepi'] },
  { id: 'optim-amp', phase: 'correctness', file: 'correctness', sections: ['optim', 'amp', 'gpt'], limitS: 20, sync: true, variants: ['simt', 'noepi'] },
  { id: 'memory', phase: 'correctness', file: 'correctness', sections: ['streams', 'allocator', 'oom'], limitS: 15, sync: true, variants: ['nosync'] },
  { id: 'gpt2-step', phase: 'gpt2', file: 'performance', fn: 'gpt2Step', limitS: 60, minS: 25, retry: 'simt', variants: ['simt+noepi', 'simt+sync'] },
  { id: 'gpt2-torch-eager', phase: 'gpt2', file: 'performance', fn: 'gpt2Torch', args: { mode: 'eager' }, limitS: 45, minS: 25, torch: true, variants: [''] },
  { id: 'gemm-perf', phase: 'gemm', file: 'performance', fn: 'gemmPerf', limitS: 40, minS: 20, torch: true },
  { id: 'membw', phase: 'rest', file: 'performance', fn: 'membw', limitS: 20, minS: 10, torch: true },
  { id: 'dispatch', phase: 'rest', file: 'performance', fn: 'dispatch', limitS: 10, minS: 5 },
  // (never @sync: a capture refuses NODETRON_CUDA_SYNC=1)
  { id: 'gpt2-graph', phase: 'rest', file: 'performance', fn: 'gpt2Graph', limitS: 30, minS: 15, variants: ['simt', 'noepi'] },
  // torch.compile: ~40-90 s of Inductor compiling GPT-2 124M's forward and backward with 16 compile
  // workers (TORCHINDUCTOR_COMPILE_THREADS, the device's cores), then 13 steps; 150 s bounds it.
  { id: 'gpt2-torch-compile', phase: 'rest', file: 'performance', fn: 'gpt2Torch', args: { mode: 'compile' }, limitS: 150, minS: 90, torch: true, second: true, variants: [''] },
  { id: 'parallel', phase: 'rest', file: 'parallel', fn: 'run', limitS: 90, minS: 40, second: true },
  { id: 'sanitizer', phase: 'rest', file: 'correctness', sections: ['sanitizer'], limitS: 150, minS: 40, second: true },
];
/** The first command's budget: it leaves the second one ~5 min of the 15 (docs/gpu.md). One command may run 600 s. */
export const BUDGET_S = 420;

/**
 * Variants: a step run again with environment changes only, named `<step>@<variant>[+<variant>]` in
 * --only and in results.json (each recorded beside the plain step).
 */
export const VARIANTS = {
  simt: { NODETRON_FLASH_SIMT: '1' },         // flash attention on its SIMT kernels instead of the tensor-core ones
  noepi: { NODETRON_CUDA_EPILOGUES: '0' },    // cuBLASLt without epilogues (the plain GEMM, then nodetron's kernels)
  sync: { NODETRON_CUDA_SYNC: '1' },          // every launch synchronized: a fault is reported by the op that made it
  nosync: { NODETRON_CUDA_SYNC: '0' },        // the correctness steps' per-launch synchronization off
  // Issue #35's speed levers, each measured against the GPT-2 step's default path in the second command:
  residual: { NODETRON_LOW_PRECISION_RESIDUAL: '1' }, // the residual stream in bf16, norms reading and writing it (add + norm + cast fused)
  graph: { NODETRON_CUDA_GRAPH: '1' },        // the whole step (clipping, AdamW, zeroGrad) captured into one CUDA graph
  padvocab: { NODETRON_PAD_VOCAB: '64' },     // the LM head's vocabulary padded to a multiple of 64 (50257 -> 50304)
  scalar: { NODETRON_CUDA_VECTOR: '0' },      // the norm, softmax and cross-entropy kernels without their 16-byte loads
};
/**
 * The lever runs the second command makes of the GPT-2 step once it passed (on the variant it passed
 * with): tokens/s and the first losses with each lever beside the step's own record.
 */
export const LEVERS = ['residual', 'graph', 'padvocab', 'scalar'];
/** The environment variables that change what a step runs; results.json records their values per step. */
export const SWITCHES = ['NODETRON_FLASH_SIMT', 'NODETRON_CUDA_EPILOGUES', 'NODETRON_CUDA_SYNC', 'NODETRON_CUDA_GRAPH', 'NODETRON_LOW_PRECISION_RESIDUAL', 'NODETRON_PAD_VOCAB', 'NODETRON_CUDA_VECTOR', 'NODETRON_HEAD_DEVICE_COUNT', 'NODETRON_ADAMW_DEVICE_META', 'TORCHINDUCTOR_COMPILE_THREADS'];

/** `id` or `id@v1+v2` -> { id, step (the PLAN entry), variant, env } ; throws on an unknown step or variant. */
export function parseSelector(sel) {
  const [id, variant] = sel.split('@');
  const step = PLAN.find((s) => s.id === id);
  if (!step) throw new Error(`unknown step ${id} (steps: ${PLAN.map((s) => s.id).join(', ')})`);
  const env = {};
  for (const v of variant ? variant.split('+') : []) {
    if (!VARIANTS[v]) throw new Error(`unknown variant ${v} in ${sel} (variants: ${Object.keys(VARIANTS).join(', ')})`);
    Object.assign(env, VARIANTS[v]);
  }
  return { id: sel, step, variant: variant ?? null, env };
}

/**
 * The second command, from the first one's step records: each step that did not pass again with the
 * environment changes that tell its failure's cause apart (its `variants`: flash attention on SIMT
 * kernels, cuBLASLt without epilogues, per-launch synchronization to name a fault, or, after a timeout,
 * without it), then the steps that found no time, then those the plan leaves for it (`second`).
 * Returns { only: [selectors], budgetS, line } or null when nothing is left.
 */
export function secondCommand(records, firstElapsedS) {
  const sels = [];
  const add = (s) => { if (!sels.includes(s)) sels.push(s); };
  const rec = (id) => records.filter((r) => r.step === id || r.step.startsWith(`${id}@`));
  for (const step of PLAN) {
    const mine = rec(step.id);
    const plain = mine.find((r) => r.step === step.id);
    if (!plain) continue;
    const bad = ['failed', 'crashed', 'timeout'].includes(plain.status);
    if (bad && !mine.some((r) => r.status === 'passed' && r.step !== step.id) && !(step.torch && /^cuda unusable/.test(plain.reason ?? ''))) {
      // A correctness step that timed out may have spent its time synchronizing after every launch.
      const variants = plain.status === 'timeout' && step.sync ? ['nosync'] : step.variants ?? ['sync'];
      for (const v of variants) add(v ? `${step.id}@${v}` : step.id);
    }
  }
  for (const r of records) if (r.status === 'not run' && !r.step.includes('@')) add(r.step);
  // The speed levers, on the GPT-2 step's passing variant, after torch.compile (the peer comes first).
  const passed = rec('gpt2-step').find((r) => r.status === 'passed');
  const base = passed ? (passed.step.includes('@') ? `${passed.step.split('@')[1]}+` : '') : null;
  const levers = base === null ? [] : LEVERS.map((v) => `gpt2-step@${base}${v}`).filter((s) => !records.some((r) => r.step === s));
  for (const step of PLAN) {
    if (step.second && !records.some((r) => r.step === step.id)) add(step.id);
    if (step.id === 'gpt2-torch-compile') levers.forEach(add);
  }
  if (!sels.length) return null;
  // 900 s of device time: ~150 s of machine start-up, the first command (its run, ~15 s of unpacking and
  // the transfers, ~40 s), the second's unpacking; what is left, at most one command's 600 s less unpacking.
  const budgetS = Math.max(60, Math.min(560, Math.floor(900 - 150 - firstElapsedS - 40 - 20)));
  const want = sels.reduce((t, s) => t + parseSelector(s).step.limitS, 0);
  const b = Math.min(budgetS, want + 10);
  return { only: sels, budgetS: b, line: `bash scripts/gpu/device.sh --only ${sels.join(',')} --budget ${b}` };
}

/** Test hook: what NODETRON_GPU_RUN_SIMULATE="nccl:hang,gemm:crash" makes step `id` do ('hang', 'crash', 'throw', 'fail'), or undefined. */
export function simulatedFate(id) {
  return (process.env.NODETRON_GPU_RUN_SIMULATE ?? '').split(',').map((p) => p.split(':')).find(([s]) => s === id)?.[1];
}
