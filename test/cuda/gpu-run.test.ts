// scripts/gpu/run.mjs, the device run in one command: without a GPU every step records "skipped" with
// the reason (exit 0, never "passed"); each step is its own process with its own limit, so a step that
// hangs is killed at its limit, one that crashes is recorded, and the next step still runs; results go
// to $OUT as two files (results.json rewritten after every step, run.log), within the phase budget.
// The dry run (NODETRON_GPU_RUN_DRY=1) runs every device-only block's JavaScript against the cpu backend
// (scripts/gpu/stages/dry.mjs's stand-ins), so a bug in a block that only a GPU would reach shows here.
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

interface Step { step: string; status: string; reason?: string; exitCode: number | null; checksPassed: number; checksFailed: number; timedOut?: boolean; limitS: number; wallS: number; signal?: string | null; variant?: string; env?: Record<string, string> }

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
    // The first command leaves ~5 minutes of the 15 for the second (docs/gpu.md).
    expect(common.BUDGET_S).toBeLessThanOrEqual(440);
    expect(common.PHASES.at(-1).endS).toBe(common.BUDGET_S);
    // Each phase's steps' limits fit their phase in the first command (the second command's steps aside).
    let start = 0;
    for (const p of common.PHASES) {
      const limits = common.PLAN.filter((s: { phase: string; second?: boolean }) => s.phase === p.name && !s.second).reduce((t: number, s: { limitS: number }) => t + s.limitS, 0);
      expect(limits, p.name).toBeLessThanOrEqual(p.endS - start);
      start = p.endS;
    }
    // Every variant a step names exists, and a graph capture is never run synchronized.
    for (const s of common.PLAN) {
      for (const v of [...(s.variants ?? []), ...(s.retry ? [s.retry] : [])]) if (v) expect(() => common.parseSelector(`${s.id}@${v}`), `${s.id}@${v}`).not.toThrow();
    }
    expect(common.PLAN.find((s: { id: string }) => s.id === 'gpt2-graph').variants.join()).not.toMatch(/sync/);
  });

  it('the second command: failed steps with their variants, then the steps without time, then the second command\'s', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const rec = (step: string, status: string, reason?: string) => ({ step, status, reason });
    const second = common.secondCommand([
      rec('preflight', 'passed'), rec('nccl', 'timeout'), rec('gemm', 'failed'), rec('ops-bf16', 'crashed'), rec('kernels', 'passed'),
      rec('gpt2-step', 'failed'), rec('gpt2-step@simt', 'passed'), rec('gpt2-torch-eager', 'failed'), rec('gemm-perf', 'crashed'), rec('dispatch', 'not run'),
    ], 420);
    expect(second.only).toEqual(['nccl@nosync', 'gemm@noepi', 'ops-bf16@simt', 'ops-bf16@noepi', 'gpt2-torch-eager', 'gemm-perf@sync', 'dispatch', 'gpt2-torch-compile', 'gpt2-step@simt+residual', 'gpt2-step@simt+graph', 'gpt2-step@simt+padvocab', 'gpt2-step@simt+scalar', 'parallel', 'sanitizer']);
    expect(second.line).toBe(`bash scripts/gpu/device.sh --only ${second.only.join(',')} --budget ${second.budgetS}`);
    // 900 s of device time less start-up, the first command and the transfers: at most what the steps need.
    expect(second.budgetS).toBeLessThanOrEqual(900 - 150 - 420);
    // The GPT-2 step whose SIMT retry failed too gets epilogues off and synchronized launches.
    expect(common.secondCommand([rec('gpt2-step', 'failed'), rec('gpt2-step@simt', 'failed')], 420).only.slice(0, 2)).toEqual(['gpt2-step@simt+noepi', 'gpt2-step@simt+sync']);
    expect(() => common.parseSelector('gemm@fast')).toThrow(/unknown variant fast/);
    // The speed levers run on the GPT-2 step's plain path when it passed plainly, and not at all when it never passed.
    expect(common.secondCommand([rec('gpt2-step', 'passed')], 420).only).toEqual(['gpt2-torch-compile', 'gpt2-step@residual', 'gpt2-step@graph', 'gpt2-step@padvocab', 'gpt2-step@scalar', 'parallel', 'sanitizer']);
    expect(common.parseSelector('gpt2-step@residual').env).toEqual({ NODETRON_LOW_PRECISION_RESIDUAL: '1' });
    expect(common.parseSelector('gpt2-step@padvocab').env).toEqual({ NODETRON_PAD_VOCAB: '64' });
    expect(common.parseSelector('ops-f16@simt+noepi').env).toEqual({ NODETRON_FLASH_SIMT: '1', NODETRON_CUDA_EPILOGUES: '0' });
  });

  it('tensorRelErr (the native comparison) gives relErr\'s verdicts: max error, count past tol, NaN and size mismatch', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const { cpu } = await import('../../lib/native.js');
    const want = Float32Array.from({ length: 1000 }, (_, i) => Math.sin(i) * 10);
    const got = Float32Array.from(want, (v, i) => (i % 100 === 7 ? v + 0.5 : i === 500 ? v + 1e-6 : v));
    for (const tol of [0, 1e-3, 0.1]) {
      const js = common.relErr(got, want, tol);
      const native = common.tensorRelErr(nt, cpu(), nt.tensor(got, [1000]), nt.tensor(want, [10, 100]), tol);
      expect(native.bad, `tol ${tol}`).toBe(js.bad);
      expect(native.maxRelErr).toBeCloseTo(js.maxRelErr, 6);
    }
    expect(common.tensorRelErr(nt, cpu(), nt.tensor(want, [1000]), nt.tensor(want, [1000]), 0)).toEqual({ maxRelErr: 0, bad: 0 });
    const nan = Float32Array.from(want); nan[3] = NaN;
    expect(common.tensorRelErr(nt, cpu(), nt.tensor(nan, [1000]), nt.tensor(want, [1000]), 1).maxRelErr).toBe(Infinity);
    expect(common.tensorRelErr(nt, cpu(), nt.tensor(want.subarray(0, 999), [999]), nt.tensor(want, [1000]), 1).bad).toBeGreaterThan(0);
    // bf16 and i32 operands are compared in f32.
    expect(common.tensorRelErr(nt, cpu(), nt.tensor(want, [1000]).to('bf16'), nt.tensor(want, [1000]), 1e-2).bad).toBe(0);
    expect(common.tensorRelErr(nt, cpu(), nt.tensor(Int32Array.from([1, 2, 3]), [3]), nt.tensor(Int32Array.from([1, 2, 4]), [3]), 0).bad).toBe(1);
  });
});

