// ABI parity of the two backends (no GPU needed): every kernel lib/ops and lib/optim call through
// `t.backend.<name>(...)` exists on the cuda addon, validates the same argument count as the cpu one,
// and fails with a typed NodetronError (not a crash) when it cannot run.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { ArgumentError, BackendUnavailableError, NodetronError } from '../../lib/errors.js';
import { CUDA_ONLY_EXPORTS, cpu, cudaAddonLoadable, cuda as cudaAddon, packageRoot } from '../../lib/native.js';

function tsFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? tsFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Every kernel name called on a tensor's backend anywhere in lib/. */
function backendCalls(): string[] {
  const names = new Set<string>();
  for (const f of tsFiles(join(packageRoot, 'lib')))
    for (const m of readFileSync(f, 'utf8').matchAll(/\bbackend\.([A-Za-z_]\w*)\(/g)) names.add(m[1]!);
  return [...names].sort();
}

/** The message of what fn throws (it must throw a NodetronError). */
function thrown(fn: () => unknown): NodetronError {
  try { fn(); } catch (e) {
    expect(e).toBeInstanceOf(NodetronError);
    return e as NodetronError;
  }
  throw new Error('expected a throw');
}

const loadable = cudaAddonLoadable();
const names = backendCalls();
// Calls lib/ makes only on cuda tensors (e.g. gemm_epilogue for linear's bias): cuda-only exports.
const cudaOnly = new Set<string>(CUDA_ONLY_EXPORTS);
const shared = names.filter((n) => !cudaOnly.has(n));

describe('kernel names lib/ calls on a backend', () => {
  it('are found in the sources (the scan sees the ops and optimizers)', () => {
    for (const n of ['gemm', 'binary', 'unary', 'sum_to', 'copy_strided', 'attention_softmax_forward', 'adamw_step', 'sum_squares'])
      expect(names).toContain(n);
    for (const n of shared) expect(typeof cpu()[n], `cpu ${n}`).toBe('function');
    expect(names.filter((n) => cudaOnly.has(n))).toEqual(['gemm_epilogue']);
  });
});

describe.skipIf(!loadable.ok)(`cuda addon ABI parity${loadable.ok ? '' : ` (skipped: ${loadable.reason})`}`, () => {
  it('exports every kernel lib/ops and lib/optim call', () => {
    const missing = names.filter((n) => typeof cudaAddon()[n] !== 'function');
    expect(missing).toEqual([]);
  });

  it('validates the same argument count as the cpu backend (ArgumentError "expected N arguments")', () => {
    const expected = (addon: ReturnType<typeof cpu>, n: string) => {
      const e = thrown(() => addon[n]());
      expect(e, `${n}: ${e.message}`).toBeInstanceOf(ArgumentError);
      return /expected (\d+(?: to \d+)?) arguments/.exec(e.message)?.[1];
    };
    const mismatched = shared
      .map((n) => ({ n, cpu: expected(cpu(), n), cuda: expected(cudaAddon(), n) }))
      .filter((r) => r.cpu === undefined || r.cpu !== r.cuda);
    expect(mismatched).toEqual([]);
  });

  it('a kernel given cpu storages or no GPU fails typed, and the process stays healthy', () => {
    const x = nt.tensor([1, 2, 3, 4]), y = nt.zeros([4]);
    for (const n of ['unary', 'gelu_forward', 'copy_strided'] as const) {
      const args: Record<string, unknown[]> = {
        unary: [0, x.storage, y.storage, 4, 0, 0],
        gelu_forward: [x.storage, y.storage, 4, 0],
        copy_strided: [x.storage, y.storage, 0, new Int32Array([4]), new Int32Array([1]), 0, new Int32Array([1]), 0],
      };
      const e = thrown(() => cudaAddon()[n](...args[n]!));
      expect(e.message).toMatch(new RegExp(n));
    }
    if (!nt.cuda.isAvailable()) expect(() => nt.zeros([2], { device: 'cuda' })).toThrow(BackendUnavailableError);
    expect(Array.from(nt.add(x, x).toArraySync())).toEqual([2, 4, 6, 8]);
    x.dispose(); y.dispose();
  });
});
