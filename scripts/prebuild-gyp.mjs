#!/usr/bin/env node
// Stands in for node-gyp when prebuildify runs (`npm run prebuild`): the one build description is
// CMakeLists.txt, so "node-gyp rebuild" becomes a cmake-js build into build/Release.
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const cmakeJs = require.resolve('cmake-js/bin/cmake-js');
const debug = process.argv.includes('--debug');
const r = spawnSync(process.execPath, [cmakeJs, 'rebuild', '--out', 'build', ...(debug ? ['--debug'] : [])], { stdio: 'inherit' });
process.exit(r.status ?? 1);
