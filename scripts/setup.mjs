#!/usr/bin/env node
// Brings a machine to the point where nodetron runs: Debian packages (apt when root, else the exact
// line to run), the CUDA wheels for the cuda backend (pip, where nvcc and pip are present), npm
// packages, the native build (cmake-js), the TypeScript build, the prebuilt binaries `npm pack`
// ships (scripts/prebuild.mjs) and the example's token shards it ships beside them. Each step is skipped when done.
//   node scripts/setup.mjs [--force] [--release]   (in a checkout of the repository; scripts/install.mjs
//                                         is what `npm install nodetron` runs in a user's project)
// The cuda backend's architectures: a first build compiles NODETRON_CUDA_ARCHS when it is set (CMake's
// syntax, ';' or ',' between entries; the test set-up sets it, see scripts/test.mjs), else the release
// set (Ampere and Hopper SASS, Hopper PTX). Later runs keep the build's set unless NODETRON_CUDA_ARCHS
// names an architecture it lacks; --force rebuilds for NODETRON_CUDA_ARCHS or the release set, and
// --release (what `npm pack` runs first) for the release set whatever the environment says.
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { aptInstall, dpkgInstalled, has, newest, root, run } from './sys.mjs';

const force = process.argv.includes('--force');
const normArchs = (a) => a.split(/[;,\s]+/).filter(Boolean).join(';');
// The release set, as CMakeLists.txt defines it (NT_CUDA_RELEASE_ARCHS): one definition for both.
const releaseMatch = /set\(NT_CUDA_RELEASE_ARCHS "([^"]+)"\)/.exec(readFileSync(join(root, 'CMakeLists.txt'), 'utf8'));
if (!releaseMatch) throw new Error('CMakeLists.txt no longer sets NT_CUDA_RELEASE_ARCHS, which scripts/setup.mjs reads');
const RELEASE_CUDA_ARCHS = normArchs(releaseMatch[1]);
const release = process.argv.includes('--release');
const log = (m) => console.error(`[nodetron setup] ${m}`);
// --release: the release set whatever NODETRON_CUDA_ARCHS says (a package never ships fewer); else
// NODETRON_CUDA_ARCHS; else, with --force, the release set; else whatever the build already has.
const envArchs = process.env.NODETRON_CUDA_ARCHS ? normArchs(process.env.NODETRON_CUDA_ARCHS) : null;
if (release && envArchs && envArchs !== RELEASE_CUDA_ARCHS) log(`--release: the cuda addon is built for ${RELEASE_CUDA_ARCHS}, not NODETRON_CUDA_ARCHS=${envArchs}`);
const wantedCudaArchs = release ? RELEASE_CUDA_ARCHS : envArchs ?? (force ? RELEASE_CUDA_ARCHS : null);
// --release and --force want exactly that set; otherwise a build that has every wanted architecture
// (a release build, when the tests want one) is kept rather than recompiled.
const exactArchs = release || force;

// 1. System packages ------------------------------------------------------------------------------
function systemPackages() {
  const need = ['cmake', 'g++', 'libopenblas-dev', 'libgloo-dev'];
  if (!has('dpkg-query')) {
    log('not a Debian-like system: make sure cmake, a C++17 compiler, OpenBLAS (cblas.h) and Gloo are installed');
    return;
  }
  // redis-server backs the optional Redis rendezvous store; its tests run where it is installed.
  const optional = ['redis-server'];
  const isRoot = process.getuid?.() === 0 && has('apt-get');
  const missing = need.filter((p) => !dpkgInstalled(p));
  if (isRoot) missing.push(...optional.filter((p) => !dpkgInstalled(p) && !has(p)));
  if (!missing.length) return;
  const line = `apt-get install -y ${missing.join(' ')}`;
  if (isRoot) {
    log(`installing ${missing.join(', ')} with apt`);
    if (!aptInstall(missing)) throw new Error(`apt could not install ${missing.join(' ')}; run: sudo ${line}`);
  } else {
    throw new Error(`missing system packages: ${missing.join(', ')}. Run: sudo apt-get update && sudo ${line}`);
  }
}