describe.skipIf(nt.cuda.isAvailable())('scripts/gpu/run.mjs without a GPU', () => {
  it('runs every step into $OUT as two files, each step skipped with "no GPU: <reason>", exit 0, the table and the second command last', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const { code, output, results, steps, files } = runPlan('skip', []);
    expect(code, output).toBe(0);
    expect(files).toEqual(['results.json', 'run.log']);
    // The first command: the plan less the steps it leaves for the second.
    expect(steps.map((s) => s.step)).toEqual(common.PLAN.filter((s: { second?: boolean }) => !s.second).map((s: { id: string }) => s.id));
    expect(steps.length).toBeGreaterThanOrEqual(14);
    for (const s of steps) {
      expect(s.status, s.step).toBe('skipped');
      expect(s.reason).toMatch(/^no GPU: \S/);
      expect(s.exitCode).toBe(0);
      expect(s.checksPassed).toBe(0);
    }
    expect(results.checks).toEqual([]);
    expect(results.commit).toMatch(/^[0-9a-f]{7,}(-dirty)?$|^unknown$/);
    expect(readFileSync(join(work, 'skip', 'run.log'), 'utf8')).toMatch(/== .* step gpt2-graph/);
    // The summary is the output's tail: a reply that shows only the last lines still has it, and the
    // second command (the steps left for it) is its last line, also in results.json.
    const tail = output.trimEnd().split('\n').slice(-25).join('\n');
    expect(tail).toMatch(/^preflight\s+skipped/m);
    expect(tail).toMatch(/^gpt2-graph\s+skipped/m);
    expect(tail).toMatch(/0 checks passed, 0 failed/);
    expect(output.trimEnd().split('\n').at(-1)).toBe(`  ${results.secondCommand.line}`);
    expect(results.secondCommand.only).toEqual(['gpt2-torch-compile', 'parallel', 'sanitizer']);
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

  it('keeps to the budget: a hanging step is cut at its phase end, and a step with no time left is not run', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const t0 = Date.now();
    const others = common.PLAN.filter((s: { id: string; second?: boolean }) => !['nccl', 'gemm-perf'].includes(s.id) && !s.second).map((s: { id: string }) => s.id);
    const { code, steps } = runPlan('budget', ['--budget', '12', '--skip', others.join(',')], { NODETRON_GPU_RUN_SIMULATE: 'nccl:hang' });
    expect(code).toBe(1);
    // Correctness ends at 205/420 of the budget (5.9 s of 12); gemm-perf needs 20 s and gets none.
    const end = (common.PHASES.find((p: { name: string }) => p.name === 'correctness').endS / common.BUDGET_S) * 12;
    expect(steps[0]).toMatchObject({ step: 'nccl', status: 'timeout' });
    expect(steps[0]!.limitS).toBeLessThan(end + 0.1);
    expect(steps[1]).toMatchObject({ step: 'gemm-perf', status: 'not run' });
    expect(steps[1]!.reason).toMatch(/no time left in its phase/);
    // A command that names its steps has no phases: the hang is cut at the budget, not the phase end.
    const named = runPlan('budget-only', ['--budget', '9', '--only', 'nccl'], { NODETRON_GPU_RUN_SIMULATE: 'nccl:hang' });
    expect(named.steps[0]).toMatchObject({ step: 'nccl', status: 'timeout' });
    expect(named.steps[0]!.limitS).toBeGreaterThan(end);
    expect(Date.now() - t0).toBeLessThan(120_000);
  }, 180_000);

  it('the GPT-2 step is retried at once on the SIMT attention kernels when it fails; both outcomes are kept, and the second command has its next variants', () => {
    const { code, steps, results, output } = runPlan('retry', ['--only', 'gpt2-step'], { NODETRON_GPU_RUN_SIMULATE: 'gpt2-step:fail', NODETRON_CUDA_EPILOGUES: '0' });
    expect(code).toBe(1);
    expect(steps.map((s) => [s.step, s.status])).toEqual([['gpt2-step', 'failed'], ['gpt2-step@simt', 'failed']]);
    // Each step records the switches it ran with (NODETRON_CUDA_EPILOGUES passes through to every step).
    expect(steps[0]!.env).toEqual({ NODETRON_CUDA_EPILOGUES: '0' });
    expect(steps[1]).toMatchObject({ variant: 'simt', env: { NODETRON_FLASH_SIMT: '1', NODETRON_CUDA_EPILOGUES: '0' } });
    expect(results.checks.filter((c: { step: string }) => c.step === 'gpt2-step@simt')).toHaveLength(2);
    expect(results.secondCommand.only.slice(0, 2)).toEqual(['gpt2-step@simt+noepi', 'gpt2-step@simt+sync']);
    expect(output).toContain(results.secondCommand.line);
  }, 180_000);

  it('a GPU whose cuda addon does not load: preflight records the load error, ldd and the search path; the PyTorch steps still start', () => {
    const { steps, results } = runPlan('unusable', ['--only', 'preflight,gemm,gpt2-torch-eager'], { NODETRON_GPU_RUN_FAKE_GPU: '1', NODETRON_GPU_RUN_DRY: '' });
    const [pre, gemm, eager] = steps;
    expect(pre).toMatchObject({ step: 'preflight', status: 'failed' });
    expect(pre!.reason).toMatch(/^cuda unusable: /);
    const load = results.info.preflight.cudaLoad;
    expect(load.reason).toBe(pre!.reason);
    expect(load.ldd).toMatch(/\S/);
    expect(load).toHaveProperty('LD_LIBRARY_PATH');
    expect(results.checks.find((c: { name: string }) => c.name === 'the cuda addon loads on this GPU machine')).toMatchObject({ ok: false });
    // nodetron's steps are not started; the torch step is (here it finds no torch, or no GPU, and says so).
    expect(gemm).toMatchObject({ step: 'gemm', status: 'skipped', wallS: 0 });
    expect(gemm!.reason).toMatch(/^cuda unusable: /);
    expect(eager!.step).toBe('gpt2-torch-eager');
    expect(eager!.wallS).toBeGreaterThan(0);
    expect(eager!.status).toBe('failed');
    expect(results.checks.find((c: { step: string }) => c.step === 'gpt2-torch-eager').name).toMatch(/torch eager GPT-2 step ran/);
  }, 180_000);

  it('python children get the machine\'s LD_LIBRARY_PATH back, not the one device.sh set for node', async () => {
    const common = await import(pathToFileURL(join(root, 'scripts', 'gpu', 'common.mjs')).href);
    const saved = { ld: process.env.LD_LIBRARY_PATH, sys: process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH };
    try {
      process.env.LD_LIBRARY_PATH = '/bundle/lib:/wheels/nvidia/cublas/lib:/usr/local/nvidia/lib64';
      process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH = '/usr/local/nvidia/lib64';
      expect(common.pythonEnv().LD_LIBRARY_PATH).toBe('/usr/local/nvidia/lib64');
      process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH = '';
      expect(common.pythonEnv()).not.toHaveProperty('LD_LIBRARY_PATH');
      expect(common.pythonEnv({ TORCHINDUCTOR_COMPILE_THREADS: '16' }).TORCHINDUCTOR_COMPILE_THREADS).toBe('16');
      delete process.env.NODETRON_SYSTEM_LD_LIBRARY_PATH;
      expect(common.pythonEnv().LD_LIBRARY_PATH).toBe(process.env.LD_LIBRARY_PATH);
    } finally {
      for (const [k, v] of [['LD_LIBRARY_PATH', saved.ld], ['NODETRON_SYSTEM_LD_LIBRARY_PATH', saved.sys]] as const) {
        if (v === undefined) delete process.env[k]; else process.env[k] = v;
      }
    }
  });

  it('the dry run checks the device-neutral part with cpu as the device; a failing check fails the run', () => {
    const dry = runPlan('dry', ['--only', 'kernels,gpt2-step'], { NODETRON_GPU_RUN_DRY: '1' });
    expect(dry.code, dry.output).toBe(0);
    expect(dry.steps[0]).toMatchObject({ step: 'kernels', status: 'passed' });
    expect(dry.steps[0]!.checksPassed).toBeGreaterThan(10);
    // The GPT-2 step's code runs on a tiny GPT: 20 losses recorded, a throughput row with its parameter count.
    expect(dry.steps[1]).toMatchObject({ step: 'gpt2-step', status: 'passed' });
    expect(dry.results.info['gpt2-step'].gpt2Losses).toHaveLength(20);
    const row = dry.results.bench.find((b: { step: string }) => b.step === 'gpt2-step');
    expect(row.value).toBeGreaterThan(0);
    expect(row.params).toBe(136960);
    // A step that reports its cpu side's time (the references and comparisons the GPU run does on the host).
    expect(dry.results.info.kernels.cpuSideMs).toBeGreaterThan(0);
    const failing = runPlan('fail', ['--only', 'ops-f16'], { NODETRON_GPU_RUN_SIMULATE: 'ops-f16:fail' });
    expect(failing.code).toBe(1);
    expect(failing.steps[0]).toMatchObject({ step: 'ops-f16', status: 'failed' });
    expect(failing.output).toMatch(/FAIL simulated failing check/);
  }, 180_000);

  // (The parallel step's launches on the cpu are the CPU equivalence tests' fixture, test/parallel; the
  // rehearsal, scripts/gpu/rehearse.sh, runs that step dry too.)
  it('the device-only blocks run on the cpu in the dry run (streams, allocator, OOM, NCCL over Gloo, epilogues, sanitizer subset, benchmarks, graphs)', () => {
    const ids = ['memory', 'nccl', 'gemm', 'sanitizer', 'gemm-perf', 'membw', 'dispatch', 'gpt2-graph'];
    const dry = runPlan('device-blocks', ['--only', ids.join(',')], { NODETRON_GPU_RUN_DRY: '1' });
    expect(dry.code, dry.output).toBe(0);
    // (results.json lists steps in the plan's order; --only ran them in the order given)
    expect(dry.steps.map((s) => [s.step, s.status]).sort()).toEqual(ids.map((id) => [id, 'passed']).sort());
    const names = dry.results.checks.map((c: { name: string }) => c.name).join('\n');
    // The allocator check measures the baseline after its temporaries are gone (it did not: 144 MiB of
    // nt.add results were still held by its own scope).
    for (const n of ['memory returns to the baseline; emptyCache releases', 'event timing positive', 'one allocation of 2x device memory: OutOfMemoryError',
      'gloo allReduce avg bf16 in-place', 'gloo group: wrong out dtype', 'gemm_epilogue bgrad bf16->f32 beta 1', 'gemm_epilogue dgelu+bgrad bf16', 'gemm_epilogue gelu_bias',
      'sanitizer subset runs', 'CUDA graph: GPT-2 replayed gradient 0 = eager']) expect(names).toContain(n);
    expect(names).toMatch(/exhausting memory in 64 MiB tensors: OutOfMemoryError after \d+/);
    const bench = dry.results.bench.map((b: { name: string }) => b.name).join('\n');
    for (const n of ['gemm bf16 256x256x256 NN', 'layernorm_backward bf16', 'dispatch: nt.add through lib/ops']) expect(bench).toContain(n);
  }, 240_000);

  it('a later command adds its steps to the same results; an unknown step or argument is refused', () => {
    runPlan('merge', ['--only', 'preflight']);
    const { steps } = runPlan('merge', ['--only', 'dispatch']);
    expect(steps.map((s) => s.step)).toEqual(['preflight', 'dispatch']);
    for (const args of [['--only', 'nope'], ['--only', 'gemm@fast'], ['--stage', '1'], ['--budget', '-3']]) {
      const bad = spawnSync(process.execPath, [join(root, 'scripts', 'gpu', 'run.mjs'), ...args, '--out', join(work, 'bad')], { encoding: 'utf8' });
      expect(bad.status, args.join(' ')).toBe(2);
    }
  }, 180_000);
});
