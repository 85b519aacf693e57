// What scripts/setup.mjs and scripts/arm64/build.mjs share: running a command in the repository,
// asking whether a command or a Debian package is there, installing Debian packages with apt, and the
// newest modification time under a set of paths (to skip a build that is up to date).
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The repository (or installed package) root: the folder above scripts/. */
export const root = join(dirname(fileURLToPath(import.meta.url)), '..');

/** Runs `cmd args` in the root (its output on this process's, unless opts say otherwise); true when it exits 0. */
export function run(cmd, args, opts = {}) {
  return spawnSync(cmd, args, { stdio: 'inherit', cwd: root, ...opts }).status === 0;
}

/** Whether `cmd` is on PATH. */
export function has(cmd) {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/** Whether the Debian package `pkg` (e.g. 'cmake' or 'libopenblas-dev:arm64') is installed. */
export function dpkgInstalled(pkg) {
  try {
    return execFileSync('dpkg-query', ['-W', '-f=${Status}', pkg], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().includes('install ok installed');
  } catch {
    return false;
  }
}

/** apt-get install (as root, noninteractive, no recommends), once more after an apt-get update when the
 *  package lists were stale; true when the packages are installed. The caller names the line to run
 *  by hand when it is false. */
export function aptInstall(packages) {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const install = () => run('apt-get', ['install', '-y', '--no-install-recommends', ...packages], { env });
  if (install()) return true;
  run('apt-get', ['update'], { env });
  return install();
}

/** The newest modification time (ms) of the files under `paths` (relative to the root; missing ones are passed over). */
export function newest(paths) {
  let t = 0;
  const walk = (p) => {
    if (!existsSync(p)) return;
    const s = statSync(p);
    if (s.isDirectory()) for (const e of readdirSync(p)) walk(join(p, e));
    else t = Math.max(t, s.mtimeMs);
  };
  paths.forEach((p) => walk(join(root, p)));
  return t;
}