// 2. CUDA wheels (headers and libraries of cuBLASLt and NCCL) -----------------------------------
function cudaWheels() {
  const nvcc = has('nvcc') || existsSync('/usr/local/cuda/bin/nvcc');
  if (!nvcc) { log('no nvcc: the cuda backend will not be built (install the CUDA toolkit to build it)'); return; }
  if (!has('python3')) { log('no python3/pip: install nvidia-cublas and nvidia-nccl-cu13 or set CUDA_HOME/NCCL_HOME for the cuda backend'); return; }
  const probe = spawnSync('python3', ['-c', [
    'import nvidia, os',
    'ds=[os.path.join(p,d,"include") for p in nvidia.__path__ for d in os.listdir(p)]',
    'ok=[any(os.path.exists(os.path.join(d,h)) for d in ds) for h in ("cublasLt.h","nccl.h")]',
    'raise SystemExit(0 if all(ok) else 1)',
  ].join('\n')], { stdio: 'ignore' });
  if (probe.status === 0) return;
  log('installing the CUDA wheels nvidia-cublas and nvidia-nccl-cu13 with pip (headers and libraries for the cuda backend)');
  // Local wheels (pip's find-links) first, without touching the network; then the index, once, briefly.
  const wheels = ['nvidia-cublas', 'nvidia-nccl-cu13'];
  if (!run('python3', ['-m', 'pip', 'install', '--quiet', '--no-index', ...wheels], { stdio: ['ignore', 'ignore', 'ignore'] }) &&
    !run('python3', ['-m', 'pip', 'install', '--quiet', '--retries', '0', '--timeout', '15', ...wheels])) {
    log('pip could not install the CUDA wheels: the cuda backend will not be built');
  }
}

// 3. npm packages ---------------------------------------------------------------------------------
function npmPackages() {
  if (existsSync(join(root, 'node_modules', 'cmake-js')) && existsSync(join(root, 'node_modules', 'vitest'))) return;
  if (process.env.npm_lifecycle_event === 'install') return; // npm is installing them right now
  log('installing npm packages');
  if (!run('npm', ['install', '--ignore-scripts', '--no-audit', '--no-fund'])) throw new Error('npm install failed');
}

// 4. Native addons --------------------------------------------------------------------------------
/** The CUDA architectures of the cuda addon in build/ (from build/cuda-status.txt), or null when none was built. */
function builtCudaArchs() {
  const status = join(root, 'build', 'cuda-status.txt');
  if (!existsSync(status)) return null;
  const text = readFileSync(status, 'utf8');
  if (!text.startsWith('built')) return null;
  const m = /archs ([^,]+),/.exec(text);
  return m ? normArchs(m[1]) : RELEASE_CUDA_ARCHS; // builds from before the record had the release set
}

function nativeBuild() {
  // When the last build succeeded (ninja relinks nothing when an edit changes no object, so the addons' own times can stay older than the sources).
  const stamp = join(root, 'build', 'setup-built.stamp');
  const built = existsSync(stamp) && existsSync(join(root, 'build', 'Release', 'nodetron.node')) ? statSync(stamp).mtimeMs : 0;
  const sources = newest(['native', 'CMakeLists.txt']);
  const archs = builtCudaArchs();
  const otherArchs = wantedCudaArchs !== null && archs !== null
    && (exactArchs ? archs !== wantedCudaArchs : !wantedCudaArchs.split(';').every((a) => archs.split(';').includes(a)));
  if (!force && !otherArchs && built > sources && existsSync(join(root, 'build', 'cuda-status.txt'))) return;
  log(otherArchs ? `building the native addons (cmake-js), the cuda addon for ${wantedCudaArchs} instead of ${archs}` : 'building the native addons (cmake-js)');
  const cmakeJs = createRequire(join(root, 'package.json')).resolve('cmake-js/bin/cmake-js');
  // Ninja's own default, cores + 2: a compile waiting on the disk leaves no core idle, and on a machine
  // that is busy with other work the build keeps its share (two jobs beside two busy loops got half the cores).
  const jobs = process.env.CMAKE_BUILD_PARALLEL_LEVEL ?? String(availableParallelism() + 2);
  const env = { ...process.env, CMAKE_BUILD_PARALLEL_LEVEL: jobs };
  const defs = wantedCudaArchs ? [`--CDNT_CUDA_ARCHS=${wantedCudaArchs}`] : [];
  // cmake-js compile configures only a build folder without a CMake cache: a new architecture list
  // needs its own configure (ninja then recompiles only the cuda objects).
  if (otherArchs && existsSync(join(root, 'build', 'CMakeCache.txt')) && !run(process.execPath, [cmakeJs, 'configure', '--out', 'build', ...defs], { env })) {
    throw new Error('configuring the native build failed (see the output above)');
  }
  if (!run(process.execPath, [cmakeJs, 'compile', '--out', 'build', ...defs], { env })) {
    throw new Error('the native build failed (see the compiler output above)');
  }
  writeFileSync(stamp, `${new Date().toISOString()}\n`);
}

