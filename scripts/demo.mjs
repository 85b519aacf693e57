#!/usr/bin/env node
// `npm run demo`: brings the machine up (scripts/setup.mjs), then trains the example GPT on Moby-Dick in
// one process for a fixed time budget, and ends with the loss curve (in the terminal, and as loss.svg in
// runs/demo-<time>/), the validation loss beside the unigram level, and a generated sample.
// Extra arguments go to the example and override the settings below (npm run demo -- --time-budget 60,
// -- --steps 300 for a fixed number of steps instead); a layout flag runs the layout under
// `nodetron launch` (-- --dp 2, -- --pp 2 --micro-batches 4).
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');

// The demo's settings, all in one place. Sized for a 2-core CPU: training (validations included) stops
// at the time budget, so a slower machine still ends on time with fewer steps, and the whole demo
// (model set-up, final validation, sampling, plots) ends within 4 minutes once the machine is set up.
// One process with both cores beats two data-parallel processes of one core each on 2 cores. A faster
// step raises the steps done within the budget by itself.
const DEMO_SETTINGS = {
  layers: 4, heads: 4, width: 128, // 0.8M parameters in the blocks, 6.4M in the (tied) GPT-2 token table
  ctx: 128, batch: 8, // 1024 tokens per step
  lr: 3e-3, warmup: 20, // peak learning rate, cosine to lr/10 over the steps the budget allows
  'time-budget': 210, // seconds of training, validations included (about 10 s more for set-up, sampling and plots)
  'eval-interval': 25, 'eval-batches': 8, // a validation loss every 25 steps, on 8 × 1024 tokens
  'progress-every': 25,
  generate: 80, temperature: 0.7, 'top-k': 20, // the sample at the end
};

const given = process.argv.slice(2);
const flagValue = (name) => { const i = given.indexOf(`--${name}`); return i >= 0 ? given[i + 1] : undefined; };
const settings = { ...DEMO_SETTINGS };
// --steps without --time-budget: a fixed number of steps instead of the budget.
if (flagValue('steps') !== undefined && flagValue('time-budget') === undefined) delete settings['time-budget'];
const defaults = Object.entries(settings).filter(([k]) => !given.includes(`--${k}`)).flatMap(([k, v]) => [`--${k}`, String(v)]);
const stamp = new Date().toISOString().slice(0, 19).replace(/:/g, '-');
const out = given.includes('--out') ? [] : ['--out', join('runs', `demo-${stamp}`)];
const args = [...defaults, ...out, ...given];

const layoutFlag = (name) => Number(flagValue(name) ?? 1);
const nproc = layoutFlag('tp') * layoutFlag('pp') * layoutFlag('dp');
const example = join(root, 'examples', 'gpt', 'train.ts');
const step = (cmd) => spawnSync(process.execPath, cmd, { stdio: 'inherit', cwd: root }).status ?? 1;

const t0 = performance.now();
let code = step([join(root, 'scripts', 'setup.mjs')]);
const t1 = performance.now();
if (code === 0) {
  code = nproc > 1
    ? step([join(root, 'bin', 'nodetron.js'), 'launch', '--nproc-per-node', String(nproc), example, ...args])
    : step([join(root, 'node_modules', 'tsx', 'dist', 'cli.mjs'), example, ...args]);
  const t2 = performance.now();
  console.log(`demo: set-up ${((t1 - t0) / 1000).toFixed(1)} s, training run ${((t2 - t1) / 1000).toFixed(1)} s (start to sample), ${((t2 - t0) / 1000).toFixed(1)} s in all`);
}
process.exitCode = code;
