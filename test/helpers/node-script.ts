// How tests start a TypeScript process of the repository (a launcher, a rank fixture, a bench script).
// Through tsx, every process pays about 0.3 CPU-seconds more to start than plain node running
// JavaScript (tsx's own start and its per-file transpile-cache lookups over lib/), and a multi-process
// test starts hundreds of them. So when the compiled code is fresh, processes run it instead:
//   - lib/X.ts       -> dist/X.js (tsc's build, made by scripts/setup.mjs), when dist/index.js is newer
//                       than every file of lib/ and tsconfig.json;
//   - test/**/X.ts   -> build/test-js/test/**/X.js (esbuild's transpile of test/'s non-test files and
//                       .mjs fixtures, made by buildTestScripts before the run: vitest's globalSetup),
//                       whose '../lib' is a link to dist/, when it is newer than every file it copies.
// Anything else, or any of it stale, runs the .ts file through tsx as before: a developer who edits
// lib/ and runs one test file without `node scripts/setup.mjs` still tests the edited sources.
// NODETRON_TEST_TSX=1 always uses tsx.
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, relative, sep } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const dist = join(root, 'dist');
/** The transpiled copy of test/: build/test-js/test/... beside a link build/test-js/lib -> dist. */
export const testJs = join(root, 'build', 'test-js');
const stamp = join(testJs, 'stamp');

/** Newest modification time of the files under `dir` whose names pass `keep` (0 when none). */
function newest(dir: string, keep: (name: string) => boolean = () => true): number {
  let t = 0;
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (keep(e.name)) t = Math.max(t, statSync(p).mtimeMs);
    }
  };
  if (existsSync(dir)) walk(dir);
  return t;
}

/** test/'s files that run in child processes: TypeScript other than the test files themselves, and .mjs fixtures. */
const isScript = (name: string) => (/\.(ts|mts)$/.test(name) && !name.endsWith('.test.ts')) || name.endsWith('.mjs');
const mtime = (p: string) => (existsSync(p) ? statSync(p).mtimeMs : 0);

let fresh: { dist: boolean; tests: boolean } | undefined;
/** Whether dist/ and build/test-js are at least as new as their sources (checked once per process). */
function freshness(): { dist: boolean; tests: boolean } {
  if (fresh) return fresh;
  if (process.env.NODETRON_TEST_TSX === '1') return (fresh = { dist: false, tests: false });
  const built = mtime(join(dist, 'index.js'));
  const distFresh = built > 0 && built >= Math.max(newest(join(root, 'lib')), mtime(join(root, 'tsconfig.json')));
  const testsFresh = distFresh && existsSync(join(testJs, 'lib', 'index.js')) && mtime(stamp) >= newest(join(root, 'test'), isScript);
  return (fresh = { dist: distFresh, tests: testsFresh });
}

/** The file a child process runs for `script`: its compiled .js when fresh, else `script` itself. */
export function scriptPath(script: string): string {
  const rel = relative(root, script);
  if (!/\.(ts|mts|mjs)$/.test(rel) || rel.startsWith('..')) return script;
  const [top] = rel.split(sep);
  const f = freshness();
  if (top === 'lib' && f.dist) return join(dist, rel.slice('lib'.length + 1).replace(/\.m?ts$/, '.js'));
  if (top === 'test' && f.tests) {
    const js = join(testJs, rel.replace(/\.m?ts$/, '.js'));  // .mjs keeps its name
    if (existsSync(js)) return js;
  }
  return script;
}

/** node's arguments that run `script`: `[compiled.js]` when fresh, else `['--import', 'tsx', script]` (.mjs without tsx's loader only when compiled). */
export function nodeArgs(script: string): string[] {
  const path = scriptPath(script);
  return path === script ? ['--import', 'tsx', script] : [path];
}

/**
 * nodetron/internal (where the planner is) for a test whose library call launches the library's own
 * rank script (e.g. plan.calibrateLayout starts calibrate-rank beside itself): dist/internal.js when
 * fresh, so those ranks start as compiled code, else lib/internal.ts (ranks through tsx).
 */
export async function launchingInternal(): Promise<typeof import('../../lib/internal.js')> {
  return freshness().dist ? import(pathToFileURL(join(dist, 'internal.js')).href) : import('../../lib/internal.js');
}

/**
 * Transpiles test/'s scripts (isScript) into build/test-js/test with esbuild, relative `.ts`
 * imports renamed `.js`, and links build/test-js/lib to dist/ (so `../../../lib/index.js` of a
 * fixture is tsc's build). Skipped when the stamp is newer than every source; written into a new
 * directory and swapped in, so a concurrent reader never sees half a tree. Returns whether it wrote.
 */
export async function buildTestScripts(): Promise<boolean> {
  if (mtime(stamp) >= newest(join(root, 'test'), isScript) && existsSync(join(testJs, 'lib'))) return false;
  // esbuild as tsx (a dev dependency, an optional peer of the package) brings it: the transpiler tsx itself runs.
  const esbuild = createRequire(createRequire(join(root, 'package.json')).resolve('tsx'))('esbuild') as typeof import('esbuild');
  const tmp = `${testJs}.tmp-${process.pid}`;
  rmSync(tmp, { recursive: true, force: true });
  const files: string[] = [];
  const walk = (d: string) => {
    for (const e of readdirSync(d, { withFileTypes: true })) {
      const p = join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (isScript(e.name)) files.push(p);
    }
  };
  walk(join(root, 'test'));
  await Promise.all(files.map(async (file) => {
    const src = readFileSync(file, 'utf8');
    const { code } = await esbuild.transform(src, {
      loader: file.endsWith('.mjs') ? 'js' : 'ts', format: 'esm', target: 'es2022', sourcefile: file, sourcemap: 'inline',
    });
    // Relative imports written with .ts (allowed under tsx) name the compiled .js files.
    const js = code.replace(/((?:\bfrom|\bimport)\s*\(?\s*['"])(\.{1,2}\/[^'"]*?)\.m?ts(['"])/g, '$1$2.js$3');
    const out = join(tmp, relative(root, file).replace(/\.m?ts$/, '.js'));  // .mjs keeps its name
    mkdirSync(dirname(out), { recursive: true });
    writeFileSync(out, js);
  }));
  symlinkSync(join('..', '..', 'dist'), join(tmp, 'lib'), 'dir');
  writeFileSync(join(tmp, 'stamp'), `${files.length} files\n`);
  const old = `${testJs}.old-${process.pid}`;
  if (existsSync(testJs)) renameSync(testJs, old);
  renameSync(tmp, testJs);
  rmSync(old, { recursive: true, force: true });
  fresh = undefined;
  return true;
}
