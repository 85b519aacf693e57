// Published memory formulas, re-derived so tests can pin the planner to them: DeepSpeed's model-state
// estimates (deepspeed/runtime/zero/stage_1_and_2.py, deepspeed/runtime/zero/stage3.py, as of
// DeepSpeed 0.19.6) and Megatron-LM's theoretical memory (megatron/training/theoretical_memory_usage.py
// at its main of 2026-08-22, for sequence parallelism with selective recomputation). DeepSpeed has no ZeRO-1 estimator (its
// memory API, docs/code-docs/source/memory.rst, covers ZeRO-2 and ZeRO-3); Megatron's distributed
// optimizer (megatronWeightAndOptimizerBytes with useDistributedOptimizer) is the ZeRO-1 split.

/**
 * DeepSpeed's estimate_zero2_model_states_mem_needs (deepspeed/runtime/zero/stage_1_and_2.py) as it
 * is since DeepSpeed 0.14.3 (PR #5099, June 2024) and still in 0.19.6: [cpu bytes per node, gpu
 * bytes per GPU]. Without offload a GPU holds its 16-bit parameters whole and 18 bytes per parameter
 * of its 1/N partition: 2 (16-bit gradients) + 4 (fp32 gradients) + 4 (fp32 master) + 8 (Adam's two
 * moments), i.e. 2Ψ + 18Ψ/N. Before 0.14.3 DeepSpeed computed 4Ψ + 16Ψ/N (4-byte weights and
 * gradients); DeepSpeed's own memory.rst still prints that formula's numbers (t5-3b on 8 GPUs:
 * 15.93 GB without offload, 11.28 GB by the current one). With optimizer offload the GPU keeps 2Ψ
 * (unchanged by #5099) and each node's host max(4N, 16)Ψ × the buffer factor.
 */
export function deepspeedZero2Estimate(totalParams: number, gpusPerNode = 1, nodes = 1, cpuOffload = true, bufferFactor = 1.5): {
  /** Host bytes per node. */
  cpu: number;
  /** Device bytes per GPU. */
  gpu: number;
} {
  const totalGpus = nodes * gpusPerNode;
  if (cpuOffload) return { gpu: Math.trunc(2 * totalParams), cpu: Math.trunc(totalParams * Math.max(4 * totalGpus, 16) * bufferFactor) };
  return { gpu: Math.trunc(2 * totalParams + Math.trunc((18 * totalParams) / totalGpus)), cpu: Math.trunc(totalParams * 4 * gpusPerNode * bufferFactor) };
}

/**
 * DeepSpeed's estimate_zero3_model_states_mem_needs (deepspeed/runtime/zero/stage3.py), unchanged
 * since it was added in DeepSpeed 0.4.2 (PR #965, June 2021) through 0.19.6: per GPU 4 bytes × the
 * largest layer's parameters (the gathered layer) plus 18Ψ/N without offload, + 2Ψ/N with the
 * optimizer offloaded, nothing more with parameters offloaded too; host bytes per node as below.
 * (DeepSpeed's function also returns the largest layer's bytes, `largest` here.)
 */
export function deepspeedZero3Estimate(totalParams: number, largestLayerParams: number, gpusPerNode = 1, nodes = 1,
  opts: { cpuOffload?: boolean; cpuOffloadParams?: boolean; zeroInit?: boolean; bufferFactor?: number } = {}): {
  /** Host bytes per node. */
  cpu: number;
  /** Device bytes per GPU. */
  gpu: number;
  /** The gathered largest layer's bytes (4 × its parameters), DeepSpeed's third return value. */
  largest: number;
} {
  const { cpuOffload = true, cpuOffloadParams = true, zeroInit = true, bufferFactor = 1.5 } = opts;
  const totalGpus = nodes * gpusPerNode, gpusFactor = 1 / nodes, largest = 4 * largestLayerParams;
  let gpu: number, cpu: number;
  if (cpuOffload) {
    if (cpuOffloadParams) {
      gpu = largest;
      cpu = totalParams * (zeroInit ? 18 * gpusFactor : Math.max(4 * gpusPerNode, 18 * gpusFactor)) * bufferFactor;
    } else {
      gpu = largest + Math.trunc((2 * totalParams) / totalGpus);
      cpu = totalParams * (zeroInit ? 16 * gpusFactor : Math.max(4 * gpusPerNode, 16 * gpusFactor)) * bufferFactor;
    }
  } else {
    gpu = largest + Math.trunc((18 * totalParams) / totalGpus);
    cpu = (zeroInit ? largestLayerParams : totalParams) * 4 * gpusPerNode * bufferFactor;
  }
  return { cpu: Math.trunc(cpu), gpu: Math.trunc(gpu), largest };
}

