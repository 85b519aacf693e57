#!/usr/bin/env node
// `npm run demo`: brings the machine up (scripts/setup.mjs), then trains the example GPT on Moby-Dick.
// Extra arguments go to the example: npm run demo -- --steps 50
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const step = (args) => spawnSync(process.execPath, args, { stdio: 'inherit', cwd: root }).status ?? 1;

let code = step([join(root, 'scripts', 'setup.mjs')]);
if (code === 0) code = step([join(root, 'node_modules', 'tsx', 'dist', 'cli.mjs'), join(root, 'examples', 'gpt', 'train.ts'), ...process.argv.slice(2)]);
process.exitCode = code;
