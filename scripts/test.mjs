#!/usr/bin/env node
// The README's test command: sets the machine up, runs every vitest suite, and ends with the line
// `N passed, N failed, N skipped` that CI reads. Extra arguments go to vitest (e.g. a file filter).
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
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
const report = join(root, 'build', 'test-report.json');
const vitest = join(root, 'node_modules', 'vitest', 'vitest.mjs');
const r = spawnSync(process.execPath, [vitest, 'run', '--reporter=default', '--reporter=json', `--outputFile.json=${report}`, ...process.argv.slice(2)], {
  stdio: 'inherit',
  cwd: root,
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
console.log(`${passed} passed, ${failed} failed, ${skipped} skipped`);
process.exit(failed > 0 ? 1 : r.status ?? 1);
