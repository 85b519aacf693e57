// The vocabulary split across the tensor-parallel group (Megatron's VocabParallelEmbedding and
// vocab-parallel cross-entropy): rank r holds the contiguous rows [r·V/tp, (r+1)·V/tp) of the token
// table, so the tied LM head yields that slice of every row's logits and the loss never gathers them.
import { needsGrad, own, record, save } from '../../autograd/engine.js';
import type { DType } from '../../dtype.js';
import { tensor } from '../../creation.js';
import { ArgumentError, ShapeError } from '../../errors.js';
import { normal } from '../../nn/init.js';
import { Module, type Parameter } from '../../nn/module.js';
import { checkFloats, checkIndices, code, emptyLike } from '../../ops/common.js';
import { checkLossInputs, checkLossOptions, countTargets } from '../../ops/loss.js';
import { embedding } from '../../ops/embedding.js';
import { mul } from '../../ops/elementwise.js';
import { defaultGenerator, type Generator } from '../../random.js';
import type { Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { divisible, initAndTakeRows } from './layers.js';
import { allReduceSync, copyToRegion, gatherFromSequenceRegion, reduceFromRegion, reduceScatterToSequenceRegion } from './mappings.js';
import { checkHeadOptions, checkHeadShapes, chunkedLinearCrossEntropy, flattenRows, headUnderAutocast, type HeadChunkRule, type LinearCrossEntropyOptions } from '../../ops/linear-cross-entropy.js';

/** The vocabulary rows [start, end) that group rank `rank` holds when `vocabSize` is split `size` ways. */
export function vocabRange(vocabSize: number, rank: number, size: number, call = 'vocabRange'): {
  /** First row held. */
  start: number;
  /** One past the last row held. */
  end: number;
} {
  const local = divisible('the vocabulary size', vocabSize, size, call);
  return { start: rank * local, end: (rank + 1) * local };
}

/** Options of {@link VocabParallelEmbedding}. */
export interface VocabParallelEmbeddingOptions {
  /** The tensor-parallel group the table is split over. */
  group: CollectiveGroup;
  /** Device (default cpu). */
  device?: string;
  /** Parameter dtype (default f32). */
  dtype?: string;
  /** Generator of the initialization (default: the global one). */
  generator?: Generator;
  /** Fills the full-size table [numEmbeddings, dim] before it is split (default N(0, 1), as Embedding). */
  initWeight?: (full: Tensor, generator: Generator) => void;
  /**
   * Sequence parallelism: the partial lookups of ids [B, T] are reduce-scattered along the
   * sequence, so each rank gets its chunk [B, T/size, dim] of the embedding (default false).
   */
  sequenceParallel?: boolean;
}

/**
 * A token table [numEmbeddings, dim] split by rows across the group. Each rank looks up the ids in
 * its range (others give zero rows) and the partial lookups are summed (reduceFromRegion), so every
 * rank gets the full embedding and its gradient reaches only the rows it holds. Under
 * sequenceParallel the sum is reduce-scattered instead: each rank gets its chunk of the sequence.
 */
export class VocabParallelEmbedding extends Module {
  /** This rank's rows of the table: [numEmbeddings / size, embeddingDim]. */
  readonly weight: Parameter;
  /** The tensor-parallel group. */
  readonly group: CollectiveGroup;
  /** First vocabulary row held here. */
  readonly vocabStart: number;
  /** One past the last vocabulary row held here. */
  readonly vocabEnd: number;
  /** Whether forward returns this rank's chunk of the sequence (reduce-scatter instead of allReduce). */
  readonly sequenceParallel: boolean;
  /**
   * Draws the full-size table and keeps this rank's rows. Throws ArgumentError when the group size does not divide
   * numEmbeddings, or for a non-positive embeddingDim.
   * @param numEmbeddings Rows of the whole table (vocabulary size).
   * @param embeddingDim Width of each row.
   * @param opts The group and parameter options.
   */
  constructor(readonly numEmbeddings: number, readonly embeddingDim: number, opts: VocabParallelEmbeddingOptions) {
    super();
    const call = 'VocabParallelEmbedding';
    if (!Number.isInteger(embeddingDim) || embeddingDim <= 0) throw new ArgumentError(`${call}: embeddingDim must be a positive integer, got ${embeddingDim}`);
    const { start, end } = vocabRange(numEmbeddings, opts.group.rank, opts.group.size, call);
    this.group = opts.group;
    this.vocabStart = start;
    this.vocabEnd = end;
    this.sequenceParallel = opts.sequenceParallel ?? false;
    const init = opts.initWeight ?? ((t: Tensor, g: Generator) => { normal(t, 0, 1, g); });
    this.weight = initAndTakeRows(numEmbeddings, embeddingDim, [[start, end - start]], init, opts.generator ?? defaultGenerator, opts, call);
  }

  /**
   * ids: i32 of any shape, every id in [0, numEmbeddings) → [...ids.shape, dim] (the same on every
   * rank); under sequenceParallel ids [B, T] → this rank's chunk [B, T/size, dim].
   */
  forward(ids: Tensor): Tensor {
    const call = 'VocabParallelEmbedding.forward';
    checkIndices(call, 'ids', ids);
    if (this.sequenceParallel && ids.ndim !== 2) throw new ShapeError(`${call}: under sequence parallelism ids must be [B, T], got ${ids.describe()}`);
    const all = ids.toArraySync() as Int32Array;
    const sum = (partial: Tensor) => (this.sequenceParallel ? reduceScatterToSequenceRegion(partial, this.group) : reduceFromRegion(partial, this.group));
    const local = new Int32Array(all.length), mask = new Float32Array(all.length);
    let foreign = 0;
    for (let i = 0; i < all.length; i++) {
      const id = all[i]!;
      if (id < 0 || id >= this.numEmbeddings) throw new ArgumentError(`${call}: id ${id} at position ${i} is outside the vocabulary [0, ${this.numEmbeddings})`);
      const owned = id >= this.vocabStart && id < this.vocabEnd;
      // A foreign id looks up local row 0, which the mask then zeroes (and with it that row's gradient).
      local[i] = owned ? id - this.vocabStart : 0;
      mask[i] = owned ? 1 : 0;
      if (!owned) foreign++;
    }
    using localIds = tensor(local, ids.shape, { dtype: 'i32', device: ids.device });
    const rows = embedding(localIds, this.weight);
    if (foreign === 0) return sum(rows);
    using maskT = tensor(mask, [...ids.shape, 1], { dtype: this.weight.dtype, device: this.weight.device });
    return sum(mul(rows, maskT));
  }
}

/** Options of {@link vocabParallelCrossEntropy}. */
export interface VocabParallelCrossEntropyOptions {
  /** Targets equal to this contribute no loss and no gradient (default −100, as crossEntropy). */
  ignoreIndex?: number;
}

// Encodings of the per-row local targets handed to the kernels (anything outside [0, V/tp)).
const NOT_HERE = -1;   // forward: the row's target logit is not in this shard (or the row is ignored)
const IGNORED = -1;    // backward: the row has no loss, its gradient is zero
const ELSEWHERE = -2;  // backward: another shard holds the target; this shard's gradient is softmax only

/**
 * Full-vocabulary targets as the kernels of this rank's slice read them: forward, the target's
 * column here or NOT_HERE; backward, that column, ELSEWHERE, or IGNORED for ignoreIndex (whose rows
 * are not counted). An ArgumentError for a target outside the vocabulary.
 */
function encodeShardTargets(call: string, targets: Tensor, ignoreIndex: number, localVocab: number, group: CollectiveGroup): {
  fwdTargets: Int32Array; bwdTargets: Int32Array; counted: number;
} {
  const start = group.rank * localVocab;
  const N = targets.size;
  const t = targets.toArraySync() as Int32Array;
  const counted = countTargets(call, t, ignoreIndex, localVocab * group.size);
  const fwdTargets = new Int32Array(N), bwdTargets = new Int32Array(N);
  for (let i = 0; i < N; i++) {
    const id = t[i]!;
    if (id === ignoreIndex) { fwdTargets[i] = NOT_HERE; bwdTargets[i] = IGNORED; continue; }
    const owned = id >= start && id < start + localVocab;
    fwdTargets[i] = owned ? id - start : NOT_HERE;
    bwdTargets[i] = owned ? id - start : ELSEWHERE;
  }
  return { fwdTargets, bwdTargets, counted };
}

/**
 * The cross-entropy forward of `rows` rows of logits [rows, localVocab] (a prefix of `logits`) whose
 * vocabulary is split across the group, combined across it: each row's logsumexp over the whole
 * vocabulary and the sum of the counted rows' losses (the same on every rank). fwdTargets (and its
 * host copy `here`) holds each row's target column in this slice or NOT_HERE; bwdTargets[i] is
 * IGNORED for rows without loss.
 * Two allReduces: the max of the slices' logsumexps, then one sum of three values per row.
 */
function combineShardRows(logits: Tensor, fwdTargets: Tensor, here: ArrayLike<number>, bwdTargets: ArrayLike<number>, rows: number,
  localVocab: number, group: CollectiveGroup, call: string): { lse: Float32Array; total: number } {
  using shardLoss = emptyLike(logits, [rows], 'f32');
  using shardLse = emptyLike(logits, [rows], 'f32');
  logits.backend.cross_entropy_forward(logits.storage, fwdTargets.storage, shardLoss.storage, shardLse.storage, rows, localVocab, NOT_HERE, code(logits));
  const lossHere = shardLoss.toArraySync() as Float32Array, lseHere = shardLse.toArraySync() as Float32Array;
  // The largest slice logsumexp of each row bounds the exponents below. One sum then carries
  // Σ_r exp(lse_r − max), and from the target's owner its slice loss lse_r − x[target] and lse_r − max,
  // so that loss = slice loss + log Σ − (lse_r − max) adds small numbers only (no cancellation of
  // two large logits in f32).
  allReduceSync(shardLse, group, `${call} (max)`, 'max');
  const rowMax = shardLse.toArraySync() as Float32Array;
  const packed = new Float32Array(3 * rows);
  for (let i = 0; i < rows; i++) {
    packed[i] = Math.exp(lseHere[i]! - rowMax[i]!);
    if (here[i] !== NOT_HERE) { packed[rows + i] = lossHere[i]!; packed[2 * rows + i] = lseHere[i]! - rowMax[i]!; }
  }
  using sums = tensor(packed, [3 * rows], { device: logits.device });
  allReduceSync(sums, group, `${call} (sum)`);
  const summed = sums.toArraySync() as Float32Array;
  const lse = new Float32Array(rows);
  let total = 0;
  for (let i = 0; i < rows; i++) {
    const logSum = Math.log(summed[i]!);
    lse[i] = rowMax[i]! + logSum;
    if (bwdTargets[i] !== IGNORED) total += summed[rows + i]! + logSum - summed[2 * rows + i]!;
  }
  return { lse, total };
}

/**
 * Mean cross-entropy of logits whose vocabulary dimension is split across the group: localLogits
 * [..., V/tp] holds this rank's contiguous slice of every row, targets (i32 [...], the same on every
 * rank) index the full vocabulary. One autograd op; the loss is the same scalar on every rank.
 *
 * Forward: each rank's logsumexp over its slice is combined stably across ranks (allReduce(max),
 * then allReduce(sum) of exp(lse_r − max) packed with the target's terms, which one rank owns).
 * Backward: softmax(local) − onehot(local), times gradOut / (rows counted); no communication.
 */
export function vocabParallelCrossEntropy(localLogits: Tensor, targets: Tensor, group: CollectiveGroup, opts: VocabParallelCrossEntropyOptions = {}): Tensor {
  const call = 'vocabParallelCrossEntropy';
  const localVocab = checkLossInputs(call, 'localLogits', 'V/tp', localLogits, targets);
  // Its options hold no reduction (the loss is a mean).
  const { ignoreIndex } = checkLossOptions(call, { ignoreIndex: opts.ignoreIndex });
  if (localVocab === 0) throw new ShapeError(`${call}: empty vocabulary slice`);
  const N = targets.size;
  const { fwdTargets, bwdTargets, counted } = encodeShardTargets(call, targets, ignoreIndex, localVocab, group);
  const device = localLogits.device;

  // This slice's logsumexp per row, and lse − x[target] where the target is here (0 elsewhere).
  using fwdT = tensor(fwdTargets, [N], { dtype: 'i32', device });
  const { lse, total } = combineShardRows(localLogits, fwdT, fwdTargets, bwdTargets, N, localVocab, group, call);
  const out = emptyLike(localLogits, []);
  out.backend.fill(out.storage, code(out), 1, counted > 0 ? total / counted : Number.NaN);
  if (!needsGrad(localLogits)) return out;

  const scale = counted > 0 ? 1 / counted : 0;
  const ls = save(localLogits);
  const lseT = own(tensor(lse, [N], { device }));
  const bwdT = own(tensor(bwdTargets, [N], { dtype: 'i32', device }));
  return record('vocabParallelCrossEntropy', out, [localLogits, targets], (g) => {
    const gl = emptyLike(ls);
    g.backend.cross_entropy_shard_backward(ls.storage, bwdT.storage, lseT.storage, g.storage, gl.storage, N, localVocab, IGNORED, scale, code(g));
    return [gl, null];
  }, [ls, lseT, bwdT]);
}

/** Options of {@link vocabParallelLinearCrossEntropy}. */
export interface VocabParallelLinearCrossEntropyOptions extends Omit<LinearCrossEntropyOptions, 'bias'> {
  /**
   * x is this rank's chunk [B, T/size, C] of the sequence (sequence parallelism): the chunks are
   * gathered along the sequence first (and the gradient reduce-scattered back), and targets are
   * the whole sequence [B, T]. Default false: x [..., C] is the same on every rank.
   */
  sequenceParallel?: boolean;
}

/**
 * The vocabulary-parallel LM head fused with its loss: cross-entropy of the logits x·weightᵀ, where
 * weight [V/size, C] is this rank's contiguous slice of the vocabulary (a VocabParallelEmbedding's
 * table), against full-vocabulary targets; equal to `vocabParallelCrossEntropy(linear(x, weight),
 * targets, group)` up to float rounding, and the same scalar on every rank. The logits exist one
 * chunk of rows at a time, as in linearCrossEntropy: per chunk, the rows' maxima and
 * [sum of exps, target terms] are combined across the group (two allReduces), and the gradients of
 * both inputs are made in the same pass. x's gradient is summed over the group in backward (each
 * slice contributes its part); under opts.sequenceParallel it is reduce-scattered to the chunks.
 */
export function vocabParallelLinearCrossEntropy(x: Tensor, weight: Tensor, targets: Tensor, group: CollectiveGroup,
  opts: VocabParallelLinearCrossEntropyOptions = {}): Tensor {
  return headUnderAutocast('vocabParallelLinearCrossEntropy', x, weight, null, (x2, w2, _bias, lossDtype) => vocabParallelHead(x2, w2, targets, group, opts, lossDtype));
}

function vocabParallelHead(x: Tensor, weight: Tensor, targets: Tensor, group: CollectiveGroup, opts: VocabParallelLinearCrossEntropyOptions, lossDtype: DType | undefined): Tensor {
  const call = 'vocabParallelLinearCrossEntropy';
  const { reduction, ignoreIndex, chunkRows, padVocab } = checkHeadOptions(call, opts);
  checkFloats(call, { x, weight });
  if (opts.sequenceParallel && x.ndim !== 3) throw new ShapeError(`${call}: under sequence parallelism x must be this rank's chunk [B, T/${group.size}, C], got ${x.describe()}`);
  // Every rank's slice needs the whole input; its gradient is the sum of the slices' parts.
  const input = opts.sequenceParallel ? gatherFromSequenceRegion(x, group) : copyToRegion(x, group);
  const [rows, flatTargets] = flattenRows(call, input, targets);
  const { n, v: localVocab } = checkHeadShapes(call, rows, weight, flatTargets);
  const { fwdTargets, bwdTargets, counted } = encodeShardTargets(call, flatTargets, ignoreIndex, localVocab, group);
  const device = x.device;
  using fwdAll = tensor(fwdTargets, [n], { dtype: 'i32', device });
  const rule: HeadChunkRule = {
    call, counted,
    rows(logits, start, count) {
      using fwdT = emptyLike(fwdAll, [count]);
      fwdT.backend.copy(fwdT.storage, 0, fwdAll.storage, start * 4, count * 4);
      const bwd = bwdTargets.subarray(start, start + count);
      // The block's width: this slice's vocabulary, or its padded width (pad columns −inf, no target there).
      const { lse, total } = combineShardRows(logits, fwdT, fwdTargets.subarray(start, start + count), bwd, count, logits.shape[1]!, group, call);
      const lseT = tensor(lse, [count], { device });
      return { loss: total, lse: lseT, targets: tensor(bwd, [count], { dtype: 'i32', device }), ignore: IGNORED, shard: true };
    },
  };
  return chunkedLinearCrossEntropy(rows, weight, null, [flatTargets], rule, reduction, chunkRows, lossDtype ?? rows.dtype, padVocab);
}
