// Per-rank memory of a training layout: parameters, gradients and optimizer state (ZeRO's split),
// activations (Korthikanti et al. 2022 for 16-bit training; nodetron's own f32 tensors, calibrated
// on its CPU allocator, for f32), the fused LM head's chunk of logits and its gradients, communication
// buckets, ZeRO-3's gathered layers. This file is the entry: the layout and option types, and the
// whole-layout estimate; one stage's estimate is in stage-memory.ts, the schedule's states in
// schedule-states.ts, what each precision's ops keep in precision.ts.
import { ArgumentError } from '../errors.js';
import type { LayoutRequest } from '../parallel/layout.js';
import type { PlanModel } from './models.js';
import { estimateStageMemory } from './stage-memory.js';

export { scheduleStates, inFlightMicroBatches, type ScheduleState } from './schedule-states.js';
export {
  cpuBf16Path, sizeClass, F32_BLOCK_REPLICATED, F32_BLOCK_SPLIT, F32_SCORES, F32_BLOCK_TRANSIENT_SPLIT, F32_BLOCK_TRANSIENT_REPLICATED,
  F32_DEFERRED_REPLICATED, F32_DEFERRED_SPLIT, F32_EMBEDDING, F32_STAGE_OUTSIDE, F32_PROFILE, BF16_PROFILE, type TensorCounts, type PrecisionProfile,
} from './precision.js';
export { estimateStageMemory, korthikantiLayerBytes, contextBuffers } from './stage-memory.js';

/** Activation recomputation: none, Megatron's selective (attention core only) or full (each layer's input kept). */
export type Recompute = 'none' | 'selective' | 'full';

/**
 * One candidate layout: the trainer's own layout (the mesh, ZeRO, sequence parallelism, the pipeline
 * schedule; virtual stages may be left out) plus activation recomputation. Context parallelism's cp
 * ranks each hold seq/cp tokens of every sequence (gradients average and ZeRO shards over dp × cp);
 * expert parallelism's ep ranks each hold experts/ep of every MoE layer's routed experts, whose ZeRO
 * shards span the dp/ep ranks holding the same experts.
 */
export type PlanLayout = LayoutRequest & {
  /** Activation recomputation. */
  recompute: Recompute;
};

/** Training precision: bf16 mixed precision (16-bit weights, fp32 master and Adam moments) or plain f32 (nodetron on CPU). */
export type PlanDType = 'bf16' | 'f32';

/** Options of {@link estimateMemory}. */
export interface MemoryOptions {
  /** Sequence length. */
  seq: number;
  /** Sequences per micro-batch on one data-parallel replica. */
  microBatchSize: number;
  /** Training precision. */
  dtype: PlanDType;
  /** Gradient bucket bytes (nodetron's default 25 MiB). */
  bucketBytes?: number;
  /**
   * Factor on the total for the caching allocator's fragmentation and the CUDA context's workspaces
   * (default 1.1: an assumption, not a measurement), for the published bf16 model and for nodetron's
   * on cuda. nodetron's on cpu ignores it: it rounds each large tensor to the CPU allocator's size
   * class instead.
   */
  overhead?: number;
  /** Optimizer state bytes per parameter beside the weights (K): 8 for nodetron's Adam (m, v beside its f32 weights), 12 for the published recipe's (fp32 master, m, v). */
  optimizerBytesPerParam?: number;
  /**
   * Whose bf16 training is estimated (default 'megatron'; f32 is always nodetron's). 'megatron': the
   * published mixed-precision recipe, the ZeRO paper's (2 + 2 + K)Ψ with K = 12 and Korthikanti et
   * al.'s activations. 'nodetron': what nodetron's own bf16 autocast keeps (f32 weights, gradients and
   * Adam moments; per micro-batch in flight the 16-bit copies of the weights and the tensors its ops
   * save), measured on its CPU backend (`nodetron plan --calibrate --dtype bf16`); its cuda side (the
   * head's 1 GiB chunks, the allocator) waits for a GPU run to be measured.
   */
  model?: 'nodetron' | 'megatron';
  /**
   * The backend whose op variants and allocator the nodetron model follows (default: 'cuda' for bf16,
   * 'cpu' for f32). It sets the fused head's chunk budget (64 MiB on cpu, 1 GiB on cuda) and, on
   * cuda, the overhead factor on the total.
   */
  backend?: 'cpu' | 'cuda';
  /**
   * How the nodetron model's backend runs 16-bit GEMMs (bf16 only). 'native': on 16-bit operands as
   * they are (cuBLASLt on cuda; the AVX512_BF16 kernel on cpu). 'widen': the cpu fallback
   * (`nt.info().cpu.bf16Gemm.kernel` 'sgemm': no AVX512_BF16, a SIMD level below avx512, or
   * NODETRON_BF16_GEMM=fallback), where each GEMM makes f32 copies of its 16-bit operands and output
   * for cblas_sgemm, alive while it runs: at the fused head a [rows, V/tp] f32 block beside the
   * table's f32 copy. Default: 'native' on cuda; on cpu the kernel this process's addon runs now
   * ('native' where the addon cannot load). cuda has no 'widen'.
   */
  bf16Path?: Bf16GemmPath;
}

