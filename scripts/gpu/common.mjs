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
    const r = spawnSync(py, ['-c', 'import torch,json;print(json.dumps({"torch":torch.__version__}))'], { encoding: 'utf8', timeout: 60_000 });
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
