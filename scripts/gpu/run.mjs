#!/usr/bin/env node
// The device run in one command of at most BUDGET_S seconds (common.mjs): preflight -> correctness ->
// a GPT-2 124M step beside PyTorch eager -> GEMM shapes -> bandwidth, dispatch, CUDA graphs, each step in
// its own child process with its own time limit (a hang is killed, a crash or sticky CUDA error is
// recorded, and the next step runs in a fresh process). After every step <out>/results.json is rewritten
// and <out>/run.log gets the step's full output: two files, so everything comes back from a machine that
// returns at most 8. Standard output gets one line per step and, last, the benchmark table, the step
// table and the second command (the reply may show only the last 12,000 characters).
// Without a GPU every step records "skipped" with `no GPU: <reason>` and the run exits 0 (never "passed");
// after the first step that finds no GPU, the others are recorded so without starting a process. On a
// GPU machine where nodetron's cuda addon does not load ("cuda unusable: ..."), the steps with a PyTorch
// part (torch in PLAN) still run.
//
//   node scripts/gpu/run.mjs [--out DIR] [--budget S] [--only id[@variant],...] [--skip id,id] [--all] [--list]
//
// --out defaults to $OUT when it is set (the device machine returns only what is written there), else
// .device/results. A later command into the same folder adds its steps to results.json. --only runs the
// named steps in the order given, without phases (the second command: `<step>@simt+noepi` runs a step
// with VARIANTS' environment changes); --all adds the steps the plan leaves for the second command.
// At the end the run prints and records (results.json's secondCommand) the command for the rest of the
// device window: the failed steps' variants, the steps that found no time, the second command's steps.
// Scratch (each step's JSON, the GPT-2 weights the torch steps start from) goes to $NODETRON_GPU_RUN_WORK
// when set (device.sh: .device/work, kept between two commands on a warm machine), else a temporary folder.
// Test hooks (test/cuda/gpu-run.test.ts): NODETRON_GPU_RUN_SIMULATE="nccl:hang,gemm:crash" makes those
// steps hang or crash at their start; NODETRON_GPU_RUN_LIMIT_S="nccl:3" (or "5" for every step) sets limits.
import { spawn, spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { BUDGET_S, PHASES, PLAN, SWITCHES, commit, parseSelector, root, secondCommand, simulatedFate } from './common.mjs';

const argv = process.argv.slice(2);
const known = new Set(['--out', '--budget', '--only', '--skip', '--list', '--all']);
const flags = new Set(['--list', '--all']);
for (let i = 0; i < argv.length; i++) {
  if (!known.has(argv[i])) { console.error(`run.mjs: unknown argument ${argv[i]} (${[...known].join(', ')})`); process.exit(2); }
  if (!flags.has(argv[i])) i++;
}
const arg = (k, d) => (argv.includes(k) ? argv[argv.indexOf(k) + 1] : d);
if (argv.includes('--list')) {
  for (const s of PLAN) console.log(`${s.id.padEnd(20)} ${s.phase.padEnd(12)} limit ${String(s.limitS).padStart(3)} s${s.sync ? ', NODETRON_CUDA_SYNC=1' : ''}${s.retry ? `, retried @${s.retry}` : ''}${s.torch ? ', torch' : ''}${s.second ? ', second command' : ''}`);
  process.exit(0);
}
const out = resolve(arg('--out', process.env.OUT || join(root, '.device', 'results')));
const budgetS = Number(arg('--budget', BUDGET_S));
if (!(budgetS > 0)) { console.error(`run.mjs: --budget must be a positive number of seconds, got ${arg('--budget')}`); process.exit(2); }
const list = (k) => (arg(k) ? arg(k).split(',').filter(Boolean) : null);
const only = list('--only'), skip = list('--skip') ?? [];
let selected;
try {
  for (const id of skip) if (!PLAN.some((s) => s.id === id)) throw new Error(`unknown step ${id} (steps: ${PLAN.map((s) => s.id).join(', ')})`);
  selected = only ? only.map(parseSelector)
    : PLAN.filter((s) => (argv.includes('--all') || !s.second) && !skip.includes(s.id)).map((s) => parseSelector(s.id));
} catch (e) { console.error(`run.mjs: ${e.message}`); process.exit(2); }
const steps = selected.filter((s) => !skip.includes(s.step.id));
mkdirSync(out, { recursive: true });
const resultsFile = join(out, 'results.json'), logFile = join(out, 'run.log');
// Scratch stays out of $OUT.
const keptWork = process.env.NODETRON_GPU_RUN_WORK;
const work = keptWork ? resolve(keptWork) : mkdtempSync(join(tmpdir(), 'nt-gpu-run-'));
mkdirSync(work, { recursive: true });
const t0 = Date.now();
const elapsedS = () => (Date.now() - t0) / 1000;
// Phase ends scale with the budget, so a shorter --budget keeps the order of value. A command that names
// its steps (--only) has no phases: its steps run in the order given, within the budget.
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

/** Runs one step (a selector: a PLAN step and its variant's environment) in a child; kills its process group at the limit. */
function runStep(sel, limitS) {
  const { step } = sel;
  const file = join(work, `${sel.id.replace(/[^\w.-]+/g, '_')}.json`);
  const started = Date.now();
  const env = { ...process.env, NODETRON_GPU_RUN_WORK: work, ...(step.sync ? { NODETRON_CUDA_SYNC: '1' } : {}), ...sel.env };
  const switches = Object.fromEntries(SWITCHES.filter((k) => env[k] !== undefined).map((k) => [k, env[k]]));
  appendFileSync(logFile, `\n== ${new Date().toISOString()} step ${sel.id} (limit ${limitS.toFixed(0)} s${Object.keys(switches).length ? `, ${Object.entries(switches).map(([k, v]) => `${k}=${v}`).join(' ')}` : ''})\n`);
  return new Promise((finish) => {
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
        step: sel.id, phase: step.phase, status, ...(sel.variant ? { variant: sel.variant } : {}), env: switches,
        reason: rec?.reason ?? (timedOut ? `killed at its ${limitS.toFixed(0)} s limit` : signal ? `killed by ${signal}` : code !== 0 ? `exit code ${code}` : undefined),
        exitCode: code, signal, timedOut, limitS: Number(limitS.toFixed(1)), wallS: (Date.now() - started) / 1000,
        checksPassed: checks.filter((c) => c.ok).length, checksFailed: checks.filter((c) => !c.ok).length,
        info: rec?.info ?? {}, checks, bench: rec?.bench ?? [],
      });
    });
  });
}

