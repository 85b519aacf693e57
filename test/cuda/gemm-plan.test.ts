// The host-only parts of the cuBLASLt GEMM (native/cuda/gemm_plan.h, through the test-only addon):
// the alignment each matrix is declared with, and the bounded plan cache. No GPU needed.
import { describe, expect, it } from 'vitest';
import { testingAddon } from '../../lib/testing/native.js';

const align = (address: number, batch = 1, strideBytes = 0): number => testingAddon().gemmAlignment(address, batch, strideBytes);

describe('cuBLASLt alignment declared per matrix', () => {
  it('is the largest power of two <= 256 dividing the address', () => {
    const base = 2 ** 32;  // allocator blocks are 512-byte aligned
    expect(align(base)).toBe(256);
    expect(align(base + 512)).toBe(256);
    expect(align(base + 128)).toBe(128);
    expect(align(base + 2 * 3)).toBe(2);  // bf16 element 3 of a storage
    expect(align(base + 4 * 5)).toBe(4);  // f32 element 5
    expect(align(base + 16 * 7)).toBe(16);
    expect(align(base + 1)).toBe(1);
    expect(align(0)).toBe(256);
  });

  it('with a strided batch, also divides the batch stride (every matrix of the batch)', () => {
    const base = 2 ** 32;
    expect(align(base, 4, 17 * 33 * 4)).toBe(4);    // f32 17x33 matrices
    expect(align(base, 4, 17 * 33 * 2)).toBe(2);    // bf16
    expect(align(base, 4, 64 * 64 * 2)).toBe(256);
    expect(align(base, 4, 0)).toBe(256);            // shared operand: one matrix
    expect(align(base, 1, 6)).toBe(256);            // a batch of one reads no stride
    expect(align(base + 32, 8, 1024)).toBe(32);
  });
});

describe('cuBLASLt plan cache (LRU)', () => {
  const trace = (capacity: number, keys: number[]) => testingAddon().gemmPlanCacheTrace(capacity, keys) as
    { hits: boolean[]; size: number; hitCount: number; misses: number; evictions: number; heldSurvives: boolean };

  it('builds a plan once per key and finds it on repeats', () => {
    const t = trace(8, [1, 2, 1, 1, 3, 2]);
    expect(t.hits).toEqual([false, false, true, true, false, true]);
    expect(t).toMatchObject({ size: 3, hitCount: 3, misses: 3, evictions: 0 });
  });

  it('stays bounded, evicting the least recently used', () => {
    // capacity 2: 1, 2, touch 1, add 3 (evicts 2), 1 is still there, 2 is rebuilt (evicts 3)
    const t = trace(2, [1, 2, 1, 3, 1, 2, 3]);
    expect(t.hits).toEqual([false, false, true, false, true, false, false]);
    expect(t).toMatchObject({ size: 2, evictions: 3 });
  });

  it('a plan held by a running call survives its eviction', () => {
    const t = trace(1, [1, 2, 3, 4]);
    expect(t.evictions).toBe(3);
    expect(t.heldSurvives).toBe(true);
  });
});
