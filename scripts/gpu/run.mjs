#!/usr/bin/env node
// The device run in one command: each stage in its own child process with its own time limit; after
// every stage its result is appended to <out>/runs.jsonl and <out>/results.json is rewritten, so a
// crash, sticky CUDA error or hang in one stage loses nothing of the others. Without a GPU every
// stage records "skipped" with the reason and exits 0 (never "passed").
//
//   node scripts/gpu/run.mjs [--stage 0,1,2,3] [--out DIR]        (default out: .device/results)
//
// Stages: 0 preflight, 1 correctness, 2 parallel on one GPU, 3 performance (see docs/gpu.md).
// Each command on the GPU machine may run 10 minutes: `--stage 0,1` then `--stage 2` then `--stage 3`.
// Test hooks (test/cuda/gpu-run.test.ts): NODETRON_GPU_RUN_SIMULATE="1:hang,2:crash" makes those stages
// hang or crash at their start; NODETRON_GPU_RUN_LIMIT_S="1:3" (or "5" for every stage) sets limits.
import { spawn } from 'node:child_process';
import { appendFileSync, createWriteStream, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { root } from './common.mjs';

export const STAGES = [
  { id: 0, name: 'preflight', limitS: 120 },
  { id: 1, name: 'correctness', limitS: 570 },
  { id: 2, name: 'parallel', limitS: 570 },
  { id: 3, name: 'performance', limitS: 570 },
];

const argv = process.argv.slice(2);
const arg = (k, d) => (argv.includes(k) ? argv[argv.indexOf(k) + 1] : d);
const out = resolve(arg('--out', join(root, '.device', 'results')));
const selected = arg('--stage', '0,1,2,3').split(',').map(Number);
for (const s of selected) if (!STAGES[s]) { console.error(`unknown stage ${s} (0..${STAGES.length - 1})`); process.exit(2); }
mkdirSync(out, { recursive: true });

function limitFor(id) {
  const spec = process.env.NODETRON_GPU_RUN_LIMIT_S;
  if (!spec) return STAGES[id].limitS;
  if (/^\d+(\.\d+)?$/.test(spec)) return Number(spec);
  for (const part of spec.split(',')) { const [s, v] = part.split(':'); if (Number(s) === id) return Number(v); }
  return STAGES[id].limitS;
}

/** Runs one stage; kills its whole process group at the limit. */
function runStage(stage) {
  const limitS = limitFor(stage.id);
  const file = join(out, `stage-${stage.id}-${stage.name}.json`);
  const log = createWriteStream(join(out, `stage-${stage.id}-${stage.name}.log`));
  const t0 = Date.now();
  console.log(`\n== stage ${stage.id} ${stage.name} (limit ${limitS} s)`);
  return new Promise((done) => {
    const child = spawn(process.execPath, [join(root, 'scripts', 'gpu', 'stage.mjs'), String(stage.id), file], { cwd: root, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    for (const s of [child.stdout, child.stderr]) s.on('data', (d) => { process.stdout.write(d); log.write(d); });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      try { process.kill(-child.pid, 'SIGKILL'); } catch { /* gone */ }
    }, limitS * 1000);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      log.end();
      let rec = null;
      try { rec = JSON.parse(readFileSync(file, 'utf8')); } catch { /* the stage died before writing */ }
      const checks = rec?.checks ?? [];
      let status;
      if (timedOut) status = 'timeout';
      else if (code !== 0) status = rec?.status === 'skipped' ? 'failed' : signal ? 'crashed' : 'failed';
      else if (rec?.status === 'skipped') status = 'skipped';
      else if (rec?.status === 'passed' && checks.every((c) => c.ok)) status = 'passed';
      else status = 'failed';
      const result = {
        stage: stage.id, name: stage.name, status, reason: rec?.reason ?? (timedOut ? `killed at its ${limitS} s limit` : signal ? `killed by ${signal}` : code !== 0 ? `exit code ${code}` : undefined),
        exitCode: code, signal, timedOut, limitS, wallS: (Date.now() - t0) / 1000,
        checksPassed: checks.filter((c) => c.ok).length, checksFailed: checks.filter((c) => !c.ok).length,
        info: rec?.info ?? {}, checks, bench: rec?.bench ?? [],
      };
      appendFileSync(join(out, 'runs.jsonl'), JSON.stringify({ at: new Date().toISOString(), ...result }) + '\n');
      done(result);
    });
  });
}

/** The latest result of every stage in out/runs.jsonl (earlier commands' stages included). */
function latestResults() {
  const latest = new Map();
  if (existsSync(join(out, 'runs.jsonl'))) {
    for (const line of readFileSync(join(out, 'runs.jsonl'), 'utf8').split('\n')) if (line.trim()) { const r = JSON.parse(line); latest.set(r.stage, r); }
  }
  return [...latest.values()].sort((a, b) => a.stage - b.stage);
}

function writeSummary() {
  const stages = latestResults();
  const info = Object.assign({}, ...stages.map((s) => s.info));
  const summary = {
    kind: 'nodetron-gpu-run', commit: info.commit, date: new Date().toISOString().slice(0, 10),
    machine: { gpu: info.gpu ?? null, driver: info.driver ?? null, libraries: info.libraries ?? null, torch: info.torch ?? null, node: process.version },
    stages: stages.map(({ checks, bench, info: _i, ...s }) => s),
    checks: stages.flatMap((s) => s.checks.map((c) => ({ stage: s.stage, ...c }))),
    bench: stages.flatMap((s) => s.bench.map((b) => ({ stage: s.stage, ...b }))),
  };
  writeFileSync(join(out, 'results.json'), JSON.stringify(summary, null, 2));
  return summary;
}

const fmt = (x) => (x === undefined || x === null ? '-' : typeof x === 'number' ? (Math.abs(x) >= 100 || x === 0 ? x.toFixed(0) : x.toPrecision(3)) : String(x));
for (const id of selected) { await runStage(STAGES[id]); writeSummary(); }
const summary = writeSummary();

console.log('\nstage          status    passed failed  worst check (max rel. error)');
for (const s of summary.stages) {
  const mine = summary.checks.filter((c) => c.stage === s.stage);
  const worst = mine.filter((c) => !c.ok)[0] ?? mine.reduce((w, c) => (w && (w.maxRelErr ?? 0) >= (c.maxRelErr ?? 0) ? w : c), undefined);
  console.log(`${(s.stage + ' ' + s.name).padEnd(15)}${s.status.padEnd(10)}${String(s.checksPassed).padStart(6)} ${String(s.checksFailed).padStart(6)}  ${worst ? `${worst.name}: ${worst.error ? worst.error.split('\n')[0].slice(0, 80) : fmt(worst.maxRelErr)}` : s.reason ?? ''}`);
}
const ratios = summary.bench.filter((b) => b.ratio !== undefined);
if (ratios.length) {
  console.log('\nbenchmark                                          nodetron      torch   ratio  unit');
  for (const b of ratios) console.log(`${b.name.slice(0, 50).padEnd(50)}${fmt(b.value).padStart(9)}  ${fmt(b.torch).padStart(9)}  ${fmt(b.ratio).padStart(6)}  ${b.unit}`);
}
const bad = summary.stages.filter((s) => !['passed', 'skipped'].includes(s.status));
console.log(`\nresults: ${join(out, 'results.json')} (copy to bench/results/<date>-<gpu>.json to keep)`);
process.exit(bad.length ? 1 : 0);