/** Whether a step's record says it found no GPU; whether it found a GPU that nodetron's cuda addon cannot use. */
const isNoGpu = (r) => r.status === 'skipped' && /^no GPU: /.test(r.reason ?? '');
const isCudaUnusable = (r) => /^cuda unusable: /.test(r.reason ?? '');

/** Kernel coverage over every correctness step: each counts the interface kernels it called. */
function coverage(results) {
  const ran = results.filter((r) => r.phase === 'correctness' && r.info.kernelCalls);
  if (!ran.length) return null;
  const seen = new Set(ran.flatMap((r) => Object.keys(r.info.kernelCalls)));
  const interfaceKernels = ran.find((r) => r.info.interfaceKernels)?.info.interfaceKernels ?? [];
  const missed = interfaceKernels.filter((k) => !seen.has(k));
  const complete = PLAN.filter((s) => s.phase === 'correctness').every((s) => results.some((r) => r.step === s.id && r.status !== 'skipped'));
  return { name: `every interface kernel called on ${process.env.NODETRON_GPU_RUN_DRY ? 'the cpu (dry run)' : 'cuda'} (${seen.size} seen${complete ? '' : '; not every correctness step ran'})`, ok: missed.length === 0, error: missed.length ? `never called: ${missed.join(', ')}` : undefined };
}

