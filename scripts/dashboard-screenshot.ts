// Regenerates docs/dashboard.png: trains a small GPT (4 layers, width 128, context 128, vocabulary
// 256, on a synthetic token shard: test/fixtures/launch/train-metrics.ts through nt.train.setup) with
// 4 data-parallel ranks on cpu, rank 2 made 30% slower (NODETRON_DEBUG_SLOW_RANK=2), recording with
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
const code = await launch(['--nproc-per-node', '4', join(root, 'test', 'fixtures', 'launch', 'train-metrics.ts'), '--steps', steps,
  '--layers', '4', '--width', '128', '--ctx', '128', '--data', join(dir, 'data')]);
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
