#!/usr/bin/env node
// Collects the prebuilt binaries that `npm pack` ships, from the build in build/Release (no second
// build: `npm run build` first). Layout, as node-gyp-build reads it:
//   prebuilds/linux-x64/nodetron.napi.node      the cpu addon, with the shared libraries it needs that a
//   prebuilds/linux-x64/lib*.so.*               bare machine lacks (OpenBLAS, Gloo and their own
//                                               dependencies), found through its $ORIGIN RPATH
//   prebuilds/linux-x64/cuda/nodetron_cuda.node the cuda addon (cuBLASLt and NCCL are not shipped:
//                                               lib/native.ts finds them on the machine at run time)
//   prebuilds/linux-arm64/nodetron.napi.node    the cpu addon cross-built for arm64 (scripts/arm64/build.mjs,
//   prebuilds/linux-arm64/lib*.so.*             build-arm64/), with its libraries as for x64; no cuda addon
// The arm64 binary is collected whenever build-arm64/ holds one at least as new as native/ (else
// prebuilds/linux-arm64 is removed, so a package never ships a stale one); --arm64 (what
// scripts/setup.mjs --release passes) requires it and loads it under qemu-aarch64-static.
//   node scripts/prebuild.mjs [--check] [--arm64]   (--check: only verify that the prebuilt cpu addons load alone)
import { execFileSync, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const tuple = `${process.platform}-${process.arch}`;
const out = join(root, 'prebuilds', tuple);
const log = (m) => console.error(`[nodetron prebuild] ${m}`);

// Libraries every Linux machine that runs Node.js has: never shipped.
const SYSTEM = /^(linux-vdso|ld-linux[^/]*|libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s)\.so/;

/** The resolved shared-library dependencies of `file` (ldd), without the system's. */
function dependencies(file) {
  const text = execFileSync('ldd', [file], { encoding: 'utf8' });
  const deps = [];
  for (const line of text.split('\n')) {
    const m = /^\s*(\S+) => (\S+)/.exec(line);
    if (!m) continue;
    if (m[2] === 'not') throw new Error(`${basename(file)} needs ${m[1]}, which is not found on this machine`);
    if (!SYSTEM.test(m[1])) deps.push({ soname: m[1], path: m[2] });
  }
  return deps;
}

function strip(file) {
  spawnSync('strip', ['--strip-unneeded', file], { stdio: 'ignore' });
}

/** Loads the prebuilt cpu addon in a child with the build folder hidden, so only prebuilds/ can answer. */
function check() {
  const probe = `const load = require(${JSON.stringify(join(root, 'node_modules', 'node-gyp-build'))});` +
    `const a = load.path(${JSON.stringify(root)}); if (!a.includes('prebuilds')) throw new Error('resolved ' + a);` +
    'const m = require(a); if (typeof m.gemm !== "function") throw new Error("no gemm");' +
    // Every shipped library must be the copy beside the addon, not the system's.
    `const maps = require('fs').readFileSync('/proc/self/maps', 'utf8'); const dir = ${JSON.stringify(out)};` +
    'const libs = require("fs").readdirSync(dir).filter((f) => /\\.so/.test(f));' +
    'const elsewhere = libs.filter((l) => !maps.includes(dir + "/" + l) && maps.split("\\n").some((x) => x.endsWith("/" + l)));' +
    'if (elsewhere.length) throw new Error("loaded from the system instead: " + elsewhere.join(", ")); console.log("ok");';
  const r = spawnSync(process.execPath, ['-e', probe], { encoding: 'utf8', env: { ...process.env, PREBUILDS_ONLY: '1', LD_LIBRARY_PATH: '' } });
  if (r.status !== 0 || r.stdout.trim() !== 'ok') throw new Error(`the prebuilt cpu addon does not load: ${(r.stderr || r.stdout).trim().split('\n').slice(-3).join(' ')}`);
  log(`${join('prebuilds', tuple, 'nodetron.napi.node')} loads on its own`);
}

// ---- linux-arm64 (cross-built on x64) ------------------------------------------------------------
const arm64Build = join(root, 'build-arm64');
const arm64Out = join(root, 'prebuilds', 'linux-arm64');
// Where an arm64 library is found on the x64 build machine: the unpacked arm64 Gloo, then Debian's
// multiarch folders (ldd cannot read a foreign binary, so the DT_NEEDED entries are followed by hand).
const ARM64_LIB_DIRS = [join(arm64Build, 'sysroot', 'usr', 'lib'), '/usr/lib/aarch64-linux-gnu', '/lib/aarch64-linux-gnu', '/usr/aarch64-linux-gnu/lib'];

function needed(file) {
  const text = execFileSync('readelf', ['-d', file], { encoding: 'utf8' });
  return [...text.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
}

/** The non-system libraries `file` needs, transitively, resolved in ARM64_LIB_DIRS. */
function arm64Dependencies(file) {
  const found = new Map();
  const visit = (f) => {
    for (const soname of needed(f)) {
      if (SYSTEM.test(soname) || found.has(soname)) continue;
      const dir = ARM64_LIB_DIRS.find((d) => existsSync(join(d, soname)));
      if (!dir) throw new Error(`${basename(f)} needs ${soname}, not found in ${ARM64_LIB_DIRS.join(', ')} (node scripts/arm64/build.mjs installs the arm64 packages)`);
      found.set(soname, join(dir, soname));
      visit(join(dir, soname));
    }
  };
  visit(file);
  return [...found].map(([soname, path]) => ({ soname, path }));
}

function newestUnder(dir) {
  let t = 0;
  for (const e of readdirSync(dir, { recursive: true })) {
    const s = statSync(join(dir, String(e)));
    if (s.isFile()) t = Math.max(t, s.mtimeMs);
  }
  return t;
}

/** Collects prebuilds/linux-arm64 from build-arm64 (when fresh); returns whether it did. */
function collectArm64(required) {
  const addon = join(arm64Build, 'nodetron.node');
  rmSync(arm64Out, { recursive: true, force: true });
  const sources = Math.max(newestUnder(join(root, 'native')), statSync(join(root, 'CMakeLists.txt')).mtimeMs);
  // scripts/arm64/build.mjs stamps each successful build (ninja need not relink the addon after every edit).
  const stamp = join(arm64Build, 'built.stamp');
  if (!existsSync(addon) || !existsSync(stamp) || statSync(stamp).mtimeMs < sources) {
    const why = existsSync(addon) ? 'build-arm64/nodetron.node is older than native/' : 'there is no build-arm64/nodetron.node';
    if (required) throw new Error(`${why}: run node scripts/arm64/build.mjs`);
    log(`WARNING: ${why}: the package will have no linux-arm64 binary (node scripts/arm64/build.mjs cross-builds it)`);
    return false;
  }
  mkdirSync(arm64Out, { recursive: true });
  const target = join(arm64Out, 'nodetron.napi.node');
  copyFileSync(addon, target);
  const stripArm64 = (f) => spawnSync('aarch64-linux-gnu-strip', ['--strip-unneeded', f], { stdio: 'ignore' });
  stripArm64(target);
  const shipped = [];
  for (const dep of arm64Dependencies(addon)) {
    copyFileSync(dep.path, join(arm64Out, dep.soname));
    stripArm64(join(arm64Out, dep.soname));
    shipped.push(`${dep.soname} (${(statSync(join(arm64Out, dep.soname)).size / 2 ** 20).toFixed(1)} MiB)`);
  }
  log(`linux-arm64 cpu addon with ${shipped.join(', ')}`);
  const files = readdirSync(arm64Out).map(String);
  writeFileSync(join(arm64Out, 'MANIFEST.txt'), `cross-built from build-arm64/nodetron.node (cmake/aarch64-linux-gnu.cmake) on ${new Date().toISOString()}\ncuda backend: not built for arm64 (build it from source: docs/architecture.md)\n${files.join('\n')}\n`);
  return true;
}

/** Loads the arm64 prebuilt addon under qemu-aarch64-static with an arm64 Node.js, when both are here. */
function checkArm64(required) {
  if (!existsSync(join(arm64Out, 'nodetron.napi.node'))) return;
  // NODETRON_ARM64_NODE, else the arm64 Node.js .ci/arm64-smoke.sh keeps in build-arm64/node/<major>.
  const node = process.env.NODETRON_ARM64_NODE ?? join(arm64Build, 'node', process.versions.node.split('.')[0], 'package', 'bin', 'node');
  const qemu = spawnSync('sh', ['-c', 'command -v qemu-aarch64-static'], { encoding: 'utf8' }).stdout.trim();
  if (!qemu || !node || !existsSync(node)) {
    const msg = 'the linux-arm64 addon was not loaded here (needs qemu-aarch64-static and an arm64 node in NODETRON_ARM64_NODE; .ci/arm64-smoke.sh runs it)';
    if (required) log(`WARNING: ${msg}`);
    return;
  }
  const probe = `const m = require(${JSON.stringify(join(arm64Out, 'nodetron.napi.node'))}); if (typeof m.gemm !== "function") throw new Error("no gemm"); console.log(m.cpuIsa().best);`;
  const r = spawnSync(qemu, [node, '-e', probe], { encoding: 'utf8', timeout: 120_000, env: { ...process.env, LD_LIBRARY_PATH: '' } });
  if (r.status !== 0) throw new Error(`the prebuilt linux-arm64 addon does not load under qemu: ${(r.stderr || r.stdout || String(r.error)).trim().split('\n').slice(-3).join(' ')}`);
  log(`prebuilds/linux-arm64/nodetron.napi.node loads on its own under qemu (kernels at ${r.stdout.trim()})`);
}

try {
  const arm64Required = process.argv.includes('--arm64');
  if (!process.argv.includes('--check') && process.arch === 'x64') collectArm64(arm64Required);
  if (!process.argv.includes('--check')) {
    const cpuAddon = join(root, 'build', 'Release', 'nodetron.node');
    if (!existsSync(cpuAddon)) throw new Error('build/Release/nodetron.node is missing: run `npm run build` first');
    rmSync(out, { recursive: true, force: true });
    mkdirSync(out, { recursive: true });
    const target = join(out, 'nodetron.napi.node');
    copyFileSync(cpuAddon, target);
    strip(target);
    const shipped = [];
    for (const dep of dependencies(cpuAddon)) {
      copyFileSync(dep.path, join(out, dep.soname));
      shipped.push(`${dep.soname} (${(statSync(dep.path).size / 2 ** 20).toFixed(1)} MiB)`);
    }
    log(`cpu addon with ${shipped.join(', ')}`);
    const cudaAddon = join(root, 'build', 'Release', 'nodetron_cuda.node');
    // The last configure's record of the cuda addon (nvcc, architectures, libraries): only the addon it
    // says was built is shipped (one left over from an earlier build that the last one skipped, with
    // NODETRON_CUDA=0 or no toolkit, is not), and MANIFEST.txt carries it, so a package says what it holds.
    const statusFile = join(root, 'build', 'cuda-status.txt');
    const cudaStatus = existsSync(statusFile) ? readFileSync(statusFile, 'utf8').trim() : null;
    const cudaBuilt = cudaStatus?.startsWith('built') ?? false;
    if (existsSync(cudaAddon) && !cudaBuilt) log('build/Release/nodetron_cuda.node is left over from an earlier build (build/cuda-status.txt says it was not built): not shipped');
    if (existsSync(cudaAddon) && cudaBuilt) {
      mkdirSync(join(out, 'cuda'));
      copyFileSync(cudaAddon, join(out, 'cuda', 'nodetron_cuda.node'));
      strip(join(out, 'cuda', 'nodetron_cuda.node'));
      log('cuda addon (cuBLASLt and NCCL found on the machine at run time)');
    } else {
      log('no cuda addon in build/Release: the package will have the cpu backend only');
    }
    const files = readdirSync(out, { recursive: true }).map(String);
    const cuda = cudaStatus !== null ? `cuda backend: ${cudaStatus}\n` : '';
    writeFileSync(join(out, 'MANIFEST.txt'), `built from ${cpuAddon.replace(root + '/', '')} on ${new Date().toISOString()}\n${cuda}${files.join('\n')}\n`);
  }
  check();
  if (process.arch === 'x64') checkArm64(arm64Required);
} catch (e) {
  log(`error: ${e.message}`);
  process.exit(1);
}