const order = (id) => PLAN.findIndex((p) => p.id === id.split('@')[0]);
// The GPU and driver as the driver names them, for a command without the preflight step (the second one:
// keep.mjs names its file by the GPU).
const smi = (() => {
  const r = spawnSync('nvidia-smi', ['--query-gpu=name,driver_version', '--format=csv,noheader'], { encoding: 'utf8', timeout: 15_000 });
  const [name, driver] = r.status === 0 ? r.stdout.split('\n')[0].split(',').map((x) => x.trim()) : [];
  return { name: name || null, driver: driver || null };
})();
function writeResults(second) {
  const mine = new Set(done.map((r) => r.step));
  const all = [...(previous?.steps ?? []).filter((s) => !mine.has(s.step)).map((s) => ({ ...s, checks: (previous.checks ?? []).filter((c) => c.step === s.step), bench: (previous.bench ?? []).filter((b) => b.step === s.step), info: previous.info?.[s.step] ?? {} })), ...done]
    .map((r, i) => [r, i]).sort(([a, i], [b, j]) => order(a.step) - order(b.step) || i - j).map(([r]) => r);
  const info = Object.assign({}, ...all.map((s) => s.info));
  const cov = coverage(all);
  const summary = {
    kind: 'nodetron-gpu-run', commit: info.commit ?? commit(), date: new Date().toISOString().slice(0, 10), budgetS, elapsedS: elapsedS(),
    args: argv,
    machine: { gpu: info.gpu ?? smi.name, driver: info.driver ?? smi.driver, nvidiaSmi: info.nvidiaSmi ?? null, libraries: info.libraries ?? null, torch: info.torch ?? null, node: process.version },
    steps: all.map(({ checks, bench, info: _i, ...s }) => s),
    checks: [...all.flatMap((s) => s.checks.map((c) => ({ step: s.step, ...c }))), ...(cov ? [{ step: 'coverage', ...cov }] : [])],
    bench: all.flatMap((s) => s.bench.map((b) => ({ step: s.step, ...b }))),
    info: Object.fromEntries(all.map((s) => [s.step, s.info])),
    secondCommand: second ?? previous?.secondCommand ?? null,
  };
  writeFileSync(resultsFile, JSON.stringify(summary, null, 2));
  return summary;
}

const notStarted = (sel, status, reason, limitS = 0) => ({ step: sel.id, phase: sel.step.phase, status, reason, ...(sel.variant ? { variant: sel.variant } : {}), exitCode: status === 'skipped' ? 0 : null, signal: null, timedOut: false, limitS: Number(limitS.toFixed(1)), wallS: 0, checksPassed: 0, checksFailed: 0, info: {}, checks: [], bench: [] });
const line = (r) => console.log(`[${elapsedS().toFixed(0).padStart(4)} s] ${r.step.padEnd(20)} ${r.status.padEnd(9)} ${String(r.checksPassed).padStart(4)} ok ${String(r.checksFailed).padStart(3)} failed  ${r.wallS.toFixed(1)} s${r.status === 'passed' ? '' : `  ${String(r.reason ?? '').split('\n')[0].slice(0, 100)}`}`);

console.log(`device run: ${steps.length} steps in at most ${budgetS} s${only ? ' (the steps named, in that order)' : ''}; results -> ${resultsFile}, full output -> ${logFile}`);
writeFileSync(logFile, `nodetron device run ${new Date().toISOString()} budget ${budgetS} s ${argv.join(' ')}\n`, { flag: previous ? 'a' : 'w' });
const queue = [...steps];
while (queue.length) {
  const sel = queue.shift();
  const { step } = sel;
  const left = (only ? budgetS : Math.min(phaseEnd(step.phase), budgetS)) - elapsedS();
  const limitS = Math.min(limitFor(step), left);
  // Once a step has found no GPU (outside the dry run), the later steps would each start a process only
  // to find the same: they are recorded skipped with that reason, unstarted (simulated steps still run).
  // Only while every step so far found no GPU: a step that ran on the GPU means a later "no GPU" is a
  // fault of that step, not of the machine. Where a GPU is there but the cuda addon does not load, the
  // steps with a PyTorch part still run (the baselines), the others are recorded skipped with the reason.
  const noGpu = process.env.NODETRON_GPU_RUN_DRY || !done.length || !done.every(isNoGpu) ? undefined : done[0].reason;
  const unusable = step.torch ? undefined : done.find(isCudaUnusable)?.reason;
  const simulated = simulatedFate(step.id) !== undefined;
  if (left < (step.minS ?? 5)) {
    done.push(notStarted(sel, 'not run', `no time left in its ${only ? 'budget' : 'phase'} (${Math.max(0, left).toFixed(0)} s of ${step.minS ?? 5} s needed)`));
  } else if ((noGpu || unusable) && !simulated) {
    appendFileSync(logFile, `\n== ${new Date().toISOString()} step ${sel.id} not started: an earlier step found ${noGpu ?? unusable}\n`);
    done.push(notStarted(sel, 'skipped', noGpu ?? unusable, limitS));
  } else {
    done.push(await runStep(sel, limitS));
  }
  const r = done.at(-1);
  line(r);
  // The second command as it would be if the run ended here (the steps still queued count as not run),
  // so a first command cut off by the device's own limit still leaves one in results.json.
  writeResults(secondCommand([...done, ...queue.map((q) => ({ step: q.id, status: 'not run' }))], elapsedS()));
  // The GPT-2 step again at once with its retry variant (flash attention on SIMT kernels) when it failed,
  // crashed or hung: both outcomes are recorded, and the torch steps compare with the last losses written.
  if (step.retry && !sel.variant && ['failed', 'crashed', 'timeout'].includes(r.status)) queue.unshift(parseSelector(`${step.id}@${step.retry}`));
}
const second = secondCommand(writeResults().steps, elapsedS());
const summary = writeResults(second);
if (!keptWork) rmSync(work, { recursive: true, force: true });

