#!/usr/bin/env node
// What `npm install nodetron` runs. In a user's project: nothing, when the prebuilt binaries for this
// platform load (prebuilds/, through node-gyp-build); otherwise, or with
// `npm install --build-from-source`, a source build through cmake-js and the same CMakeLists.txt,
// with the build tools found wherever npm put them and each missing tool named. It never runs apt,
// pip or anything else over the network. In a checkout of the repository it runs the developer
// set-up instead (scripts/setup.mjs). NODETRON_CUDA=0 builds the cpu backend only.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const log = (m) => console.error(`[nodetron install] ${m}`);
const requireHere = createRequire(join(root, 'package.json'));

if (existsSync(join(root, '.git'))) {
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'setup.mjs')], { stdio: 'inherit', cwd: root });
  process.exit(r.status ?? 1);
}

const fromSource = ['true', '1'].includes(process.env.npm_config_build_from_source ?? 'no') ||
  process.env.NODETRON_BUILD_FROM_SOURCE === '1';

/** Why the prebuilt addon for this machine cannot be used (null when it loads). */
function prebuiltProblem() {
  try {
    const load = requireHere('node-gyp-build');
    const path = load.path(root);
    requireHere(path);
    return null;
  } catch (e) {
    return String(e.message ?? e).split('\n')[0];
  }
}

function has(cmd) {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

function sourceBuild(why) {
  log(`building from source: ${why}`);
  const missing = [];
  if (!has('cmake')) missing.push('cmake');
  if (!has('c++') && !has('g++') && !has('clang++')) missing.push('a C++17 compiler (g++)');
  if (missing.length) {
    log(`cannot build: ${missing.join(' and ')} not found. On Debian/Ubuntu: sudo apt-get install cmake g++ libopenblas-dev libgloo-dev`);
    process.exit(1);
  }
  let cmakeJs;
  try {
    cmakeJs = requireHere.resolve('cmake-js/bin/cmake-js');
  } catch {
    log('cannot build: the cmake-js package was not installed beside nodetron (it is a dependency: reinstall without --omit)');
    process.exit(1);
  }
  const jobs = process.env.CMAKE_BUILD_PARALLEL_LEVEL ?? String(Math.max(2, availableParallelism()));
  const r = spawnSync(process.execPath, [cmakeJs, 'compile', '--out', 'build', '--CDNT_TESTING=OFF'], {
    stdio: 'inherit', cwd: root, env: { ...process.env, CMAKE_BUILD_PARALLEL_LEVEL: jobs },
  });
  if (r.status !== 0) {
    log('the source build failed (see above). It needs cmake, a C++17 compiler, OpenBLAS (cblas.h) and Gloo: ' +
      'sudo apt-get install cmake g++ libopenblas-dev libgloo-dev');
    process.exit(1);
  }
  const problem = prebuiltProblem();
  if (problem) {
    log(`the freshly built addon does not load: ${problem}`);
    process.exit(1);
  }
  log('built build/Release/nodetron.node');
}

if (fromSource) {
  sourceBuild('--build-from-source was given');
} else {
  const problem = prebuiltProblem();
  if (problem) sourceBuild(`no usable prebuilt binary for ${process.platform}-${process.arch} (${problem})`);
}
