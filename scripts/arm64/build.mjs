#!/usr/bin/env node
// Cross-builds the cpu addon for Linux arm64 (aarch64: NVIDIA Grace in GH200/GB200 nodes, AWS Graviton)
// on an x86-64 Debian/Ubuntu machine, into build-arm64/ (never build/, which stays this machine's own
// build), with the toolchain file cmake/aarch64-linux-gnu.cmake. scripts/setup.mjs --release (what
// `npm pack` runs) calls it, and scripts/prebuild.mjs then collects prebuilds/linux-arm64/ from it.
//   node scripts/arm64/build.mjs [--qemu]   (--qemu: also make sure qemu-user-static and the arm64 C/C++ runtimes are there, for the smoke)
// What it needs, installed with apt when run as root (else it fails naming the exact commands):
//   g++-aarch64-linux-gnu, and through Debian's multiarch libopenblas-dev:arm64, libhiredis-dev:arm64,
//   libibverbs-dev:arm64 (Gloo's dependencies). Debian's libgloo-dev is not multiarch: installing
//   libgloo-dev:arm64 REMOVES the machine's own libgloo-dev (x86-64), so its arm64 .debs are fetched with
//   `apt-get download` and unpacked into build-arm64/sysroot instead.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { aptInstall, dpkgInstalled, has, newest, root, run } from '../sys.mjs';

export { root };
export const buildDir = join(root, 'build-arm64');
const sysroot = join(buildDir, 'sysroot');
const log = (m) => console.error(`[nodetron arm64] ${m}`);

// Multiarch packages that sit beside the x86-64 ones (never libgloo-dev:arm64: see above).
export const APT_PACKAGES = ['g++-aarch64-linux-gnu', 'libopenblas-dev:arm64', 'libhiredis-dev:arm64', 'libibverbs-dev:arm64'];
const GLOO_DEBS = ['libgloo0:arm64', 'libgloo-dev:arm64'];
/** The exact commands that bring a Debian/Ubuntu x86-64 machine to cross-build (as root). */
export const APT_LINE = `dpkg --add-architecture arm64 && apt-get update && apt-get install -y --no-install-recommends ${APT_PACKAGES.join(' ')}`;

/** Installs (as root) or names what the cross build needs; throws when it cannot be had. */
export function ensureToolchain({ qemu = false } = {}) {
  if (process.platform !== 'linux' || process.arch !== 'x64') throw new Error(`the arm64 cross build runs on linux-x64 (this is ${process.platform}-${process.arch})`);
  if (!has('dpkg-query') || !has('apt-get')) throw new Error('the arm64 cross build needs a Debian/Ubuntu machine (dpkg, apt): install an aarch64-linux-gnu cross g++, arm64 OpenBLAS and Gloo, then build with cmake/aarch64-linux-gnu.cmake');
  // Under qemu-user the arm64 Node.js and the addon load their C and C++ runtimes from Debian's multiarch
  // libc6:arm64 and libstdc++6:arm64; no arm64 package above depends on libstdc++6, so it is named here.
  const wanted = [...APT_PACKAGES, ...(qemu ? ['qemu-user-static', 'libc6:arm64', 'libstdc++6:arm64'] : [])];
  const missing = wanted.filter((p) => !dpkgInstalled(p));
  if (!missing.length) return;
  const line = `dpkg --add-architecture arm64 && apt-get update && apt-get install -y --no-install-recommends ${missing.join(' ')}`;
  if (process.getuid?.() !== 0) throw new Error(`the arm64 cross build needs ${missing.join(', ')}. Run as root: ${line}`);
  log(`installing ${missing.join(', ')} with apt`);
  const foreign = execFileSync('dpkg', ['--print-foreign-architectures'], { encoding: 'utf8' }).split(/\s+/);
  if (!foreign.includes('arm64')) run('dpkg', ['--add-architecture', 'arm64']);
  if (!aptInstall(missing)) throw new Error(`apt could not install ${missing.join(' ')}; run: ${line}`);
}

