// Per-rank memory of a training layout: parameters, gradients and optimizer state (ZeRO's split),
// activations (Korthikanti et al. 2022 for 16-bit training; nodetron's own f32 tensors, calibrated
// on its CPU allocator, for f32), the fused LM head's chunk of logits and its gradients, communication
// buckets, ZeRO-3's gathered layers.
import { ArgumentError } from '../errors.js';
import type { LayoutRequest } from '../parallel/layout.js';
import { LINEAR_CE_CHUNK_BYTES, LINEAR_CE_CUDA_CHUNK_BYTES, linearCrossEntropyChunkRows } from '../ops/linear-cross-entropy.js';
import { largestLayerParams, layerParams, stageExpertParams, stageLayers, stageParams, type PlanModel } from './models.js';
import { cpu as cpuAddon } from '../native.js';
import { checkSchedule, rankOfVirtualStage, schedulePlacement, scheduleTables, splitsBackward, virtualStageOf, type ScheduleKind } from '../parallel/pipeline/schedules.js';

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

/** What a stage holds at one point of its schedule, in micro-batches of the whole stage (a chunk counts 1/v). */
export interface ScheduleState {
  /** Forward done, backward not (all of its saved tensors). */
  held: number;
  /** ZB-H1: input gradient done, weight gradient not (the linear layers' inputs and output gradients). */
  deferred: number;
  /** Interleaved: receives posted at the step's start and not yet taken (boundary-sized buffers). */
  posted: number;
  /** Micro-batches in flight on the rank's last chunk (on the last stage: those whose head gradients wait for their backward). */
  lastChunk: number;
  /** Whether a backward ran before (the gradients exist). */
  afterBackward: boolean;
  /** Whether the forward that led here ran the rank's last chunk (on the last stage: the head). */
  onLastChunk: boolean;
}

/**
 * The states a pipeline stage passes through under the layout's schedule, read from the schedule's
 * own table (lib/parallel/pipeline/schedules.ts), one right after each forward (where memory peaks);
 * one micro-batch without a pipeline.
 */
export function scheduleStates(layout: PlanLayout, stage: number): ScheduleState[] {
  const v = layout.virtualStages ?? 1, p = layout.pp, m = layout.microBatches;
  if (p === 1) return [{ held: 1, deferred: 0, posted: 0, lastChunk: 1, afterBackward: m > 1, onLastChunk: true }];
  checkSchedule(layout.schedule, { stages: p, microBatches: m, chunks: v }, 'plan');
  // The planner asks for the same few schedules over and over (every candidate, every stage).
  const key = `${layout.schedule}/${p}/${m}/${v}/${stage}`;
  let states = statesCache.get(key);
  if (!states) {
    states = computeStates(layout, stage);
    if (statesCache.size > 4096) statesCache.clear();
    statesCache.set(key, states);
  }
  return states;
}

const statesCache = new Map<string, ScheduleState[]>();

function computeStates(layout: PlanLayout, stage: number): ScheduleState[] {
  const v = layout.virtualStages ?? 1, p = layout.pp, m = layout.microBatches;
  const table = scheduleTables(layout.schedule, { stages: p, microBatches: m, chunks: v })[stage]!;
  // Interleaving posts every receive first: activations for chunks after the first virtual stage,
  // gradients for chunks before the last.
  // ZB-V too, but for the last rank's hand-offs between its own two chunks.
  const placement = schedulePlacement(layout.schedule), postsFirst = layout.schedule === 'interleaved' || layout.schedule === 'zb-v';
  const remote = (vs: number) => vs >= 0 && vs < p * v && rankOfVirtualStage(vs, p, placement).rank !== stage;
  const postsInput = (c: number) => remote(virtualStageOf(stage, c, p, placement) - 1);
  const postsGrad = (c: number) => remote(virtualStageOf(stage, c, p, placement) + 1);
  let posted = 0;
  if (postsFirst) for (let c = 0; c < v; c++) posted += m * ((postsInput(c) ? 1 : 0) + (postsGrad(c) ? 1 : 0));
  const out: ScheduleState[] = [];
  let held = 0, deferred = 0, lastChunk = 0, afterBackward = false;
  const split = splitsBackward(layout.schedule);
  for (const a of table) {
    const last = a.chunk === v - 1 ? 1 : 0;
    if (a.op === 'F') { held++; lastChunk += last; if (postsFirst && postsInput(a.chunk)) posted--; }
    else if (a.op === 'B') { held--; lastChunk -= last; if (split) deferred++; if (postsFirst && postsGrad(a.chunk)) posted--; }
    else deferred--;
    if (a.op === 'B') afterBackward = true;
    // Memory peaks in forwards (a backward frees more than it makes): the states right after each.
    if (a.op === 'F') out.push({ held: held / v, deferred: deferred / v, posted, lastChunk, afterBackward, onLastChunk: last === 1 });
  }
  return out;
}

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

