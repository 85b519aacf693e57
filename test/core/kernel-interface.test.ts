// One kernel interface: both addons export exactly the functions lib/native.ts declares
// (BackendKernels, plus each addon's own list), so a kernel cannot exist on one backend only, under
// another name, or as a leftover no code calls. The cuda addon is checked wherever it was built; it
// loads without a GPU.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { BACKEND_KERNELS, CPU_ONLY_EXPORTS, CUDA_ONLY_EXPORTS, cpu, cuda, packageRoot } from '../../lib/native.js';

const sorted = (xs: readonly string[]) => [...xs].sort();
const statusFile = join(packageRoot, 'build', 'cuda-status.txt');
const cudaBuilt = existsSync(statusFile) && readFileSync(statusFile, 'utf8').startsWith('built');

describe('the kernel interface (lib/native.ts)', () => {
  it('kernels are snake_case; runtime calls camelCase; no name is declared twice', () => {
    const all = [...BACKEND_KERNELS, ...CPU_ONLY_EXPORTS, ...CUDA_ONLY_EXPORTS];
    expect(new Set(all).size).toBe(all.length);
    for (const name of all) expect(name, name).toMatch(/^([a-z0-9]+(_[a-z0-9]+)*|[a-z]+([A-Z][a-z0-9]*)*|[A-Z][A-Za-z]+)$/);
  });

  it('the cpu addon exports exactly the shared kernels and its own calls', () => {
    expect(sorted(Object.keys(cpu()))).toEqual(sorted([...BACKEND_KERNELS, ...CPU_ONLY_EXPORTS]));
    for (const name of BACKEND_KERNELS) expect(typeof cpu()[name], name).toBe('function');
  });

  it.runIf(cudaBuilt)('the cuda addon exports exactly the shared kernels and its own calls', () => {
    const addon = cuda();
    expect(sorted(Object.keys(addon))).toEqual(sorted([...BACKEND_KERNELS, ...CUDA_ONLY_EXPORTS]));
    for (const name of BACKEND_KERNELS) expect(typeof addon[name], name).toBe('function');
  });
});
