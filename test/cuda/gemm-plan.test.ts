// The host-only parts of the cuBLASLt GEMM (native/cuda/gemm_plan.h, through the test-only addon):
// the alignment each matrix is declared with, the bounded plan cache, the choice between cuBLASLt's
// fused epilogue and the composed one, and the books of the per-stream workspaces. No GPU needed.
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

describe('how gemm_epilogue runs an epilogue (lt::planEpilogue)', () => {
  const E = { none: 0, bias: 1, gelu: 2, geluBias: 3, bgrad: 4, dgeluBgrad: 5 };
  const plan = (c: Record<string, unknown>) => testingAddon().gemmEpiloguePlan({ m: 16, n: 32, ...c }) as
    { fused: boolean; intoAux: boolean; copyCToAux: boolean; perMatrix: boolean };
  const composed = { fused: false, intoAux: false, copyCToAux: false, perMatrix: false };

  it('fuses when allowed and cuBLASLt both offers and accepts an algorithm', () => {
    for (const e of [E.bias, E.gelu, E.geluBias, E.bgrad, E.dgeluBgrad]) expect(plan({ epilogue: e }).fused).toBe(true);
    expect(plan({ epilogue: E.none })).toEqual(composed);  // a plain GEMM has nothing to fuse
  });

  it('composes when cublasLtMatmul answers NOT_SUPPORTED after a successful heuristic, when the heuristic finds nothing, or when the aux breaks cuBLASLt\'s rules', () => {
    for (const e of [E.bias, E.gelu, E.geluBias, E.bgrad, E.dgeluBgrad]) {
      expect(plan({ epilogue: e, fusedNotSupported: true }).fused).toBe(false);
      expect(plan({ epilogue: e, heuristicFound: false }).fused).toBe(false);
    }
    expect(plan({ epilogue: E.geluBias, aux: true, auxFits: false })).toEqual({ ...composed, intoAux: true });
  });

  it('NODETRON_CUDA_EPILOGUES=0 composes every epilogue', () => {
    for (const e of [E.bias, E.gelu, E.geluBias, E.bgrad, E.dgeluBgrad]) expect(plan({ epilogue: e, fusedAllowed: false }).fused).toBe(false);
  });

  it('a GELU forward with an aux makes the pre-activation in aux, copying C there first when beta != 0', () => {
    const off = { fusedAllowed: false };
    expect(plan({ ...off, epilogue: E.gelu, aux: true })).toEqual({ ...composed, intoAux: true });
    expect(plan({ ...off, epilogue: E.geluBias, aux: true, betaZero: false })).toEqual({ ...composed, intoAux: true, copyCToAux: true });
    // without an aux the product is made in C and GELU runs in place, beta or not
    expect(plan({ ...off, epilogue: E.geluBias, betaZero: false })).toEqual(composed);
    // the bias epilogue never uses aux
    expect(plan({ ...off, epilogue: E.bias, aux: true, betaZero: false })).toEqual(composed);
  });

  it('a GELU over a strided batch runs one matrix at a time; contiguous batches and the bias kernel run as one', () => {
    const off = { fusedAllowed: false, batch: 4 };
    expect(plan({ ...off, epilogue: E.gelu, strideC: 16 * 32 + 8 }).perMatrix).toBe(true);
    expect(plan({ ...off, epilogue: E.gelu, strideC: 16 * 32 }).perMatrix).toBe(false);
    expect(plan({ ...off, epilogue: E.bias, strideC: 16 * 32 + 8 }).perMatrix).toBe(false);  // addBiasKernel takes the stride
    expect(plan({ fusedAllowed: false, epilogue: E.gelu, batch: 1, strideC: 0 }).perMatrix).toBe(false);
  });
});

describe('cuBLASLt workspaces per stream (lt::WorkspaceTable)', () => {
  const MiB32 = 32 * 2 ** 20;
  const trace = (ops: (string | number)[][]) => testingAddon().gemmWorkspaceTrace(MiB32, ops) as { count: number; bytes: number; freed: number[] }[];

  it('one workspace per stream, freed when the stream (a graph\'s side stream) is destroyed', () => {
    const t = trace([['use', 0], ['use', 0], ['use', 5], ['use', 7], ['destroy', 5], ['destroy', 5], ['use', 0]]);
    expect(t.map((r) => r.count)).toEqual([1, 1, 2, 3, 2, 2, 2]);
    expect(t.map((r) => r.bytes / MiB32)).toEqual([1, 1, 2, 3, 2, 2, 2]);
    expect(t[4]!.freed).toEqual([2]);  // stream 5's workspace (the second one made)
    expect(t[5]!.freed).toEqual([]);   // destroying twice frees nothing more
  });

  it('teardown frees every remaining workspace', () => {
    const t = trace([['use', 0], ['use', 3], ['destroy', 3], ['use', 4], ['teardown'], ['use', 0]]);
    expect(t[4]).toEqual({ count: 0, bytes: 0, freed: [1, 3] });
    expect(t[5]).toMatchObject({ count: 1, bytes: MiB32 });  // a later GEMM makes one again
  });

  it('many graphs made and disposed hold no workspace afterwards', () => {
    const ops: (string | number)[][] = [['use', 0]];
    for (let s = 1; s <= 100; s++) ops.push(['use', s], ['destroy', s]);
    const t = trace(ops);
    expect(t.at(-1)).toMatchObject({ count: 1, bytes: MiB32 });
    expect(Math.max(...t.map((r) => r.count))).toBe(2);
  });
});
