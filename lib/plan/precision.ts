// What nodetron's ops keep in each training precision (the f32 and bf16 profiles, measured with
// `nodetron plan --calibrate`), the CPU allocator's size classes they are rounded to, and the bf16
// GEMM path of this process's cpu backend.
import { cpu as cpuAddon } from '../native.js';
import type { Bf16GemmPath } from './memory.js';

/**
 * The bf16 GEMM path of this process's cpu backend: 'native' when the AVX512_BF16 kernel runs now,
 * 'widen' when bf16 GEMMs are widened to f32 for cblas_sgemm; 'native' where the addon cannot load.
 */
export function cpuBf16Path(): Bf16GemmPath {
  try {
    return (cpuAddon().gemmBf16Kernel() as { kernel: string }).kernel === 'sgemm' ? 'widen' : 'native';
  } catch {
    return 'native';
  }
}

/** Counts of same-sized activation tensors: how many are f32 and how many 16-bit. */
export interface TensorCounts {
  /** f32 tensors. */
  f32: number;
  /** 16-bit (bf16/f16) tensors. */
  half: number;
}

/**
 * What nodetron's ops keep in one training precision, in tensors of s·b·h elements (whole: every
 * tensor-parallel rank holds it; split: 1/tp of it per rank). Measured on the CPU backend with
 * `nodetron plan --calibrate` (test/plan/calibration.test.ts); the f32 figures are the F32_* constants.
 */
export interface PrecisionProfile {
  /** Saved for backward per block, whole-width. */
  blockReplicated: TensorCounts;
  /** Saved for backward per block, split. */
  blockSplit: TensorCounts;
  /** Made per block and saved by nothing, alive until the micro-batch's forward ends, whole-width. */
  transientReplicated: TensorCounts;
  /** The same, split. */
  transientSplit: TensorCounts;
  /** Kept per block between ZB-H1's B and W, whole-width. */
  deferredReplicated: TensorCounts;
  /** The same, split. */
  deferredSplit: TensorCounts;
  /** Context parallelism's one more split tensor per layer (ring: the compact queries; Ulysses: the head-sharded output). */
  contextLayer: TensorCounts;
  /** Ulysses' whole-sequence q, k, v kept until the forward ends (split, per layer). */
  ulyssesTransient: TensorCounts;
  /** Outside the blocks without a pipeline (whole-width). */
  embedding: TensorCounts;
  /** Outside the blocks on a pipeline stage, per micro-batch in flight (whole-width). */
  stageOutside: Readonly<Record<'first' | 'middle' | 'last', TensorCounts>>;
  /** Bytes per weight parameter of the 16-bit copies autocast makes once per micro-batch's forward and its ops save for backward (0 in f32). */
  weightCopyBytes: number;
  /** Bytes per element of the fused head's logits block and of the table and input gradients it makes in the forward. */
  headBytes: 2 | 4;
}

const counts = (f32: number, half = 0): TensorCounts => ({ f32, half });

/** nodetron's CPU allocator size classes (native/core/core.cc sizeClass): 64-byte steps below 64 KiB, else eight steps per power of two. */
export function sizeClass(bytes: number): number {
  if (bytes <= 0) return 0;
  if (bytes < 65536) return Math.ceil(bytes / 64) * 64;
  const p = 2 ** Math.floor(Math.log2(bytes));
  const step = p / 8;
  return Math.ceil(bytes / step) * step;
}

// ---- nodetron's f32 training on CPU: what its ops keep, measured (test/plan/calibration.test.ts) ----
/**
 * f32 elements of s·b·h a GPT block keeps for backward (its autograd graph's saved tensors; the
 * intermediates nothing saves are released when the micro-batch's forward ends), measured as the
 * peak's growth per extra layer (`nodetron plan --calibrate`, 2 against 4 layers): 16 in all without
 * tensor parallelism, 10 per rank at tp 2 and 8 with sequence parallelism too, beside the attention
 * probabilities. Solving those: 12 lie in tensor-parallel tensors (QKV output and its per-head
 * q/k/v, attention output, MLP hidden and its GELU) and 4 in tensors every tensor-parallel rank
 * holds whole (LayerNorm inputs and outputs; 1/tp of them under sequence parallelism).
 */
export const F32_BLOCK_REPLICATED = 4;
/** f32 elements of s·b·h a GPT block keeps in tensor-parallel tensors (see F32_BLOCK_REPLICATED). */
export const F32_BLOCK_SPLIT = 12;
/**
 * What attention keeps per layer beside its inputs and output: flash attention (lib/ops/attention.ts)
 * saves one f32 log-sum-exp per query and head, [b, heads/tp, s], and never the T×T probabilities.
 */