/** Unpacks the arm64 Gloo .debs into build-arm64/sysroot (once) and points its CMake package there. */
function glooSysroot() {
  const config = join(sysroot, 'usr', 'share', 'cmake', 'Gloo', 'GlooTargets-relwithdebinfo.cmake');
  if (existsSync(config) && existsSync(join(sysroot, 'usr', 'lib', 'libgloo.so.0'))) return;
  const debs = join(buildDir, 'debs');
  rmSync(debs, { recursive: true, force: true });
  mkdirSync(debs, { recursive: true });
  // apt-get download runs unprivileged (the _apt user) and warns when it cannot write the folder as that user.
  const r = spawnSync('apt-get', ['download', ...GLOO_DEBS], { cwd: debs, encoding: 'utf8' });
  const files = readdirSync(debs).filter((f) => f.endsWith('.deb'));
  if (r.status !== 0 || files.length !== GLOO_DEBS.length) {
    throw new Error(`apt-get download ${GLOO_DEBS.join(' ')} failed (${(r.stderr || '').trim().split('\n').pop()}); the arm64 architecture must be known to apt: ${APT_LINE}`);
  }
  for (const f of files) execFileSync('dpkg-deb', ['-x', join(debs, f), sysroot]);
  // Debian's Gloo package names its library by absolute path (/usr/lib/libgloo.so.0.5.0): on this
  // machine that is the x86-64 one, so the unpacked copy is named instead.
  const text = readFileSync(config, 'utf8');
  writeFileSync(config, text.replaceAll('"/usr/lib/', `"${sysroot}/usr/lib/`));
  log(`unpacked ${files.join(', ')} into ${sysroot.replace(root + '/', '')}`);
}

/** Cross-builds build-arm64/nodetron.node when the sources are newer than it; returns its path. */
export function buildArm64({ force = false, qemu = false } = {}) {
  ensureToolchain({ qemu });
  glooSysroot();
  const addon = join(buildDir, 'nodetron.node');
  // When the last build succeeded (ninja relinks nothing when an edit changes no object of this addon,
  // e.g. one under native/cuda, so the addon's own time can stay older than the sources).
  const stamp = join(buildDir, 'built.stamp');
  if (!force && existsSync(addon) && existsSync(stamp) && statSync(stamp).mtimeMs > newest(['native', 'CMakeLists.txt', 'cmake'])) return addon;
  const headers = [join(root, 'node_modules', 'node-api-headers', 'include'), join(root, 'node_modules', 'node-addon-api')];
  for (const h of headers) if (!existsSync(h)) throw new Error(`${h} is missing: run npm install first`);
  if (!existsSync(join(buildDir, 'CMakeCache.txt')) || force) {
    log('configuring build-arm64 (cmake/aarch64-linux-gnu.cmake)');
    const ok = run('cmake', ['-S', root, '-B', buildDir, ...(has('ninja') ? ['-G', 'Ninja'] : []),
      `-DCMAKE_TOOLCHAIN_FILE=${join(root, 'cmake', 'aarch64-linux-gnu.cmake')}`, `-DNT_ARM64_GLOO_ROOT=${sysroot}`,
      '-DCMAKE_BUILD_TYPE=Release', '-DNT_TESTING=OFF', '-DNT_CUDA=OFF',
      // RPATH $ORIGIN only, as the addon is shipped (not the unpacked Gloo's folder on this machine).
      '-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON',
      // What cmake-js passes for a Node-API addon on Linux (headers only: N-API needs no node library).
      `-DCMAKE_JS_INC=${headers.join(';')}`, '-DCMAKE_CXX_FLAGS=-DBUILDING_NODE_EXTENSION']);
    if (!ok) throw new Error('configuring the arm64 cross build failed (see the output above)');
  }
  log('building build-arm64/nodetron.node');
  const jobs = process.env.CMAKE_BUILD_PARALLEL_LEVEL ?? String(availableParallelism() + 2);
  if (!run('cmake', ['--build', buildDir, '--target', 'nodetron', '--parallel', jobs])) throw new Error('the arm64 cross build failed (see the compiler output above)');
  writeFileSync(stamp, `${new Date().toISOString()}\n`);
  return addon;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  try {
    const addon = buildArm64({ force: process.argv.includes('--force'), qemu: process.argv.includes('--qemu') });
    log(`built ${addon.replace(root + '/', '')}`);
  } catch (e) {
    log(`error: ${e.message}`);
    process.exit(1);
  }
}
