#!/usr/bin/env node
// binding.gyp's one action: node-gyp (and tools that expect a binding.gyp) build nodetron through the
// one build description, CMakeLists.txt, with cmake-js into build/cmake, and the addons are copied to
// build/Release where node-gyp-build looks. There is no second list of sources.
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, readdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cmakeJs = createRequire(join(root, 'package.json')).resolve('cmake-js/bin/cmake-js');
const debug = process.argv.includes('--debug');
const r = spawnSync(process.execPath, [cmakeJs, 'compile', '--out', join('build', 'cmake'), ...(debug ? ['--debug'] : [])], { stdio: 'inherit', cwd: root });
if (r.status !== 0) process.exit(r.status ?? 1);
const config = debug ? 'Debug' : 'Release';
const from = join(root, 'build', 'cmake', config), to = join(root, 'build', config);
mkdirSync(to, { recursive: true });
for (const f of readdirSync(from).filter((n) => n.endsWith('.node'))) copyFileSync(join(from, f), join(to, f));