export const F32_SCORES = 1;
/**
 * f32 elements of s·b·h a GPT block's forward makes that nothing saves (permuted copies, the
 * projections' outputs before their residual add): alive until the micro-batch's forward ends, so
 * at the fused head, which runs inside the forward. Measured as the growth per extra layer of what
 * is allocated when the head starts, beyond the saved tensors: 9 in all, taken as 7 in
 * tensor-parallel tensors and 2 in whole ones (the two projections' outputs).
 */
export const F32_BLOCK_TRANSIENT_SPLIT = 7;
/** f32 elements of s·b·h a block's forward leaves unsaved in tensors every tensor-parallel rank holds whole (see F32_BLOCK_TRANSIENT_SPLIT). */
export const F32_BLOCK_TRANSIENT_REPLICATED = 2;
/** Whole-width s·b·h f32 tensors per block a micro-batch keeps between ZB-H1's B and W (the QKV and MLP inputs, both projections' output gradients). */
export const F32_DEFERRED_REPLICATED = 4;
/** Split s·b·h/tp f32 tensors per block kept between B and W (the projections' inputs 1 + 4, the QKV's output gradient 3, the MLP's pre-GELU value and gradient 4 + 4). */
export const F32_DEFERRED_SPLIT = 16;
/** s·b·h f32 tensors outside the blocks kept for backward without a pipeline: token + position embedding sum and the final LayerNorm's input and output (measured: 3). */
export const F32_EMBEDDING = 3;
/**
 * s·b·h f32 tensors outside the blocks a pipeline stage keeps per in-flight micro-batch: the first
 * its output (the schedule holds the sent output until the micro-batch's backward) and the
 * embedding's own; a middle stage its output (its received input is its first block's LayerNorm
 * input, counted in the block); the last the final LayerNorm's input and output and one more, as
 * without a pipeline (the 3 of F32_EMBEDDING). Measured on PP3 and PP4 middle stages
 * (test/plan/calibration.test.ts).
 */
export const F32_STAGE_OUTSIDE: Readonly<{
  /** The first stage: its output and the embedding's own. */
  first: number;
  /** A middle stage: its output. */
  middle: number;
  /** The last stage: the final LayerNorm's input and output, and one more. */
  last: number;
}> = { first: 2, middle: 1, last: 3 };

/** nodetron's f32 training (the F32_* constants). */
export const F32_PROFILE: Readonly<PrecisionProfile> = {
  blockReplicated: counts(F32_BLOCK_REPLICATED), blockSplit: counts(F32_BLOCK_SPLIT),
  transientReplicated: counts(F32_BLOCK_TRANSIENT_REPLICATED), transientSplit: counts(F32_BLOCK_TRANSIENT_SPLIT),
  deferredReplicated: counts(F32_DEFERRED_REPLICATED), deferredSplit: counts(F32_DEFERRED_SPLIT),
  contextLayer: counts(1), ulyssesTransient: counts(3),
  embedding: counts(F32_EMBEDDING),
  stageOutside: { first: counts(F32_STAGE_OUTSIDE.first), middle: counts(F32_STAGE_OUTSIDE.middle), last: counts(F32_STAGE_OUTSIDE.last) },
  weightCopyBytes: 0, headBytes: 4,
};

/**
 * nodetron's bf16 autocast (PyTorch's policy: GEMMs and attention in bf16, norms and losses in f32,
 * f32 weights). Per block it saves the two LayerNorms' f32 inputs and the 16-bit casts of their
 * outputs (the QKV and MLP inputs), whole-width; the 16-bit QKV output (3), attention output (1),
 * MLP pre-activation (4) and GELU output (4), split. Measured by walking the autograd graph of the
 * calibration model under bf16 autocast, and by the peak's growth per layer (`nodetron plan
 * --calibrate --dtype bf16`, 2 against 4 layers).
 */
export const BF16_PROFILE: Readonly<PrecisionProfile> = {
  blockReplicated: counts(2, 2), blockSplit: counts(0, 12),
  transientReplicated: counts(2, 2), transientSplit: counts(0, 0),
  deferredReplicated: counts(0, 4), deferredSplit: counts(0, 16),
  contextLayer: counts(0, 1), ulyssesTransient: counts(0, 3),
  embedding: counts(3),
  stageOutside: { first: counts(2), middle: counts(1), last: counts(3) },
  weightCopyBytes: 2, headBytes: 2,
};
