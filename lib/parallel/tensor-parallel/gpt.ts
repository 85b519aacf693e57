// The GPT (and Llama) of lib/nn split across a tensor-parallel group the Megatron way: attention heads and the
// MLP's hidden units by Column/RowParallelLinear (Llama's key/value heads split, or replicated when
// fewer than the ranks: llama.ts), the vocabulary (token table, tied head, loss) by
// rows; with sequence parallelism the regions between them hold a chunk of the sequence per rank.
// Each rank's weights are exact slices of the single-process model built from the same seed.
import { ArgumentError, ShapeError } from '../../errors.js';
import type { Module, Parameter } from '../../nn/module.js';
import { clipFactor, globalGradNorm, gradSumSquares, scaleGrads } from '../../optim/clip.js';
import { GPT, padVocab, type GPTConfig, type GPTOptions, type LinearFactory, type SequenceLayout, type VocabLayout } from '../../nn/gpt.js';
import { constant, normal } from '../../nn/init.js';
import { linear } from '../../ops/index.js';
import type { Generator } from '../../random.js';
import type { Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { ColumnParallelLinear, RowParallelLinear, sequenceGatheredLinear } from './layers.js';
import { copyToRegion, gatherFromRegion } from './mappings.js';
import { VocabParallelEmbedding, vocabParallelCrossEntropy, vocabParallelLinearCrossEntropy } from './vocab.js';
import { checkKvHeadsSplit, ReplicatedKvLinear } from './llama.js';

/**
 * Throws one ArgumentError listing every reason a GPT cannot be split `tp` ways: the attention
 * heads, the width and the vocabulary must each divide evenly. Needs no communication.
 */
export function checkTensorParallelConfig(config: Pick<GPTConfig, 'nHead' | 'nEmbd' | 'vocabSize'>, tp: number): void {
  if (!Number.isInteger(tp) || tp < 1) throw new ArgumentError(`tensor parallelism: the group size must be a positive integer, got ${tp}`);
  const problems: string[] = [];
  if (config.nHead % tp !== 0) problems.push(`the ${config.nHead} attention heads`);
  if (config.nEmbd % tp !== 0) problems.push(`the width ${config.nEmbd}`);
  if (config.vocabSize % tp !== 0) {
    problems.push(`the vocabulary of ${config.vocabSize} tokens (pad it: padVocab(${config.vocabSize}, ${tp}) = ${padVocab(config.vocabSize, tp)})`);
  }
  if (problems.length) throw new ArgumentError(`tensor parallelism over ${tp} ranks must divide ${problems.join(', ')}`);
}

/** How tensor parallelism holds the sequence between its layers. */
export interface TensorParallelOptions {
  /**
   * Sequence parallelism (Korthikanti et al.): LayerNorms, residual adds, dropout and the embedding
   * sum each hold 1/tp of the sequence; sequence lengths must divide by tp. Default false.
   */
  sequenceParallel?: boolean;
}

const normalInit = (std: number) => (t: Tensor, g: Generator): void => { normal(t, 0, std, g); };
const zeroInit = (t: Tensor): void => { constant(t, 0); };

/**
 * Linear layers of a GPT block split across `group`: the fused QKV and the MLP's first layer by
 * output rows (QKV interleaved by 3, so each rank holds whole heads of q, k and v), both output
 * projections by input columns, whose partial products are summed. Weights are drawn N(0, std) at
 * full size from the shared generator (as defaultLinearFactory draws them) and sliced. Under
 * sequenceParallel the column-parallel layers gather their input's sequence and the row-parallel
 * ones reduce-scatter their output to the chunks.
 */
export function tensorParallelLinearFactory(group: CollectiveGroup, { sequenceParallel = false }: TensorParallelOptions = {}): LinearFactory {
  return (inF, outF, { role, bias, std, layer, config, attention }) => {
    checkTensorParallelConfig(config, group.size);
    const opts = { group, bias, device: layer.device, dtype: layer.dtype, generator: layer.generator, initWeight: normalInit(std), initBias: zeroInit, sequenceParallel };
    switch (role) {
      case 'attn.qkv': return new ColumnParallelLinear(inF, outF, { ...opts, interleave: 3 });
      case 'mlp.fc': return new ColumnParallelLinear(inF, outF, opts);
      case 'attn.proj':
      case 'mlp.proj': return new RowParallelLinear(inF, outF, opts);
      // Llama: query heads split; key/value heads split when tp divides them, else each rank holds the one its query heads read.
      case 'attn.q':
      case 'attn.k':
      case 'attn.v': {
        if (!attention) throw new ArgumentError(`tensorParallelLinearFactory: the '${role}' layer needs its attention heads`);
        checkKvHeadsSplit(attention, group.size);
        if (role !== 'attn.q' && attention.kvHeads % group.size !== 0) {
          if (bias) throw new ArgumentError(`tensor parallelism over ${group.size} ranks replicates the ${attention.kvHeads} key/value heads, which does not take q/k/v biases (qkvBias): use a tp that divides the key/value heads`);
          return new ReplicatedKvLinear(inF, attention, { group, std, generator: layer.generator!, device: layer.device, dtype: layer.dtype, sequenceParallel });
        }
        return new ColumnParallelLinear(inF, outF, opts);
      }
      case 'mlp.gate':
      case 'mlp.up':
        if (outF % group.size !== 0) throw new ArgumentError(`tensor parallelism over ${group.size} ranks must divide the MLP's ${outF} hidden units`);
        return new ColumnParallelLinear(inF, outF, opts);
      case 'attn.o':
      case 'mlp.down': return new RowParallelLinear(inF, outF, opts);
      default: throw new ArgumentError(`tensorParallelLinearFactory: unknown layer role '${String(role)}'`);
    }
  };
}

/**
 * The vocabulary split by rows across `group`: a VocabParallelEmbedding, a head whose input is
 * copied into the region (its gradient is summed over the vocabulary slices) and gives this rank's
 * slice of the logits, vocabParallelCrossEntropy, gatherFromRegion for full rows, and the fused
 * head vocabParallelLinearCrossEntropy for training. Under
 * sequenceParallel the embedding gives this rank's chunk of the sequence and the head gathers the
 * chunks (a column-parallel layer over the vocabulary), so the logits cover the whole sequence.
 */
export function vocabParallelLayout(group: CollectiveGroup, { sequenceParallel = false }: TensorParallelOptions = {}): VocabLayout {
  return {
    embedding: (vocabSize, nEmbd, { std, layer }) => new VocabParallelEmbedding(vocabSize, nEmbd,
      { group, device: layer.device, dtype: layer.dtype, generator: layer.generator, initWeight: normalInit(std), sequenceParallel }),
    logits: (x, table) => (sequenceParallel ? sequenceGatheredLinear(x, table, null, group) : linear(copyToRegion(x, group), table)),
    loss: (logits, targets) => vocabParallelCrossEntropy(logits, targets, group),
    gather: (logits) => gatherFromRegion(logits, group),
    headLoss: (x, table, targets) => vocabParallelLinearCrossEntropy(x, table, targets, group, { sequenceParallel }),
  };
}

/**
 * Rank group.rank's chunk of the sequence: positions [rank·T/tp, (rank+1)·T/tp). Parameters held
 * whole but applied to the chunk pass through copyToRegion, whose backward sums their gradient over
 * the group inside autograd (Megatron sums these after backward instead; here the data-parallel
 * buffers and ZeRO, which start from post-accumulate-grad hooks, see complete gradients).
 */
export function sequenceParallelLayout(group: CollectiveGroup): SequenceLayout {
  return {
    parts: group.size,
    chunk(seqLen) {
      if (!Number.isInteger(seqLen) || seqLen <= 0 || seqLen % group.size !== 0) {
        throw new ShapeError(`sequence parallelism: the sequence length ${seqLen} is not a multiple of the tensor-parallel size ${group.size}`);
      }
      const count = seqLen / group.size;
      return { start: group.rank * count, count };
    },
    replicated: (p) => copyToRegion(p, group),
  };
}

/** The GPTOptions that split a GPT across `group`: `new GPT(config, { seed, ...tensorParallelGPTOptions(group) })`. */
export function tensorParallelGPTOptions(group: CollectiveGroup, opts: TensorParallelOptions = {}): Pick<GPTOptions, 'linearFactory' | 'vocabLayout' | 'sequenceLayout'> {
  return {
    linearFactory: tensorParallelLinearFactory(group, opts),
    vocabLayout: vocabParallelLayout(group, opts),
    ...(opts.sequenceParallel ? { sequenceLayout: sequenceParallelLayout(group) } : {}),
  };
}

/**
 * A GPT split across opts.group, checked first (ArgumentError before any layer is built). Its
 * forward gives this rank's vocabulary slice of the logits and the full loss on every rank;
 * LayerNorms, positions and the row-parallel biases are replicated, with equal gradients on every
 * rank. With sequenceParallel, the activations between the tensor-parallel layers are chunks
 * [B, T/tp, C] of the sequence.
 */
export function tensorParallelGPT(config: GPTConfig, opts: GPTOptions & TensorParallelOptions & { group: CollectiveGroup }): GPT {
  const { group, sequenceParallel, ...rest } = opts;
  checkTensorParallelConfig(config, group.size);
  return new GPT(config, { ...rest, ...tensorParallelGPTOptions(group, { sequenceParallel }) });
}

/**
 * A model's parameters by how tensor parallelism holds them: `sharded` (each rank a different slice:
 * column-parallel weights and biases, row-parallel weights, the vocabulary-parallel table) and
 * `replicated` (the same values and gradients on every rank: norms, positions, row-parallel biases).
 */
export function tensorParallelParameters(model: Module): {
  /** Parameters each rank holds a different slice of. */
  sharded: Parameter[];
  /** Parameters every rank holds whole, with the same values and gradients. */
  replicated: Parameter[];
} {
  const sharded = new Set<Parameter>();
  for (const [, m] of model.namedModules()) {
    if (m instanceof ColumnParallelLinear) { sharded.add(m.weight); if (m.bias) sharded.add(m.bias); }
    else if (m instanceof RowParallelLinear || m instanceof VocabParallelEmbedding) sharded.add(m.weight);
  }
  const all = model.parameters();
  return { sharded: all.filter((p) => sharded.has(p)), replicated: all.filter((p) => !sharded.has(p)) };
}

/**
 * The L2 norm of the whole model's gradient, the same on every rank of `group`: the sharded
 * gradients' squares summed over the group, the replicated ones counted once. With maxNorm, scales
 * every gradient as clipGradNorm does on a single process. Returns the norm before clipping.
 */
export async function clipTensorParallelGradNorm(model: Module, group: CollectiveGroup, maxNorm?: number): Promise<number> {
  if (maxNorm !== undefined && !(typeof maxNorm === 'number' && maxNorm > 0)) {
    throw new ArgumentError(`clipTensorParallelGradNorm: maxNorm must be a number > 0, got ${maxNorm}`);
  }
  const { sharded, replicated } = tensorParallelParameters(model);
  const norm = await globalGradNorm([{ sumSquares: gradSumSquares(sharded), groups: [group] }, { sumSquares: gradSumSquares(replicated) }]);
  if (maxNorm !== undefined) {
    const factor = clipFactor(norm, maxNorm);
    if (factor < 1) scaleGrads(model.parameters(), factor);
  }
  return norm;
}
