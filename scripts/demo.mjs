#!/usr/bin/env node
// `npm run demo`: brings the machine up (scripts/setup.mjs), then trains the example GPT on Moby-Dick.
// Extra arguments go to the example: npm run demo -- --steps 50 (or -- --dp 2 --zero 1 for two processes)
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const step = (args) => spawnSync(process.execPath, args, { stdio: 'inherit', cwd: root }).status ?? 1;

// Parallel layouts (-- --dp 2 --zero 1) run under `nodetron launch` with tp·pp·dp processes.
const args = process.argv.slice(2);
const flag = (name) => { const i = args.indexOf(`--${name}`); return i >= 0 ? Number(args[i + 1]) : 1; };
const nproc = flag('tp') * flag('pp') * flag('dp');
const example = join(root, 'examples', 'gpt', 'train.ts');

let code = step([join(root, 'scripts', 'setup.mjs')]);
if (code === 0) {
  code = nproc > 1
    ? step([join(root, 'bin', 'nodetron.js'), 'launch', '--nproc-per-node', String(nproc), example, ...args])
    : step([join(root, 'node_modules', 'tsx', 'dist', 'cli.mjs'), example, ...args]);
}
process.exitCode = code;
