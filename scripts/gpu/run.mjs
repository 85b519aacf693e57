#!/usr/bin/env node
// The device run in one command of at most BUDGET_S seconds (common.mjs): preflight -> correctness ->
// a GPT-2 124M step beside PyTorch -> GEMM shapes -> the rest, each step in its own child process with
// its own time limit (a hang is killed, a crash or sticky CUDA error is recorded, and the next step runs
// in a fresh process). After every step <out>/results.json is rewritten and <out>/run.log gets the
// step's full output: two files, so everything comes back from a machine that returns at most 8.
// Standard output gets one line per step and, last, the summary table (a reply may show only its tail).
// Without a GPU every step records "skipped" with `no GPU: <reason>` and the run exits 0 (never "passed");
// after the first step that finds no GPU, the others are recorded so without starting a process.
//
//   node scripts/gpu/run.mjs [--out DIR] [--budget S] [--only id,id] [--skip id,id] [--list]
//
// --out defaults to $OUT when it is set (the device machine returns only what is written there), else
// .device/results. A later command into the same folder adds its steps to results.json.
// Test hooks (test/cuda/gpu-run.test.ts): NODETRON_GPU_RUN_SIMULATE="nccl:hang,gemm:crash" makes those
// steps hang or crash at their start; NODETRON_GPU_RUN_LIMIT_S="nccl:3" (or "5" for every step) sets limits.
import { spawn } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BUDGET_S, PHASES, PLAN, root, simulatedFate } from './common.mjs';

const argv = process.argv.slice(2);
const known = new Set(['--out', '--budget', '--only', '--skip', '--list']);
for (let i = 0; i < argv.length; i++) {
  if (!known.has(argv[i])) { console.error(`run.mjs: unknown argument ${argv[i]} (${[...known].join(', ')})`); process.exit(2); }
  if (argv[i] !== '--list') i++;
}
const arg = (k, d) => (argv.includes(k) ? argv[argv.indexOf(k) + 1] : d);
if (argv.includes('--list')) {
  for (const s of PLAN) console.log(`${s.id.padEnd(20)} ${s.phase.padEnd(12)} limit ${s.limitS} s${s.sync ? ', NODETRON_CUDA_SYNC=1' : ''}`);
  process.exit(0);
}
const out = resolve(arg('--out', process.env.OUT || join(root, '.device', 'results')));
const budgetS = Number(arg('--budget', BUDGET_S));
if (!(budgetS > 0)) { console.error(`run.mjs: --budget must be a positive number of seconds, got ${arg('--budget')}`); process.exit(2); }
const list = (k) => (arg(k) ? arg(k).split(',').filter(Boolean) : null);
const only = list('--only'), skip = list('--skip') ?? [];
for (const id of [...(only ?? []), ...skip]) {
  if (!PLAN.some((s) => s.id === id)) { console.error(`run.mjs: unknown step ${id} (steps: ${PLAN.map((s) => s.id).join(', ')})`); process.exit(2); }
}
const steps = PLAN.filter((s) => (!only || only.includes(s.id)) && !skip.includes(s.id));
mkdirSync(out, { recursive: true });
const resultsFile = join(out, 'results.json'), logFile = join(out, 'run.log');
// Scratch (each step's own JSON, weights shared by the GPT-2 steps) stays out of $OUT.
const work = mkdtempSync(join(tmpdir(), 'nt-gpu-run-'));
const t0 = Date.now();
const elapsedS = () => (Date.now() - t0) / 1000;
// Phase ends scale with the budget, so a shorter --budget keeps the order of value.
const phaseEnd = (name) => (PHASES.find((p) => p.name === name).endS / PHASES.at(-1).endS) * budgetS;

function limitFor(step) {
  const spec = process.env.NODETRON_GPU_RUN_LIMIT_S;
  if (!spec) return step.limitS;
  if (/^\d+(\.\d+)?$/.test(spec)) return Number(spec);
  for (const part of spec.split(',')) { const [s, v] = part.split(':'); if (s === step.id) return Number(v); }
  return step.limitS;
}

/** Every step recorded so far: earlier commands' (results.json in the same folder), then this one's. */
const previous = (() => {
  try { return JSON.parse(readFileSync(resultsFile, 'utf8')); } catch { return null; }
})();
const done = [];