/** The Megatron arguments its theoretical memory reads. */
export interface MegatronArgs {
  /** Transformer layers (--num-layers). */
  numLayers: number;
  /** Hidden width (--hidden-size). */
  hiddenSize: number;
  /** Attention heads (--num-attention-heads). */
  numAttentionHeads: number;
  /** MLP hidden width (--ffn-hidden-size). */
  ffnHiddenSize: number;
  /** Vocabulary size after padding. */
  paddedVocabSize: number;
  /** Sequence length (--seq-length). */
  seqLength: number;
  /** Sequences per micro-batch (--micro-batch-size). */
  microBatchSize: number;
  /** Tensor-parallel size. */
  tensorParallel: number;
  /** Pipeline-parallel size. */
  pipelineParallel: number;
  /** Data-parallel size. */
  dataParallel: number;
  /** The distributed optimizer (optimizer state sharded over dp, as ZeRO 1). */
  useDistributedOptimizer: boolean;
  /** A separate LM head instead of one tied to the embedding. */
  untieEmbeddings?: boolean;
  /** SwiGLU MLP (three matrices). */
  swiglu?: boolean;
  /** Key/value head groups (grouped-query attention); default numAttentionHeads. */
  numQueryGroups?: number;
}

/**
 * Megatron-LM's compute_weight_and_optimizer_memory (megatron/training/theoretical_memory_usage.py)
 * for dense models, as it is since PR #4687 (May 2026) and still at its 2026-08-22 main: the first
 * stage's parameters on one tensor-parallel rank × 18 bytes (6 + 12/dp with the distributed
 * optimizer, the ZeRO-1 split). Its layers/pp attention and MLP matrices and the embedding are split
 * by tp; its LayerNorms (2 per layer, weight and bias) are replicated. An untied output layer adds a
 * second embedding without a pipeline; the final LayerNorm is not counted. Before #4687 Megatron
 * divided everything (the norms, and the final norm's 2h, too) by tp.
 */
export function megatronWeightAndOptimizerBytes(a: MegatronArgs): number {
  const groups = a.numQueryGroups ?? a.numAttentionHeads;
  const gated = a.swiglu ? 1.5 : 1;
  const h = a.hiddenSize;
  const attention = 2 * h * h * (1 + groups / a.numAttentionHeads);
  const mlp = 2 * h * a.ffnHiddenSize * gated;
  const norms = 2 * h * 2;
  const embedding = h * a.paddedVocabSize;
  let tpSharded = ((a.numLayers * (attention + mlp)) / a.pipelineParallel + embedding) / a.tensorParallel;
  if (a.untieEmbeddings && a.pipelineParallel === 1) tpSharded += embedding / a.tensorParallel;
  const replicated = (a.numLayers * norms) / a.pipelineParallel;
  return (tpSharded + replicated) * (a.useDistributedOptimizer ? 6 + 12 / a.dataParallel : 18);
}

/** Megatron's compute_activation_memory (first stage, sequence parallel + selective recomputation, non-interleaved). */
export function megatronActivationBytes(a: MegatronArgs, numMicrobatches?: number): number {
  const s = a.seqLength, b = a.microBatchSize, h = a.hiddenSize, p = a.pipelineParallel;
  let act = s * b * h * (18 + 4 * (a.ffnHiddenSize / h)) * a.numLayers;
  act += 8 * s * b * p + s * b * h * p;
  if (p > 1 && numMicrobatches !== undefined) act *= Math.min(1, numMicrobatches / p);
  if (p === 1) act += s * b * h * 4 * (1 + a.paddedVocabSize / h);
  return act / a.tensorParallel;
}
