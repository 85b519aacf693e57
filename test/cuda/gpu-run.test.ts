// scripts/gpu/run.mjs, the device run in one command: without a GPU every step records "skipped" with
// the reason (exit 0, never "passed"); each step is its own process with its own limit, so a step that
// hangs is killed at its limit, one that crashes is recorded, and the next step still runs; results go
// to $OUT as two files (results.json rewritten after every step, run.log), within the phase budget.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const work = mkdtempSync(join(tmpdir(), 'nt-gpu-run-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Step { step: string; status: string; reason?: string; exitCode: number | null; checksPassed: number; timedOut?: boolean; limitS: number; wallS: number; signal?: string | null }

/** Runs run.mjs with OUT=<work>/<name> (no --out: $OUT is the default) and the given arguments. */
function runPlan(name: string, args: string[], env: Record<string, string> = {}) {
  const out = join(work, name);
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'gpu', 'run.mjs'), ...args],
    { cwd: root, encoding: 'utf8', timeout: 170_000, env: { ...process.env, NODETRON_GPU_RUN_DRY: '', OUT: out, ...env } });
  const results = JSON.parse(readFileSync(join(out, 'results.json'), 'utf8'));
  return { code: r.status, output: r.stdout + r.stderr, results, steps: results.steps as Step[], files: readdirSync(out).sort() };
}

describe('scripts/gpu/run.mjs: the plan', () => {
  it('every step names a function its stage file exports, every section exists, phases fit one 600 s command', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const correctness = readFileSync(join(root, 'scripts', 'gpu', 'stages', 'correctness.mjs'), 'utf8');
    const ids = new Set<string>();
    for (const s of common.PLAN) {
      expect(ids.has(s.id), s.id).toBe(false);
      ids.add(s.id);
      const mod = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'stages', `${s.file}.mjs`)).href);
      expect(typeof mod[s.fn ?? 'run'], `${s.id}: ${s.file}.mjs exports ${s.fn ?? 'run'}`).toBe('function');
      for (const sec of s.sections ?? []) expect(correctness.includes(`section('${sec}')`) || (sec.startsWith('ops-') && correctness.includes('section(`ops-${dtype}`)')), `${s.id}: section ${sec}`).toBe(true);
      expect(common.PHASES.some((p: { name: string }) => p.name === s.phase), `${s.id}: phase ${s.phase}`).toBe(true);
    }
    // Correctness before the GPT-2 step, before GEMM shapes, before the rest; NCCL and GEMM first.
    const order = common.PLAN.map((s: { phase: string }) => common.PHASES.findIndex((p: { name: string }) => p.name === s.phase));
    expect(order).toEqual([...order].sort((a, b) => a - b));
    expect(common.PLAN.slice(0, 3).map((s: { id: string }) => s.id)).toEqual(['preflight', 'nccl', 'gemm']);
    expect(common.PHASES.find((p: { name: string }) => p.name === 'preflight').endS).toBeLessThanOrEqual(45);
    expect(common.PHASES.find((p: { name: string }) => p.name === 'correctness').endS - 45).toBeLessThanOrEqual(240);
    expect(common.BUDGET_S).toBeLessThanOrEqual(560);
    expect(common.PHASES.at(-1).endS).toBe(common.BUDGET_S);
  });
});