/** Runs one step in a child; kills its process group at the limit. */
function runStep(step, limitS) {
  const file = join(work, `${step.id}.json`);
  const started = Date.now();
  appendFileSync(logFile, `\n== ${new Date().toISOString()} step ${step.id} (limit ${limitS.toFixed(0)} s)\n`);
  return new Promise((finish) => {
    const env = { ...process.env, NODETRON_GPU_RUN_WORK: work, ...(step.sync ? { NODETRON_CUDA_SYNC: '1' } : {}) };
    const child = spawn(process.execPath, [join(root, 'scripts', 'gpu', 'check.mjs'), step.id, file], { cwd: root, detached: true, stdio: ['ignore', 'pipe', 'pipe'], env });
    let failLines = 0;
    const onData = (d) => {
      appendFileSync(logFile, d);
      for (const line of String(d).split('\n')) {
        if (line.startsWith('FAIL ') && failLines++ < 6) console.log(`  ${line.slice(0, 200)}`);
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ }
    }, limitS * 1000);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      let rec = null;
      try { rec = JSON.parse(readFileSync(file, 'utf8')); } catch { /* the step died before writing */ }
      const checks = rec?.checks ?? [];
      let status;
      if (timedOut) status = 'timeout';
      else if (code !== 0) status = signal ? 'crashed' : 'failed';
      else if (rec?.status === 'skipped') status = 'skipped';
      else if (rec?.status === 'passed' && checks.every((c) => c.ok)) status = 'passed';
      else status = 'failed';
      finish({
        step: step.id, phase: step.phase, status,
        reason: rec?.reason ?? (timedOut ? `killed at its ${limitS.toFixed(0)} s limit` : signal ? `killed by ${signal}` : code !== 0 ? `exit code ${code}` : undefined),
        exitCode: code, signal, timedOut, limitS: Number(limitS.toFixed(1)), wallS: (Date.now() - started) / 1000,
        checksPassed: checks.filter((c) => c.ok).length, checksFailed: checks.filter((c) => !c.ok).length,
        info: rec?.info ?? {}, checks, bench: rec?.bench ?? [],
      });
    });
  });
}

/** Whether a step's record says it found no GPU. */
const isNoGpu = (r) => r.status === 'skipped' && /^no GPU: /.test(r.reason ?? '');

/** Kernel coverage over every correctness step: each counts the interface kernels it called. */
function coverage(results) {
  const ran = results.filter((r) => r.phase === 'correctness' && r.info.kernelCalls);
  if (!ran.length) return null;
  const seen = new Set(ran.flatMap((r) => Object.keys(r.info.kernelCalls)));
  const interfaceKernels = ran.find((r) => r.info.interfaceKernels)?.info.interfaceKernels ?? [];
  const missed = interfaceKernels.filter((k) => !seen.has(k));
  const complete = PLAN.filter((s) => s.phase === 'correctness').every((s) => results.some((r) => r.step === s.id && r.status !== 'skipped'));
  return { name: `every interface kernel called on cuda (${seen.size} seen${complete ? '' : '; not every correctness step ran'})`, ok: missed.length === 0, error: missed.length ? `never called: ${missed.join(', ')}` : undefined };
}

function writeResults() {
  const mine = new Set(done.map((r) => r.step));
  const all = [...(previous?.steps ?? []).filter((s) => !mine.has(s.step)).map((s) => ({ ...s, checks: (previous.checks ?? []).filter((c) => c.step === s.step), bench: (previous.bench ?? []).filter((b) => b.step === s.step), info: previous.info?.[s.step] ?? {} })), ...done]
    .sort((a, b) => PLAN.findIndex((p) => p.id === a.step) - PLAN.findIndex((p) => p.id === b.step));
  const info = Object.assign({}, ...all.map((s) => s.info));
  const cov = coverage(all);
  const summary = {
    kind: 'nodetron-gpu-run', commit: info.commit ?? null, date: new Date().toISOString().slice(0, 10), budgetS, elapsedS: elapsedS(),
    machine: { gpu: info.gpu ?? null, driver: info.driver ?? null, nvidiaSmi: info.nvidiaSmi ?? null, libraries: info.libraries ?? null, torch: info.torch ?? null, node: process.version },
    steps: all.map(({ checks, bench, info: _i, ...s }) => s),
    checks: [...all.flatMap((s) => s.checks.map((c) => ({ step: s.step, ...c }))), ...(cov ? [{ step: 'coverage', ...cov }] : [])],
    bench: all.flatMap((s) => s.bench.map((b) => ({ step: s.step, ...b }))),
    info: Object.fromEntries(all.map((s) => [s.step, s.info])),
  };
  writeFileSync(resultsFile, JSON.stringify(summary, null, 2));
  return summary;
}