// 4b. The linux-arm64 cpu addon, cross-built for what `npm pack` ships (--release on x64 only) -----
// scripts/arm64/build.mjs installs the cross toolchain with apt when root, else fails naming the apt
// line. NODETRON_ARM64=0 packs without it (linux-x64 only), with a warning.
const packArm64 = release && process.platform === 'linux' && process.arch === 'x64';
function arm64Build() {
  if (!packArm64) return false;
  if (process.env.NODETRON_ARM64 === '0') {
    log('WARNING: NODETRON_ARM64=0: the package will have NO linux-arm64 binary (arm64 users build from source)');
    return false;
  }
  log('cross-building the linux-arm64 cpu addon (scripts/arm64/build.mjs, into build-arm64/)');
  if (!run(process.execPath, [join(root, 'scripts', 'arm64', 'build.mjs')])) {
    throw new Error('the linux-arm64 cross build failed (see above); NODETRON_ARM64=0 packs linux-x64 only');
  }
  return true;
}

// 6. Prebuilt binaries: what `npm pack` ships (scripts/prebuild.mjs; copies, no second build) -----
function prebuilds(arm64) {
  const out = join(root, 'prebuilds', `${process.platform}-${process.arch}`, 'nodetron.napi.node');
  const addons = ['nodetron.node', 'nodetron_cuda.node'].map((a) => join(root, 'build', 'Release', a)).filter(existsSync);
  if (!force && !release && existsSync(out) && addons.every((a) => statSync(out).mtimeMs >= statSync(a).mtimeMs)) return;
  log('collecting the prebuilt binaries (scripts/prebuild.mjs)');
  if (!run(process.execPath, [join(root, 'scripts', 'prebuild.mjs'), ...(arm64 ? ['--arm64'] : [])])) throw new Error('collecting the prebuilt binaries failed');
}

// 7. The example's token shards: what `npm pack` ships beside examples/gpt/train.ts, so the example (and
// the launch commands `nodetron plan` prints) trains in a user's project without the 20 MB corpus package.
function exampleShards() {
  const dir = join(root, 'examples', 'gpt', 'shards');
  if (!force && existsSync(join(dir, 'mobydick1_train_000001.bin')) && existsSync(join(dir, 'mobydick1_val_000000.bin'))) return;
  // The corpus is a devDependency: present in a checkout, absent where the package was installed.
  if (!existsSync(join(root, 'node_modules', '@stdlib', 'datasets-moby-dick'))) return;
  log('tokenizing the example\'s corpus into examples/gpt/shards (shipped by npm pack)');
  const tsx = createRequire(join(root, 'package.json')).resolve('tsx');
  if (!run(process.execPath, ['--import', pathToFileURL(tsx).href, join(root, 'examples', 'gpt', 'data.ts'), '--ship'])) throw new Error('tokenizing the example\'s corpus failed');
}

// 5. TypeScript -----------------------------------------------------------------------------------
// Started before the native build and awaited after it: tsc (one thread) runs beside the compiler
// jobs, on the core the native build's last long compile leaves free.
function typescriptBuild() {
  const out = join(root, 'dist', 'index.js');
  const built = existsSync(out) ? statSync(out).mtimeMs : 0;
  if (!force && built > newest(['lib', 'tsconfig.json'])) return Promise.resolve();
  log('compiling TypeScript (lib -> dist)');
  const tsc = join(root, 'node_modules', 'typescript', 'bin', 'tsc');
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [tsc, '-p', 'tsconfig.json'], { stdio: 'inherit', cwd: root });
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error('the TypeScript build failed'))));
  });
}

try {
  systemPackages();
  cudaWheels();
  npmPackages();
  const ts = typescriptBuild();
  // A native build failure is reported after tsc has finished (its output would interleave otherwise).
  let nativeError;
  try { nativeBuild(); } catch (e) { nativeError = e; }
  await ts;
  if (nativeError) throw nativeError;
  prebuilds(arm64Build());
  exampleShards();
} catch (e) {
  log(`error: ${e.message}`);
  process.exit(1);
}
