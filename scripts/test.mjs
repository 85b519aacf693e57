#!/usr/bin/env node
// The README's test command: sets the machine up, runs every vitest suite, and ends with the line
// `N passed, N failed, N skipped` that CI reads. Extra arguments go to vitest (e.g. a file filter).
// NODETRON_TEST_LOWER_LEVEL=1 (CI sets it) first runs the numerics- and memory-sensitive files at
// the x86-64 levels below this machine's best (see LOWER_LEVEL_FILES); the final line counts every pass.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
// The cuda backend is compiled for this machine's GPUs only, or where there is none for one
// architecture (Hopper): there the build is a compile check, and the kernels have no per-architecture
// code. That halves the CUDA compile; `npm run build` and `npm pack` build the release set.
if (!process.env.NODETRON_CUDA_ARCHS) {
  const smi = spawnSync('nvidia-smi', ['--query-gpu=compute_cap', '--format=csv,noheader'], { encoding: 'utf8' });
  const caps = smi.status === 0 ? [...new Set(smi.stdout.split('\n').map((l) => l.trim().replace('.', '')).filter((c) => /^\d+$/.test(c)))] : [];
  // Only what this nvcc can compile for (an older GPU than its oldest target gets the compile check).
  const nvcc = ['nvcc', '/usr/local/cuda/bin/nvcc'].map((c) => spawnSync(c, ['--list-gpu-arch'], { encoding: 'utf8' })).find((r) => r.status === 0);
  const known = new Set((nvcc?.stdout ?? '').split('\n').map((l) => /^compute_(\d+)$/.exec(l.trim())?.[1]).filter(Boolean));
  const usable = caps.filter((c) => known.has(c));
  process.env.NODETRON_CUDA_ARCHS = usable.length ? usable.map((c) => `${c}-real`).join(';') : '90-real';
}
const setup = spawnSync(process.execPath, [join(root, 'scripts', 'setup.mjs')], { stdio: 'inherit', cwd: root });
if (setup.status !== 0) {
  console.log('0 passed, 1 failed (setup failed)');
  process.exit(1);
}
// The dashboard's test renders its page in Debian's headless chromium. As root on a Debian-like
// system, the test set-up installs it (best effort: without it that one test is skipped, saying so);
// NODETRON_NO_BROWSER=1 leaves it out. `npm run demo` never installs it.
const hasCmd = (c) => spawnSync('sh', ['-c', `command -v ${c}`], { stdio: 'ignore' }).status === 0;
if (!process.env.NODETRON_NO_BROWSER && process.getuid?.() === 0 && hasCmd('apt-get')
    && !['chromium', 'chromium-browser', 'google-chrome'].some(hasCmd)) {
  console.log('[setup] installing chromium with apt (for the dashboard\'s headless-browser test; best effort)');
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const apt = () => spawnSync('apt-get', ['install', '-y', '--no-install-recommends', 'chromium'], { stdio: 'inherit', env }).status === 0;
  if (!apt()) {
    spawnSync('apt-get', ['update'], { stdio: 'inherit', env });
    if (!apt()) console.log('[setup] chromium could not be installed: the headless-browser test will be skipped');
  }
}
mkdirSync(join(root, 'build'), { recursive: true });
const vitest = join(root, 'node_modules', 'vitest', 'vitest.mjs');

/** Runs vitest with `args` and `env` over the process's environment; its counts from the JSON report. */
function runVitest(args, env, report) {
  rmSync(report, { force: true });
  const r = spawnSync(process.execPath, [vitest, 'run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...args], {
    stdio: 'inherit',
    cwd: root,
    env: { ...process.env, ...env },
  });
  let passed = 0, failed = 0, skipped = 0;
  if (existsSync(report)) {
    const j = JSON.parse(readFileSync(report, 'utf8'));
    passed = j.numPassedTests ?? 0;
    failed = j.numFailedTests ?? 0;
    skipped = (j.numPendingTests ?? 0) + (j.numTodoTests ?? 0);
    // A suite that fails to load has no tests but must still count as a failure.
    const brokenFiles = (j.testResults ?? []).filter((f) => f.status === 'failed' && (f.assertionResults ?? []).length === 0).length;
    failed += brokenFiles;
  } else {
    failed = 1;
  }
  if (r.status !== 0 && failed === 0) failed = 1;
  return { passed, failed, skipped, status: r.status ?? 1 };
}

// The files whose results depend on the kernels' arithmetic or on the bf16 GEMM path's memory: GEMMs,
// fused and attention kernels, autocast, the equivalence of ZeRO-3 with one process, and the bf16
// memory model's calibration. A machine with AVX-512 runs the AVX-512 and AVX512_BF16 kernels and
// OpenBLAS's SkylakeX ones; users' machines (and the next CI machine) may have AVX2 only, where these
// files met other summation orders and the widening bf16 GEMM (issue #36).
const LOWER_LEVEL_FILES = [
  'test/ops/gemm-bf16.test.ts', 'test/ops/matmul.test.ts', 'test/ops/fused.test.ts', 'test/ops/flash-attention.test.ts',
  'test/ops/linear-cross-entropy.test.ts', 'test/ops/nn-ops.test.ts', 'test/core/matmul.test.ts',
  'test/amp/autocast.test.ts', 'test/nn/gpt-fused-head.test.ts', 'test/nn/train.test.ts', 'test/optim/optimizers.test.ts',
  'test/parallel/zero3.test.ts', 'test/plan/calibration-bf16.test.ts',
];