/** How 16-bit GEMMs run: on the 16-bit operands ('native') or on f32 copies of them ('widen', the cpu fallback). */
export type Bf16GemmPath = 'native' | 'widen';

/** Bytes one rank holds at its peak, by kind. */
export interface MemoryEstimate {
  /** The pipeline stage of this estimate (the worst one for estimateMemory). */
  stage: number;
  /** Parameters this rank's stage holds before ZeRO sharding (its tensor-parallel slices). */
  numParams: number;
  /** Parameter bytes. */
  params: number;
  /** Gradient bytes. */
  grads: number;
  /** Optimizer state bytes on the device (0 for the part offloaded to the host). */
  optimizerState: number;
  /** Activation bytes kept for backward. */
  activations: number;
  /**
   * Bytes of the last stage's logits: the fused head (linearCrossEntropy) holds one chunk of rows
   * of them at a time, never the whole [B·T, V/tp] nor its gradient (0 on other stages).
   */
  logits: number;
  /** Communication buckets (gradient buckets in flight; ZeRO-3's gathered layers; expert parallelism's all-to-all buffers, also in `allToAll`). */
  buffers: number;
  /**
   * Expert parallelism (ep > 1): the all-to-all buffers of the MoE layer running, part of `buffers`: its
   * routed rows (tokens · topK of width h) sent to the experts' ranks and received back, as send and
   * receive buffers (balanced routing; 0 without expert parallelism).
   */
  allToAll?: number;
  /** The routed experts' parameters this rank holds (part of numParams; absent for a dense model). */
  expertParams?: number;
  /** Allocator overhead (bf16: the overhead factor; f32: included in the size classes of the other kinds). */
  overhead: number;
  /** The sum of the above, in bytes. */
  total: number;
  /** Bytes kept in host memory (offloaded optimizer state and gradient shards). */
  hostBytes: number;
  /** Micro-batches whose activations this stage holds at once. */
  inFlight: number;
}

/** The memory of every pipeline stage's rank. */
export function estimateStages(m: PlanModel, layout: PlanLayout, opts: MemoryOptions): MemoryEstimate[] {
  return Array.from({ length: layout.pp }, (_, s) => estimateStageMemory(m, layout, opts, s));
}

/** The per-rank memory of a layout: its most loaded pipeline stage. */
export function estimateMemory(m: PlanModel, layout: PlanLayout, opts: MemoryOptions): MemoryEstimate {
  for (const k of ['dp', 'tp', 'pp', 'microBatches'] as const) {
    const v = layout?.[k];
    if (!Number.isSafeInteger(v) || v < 1) throw new ArgumentError(`estimateMemory: layout.${k} must be an integer >= 1, got ${String(v)}`);
  }
  return estimateStages(m, layout, opts).reduce((a, e) => (e.total > a.total ? e : a));
}
