// `npm install nodetron` in someone else's project, as a user meets it: the package is packed, installed
// from the tarball into a fresh project and used there — import, a matmul, `npx nodetron info --json`,
// a 2-rank `npx nodetron launch` allreduce, and the types under tsc. Once from the prebuilt binaries
// with a PATH that has no cmake and no C++ compiler (so a source build could not even start), once
// with --build-from-source (the cpu backend: NODETRON_CUDA=0 keeps the CUDA compile out of the suite).
// In the prebuilt project `npx nodetron plan` prints launch commands whose script the package ships
// (a Llama preset's trains Llama blocks), and the best one for a tiny GPT runs there as printed (one step):
// first refused (exit 2, saying how to get tsx: an optional peer dependency the install leaves out), then
// run after `npm install --save-dev tsx` in the project.
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const work = mkdtempSync(join(tmpdir(), 'nt-install-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const USE = `import * as nt from 'nodetron';
const a = nt.tensor([1, 2, 3, 4], [2, 2]), b = nt.tensor([5, 6, 7, 8], [2, 2]);
console.log(JSON.stringify({ product: Array.from(nt.matmul(a, b).toArraySync()), version: nt.version }));
`;
const ALLREDUCE = `import * as nt from 'nodetron';
const dist = await nt.distributed.init();
const t = nt.tensor([dist.world.rank + 1, 10]);
await dist.world.allReduce(t);
console.log('allreduce ' + dist.world.rank + ' ' + JSON.stringify(Array.from(t.toArraySync())));
await nt.distributed.destroy();
`;
const TYPES = `import * as nt from 'nodetron';
import { runLocalRanks } from 'nodetron/testing';
const t: nt.Tensor = nt.zeros([2, 3]);
const shape: readonly number[] = t.shape;
const sums: Promise<number[]> = runLocalRanks(2, async (g) => g.rank);
export { shape, sums };
`;

let tarball = '';
beforeAll(() => {
  for (const p of ['dist/index.js', 'dist/testing/index.js', `prebuilds/${process.platform}-${process.arch}/nodetron.napi.node`, 'examples/gpt/shards/mobydick1_train_000001.bin']) {
    if (!existsSync(join(root, p))) throw new Error(`${p} is missing: the set-up (node scripts/setup.mjs) builds it before the tests`);
  }
  const out = execFileSync('npm', ['pack', '--ignore-scripts', '--json', '--pack-destination', work], { cwd: root, encoding: 'utf8' });
  tarball = join(work, (JSON.parse(out) as { filename: string }[])[0]!.filename);
}, 120_000);

/** A fresh project with nodetron installed from the tarball; returns its folder. */
function installInto(name: string, args: string[], env: NodeJS.ProcessEnv): string {
  const dir = join(work, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, private: true, type: 'module' }));
  const r = spawnSync('npm', ['install', tarball, '--prefer-offline', '--no-audit', '--no-fund', ...args], { cwd: dir, env, encoding: 'utf8' });
  expect(r.status, `npm install failed:\n${r.stdout}\n${r.stderr}`).toBe(0);
  return dir;
}

/**
 * Runs what a user runs in the project: the script, info, launch, and (types) tsc on a typed file. The
 * types come from the tarball, the same in both projects, so the source-built one leaves tsc out.
 */
function useProject(dir: string, env: NodeJS.ProcessEnv, types = true): void {
  writeFileSync(join(dir, 'use.mjs'), USE);
  writeFileSync(join(dir, 'allreduce.mjs'), ALLREDUCE);
  const run = (cmd: string, args: string[]) => {
    const r = spawnSync(cmd, args, { cwd: dir, env, encoding: 'utf8', timeout: 120_000 });
    expect(r.status, `${cmd} ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`).toBe(0);
    return r.stdout;
  };
  const used = JSON.parse(run('node', ['use.mjs']).trim()) as { product: number[]; version: string };
  expect(used.product).toEqual([19, 22, 43, 50]);
  const info = JSON.parse(run('npx', ['nodetron', 'info', '--json'])) as { backends: { cpu: { available: boolean }; cuda: { available: boolean; reason?: string } } };
  expect(info.backends.cpu.available).toBe(true);
  if (!info.backends.cuda.available) expect(String(info.backends.cuda.reason ?? '')).not.toBe('');
  const launched = run('npx', ['nodetron', 'launch', '--nproc-per-node', '2', 'allreduce.mjs']);
  expect(launched).toMatch(/allreduce 0 \[3,20\]/);
  expect(launched).toMatch(/allreduce 1 \[3,20\]/);
  if (!types) return;
  writeFileSync(join(dir, 'typed.ts'), TYPES);
  writeFileSync(join(dir, 'tsconfig.json'), JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', strict: true, noEmit: true, skipLibCheck: false, types: ['node'], typeRoots: [join(root, 'node_modules', '@types')] }, files: ['typed.ts'] }));
  run('node', [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json']);
}

/** `npx nodetron plan` in the project: its commands name the shipped example, and the best one trains (1 step) as printed. */
function planAndTrain(dir: string, env: NodeJS.ProcessEnv): void {
  const run = (cmd: string, args: string[], timeout = 120_000) => {
    const r = spawnSync(cmd, args, { cwd: dir, env, encoding: 'utf8', timeout });
    expect(r.status, `${cmd} ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`).toBe(0);
    return r.stdout;
  };
  const best = (out: string) => /^best: (.*)$/m.exec(out)?.[1] ?? '';
  const script = 'node_modules/nodetron/examples/gpt/train.ts';
  const llama = best(run('npx', ['nodetron', 'plan', '--model', '7b', '--gpus', '8', '--top', '1']));
  expect(llama).toMatch(new RegExp(`^npx nodetron launch --nproc-per-node 8 ${script} .*--model llama --kv-heads 32 --ffn 11008 `));
  writeFileSync(join(dir, 'tiny.json'), JSON.stringify({ n_layer: 1, n_head: 2, n_embd: 32, vocab_size: 50304, n_positions: 32 }));
  const command = best(run('npx', ['nodetron', 'plan', '--model', 'tiny.json', '--gpus', '2', '--gpu', 'cpu', '--dtype', 'f32', '--seq', '16', '--batch', '4', '--top', '1']));
  expect(command).toMatch(new RegExp(`^npx nodetron launch --nproc-per-node 2 ${script} --layers 1 --heads 2 --width 32 --ctx 16 --batch 4 `));
  expect(existsSync(join(dir, script))).toBe(true);
  // The corpus package is a devDependency: the example trains on the token shards the package ships.
  expect(existsSync(join(dir, 'node_modules', '@stdlib', 'datasets-moby-dick'))).toBe(false);
  // As printed, plus one step and no sample (the flags the example takes after the plan's).
  const [npx, ...args] = command.split(' ');
  const launchArgs = [...args, '--steps', '1', '--generate', '0', '--eval-interval', '100'];
  // tsx is an optional peer dependency: not installed with nodetron, so the TypeScript example is first
  // refused with one usage error (exit 2, no rank started) that says how to get it.
  expect(existsSync(join(dir, 'node_modules', 'tsx'))).toBe(false);
  const refused = spawnSync(npx!, launchArgs, { cwd: dir, env, encoding: 'utf8', timeout: 120_000 });
  expect(refused.status, `${command} without tsx:\n${refused.stdout}\n${refused.stderr}`).toBe(2);
  expect(refused.stderr).toContain(
    `nodetron launch: \`${script}\` is TypeScript: \`nodetron launch\` runs .ts scripts with tsx, an optional peer dependency that is not installed here; ` +
      'install it in your project (`npm install --save-dev tsx`) or launch a compiled .js',
  );
  expect(refused.stdout).not.toMatch(/\[rank \d+\]/);
  // As the message says (the checkout's version, so npm's cache serves it), then the launch runs.
  const tsx = (JSON.parse(readFileSync(join(root, 'node_modules', 'tsx', 'package.json'), 'utf8')) as { version: string }).version;
  run('npm', ['install', '--save-dev', `tsx@${tsx}`, '--prefer-offline', '--no-audit', '--no-fund'], 300_000);
  expect(existsSync(join(dir, 'node_modules', 'tsx'))).toBe(true);
  const trained = run(npx!, launchArgs, 300_000);
  expect(trained).toMatch(/step +1\/1/);
}