/** nodetron's CPU allocator size classes (native/core/core.cc sizeClass): 64-byte steps below 64 KiB, else eight steps per power of two. */
export function sizeClass(bytes: number): number {
  if (bytes <= 0) return 0;
  if (bytes < 65536) return Math.ceil(bytes / 64) * 64;
  const p = 2 ** Math.floor(Math.log2(bytes));
  const step = p / 8;
  return Math.ceil(bytes / step) * step;
}

/**
 * Korthikanti et al. 2022 (Table 2), bytes of one layer's activations in 16-bit training for a
 * micro-batch of b sequences of s tokens: sbh(34 + 5as/h) without parallelism; with tensor
 * parallelism t sbh(10 + 24/t + 5as/(ht)); with sequence parallelism too sbh(34/t + 5as/(ht));
 * selective recomputation drops the 5as/h attention-core term; full recomputation keeps 2sbh (the
 * layer's input; /t under sequence parallelism). The MLP's share (16 of 24) scales with ffn/(4h),
 * ×1.5 for a gated MLP, as Megatron's theoretical_memory_usage.py scales 18 + 4·ffn/h.
 */
export function korthikantiLayerBytes(m: PlanModel, s: number, b: number, t: number, sp: boolean, recompute: Recompute): number {
  const h = m.nEmbd, a = m.nHead;
  const mlp = 16 * (m.ffn / (4 * h)) * (m.gated ? 1.5 : 1);
  const split = 8 + mlp, replicated = 10;
  const sbh = s * b * h;
  if (recompute === 'full') return (2 * sbh) / (sp ? t : 1);
  const core = recompute === 'selective' ? 0 : (5 * a * s) / (h * t);
  return sbh * ((sp ? replicated / t : replicated) + split / t + core);
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

function bucketBytesOf(o: MemoryOptions): number { return o.bucketBytes ?? 25 * 2 ** 20; }

/**
 * Context parallelism's communication buffers in one layer's attention, for sl local tokens of b
 * sequences and hl = h/tp channels per rank, w bytes per element. Ring: the key/value block held and
 * the one arriving ([k|v] × sl·b·hl each), in backward with their two gradient accumulators and the
 * block's scratch gradients (4 more). Ulysses: the all-to-all's send and receive copies of q, k, v
 * (2 × 3 × sl·b·hl).
 */
export function contextBuffers(layout: PlanLayout, sl: number, b: number, hl: number, w: number): number {
  const cp = layout.cp ?? 1;
  if (cp === 1) return 0;
  const block = sl * b * hl * w;
  return (layout.cpMode ?? 'ring') === 'ring' ? 8 * block : 6 * block;
}

/**
 * Micro-batches whose activations stage `stage` holds at once: 1F1B min(pp − stage, m), GPipe all m;
 * interleaved its table's peak of chunks in flight over v (Megatron: (1 + (p − 1)/(p·v))·p on the first
 * stage); ZB-H1 the peak of forwards whose backward has not run; one at a time without a pipeline.
 */
export function inFlightMicroBatches(layout: PlanLayout, stage: number): number {
  if (layout.pp === 1) return 1;
  if (layout.schedule === 'gpipe') return layout.microBatches;
  if (layout.schedule === '1f1b') return Math.min(layout.pp - stage, layout.microBatches);
  return Math.max(...scheduleStates(layout, stage).map((s) => s.held));
}

function checkLayout(m: PlanModel, l: PlanLayout, o: MemoryOptions): void {
  const bad: string[] = [];
  for (const k of ['dp', 'tp', 'pp', 'microBatches'] as const) if (!Number.isInteger(l[k]) || l[k] < 1) bad.push(`${k} must be an integer >= 1`);
  if (!Number.isInteger(o.seq) || o.seq < 1 || !Number.isInteger(o.microBatchSize) || o.microBatchSize < 1) bad.push('seq and microBatchSize must be integers >= 1');
  if (l.pp > m.nLayer) bad.push(`pp ${l.pp} exceeds the ${m.nLayer} layers`);
  if (o.model !== undefined && o.model !== 'nodetron' && o.model !== 'megatron') bad.push(`model must be 'nodetron' or 'megatron', got ${JSON.stringify(o.model)}`);
  else if (o.model === 'megatron' && o.dtype === 'f32') bad.push('model \'megatron\' is the published bf16 recipe; f32 is estimated for nodetron only');
  if (o.backend !== undefined && o.backend !== 'cpu' && o.backend !== 'cuda') bad.push(`backend must be 'cpu' or 'cuda', got ${JSON.stringify(o.backend)}`);
  if (o.bf16Path !== undefined && o.bf16Path !== 'native' && o.bf16Path !== 'widen') bad.push(`bf16Path must be 'native' or 'widen', got ${JSON.stringify(o.bf16Path)}`);
  else if (o.bf16Path === 'widen' && (o.backend ?? (o.dtype === 'f32' ? 'cpu' : 'cuda')) === 'cuda') bad.push("bf16Path 'widen' is the cpu backend's fallback; cuda runs bf16 GEMMs natively");
  if (bad.length) throw new ArgumentError(`estimateMemory: ${bad.join('; ')}`);
}

/** The memory of one pipeline stage's rank (tensor-parallel rank 0, data-parallel rank 0). */
export function estimateStageMemory(m: PlanModel, layout: PlanLayout, opts: MemoryOptions, stage: number): MemoryEstimate {
  checkLayout(m, layout, opts);
  const { tp: t, pp, dp, zero } = layout;
  const ep = layout.ep ?? 1;
  const sp = layout.sequenceParallel && t > 1;
  // zb-v's V: stage 0 holds both ends of the model, every stage a chunk on the way down and one back.
  const placement = schedulePlacement(layout.schedule);
  const sp_ = stageParams(m, t, pp, stage, ep, placement);
  const psi = sp_.total;
  // The routed experts held here (1/ep of them): ZeRO shards them over the dp/ep ranks holding the same experts.
  const expertPsi = stageExpertParams(m, pp, stage, ep);
  const first = stage === 0, last = placement === 'v' ? stage === 0 : stage === pp - 1;
  const nLayers = sp_.layers;
  // Context parallelism: this rank's tokens of each sequence; ZeRO shards over the dp × cp ranks.
  const cp = layout.cp ?? 1;
  const s = opts.seq / cp, b = opts.microBatchSize, h = m.nEmbd;
  const inFlight = inFlightMicroBatches(layout, stage);
  const shard = Math.ceil((psi - expertPsi) / (dp * cp)) + Math.ceil(expertPsi / (dp / ep));
  const f32 = opts.dtype === 'f32';
  const w = f32 ? 4 : 2;
  const published = !f32 && (opts.model ?? 'megatron') === 'megatron';
  // Expert parallelism: the running MoE layer's routed rows, sent to the experts' ranks and received back.
  const moeLayersHere = m.moe ? nLayers * (Math.floor(m.nLayer / m.moe.every) / m.nLayer) : 0;
  const allToAll = ep > 1 && moeLayersHere > 0 ? 2 * s * b * m.moe!.topK * h * w : 0;
  const moeFields = m.moe ? { expertParams: expertPsi, allToAll } : {};
  // The published recipe keeps 16-bit weights and gradients beside a 12-byte optimizer state; nodetron
  // keeps f32 weights and gradients in both precisions (autocast casts the weights per forward).
  const K = opts.optimizerBytesPerParam ?? (published ? 12 : 8);
  const stateW = published ? 2 : 4;
  // ZeRO (Rajbhandari et al. 2020): (2 + 2 + K)Ψ, sharding K from stage 1, gradients from 2, weights at 3.
  const params = stateW * (zero === 3 ? shard : psi);
  let grads = stateW * (zero >= 2 ? shard : psi);
  let optimizerState = K * (zero >= 1 ? shard : psi);
  let hostBytes = 0;
  if (layout.offload && zero > 0) {
    hostBytes = optimizerState + (zero >= 2 ? grads : 0);
    optimizerState = 0;
    if (zero >= 2) grads = 0;
  }
  let activations: number, logits = 0, buffers = 0;
  // The fused head sees every row of the micro-batch (sequence parallelism gathers them) over the
  // vocabulary held here, LINEAR_CE_CHUNK_BYTES of logits at a time.
  const localVocab = m.vocabSize / t;
  const chunkElems = (bytes: number) => linearCrossEntropyChunkRows(s * b, localVocab, bytes) * localVocab;
  if (published) {
    // Context parallelism keeps one more [s/cp, b, h/t] tensor per layer (ring: the compact queries;
    // Ulysses: the head-sharded output beside the merged one).
    const layer = korthikantiLayerBytes(m, s, b, t, sp, layout.recompute) + (cp > 1 && layout.recompute !== 'full' ? (w * s * b * h) / t : 0);
    // Megatron (theoretical_memory_usage.py): the embedding's dropout output sbh·2 bytes per in-flight micro-batch,
    // its input ids 8sb; under full recomputation, one layer's activations rebuilt during its backward.
    activations = inFlight * (nLayers * layer + (first ? (2 * s * b * h) / (sp ? t : 1) + 8 * s * b : 0));
    // ZB-H1: the micro-batches between B and W keep their linear layers' inputs and output gradients (16-bit).
    if (splitsBackward(layout.schedule) && pp > 1 && layout.recompute !== 'full') {
      const deferred = Math.max(...scheduleStates(layout, stage).map((x) => x.deferred));
      activations += deferred * nLayers * 2 * s * b * h * (F32_DEFERRED_REPLICATED / (sp ? t : 1) + F32_DEFERRED_SPLIT / t);
    }
    if (layout.recompute === 'full' && nLayers > 0) activations += korthikantiLayerBytes(m, s, b, t, sp, 'none');
    // The last stage's fused head: one chunk of 16-bit logits (overwritten by its gradient), its fp32
    // copy for the weight gradient, which accumulates over the chunks in an fp32 [V/t, h] buffer.
    if (last) logits = chunkElems(2) * (2 + 4) + 4 * localVocab * h;
    if (dp * cp > 1) buffers += 2 * bucketBytesOf(opts); // a bucket being filled and one in flight
    buffers += contextBuffers(layout, s, b, h / t, w);
    // ZeRO-3 gathers a layer before use and prefetches the next: DeepSpeed counts 4 bytes per parameter of the largest layer.
    if (zero === 3) buffers += 4 * Math.min(largestLayerParams(m), psi) / t;
    buffers += allToAll;
    const subtotal = params + grads + optimizerState + activations + logits + buffers;
    const overhead = subtotal * ((opts.overhead ?? 1.1) - 1);
    return { stage, numParams: psi, params, grads, optimizerState, activations, logits, buffers, overhead, total: subtotal + overhead, hostBytes, inFlight, ...moeFields };
  }
  // f32 on nodetron's CPU allocator (measured with `nodetron plan --calibrate`). The peak is the
  // largest of these moments of a step:
  // - the forward of a micro-batch (every stage but the last): the in-flight micro-batches' saved
  //   tensors, the running forward's unsaved intermediates, and every gradient when an earlier
  //   micro-batch's backward has made them (1F1B with m > pp − stage; accumulation without a pipeline);
  // - the fused head on the last stage (the head runs inside the forward): the above, one chunk of
  //   logits, and the head's gradients it makes in the forward (the [V/tp, h] table's and the
  //   input's), held until the micro-batch's backward;
  // - a backward on a later pipeline stage: the gradients beside the in-flight micro-batches' saved
  //   tensors (a middle stage's peak under GPipe);
  // - the end of the first stage's backward: every gradient and the token table's dense [V/tp, h]
  //   gradient before it is added, with the activations of the micro-batches still in flight.
  const sc = sizeClass;
  const P = f32 ? F32_PROFILE : BF16_PROFILE;
  const backend = opts.backend ?? (f32 ? 'cpu' : 'cuda');
  // A [V/tp, h] table at the head's element size: the table gradient the head makes in its forward;
  // in 16 bits also the size of autocast's copy of the table.
  const headTable = sc((P.headBytes * m.vocabSize * h) / t);
  const unitRep = (4 * s * b * h) / (sp ? t : 1);
  // Elements of a whole-width and of a split s·b·h tensor, and the bytes of `c` such tensors of each kind.
  const eRep = (s * b * h) / (sp ? t : 1), eSplit = (s * b * h) / t;
  const n = (c: TensorCounts, elems: number) => c.f32 * sc(4 * elems) + c.half * sc(2 * elems);
  const scores = 4 * b * (m.nHead / t) * s;
  // Context parallelism keeps one more [s/cp, b, h/t] tensor per layer (ring: the compact queries;
  // Ulysses: the head-sharded output beside the merged one).
  const fullLayer = n(P.blockReplicated, eRep) + n(P.blockSplit, eSplit) + F32_SCORES * sc(scores) + (cp > 1 ? n(P.contextLayer, eSplit) : 0);
  const storedLayer = layout.recompute === 'full' ? sc(unitRep) : fullLayer;
  // Each in-flight micro-batch's saved tensors (1F1B: min(pp − stage, m); GPipe: m; no pipeline: one),
  // and the s·b·h tensors outside its blocks (F32_EMBEDDING without a pipeline; F32_STAGE_OUTSIDE in one).
  const outside = n(pp === 1 ? P.embedding : P.stageOutside[first ? 'first' : last ? 'last' : 'middle'], eRep);
  // Under autocast each micro-batch's forward casts the layers' weights once (16-bit), and its ops
  // save the copies for backward (a recomputed block casts them again in its backward).
  const weightCopies = layout.recompute === 'full' ? 0 : P.weightCopyBytes * sp_.layerParams;
  const perHeld = nLayers * storedLayer + outside + weightCopies;
  // ZB-H1: between a micro-batch's B and its W the linear layers keep their inputs (2 whole-width and
  // 5 split s·b·h tensors per block), their output gradients (2 whole and 7 split: the QKV's, the
  // projections', the MLP's pre-GELU one) and the MLP's pre-GELU value (4 split); the rest of its saved
  // tensors went with B. Recomputed blocks compute every gradient in B.
  // On the last stage the fused head's [V/tp, h] weight gradient, made in the forward, waits for W too.
  const perDeferred = (layout.recompute === 'full' ? 0 : nLayers * (n(P.deferredReplicated, eRep) + n(P.deferredSplit, eSplit)))
    + (last ? headTable : 0);
  const standard = layout.schedule === 'gpipe' || layout.schedule === '1f1b' || pp === 1;
  const states = standard ? [] : scheduleStates(layout, stage);
  const stateActivations = (x: ScheduleState) => x.held * perHeld + x.deferred * perDeferred;
  const worst = standard ? null : states.reduce((a, x) => (stateActivations(x) + x.posted * sc(unitRep) > stateActivations(a) + a.posted * sc(unitRep) ? x : a));
  const held = worst ? Math.max(...states.map((x) => x.held)) : inFlightMicroBatches(layout, stage);
  activations = worst ? stateActivations(worst) : held * perHeld;
  // Gradients are alive from a micro-batch's first backward to the optimizer step (zeroGrad frees them).
  // ZeRO 1/2 keep an fp32 master shard.
  const accumulating = pp > 1 || layout.microBatches > 1;
  const allGrads = 4 * (zero >= 2 ? shard : psi);
  grads = accumulating ? allGrads : 0;
  // A forward after this stage's first backward: 1F1B runs pp − stage − 1 warm-up forwards, then one
  // forward and one backward; GPipe runs every forward first.
  const gradsInForward = (pp === 1 || layout.schedule === '1f1b') && layout.microBatches > pp - stage;
  if (zero === 1 || zero === 2) buffers += 4 * shard;
  buffers += contextBuffers(layout, s, b, h / t, w) + allToAll;
  // ZeRO 3 keeps the embeddings, final norm and tied head gathered from the forward to the step.
  const table = (4 * m.vocabSize * h) / t;
  if (zero === 3) buffers += sc(table) + 4 * (sp_.embedding + sp_.head - (first ? table / 4 : 0) - (last && !first ? table / 4 : 0));
  // The head's logits block; in 16 bits over several chunks also the f32 accumulator of the table's
  // gradient, and autocast's 16-bit copy of the table, alive until the forward ends.
  const budget = backend === 'cuda' ? LINEAR_CE_CUDA_CHUNK_BYTES : LINEAR_CE_CHUNK_BYTES;
  const headRows = linearCrossEntropyChunkRows(s * b, localVocab, P.headBytes, budget);
  // bf16 on the cpu fallback ('widen'): a GEMM of op(A) [r, k], op(B) [k, n], C [r, n] makes f32 copies
  // of its 16-bit A, B and C (native/cpu/kernels/gemm.cc, F32View), alive while it runs. A linear
  // layer's forward and its two backward GEMMs (dX = dY·W, dW = dYᵀ·X) copy the same three sizes (the
  // weight's 16-bit autocast copy among them); the head's three per chunk the x rows, the [V/tp, h]
  // table and the [rows, V/tp] logits block or its gradient. The largest of a block's linear layers
  // (QKV, attention projection, MLP up and down) counts where a block's GEMM runs, the head's at the head.
  const widen = !f32 && (opts.bf16Path ?? (backend === 'cpu' ? cpuBf16Path() : 'native')) === 'widen';
  const gemmViews = (r: number, k: number, c: number) => sc(4 * r * k) + sc(4 * k * c) + sc(4 * r * c);
  const blockViews = widen && nLayers > 0
    ? Math.max(gemmViews(s * b, h, (3 * h) / t), gemmViews(s * b, h / t, h), gemmViews(s * b, h, m.ffn / t), gemmViews(s * b, m.ffn / t, h))
    : 0;
  const headViews = widen && last ? gemmViews(headRows, h, localVocab) : 0;
  const tableGrad = sc(table);
  const chunk = sc(P.headBytes * headRows * localVocab)
    + (P.headBytes === 2 ? (headRows < s * b ? sc(table) : 0) + headTable : 0);
  // The head's forward: each micro-batch whose head ran and whose backward has not holds its table
  // and input gradients; the one running holds a chunk of logits. Under GPipe every forward comes
  // before any backward (no gradients yet); under 1F1B or accumulation later heads meet them.
  const headGrads = headTable + sc(P.headBytes * s * b * h);
  // The running micro-batch's forward has not ended: its blocks' unsaved intermediates are alive
  // (a recomputed block keeps none).
  // Ulysses saves the whole-sequence q, k, v it gathered instead of this rank's, which then stays until the forward ends (3 more).
  const ulyssesTransient = cp > 1 && layout.cpMode === 'ulysses' ? n(P.ulyssesTransient, eSplit) : 0;
  const transient = layout.recompute === 'full' ? 0 : nLayers * (n(P.transientReplicated, eRep) + n(P.transientSplit, eSplit) + ulyssesTransient);
  const laterHead = last && accumulating && !(pp > 1 && layout.schedule === 'gpipe');
  interface Phase { grads: number; activations: number; logits: number; buffers: number }
  const phases: Phase[] = [];
  // The head's gradients wait per micro-batch in flight on the last chunk (all of them but under interleaving).
  const headHeld = standard ? held : Math.max(...states.map((x) => x.lastChunk));
  if (standard) {
    if (last) phases.push({ grads: laterHead ? grads : 0, activations, logits: chunk, buffers: headHeld * headGrads + transient + headViews });
    else phases.push({ grads: gradsInForward ? allGrads : 0, activations, logits: 0, buffers: transient + blockViews });
  } else {
    // Interleaved and ZB-H1: each forward of the table with what is held then (the last stage's head
    // on its last chunk; interleaving's posted receives; the gradients once a backward has run).
    for (const x of states) {
      const posted = x.posted * sc(unitRep);
      if (last && x.onLastChunk) phases.push({ grads: x.afterBackward ? grads : 0, activations: stateActivations(x), logits: chunk, buffers: x.lastChunk * headGrads + transient + posted + headViews });
      else phases.push({ grads: x.afterBackward ? allGrads : 0, activations: stateActivations(x), logits: 0, buffers: transient + posted + blockViews });
    }
  }
  // A backward on a later stage: the other in-flight micro-batches' saved tensors beside the running
  // one's, whose layers free their activations as their gradients appear (last layer first): at worst
  // every gradient with the first layer's activations, or one layer's gradients with all of them.
  if (pp > 1 && !first) {
    const perMicroBatch = held > 0 ? activations / held : 0;
    const layerGrads = (4 * layerParams(m, t, ep)) / (zero >= 2 ? dp : 1);
    const running = Math.max(allGrads + storedLayer + outside, Math.min(allGrads, layerGrads) + perMicroBatch);
    phases.push({ grads: allGrads, activations: (held - 1) * perMicroBatch + running - allGrads, logits: 0, buffers: blockViews });
  }
  // The end of the first stage's backward of a micro-batch, when the embedding makes the token
  // table's dense gradient. Without a pipeline the head's gradient of the tied table is already
  // there, so the new one is a second [V/tp, h] tensor until it is added; the activations are freed.
  // In a pipeline the first stage has no head: the first micro-batch's table gradient becomes .grad,
  // each later one is added to it, beside the micro-batches still in flight after that backward.
  // In 16 bits the head's 16-bit table gradient, handed to backward, is still held then (its f32 cast is in grads).
  if (first && pp === 1) phases.push({ grads: allGrads, activations: 0, logits: 0, buffers: tableGrad + (P.headBytes === 2 ? headTable : 0) });
  else if (first) {
    const perMicroBatch = held > 0 ? activations / held : 0;
    // After the k-th backward: 1F1B runs w = min(pp − 1, m) warm-up forwards, then each of its first
    // m − w backwards follows a forward (w stay in flight), then the cool-down drains them; GPipe is w = m.
    const mb = layout.microBatches;
    const w = layout.schedule === 'gpipe' ? mb : Math.min(pp - 1, mb);
    // Interleaved and ZB-H1: as many as the table holds at its peak, less the one just done.
    const after = standard ? (k: number) => (k < mb - w ? w : mb - 1 - k) : (k: number) => Math.max(0, held - (k + 1) / (layout.virtualStages ?? 1));
    phases.push({ grads: allGrads, activations: after(0) * perMicroBatch, logits: 0, buffers: 0 });
    if (mb > 1) phases.push({ grads: allGrads, activations: after(1) * perMicroBatch, logits: 0, buffers: tableGrad });
  }
  const sum = (p: Phase) => p.grads + p.activations + p.logits + p.buffers;
  // The first of equal phases wins (the forward's breakdown).
  const peak = phases.reduce((a, p) => (sum(p) > sum(a) ? p : a));
  // Full recomputation: one layer's activations rebuilt in its backward (after the head is done).
  const headPhase = last ? headHeld * headGrads + chunk + transient + headViews : 0;
  const recomputeExtra = layout.recompute === 'full' && nLayers > 0 ? Math.max(0, fullLayer + 4 * psi - headPhase) : 0;
  activations = peak.activations + recomputeExtra;
  logits = peak.logits;
  buffers += peak.buffers;
  // The allocator's size classes round the weights and each of Adam's two moments, and the token
  // table's [V/tp, h] gradient (the other gradients are small tensors; ZeRO 2/3 shard them flat).
  const tables = (first ? 1 : 0) + (last && !(first && m.tied) ? 1 : 0);
  const gradRounding = peak.grads > 0 && zero < 2 ? tables * (tableGrad - table) : 0;
  const rounding = sc(params) - params + (optimizerState > 0 ? 2 * sc(optimizerState / 2) - optimizerState : 0) + gradRounding;
  // On cuda a factor for the caching allocator's fragmentation and workspaces (an assumption).
  const factor = backend === 'cuda' ? (opts.overhead ?? 1.1) - 1 : 0;
  const overhead = rounding + factor * (params + peak.grads + optimizerState + activations + logits + buffers + rounding);
  const total = params + peak.grads + optimizerState + activations + logits + buffers + overhead;
  return { stage, numParams: psi, params, grads: peak.grads, optimizerState, activations, logits, buffers, overhead, total, hostBytes, inFlight: held, ...moeFields };
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