// Where both lower levels run, baseline leaves these two to avx2: its arithmetic differs again (no FMA),
// but its bf16 GEMM path, and so the memory, is avx2's (calibrated alike at both), and gemm-bf16 checks
// that widening path against float64 whatever the level.
const BASELINE_EXTRA_SKIP = new Set(['test/plan/calibration-bf16.test.ts', 'test/ops/gemm-bf16.test.ts']);

/**
 * The levels below this CPU's best, as /proc/cpuinfo names its features, each with OpenBLAS's kernels
 * for it: below AVX-512 avx2 (Haswell) with every file and baseline (Nehalem) with the arithmetic ones;
 * below AVX2 baseline with every file; none where baseline is already the best. Below avx512 bf16
 * GEMMs widen to f32 (the AVX512_BF16 kernel needs the avx512 level).
 */
function lowerLevels() {
  let flags = new Set();
  try {
    const line = readFileSync('/proc/cpuinfo', 'utf8').split('\n').find((l) => l.startsWith('flags'));
    flags = new Set(line ? line.split(':')[1].trim().split(/\s+/) : []);
  } catch { /* not Linux: no lower pass */ }
  const avx512 = ['avx512f', 'avx512bw', 'avx512vl', 'avx512dq'].every((f) => flags.has(f));
  const avx2 = ['avx2', 'fma', 'bmi2'].every((f) => flags.has(f));
  const all = LOWER_LEVEL_FILES, arithmetic = LOWER_LEVEL_FILES.filter((f) => !BASELINE_EXTRA_SKIP.has(f));
  if (avx512 && avx2) return [{ isa: 'avx2', blas: 'Haswell', files: all }, { isa: 'baseline', blas: 'Nehalem', files: arithmetic }];
  if (avx2) return [{ isa: 'baseline', blas: 'Nehalem', files: all }];
  return [];
}

const totals = { passed: 0, failed: 0, skipped: 0 };
const lowerWanted = process.env.NODETRON_TEST_LOWER_LEVEL;
if (lowerWanted && lowerWanted !== '0') {
  // NODETRON_TEST_LOWER_LEVEL=avx2 or baseline: that level alone, with every file.
  const forced = ['avx2', 'baseline'].includes(lowerWanted) ? [{ isa: lowerWanted, blas: lowerWanted === 'avx2' ? 'Haswell' : 'Nehalem', files: LOWER_LEVEL_FILES }] : null;
  const levels = forced ?? lowerLevels();
  if (levels.length === 0) console.log('[test] lower-level pass skipped: this CPU runs the baseline level already');
  for (const level of levels) {
    const env = { NODETRON_CPU_ISA: level.isa, NODETRON_BF16_GEMM: 'fallback', NODETRON_BLAS_CORETYPE: level.blas };
    console.log(`[test] lower-level pass: ${level.files.length} files at NODETRON_CPU_ISA=${level.isa}, NODETRON_BF16_GEMM=fallback, NODETRON_BLAS_CORETYPE=${level.blas}`);
    const lower = runVitest(level.files, env, join(root, 'build', `test-report-${level.isa}.json`));
    console.log(`[test] lower-level pass (${level.isa}): ${lower.passed} passed, ${lower.failed} failed, ${lower.skipped} skipped`);
    for (const k of ['passed', 'failed', 'skipped']) totals[k] += lower[k];
  }
}
// NODETRON_TEST_ARM64=1 (CI) first runs the Linux arm64 smoke on an x86-64 machine (.ci/arm64-smoke.sh: the
// cross-built addon under qemu-user with an arm64 Node.js: load, GEMM against float64, a 2-rank Gloo
// allreduce, 5 GPT steps against x64's losses). It counts as one test in the final line.
if (process.env.NODETRON_TEST_ARM64 && process.env.NODETRON_TEST_ARM64 !== '0') {
  if (process.arch !== 'x64') {
    console.log(`[test] arm64 smoke skipped: it cross-builds from x86-64 (this is ${process.arch})`);
  } else {
    const smoke = spawnSync('bash', [join(root, '.ci', 'arm64-smoke.sh')], { stdio: 'inherit', cwd: root });
    if (smoke.status === 0) totals.passed += 1; else totals.failed += 1;
    console.log(`[test] arm64 smoke: ${smoke.status === 0 ? 'passed' : 'FAILED'}`);
  }
}
const full = runVitest(process.argv.slice(2), {}, join(root, 'build', 'test-report.json'));
for (const k of ['passed', 'failed', 'skipped']) totals[k] += full[k];
console.log(`${totals.passed} passed, ${totals.failed} failed, ${totals.skipped} skipped`);
process.exit(totals.failed > 0 ? 1 : full.status);