describe('npm install nodetron into a fresh project', () => {
  it('installs from the prebuilt binaries on a machine without cmake or a compiler, then runs', () => {
    // A PATH with node, npm, npx and a shell only: no cmake, no c++, no g++.
    const bin = join(work, 'bin');
    mkdirSync(bin);
    for (const tool of ['node', 'npm', 'npx', 'sh']) {
      const found = execFileSync('sh', ['-c', `command -v ${tool}`], { encoding: 'utf8' }).trim();
      symlinkSync(found, join(bin, tool));
    }
    const env = { ...process.env, PATH: bin };
    for (const tool of ['cmake', 'g++', 'c++']) expect(spawnSync('sh', ['-c', `command -v ${tool}`], { env }).status).not.toBe(0);
    const dir = installInto('prebuilt', [], env);
    const pkg = join(dir, 'node_modules', 'nodetron');
    expect(existsSync(join(pkg, 'build'))).toBe(false);
    expect(readdirSync(join(pkg, 'prebuilds', `${process.platform}-${process.arch}`))).toContain('nodetron.napi.node');
    useProject(dir, env);
    planAndTrain(dir, env);
  }, 900_000);

  it('builds from source with --build-from-source (cpu backend) and runs', () => {
    const env = { ...process.env, NODETRON_CUDA: '0', CMAKE_BUILD_PARALLEL_LEVEL: '2' };
    const dir = installInto('source', ['--build-from-source'], env);
    const pkg = join(dir, 'node_modules', 'nodetron');
    expect(existsSync(join(pkg, 'build', 'Release', 'nodetron.node'))).toBe(true);
    useProject(dir, env, false);
  }, 900_000);
});
