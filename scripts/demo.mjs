#!/usr/bin/env node
// `npm run demo`: brings the machine up (scripts/setup.mjs), then trains the example GPT on Moby-Dick
// as two data-parallel processes under `nodetron launch` (a few minutes on two CPU cores).
// Extra arguments go to the example: npm run demo -- --steps 50; a layout flag replaces the default
// one (-- --pp 2 --micro-batches 4 for a two-stage pipeline, -- --dp 1 for a single process).
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const step = (args) => spawnSync(process.execPath, args, { stdio: 'inherit', cwd: root }).status ?? 1;

// Layouts run under `nodetron launch` with tp·pp·dp processes; without a layout flag, data parallel over 2.
const given = process.argv.slice(2);
const layoutFlags = ['--tp', '--pp', '--dp'];
const args = given.some((a) => layoutFlags.includes(a)) ? given : ['--dp', '2', ...given];
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
