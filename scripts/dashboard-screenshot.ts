// Regenerates docs/dashboard.png: trains the GPT example (examples/gpt/train.ts, Moby-Dick) with 4
// data-parallel ranks on cpu, rank 2 made 30% slower (NODETRON_DEBUG_SLOW_RANK=2), recording with
// NODETRON_TRACE; then serves `nodetron dashboard` over the directory and has headless chromium
// (Debian's `chromium` package) take the screenshot.
// Run: npx tsx scripts/dashboard-screenshot.ts [--steps N (30)] [--out FILE (docs/dashboard.png)] [--dir DIR (a temporary one)]
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { startDashboard } from '../lib/cli/dashboard.js';
import { main as launch } from '../lib/launch/cli.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const arg = (name: string, fallback: string) => { const i = process.argv.indexOf(name); return i >= 0 && process.argv[i + 1] ? process.argv[i + 1]! : fallback; };
const steps = arg('--steps', '30'), out = resolve(arg('--out', join(root, 'docs', 'dashboard.png')));
const keep = process.argv.includes('--dir');
const dir = resolve(arg('--dir', mkdtempSync(join(tmpdir(), 'nodetron-dashboard-'))));

// One BLAS thread per rank (4 ranks share the machine's cores); rank 2 computes 30% longer.
Object.assign(process.env, { NODETRON_TRACE: dir, NODETRON_DEBUG_SLOW_RANK: '2', OPENBLAS_NUM_THREADS: '1' });
const code = await launch(['--nproc-per-node', '4', join(root, 'examples', 'gpt', 'train.ts'), '--steps', steps, '--progress-every', '10', '--generate', '0']);
if (code !== 0) process.exit(code);
const server = await startDashboard(dir, { port: 0 });
try {
  await promisify(execFile)('chromium', ['--headless', '--no-sandbox', '--disable-gpu', '--hide-scrollbars', `--user-data-dir=${join(dir, '.chromium')}`,
    '--window-size=1280,900', `--screenshot=${out}`, server.url], { timeout: 120_000 });
  console.log(`${out}: the dashboard of ${dir}`);
} finally {
  await server.close();
  if (!keep) rmSync(dir, { recursive: true, force: true });
}