describe.skipIf(nt.cuda.isAvailable())('scripts/gpu/run.mjs without a GPU', () => {
  it('runs every step into $OUT as two files, each step skipped with "no GPU: <reason>", exit 0, the table last', () => {
    const { code, output, results, steps, files } = runPlan('skip', []);
    expect(code, output).toBe(0);
    expect(files).toEqual(['results.json', 'run.log']);
    expect(steps.map((s) => s.step).slice(0, 3)).toEqual(['preflight', 'nccl', 'gemm']);
    expect(steps.length).toBeGreaterThanOrEqual(15);
    for (const s of steps) {
      expect(s.status, s.step).toBe('skipped');
      expect(s.reason).toMatch(/^no GPU: \S/);
      expect(s.exitCode).toBe(0);
      expect(s.checksPassed).toBe(0);
    }
    expect(results.checks).toEqual([]);
    expect(results.commit).toMatch(/^[0-9a-f]{7,}(-dirty)?$|^unknown$/);
    expect(readFileSync(join(work, 'skip', 'run.log'), 'utf8')).toMatch(/== .* step sanitizer/);
    // The summary is the output's tail: a reply that shows only the last lines still has it.
    const tail = output.trimEnd().split('\n').slice(-25).join('\n');
    expect(tail).toMatch(/^preflight\s+skipped/m);
    expect(tail).toMatch(/^sanitizer\s+skipped/m);
    expect(tail).toMatch(/0 checks passed, 0 failed/);
  }, 180_000);

  it('kills a hanging step at its limit, records a crashing one, and the next steps still run', () => {
    const { code, results, steps } = runPlan('isolation', ['--only', 'nccl,gemm,ops-f32'], { NODETRON_GPU_RUN_SIMULATE: 'nccl:hang,gemm:crash', NODETRON_GPU_RUN_LIMIT_S: 'nccl:3' });
    expect(code).toBe(1);
    const [hang, crash, next] = steps;
    expect(hang).toMatchObject({ step: 'nccl', status: 'timeout', timedOut: true, limitS: 3 });
    expect(hang!.wallS).toBeLessThan(30);
    expect(crash).toMatchObject({ step: 'gemm', status: 'crashed', signal: 'SIGSEGV' });
    expect(next).toMatchObject({ step: 'ops-f32', status: 'skipped' });
    // What a step recorded before it hung or crashed is kept.
    expect(results.checks.filter((c: { step: string }) => c.step === 'nccl')).toHaveLength(1);
    expect(results.checks.filter((c: { step: string }) => c.step === 'gemm')).toHaveLength(1);
  }, 180_000);

  it('keeps to the budget: a hanging step is cut at its phase end, and a step with no time left is not run', () => {
    const t0 = Date.now();
    const { code, steps } = runPlan('budget', ['--budget', '12', '--only', 'nccl,gemm-perf'], { NODETRON_GPU_RUN_SIMULATE: 'nccl:hang' });
    expect(code).toBe(1);
    // Correctness ends at 285/540 of the budget (6.3 s of 12); gemm-perf needs 20 s and gets none.
    expect(steps[0]).toMatchObject({ step: 'nccl', status: 'timeout' });
    expect(steps[0]!.limitS).toBeLessThan(6.6);
    expect(steps[1]).toMatchObject({ step: 'gemm-perf', status: 'not run' });
    expect(steps[1]!.reason).toMatch(/no time left/);
    expect(Date.now() - t0).toBeLessThan(120_000);
  }, 180_000);

  it('the dry run checks the device-neutral part with cpu as the device; a failing check fails the run', () => {
    const dry = runPlan('dry', ['--only', 'kernels,memory,gpt2-step'], { NODETRON_GPU_RUN_DRY: '1' });
    expect(dry.code, dry.output).toBe(0);
    expect(dry.steps[0]).toMatchObject({ step: 'kernels', status: 'passed' });
    expect(dry.steps[0]!.checksPassed).toBeGreaterThan(10);
    expect(dry.steps[1]).toMatchObject({ step: 'memory', status: 'skipped' });   // device-only sections
    // The GPT-2 step's code runs on a tiny GPT: 20 losses recorded, a throughput row with its parameter count.
    expect(dry.steps[2]).toMatchObject({ step: 'gpt2-step', status: 'passed' });
    expect(dry.results.info['gpt2-step'].gpt2Losses).toHaveLength(20);
    const row = dry.results.bench.find((b: { step: string }) => b.step === 'gpt2-step');
    expect(row.value).toBeGreaterThan(0);
    expect(row.params).toBe(136960);
    const failing = runPlan('fail', ['--only', 'ops-f16'], { NODETRON_GPU_RUN_SIMULATE: 'ops-f16:fail' });
    expect(failing.code).toBe(1);
    expect(failing.steps[0]).toMatchObject({ step: 'ops-f16', status: 'failed' });
    expect(failing.output).toMatch(/FAIL simulated failing check/);
  }, 180_000);

  it('a later command adds its steps to the same results; an unknown step or argument is refused', () => {
    runPlan('merge', ['--only', 'preflight']);
    const { steps } = runPlan('merge', ['--only', 'dispatch']);
    expect(steps.map((s) => s.step)).toEqual(['preflight', 'dispatch']);
    for (const args of [['--only', 'nope'], ['--stage', '1'], ['--budget', '-3']]) {
      const bad = spawnSync(process.execPath, [join(root, 'scripts', 'gpu', 'run.mjs'), ...args, '--out', join(work, 'bad')], { encoding: 'utf8' });
      expect(bad.status, args.join(' ')).toBe(2);
    }
  }, 180_000);
});