console.log(`device run: ${steps.length} steps in at most ${budgetS} s; results -> ${resultsFile}, full output -> ${logFile}`);
writeFileSync(logFile, `nodetron device run ${new Date().toISOString()} budget ${budgetS} s\n`, { flag: previous ? 'a' : 'w' });
for (const step of steps) {
  const left = Math.min(phaseEnd(step.phase), budgetS) - elapsedS();
  const limitS = Math.min(limitFor(step), left);
  // Once a step has found no GPU (outside the dry run), the later steps would each start a process only
  // to find the same: they are recorded skipped with that reason, unstarted (simulated steps still run).
  // Only while every step so far found no GPU: a step that ran on the GPU means a later "no GPU" is a
  // fault of that step, not of the machine.
  const noGpu = process.env.NODETRON_GPU_RUN_DRY || !done.length || !done.every(isNoGpu) ? undefined : done[0].reason;
  const simulated = simulatedFate(step.id) !== undefined;
  if (left < (step.minS ?? 5)) {
    done.push({ step: step.id, phase: step.phase, status: 'not run', reason: `no time left in its phase (${Math.max(0, left).toFixed(0)} s of ${step.minS ?? 5} s needed)`, limitS: 0, wallS: 0, checksPassed: 0, checksFailed: 0, info: {}, checks: [], bench: [] });
  } else if (noGpu && !simulated) {
    appendFileSync(logFile, `\n== ${new Date().toISOString()} step ${step.id} not started: an earlier step found ${noGpu}\n`);
    done.push({ step: step.id, phase: step.phase, status: 'skipped', reason: noGpu, exitCode: 0, signal: null, timedOut: false, limitS: Number(limitS.toFixed(1)), wallS: 0, checksPassed: 0, checksFailed: 0, info: {}, checks: [], bench: [] });
  } else {
    const r = await runStep(step, limitS);
    done.push(r);
  }
  const r = done.at(-1);
  console.log(`[${elapsedS().toFixed(0).padStart(4)} s] ${r.step.padEnd(20)} ${r.status.padEnd(9)} ${String(r.checksPassed).padStart(4)} ok ${String(r.checksFailed).padStart(3)} failed  ${r.wallS.toFixed(1)} s${r.status === 'passed' ? '' : `  ${String(r.reason ?? '').split('\n')[0].slice(0, 100)}`}`);
  writeResults();
}
const summary = writeResults();
rmSync(work, { recursive: true, force: true });

const fmt = (x) => (x === undefined || x === null ? '-' : typeof x === 'number' ? (Math.abs(x) >= 100 || x === 0 ? x.toFixed(0) : x.toPrecision(3)) : String(x));
console.log(`\n${summary.machine.gpu ?? 'no GPU'} | driver ${fmt(summary.machine.driver)} | torch ${fmt(summary.machine.torch?.torch ?? summary.machine.torch)} | commit ${fmt(summary.commit)}`);
console.log('step                 status    passed failed   wall s  worst check');
for (const s of summary.steps) {
  const mine = summary.checks.filter((c) => c.step === s.step);
  const worst = mine.find((c) => !c.ok) ?? mine.reduce((w, c) => (w && (w.maxRelErr ?? 0) >= (c.maxRelErr ?? 0) ? w : c), undefined);
  const what = worst ? `${worst.name.slice(0, 50)}: ${worst.error ? String(worst.error).split('\n')[0].slice(0, 60) : fmt(worst.maxRelErr)}` : String(s.reason ?? '').slice(0, 80);
  console.log(`${s.step.padEnd(21)}${s.status.padEnd(10)}${String(s.checksPassed).padStart(6)} ${String(s.checksFailed).padStart(6)} ${s.wallS.toFixed(1).padStart(8)}  ${what}`);
}
const cov = summary.checks.find((c) => c.step === 'coverage');
if (cov) console.log(`coverage: ${cov.name}: ${cov.ok ? 'ok' : cov.error}`);
const rows = summary.bench.filter((b) => b.value !== undefined);
if (rows.length) {
  console.log('\nbenchmark                                          nodetron      torch   ratio  unit');
  for (const b of rows) console.log(`${String(b.name).slice(0, 50).padEnd(50)}${fmt(b.value).padStart(9)}  ${fmt(b.torch).padStart(9)}  ${fmt(b.ratio).padStart(6)}  ${b.unit ?? ''}`);
}
const passed = summary.checks.filter((c) => c.ok).length, failed = summary.checks.filter((c) => !c.ok).length;
const bad = summary.steps.filter((s) => !['passed', 'skipped', 'not run'].includes(s.status));
console.log(`\n${passed} checks passed, ${failed} failed; ${bad.length} steps not passed; ${elapsedS().toFixed(0)} s of ${budgetS} s`);
console.log(`results: ${resultsFile} (keep it: node scripts/gpu/keep.mjs <that file>)`);
process.exit(bad.length || failed ? 1 : 0);
