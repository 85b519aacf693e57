// Where the cuda addon's libraries are looked for when it is a prebuilt binary (its RUNPATH names
// the build machine's folders): CUDA_HOME/NCCL_HOME, the toolkit, the nvidia pip wheels; and what a
// user is told when one is missing.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { cudaLibraryDirs, explainCudaLoadFailure, packageRoot } from '../../lib/native.js';

const work = mkdtempSync(join(tmpdir(), 'nt-cudalibs-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

describe('finding cuBLASLt and NCCL for the cuda addon', () => {
  it('looks in CUDA_HOME, NCCL_HOME and a virtualenv\'s nvidia wheels, keeping only folders that exist', () => {
    const cudaHome = join(work, 'cuda'), ncclHome = join(work, 'nccl'), venv = join(work, 'venv');
    mkdirSync(join(cudaHome, 'lib64'), { recursive: true });
    mkdirSync(join(ncclHome, 'lib'), { recursive: true });
    const wheel = join(venv, 'lib', 'python3.12', 'site-packages', 'nvidia', 'cu13', 'lib');
    mkdirSync(wheel, { recursive: true });
    const dirs = cudaLibraryDirs({ CUDA_HOME: cudaHome, NCCL_HOME: ncclHome, VIRTUAL_ENV: venv, HOME: work, PATH: process.env.PATH });
    expect(dirs).toContain(join(cudaHome, 'lib64'));
    expect(dirs).toContain(join(ncclHome, 'lib'));
    expect(dirs).toContain(wheel);
    expect(dirs).not.toContain(join(cudaHome, 'lib'));
    expect(new Set(dirs).size).toBe(dirs.length);
  });

  it('names every missing library and how to get it', () => {
    const why = explainCudaLoadFailure('libcublasLt.so.13: cannot open shared object file; libnccl.so.2: cannot open shared object file');
    expect(why).toMatch(/libcublasLt\.so\.13 \(cuBLAS\/cuBLASLt\) was not found: `pip install nvidia-cublas`/);
    expect(why).toMatch(/libnccl\.so\.2 \(NCCL\) was not found: `pip install nvidia-nccl-cu13`/);
  });
});

const statusFile = join(packageRoot, 'build', 'cuda-status.txt');
const cudaBuilt = existsSync(statusFile) && readFileSync(statusFile, 'utf8').startsWith('built');
const dist = join(packageRoot, 'dist', 'index.js');

/** nt.info()'s cuda entry in a fresh process with exactly `env` (no PATH to python, no HOME). */
function cudaInfo(env: NodeJS.ProcessEnv): { available: boolean; reason?: string } {
  const r = spawnSync(process.execPath, ['-e', `import(${JSON.stringify(dist)}).then((nt) => console.log(JSON.stringify(nt.info().backends.cuda)))`],
    { env, encoding: 'utf8', timeout: 60_000 });
  expect(r.status, r.stderr).toBe(0);
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!);
}

describe.runIf(cudaBuilt && existsSync(dist))('the cuda addon without a RUNPATH (built here)', () => {
  it('names both libraries when nothing on the machine says where they are', () => {
    const info = cudaInfo({ PATH: join(work, 'no-bin'), HOME: join(work, 'no-home') });
    expect(info.available).toBe(false);
    expect(info.reason).toMatch(/libcublasLt\.so\.13 .*was not found.*libnccl\.so\.2 .*was not found/);
  });

  it('loads once LD_LIBRARY_PATH names their folders (then only the driver or GPU can be missing)', () => {
    const dirs = cudaLibraryDirs();
    const info = cudaInfo({ PATH: join(work, 'no-bin'), HOME: join(work, 'no-home'), LD_LIBRARY_PATH: dirs.join(':') });
    if (!info.available) expect(info.reason).not.toMatch(/was not found: `pip install/);
  });
});