// The tail of the output, most important last: benchmarks, then the step table, the totals and the
// second command (a reply shows only the last 12,000 characters).
const fmt = (x) => (x === undefined || x === null ? '-' : typeof x === 'number' ? (Math.abs(x) >= 100 || x === 0 ? x.toFixed(0) : x.toPrecision(3)) : String(x));
const rows = summary.bench.filter((b) => b.value !== undefined);
if (rows.length) {
  console.log('\nbenchmark                                          nodetron      torch   ratio  unit');
  for (const b of rows) console.log(`${String(b.name).slice(0, 50).padEnd(50)}${fmt(b.value).padStart(9)}  ${fmt(b.torch).padStart(9)}  ${fmt(b.ratio).padStart(6)}  ${b.unit ?? ''}`);
}
console.log(`\n${summary.machine.gpu ?? 'no GPU'} | driver ${fmt(summary.machine.driver)} | torch ${fmt(summary.machine.torch?.torch ?? summary.machine.torch)} | commit ${fmt(summary.commit)}`);
console.log('step                      status    passed failed   wall s  worst check');
for (const s of summary.steps) {
  const mine = summary.checks.filter((c) => c.step === s.step);
  const worst = mine.find((c) => !c.ok) ?? mine.reduce((w, c) => (w && (w.maxRelErr ?? 0) >= (c.maxRelErr ?? 0) ? w : c), undefined);
  const what = worst ? `${worst.name.slice(0, 50)}: ${worst.error ? String(worst.error).split('\n')[0].slice(0, 60) : fmt(worst.maxRelErr)}` : String(s.reason ?? '').slice(0, 80);
  console.log(`${s.step.padEnd(26)}${s.status.padEnd(10)}${String(s.checksPassed).padStart(6)} ${String(s.checksFailed).padStart(6)} ${s.wallS.toFixed(1).padStart(8)}  ${what}`);
}
const cov = summary.checks.find((c) => c.step === 'coverage');
if (cov) console.log(`coverage: ${cov.name}: ${cov.ok ? 'ok' : cov.error}`);
const passed = summary.checks.filter((c) => c.ok).length, failed = summary.checks.filter((c) => !c.ok).length;
const bad = summary.steps.filter((s) => !['passed', 'skipped', 'not run'].includes(s.status));
console.log(`\n${passed} checks passed, ${failed} failed; ${bad.length} steps not passed; ${elapsedS().toFixed(0)} s of ${budgetS} s`);
console.log(`results: ${resultsFile} (keep it: node scripts/gpu/keep.mjs <that file>)`);
if (second) console.log(`second command (${second.only.length} steps, ${second.budgetS} s; start it at once, the machine goes back after 30 s idle):\n  ${second.line}`);
process.exit(bad.length || failed ? 1 : 0);
