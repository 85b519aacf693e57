// Bad input never crashes the process: each case asserts the error class and that work goes on.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cpu } from '../../lib/native.js';

/** Runs a healthy op after an error to show the process (and addon) still work. */
function stillWorks(): void {
  const a = nt.ones([2, 3]), b = nt.ones([3, 2]);
  expect(Array.from(nt.matmul(a, b).toArraySync())).toEqual([3, 3, 3, 3]);
}

function expectError(fn: () => unknown, cls: new (...a: any[]) => nt.NodetronError, code: string, pattern?: RegExp): void {
  let caught: unknown;
  try { fn(); } catch (e) { caught = e; }
  expect(caught).toBeInstanceOf(cls);
  expect(caught).toBeInstanceOf(nt.NodetronError);
  expect((caught as nt.NodetronError).code).toBe(code);
  if (pattern) expect((caught as Error).message).toMatch(pattern);
  stillWorks();
}

describe('bad input gets typed errors', () => {
  it('wrong shapes', () => {
    expectError(() => nt.matmul(nt.ones([2, 3]), nt.ones([2, 3])), nt.ShapeError, 'ERR_SHAPE', /inner dimensions differ/);
    expectError(() => nt.matmul(nt.ones([2, 2, 3]), nt.ones([3, 3, 2])), nt.ShapeError, 'ERR_SHAPE', /batch dimensions/);
    expectError(() => nt.ones([6]).reshape([4, -1]), nt.ShapeError, 'ERR_SHAPE');
    expectError(() => nt.ones([6]).reshape([4, 2]), nt.ShapeError, 'ERR_SHAPE');
    expectError(() => nt.tensor([1, 2, 3], [2, 2]), nt.ShapeError, 'ERR_SHAPE', /needs 4 elements/);
    expectError(() => nt.tensor([[1, 2], [3]]), nt.ShapeError, 'ERR_SHAPE', /ragged/);
  });

  it('mismatched and unsupported dtypes', () => {
    expectError(() => nt.matmul(nt.ones([2, 2]), nt.ones([2, 2], { dtype: 'bf16' })), nt.DTypeError, 'ERR_DTYPE', /dtypes differ/);
    expectError(() => nt.matmul(nt.ones([2, 2], { dtype: 'i32' }), nt.ones([2, 2], { dtype: 'i32' })), nt.DTypeError, 'ERR_DTYPE');
    expectError(() => nt.zeros([2], { dtype: 'f64' as never }), nt.DTypeError, 'ERR_DTYPE', /unknown dtype/);
  });

  it('unknown or mismatched devices', () => {
    expectError(() => nt.zeros([2], { device: 'tpu' }), nt.DeviceError, 'ERR_DEVICE', /unknown device/);
    expectError(() => nt.zeros([2], { device: 'cpu:3' }), nt.DeviceError, 'ERR_DEVICE');
  });

  it('disposed tensors', () => {
    const t = nt.ones([2, 2]);
    t.dispose();
    t.dispose(); // idempotent
    expect(t.disposed).toBe(true);
    expectError(() => t.toArraySync(), nt.DisposedError, 'ERR_DISPOSED');
    expectError(() => nt.matmul(t, nt.ones([2, 2])), nt.DisposedError, 'ERR_DISPOSED');
    expectError(() => t.reshape([4]), nt.DisposedError, 'ERR_DISPOSED');
    // The native layer refuses a released storage too, whatever the JS layer does.
    const s = nt.ones([4]);
    const storage = s.storage;
    s.dispose();
    expectError(() => cpu().fill(storage, 0, 4, 1), nt.DisposedError, 'ERR_DISPOSED', /disposed/);
  });

  it('negative, fractional, NaN and absurd sizes', () => {
    expectError(() => nt.zeros([-1]), nt.ArgumentError, 'ERR_ARGUMENT', /non-negative integer/);
    expectError(() => nt.zeros([2.5]), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.zeros([NaN]), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.zeros([Infinity]), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.zeros([1e15]), nt.OutOfMemoryError, 'ERR_OUT_OF_MEMORY', /cannot allocate/);
    expectError(() => nt.zeros([1e7, 1e7]), nt.OutOfMemoryError, 'ERR_OUT_OF_MEMORY');
    expectError(() => nt.zeros([1e9, 1e9]), nt.ArgumentError, 'ERR_ARGUMENT', /2\^53/);
    expectError(() => nt.arange(0, 10, 0), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.full([2], NaN as unknown as number).reshape([3]), nt.ShapeError, 'ERR_SHAPE');
  });

  it('wrong argument types, in JS and at the native boundary', () => {
    expectError(() => nt.zeros('3' as never), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.tensor({} as never), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.tensor(['a'] as never), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.matmul(null as never, nt.ones([1])), nt.ArgumentError, 'ERR_ARGUMENT');
    expectError(() => nt.full([2], 'x' as never), nt.ArgumentError, 'ERR_ARGUMENT');
    const addon = cpu();
    expectError(() => addon.fill({} as never, 0, 1, 1), nt.ArgumentError, 'ERR_ARGUMENT', /Storage/);
    expectError(() => addon.fill(nt.ones([2]).storage, 0, 3, 1), nt.ArgumentError, 'ERR_ARGUMENT', /outside a storage/);
    expectError(() => addon.gemm(), nt.ArgumentError, 'ERR_ARGUMENT', /expected 15 to 16 arguments/);
    expectError(() => addon.cast(nt.ones([2]).storage, 9, nt.ones([2]).storage, 0, 2), nt.DTypeError, 'ERR_DTYPE');
    expectError(() => new addon.Storage(-5, false), nt.ArgumentError, 'ERR_ARGUMENT');
  });

  it('errors from native code carry the failed call and the caller\'s stack', () => {
    let err: nt.NodetronError | undefined;
    function userFunction() { cpu().fill(nt.ones([1]).storage, 0, 99, 0); }
    try { userFunction(); } catch (e) { err = e as nt.NodetronError; }
    expect(err?.call).toBe('fill');
    expect(err?.stack).toMatch(/userFunction/);
  });
});
