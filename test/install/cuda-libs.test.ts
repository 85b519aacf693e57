// Where the cuda addon's libraries are looked for when it is a prebuilt binary (its RUNPATH names
// the build machine's folders): CUDA_HOME/NCCL_HOME, the toolkit, the nvidia pip wheels; and what a
// user is told when one is missing.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { elfNeeded } from '../../lib/elf.js';
import { cudaLibrariesOf, cudaLibraryDirs, driverMismatch, explainCudaLoadFailure, minDriverFor, nvidiaDriverVersion, packageRoot } from '../../lib/native.js';

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

  it('a CUDA 12 build is told about the CUDA 12 wheels and drivers', () => {
    const why = explainCudaLoadFailure('libcublasLt.so.12: cannot open shared object file; libnccl.so.2: cannot open shared object file');
    expect(why).toMatch(/libcublasLt\.so\.12 .*`pip install nvidia-cublas-cu12`/);
    expect(why).toMatch(/libnccl\.so\.2 .*`pip install nvidia-nccl-cu12`/);
    expect(explainCudaLoadFailure('libcuda.so.1: cannot open shared object file', 12)).toMatch(/driver \(525 or newer for CUDA 12\)/);
    expect(explainCudaLoadFailure('libcuda.so.1: cannot open shared object file', 13)).toMatch(/driver \(580 or newer for CUDA 13\)/);
  });
});

describe('which CUDA the cuda addon needs, from the addon itself', () => {
  const readelf = spawnSync('readelf', ['--version'], { stdio: 'ignore' }).status === 0;
  const addons = [join(packageRoot, 'build', 'Release', 'nodetron.node'), join(packageRoot, 'build', 'Release', 'nodetron_cuda.node'), process.execPath].filter(existsSync);

  it.runIf(readelf)('reads the same DT_NEEDED sonames as readelf, in order', () => {
    expect(addons.length).toBeGreaterThan(0);
    for (const f of addons) {
      const r = spawnSync('readelf', ['-d', f], { encoding: 'utf8' });
      const want = [...r.stdout.matchAll(/\(NEEDED\)\s+Shared library: \[([^\]]+)\]/g)].map((m) => m[1]);
      expect(want.length, f).toBeGreaterThan(0);
      expect(elfNeeded(f), f).toEqual(want);
    }
  });

  it('refuses what is not a 64-bit ELF file with a message naming it', () => {
    const notElf = join(work, 'not-elf.node');
    writeFileSync(notElf, 'hello, this is not an ELF file at all; padding padding padding padding padding');
    expect(() => elfNeeded(notElf)).toThrow(/not-elf\.node is not an ELF file/);
    const elf32 = join(work, 'elf32.node');
    writeFileSync(elf32, Buffer.concat([Buffer.from([0x7f, 0x45, 0x4c, 0x46, 1, 1]), Buffer.alloc(100)]));
    expect(() => elfNeeded(elf32)).toThrow(/not a 64-bit little-endian ELF/);
  });

  it.runIf(existsSync(join(packageRoot, 'build', 'Release', 'nodetron_cuda.node')))('the cuda addon built here links cuBLASLt and NCCL of the CUDA it was compiled with', () => {
    const { sonames, cudaMajor } = cudaLibrariesOf(join(packageRoot, 'build', 'Release', 'nodetron_cuda.node'));
    const nvcc = /nvcc (\d+)\./.exec(readFileSync(join(packageRoot, 'build', 'cuda-status.txt'), 'utf8'));
    expect(nvcc).not.toBeNull();
    expect(cudaMajor).toBe(Number(nvcc![1]));
    expect(sonames).toContain(`libcublasLt.so.${cudaMajor}`);
    expect(sonames.some((n) => n.startsWith('libnccl.so.'))).toBe(true);
  });

  it('reads the driver version and says what to install when it is too old for the build', () => {
    const proc = 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 02:56:05 UTC 2024\nGCC version:  gcc version 12.3.0\n';
    expect(nvidiaDriverVersion(proc)).toEqual({ major: 550, version: '550.127.05' });
    expect(nvidiaDriverVersion('NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65  Release Build')).toEqual({ major: 580, version: '580.65' });
    expect(nvidiaDriverVersion('nothing here')).toBeUndefined();
    const old = driverMismatch({ major: 550, version: '550.127.05' }, 13)!;
    expect(old).toMatch(/driver 550\.127\.05 is older than the 580 branch that CUDA 13/);
    expect(old).toMatch(/update the driver to 580 or newer/);
    expect(old).toMatch(/nvidia-cublas-cu12 nvidia-nccl-cu12/);
    expect(driverMismatch({ major: 550, version: '550.127.05' }, 12)).toBeUndefined();
    expect(driverMismatch({ major: 520, version: '520.1' }, 12)).toMatch(/older than the 525 branch that CUDA 12/);
    expect(driverMismatch({ major: 580, version: '580.65' }, 13)).toBeUndefined();
    expect(driverMismatch(undefined, 13)).toBeUndefined();
    expect(minDriverFor(13)).toBe(580);
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
