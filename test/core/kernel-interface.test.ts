// One kernel interface: both addons export exactly the functions lib/native.ts declares
// (BackendKernels, plus each addon's own list), so a kernel cannot exist on one backend only, under
// another name, or as a leftover no code calls. The cuda addon is checked wherever it was built; it
// loads without a GPU.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
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

// Calls that are not kernels (memory, errors, the parent-death signal, the dispatch floor) have no signature.
const RUNTIME = new Set(['Storage', 'setErrorFactory', 'memoryStats', 'resetPeakMemory', 'emptyCache', 'setParentDeathSignal', 'noop']);

describe('one declarative signature per kernel (native/core/signatures.h)', () => {
  const kernels = BACKEND_KERNELS.filter((k) => !RUNTIME.has(k));
  const addons = () => [['cpu', cpu()] as const, ...(cudaBuilt ? [['cuda', cuda()] as const] : [])];

  it('every kernel of the interface has one: a call without arguments names the declared list', () => {
    for (const [backend, addon] of addons()) {
      for (const name of kernels) {
        let err: unknown;
        try { addon[name](); } catch (e) { err = e; }
        expect(err, `${backend} ${name}`).toBeInstanceOf(ArgumentError);
        expect((err as Error).message, `${backend} ${name}`).toMatch(new RegExp(`^${name}: expected \\d+( to \\d+)? arguments \\(\\w+:`));
      }
    }
  });

  it('both backends reject a wrong count or kind the same way, naming the argument', () => {
    // A cpu storage serves both: the signature is checked before a binding touches memory or a device.
    const s = new (cpu().Storage)(64, true);
    for (const [backend, addon] of addons()) {
      expect(() => addon.gelu_forward(s, s, 4), backend).toThrow('gelu_forward: expected 4 arguments (inp:s out:s n:n dtype:d), got 3');
      expect(() => addon.gelu_forward(s, s, 4, 0, 1), backend).toThrow(/expected 4 arguments/);
      expect(() => addon.gelu_forward(s, null, 4, 0), backend).toThrow('gelu_forward: argument 1 (out) must be a storage');
      expect(() => addon.softmax_forward(s, s, 2, 2, 0, 1), backend).toThrow('softmax_forward: argument 5 (log) must be a boolean');
      expect(() => addon.binary(0, s, s, s, 0, [1], new Int32Array([1]), new Int32Array([1])), backend).toThrow('binary: argument 5 (outShape) must be an Int32Array');
      expect(() => addon.sum_squares(s, [1], [0]), backend).toThrow('sum_squares: argument 0 (storages) must be an array of storages');
    }
    s.dispose();
    expect(cpu().noop()).toBeUndefined();
  });
});
