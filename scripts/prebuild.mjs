#!/usr/bin/env node
// Collects the prebuilt binaries that `npm pack` ships, from the build in build/Release (no second
// build: `npm run build` first). Layout, as node-gyp-build reads it:
//   prebuilds/linux-x64/nodetron.napi.node      the cpu addon, with the shared libraries it needs that a
//   prebuilds/linux-x64/lib*.so.*               bare machine lacks (OpenBLAS, Gloo and their own
//                                               dependencies), found through its $ORIGIN RPATH
//   prebuilds/linux-x64/cuda/nodetron_cuda.node the cuda addon (cuBLASLt and NCCL are not shipped:
//                                               lib/native.ts finds them on the machine at run time)
//   node scripts/prebuild.mjs [--check]   (--check: only verify that the prebuilt cpu addon loads alone)
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

try {
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
} catch (e) {
  log(`error: ${e.message}`);
  process.exit(1);
}
