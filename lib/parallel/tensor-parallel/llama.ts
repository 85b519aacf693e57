// What tensor parallelism adds for Llama's attention (lib/nn/llama.ts): the key/value projections when
// the tensor-parallel group has more ranks than the model has key/value heads. Each rank then needs
// the one key/value head its query heads read; it holds the whole k (or v) weight, replicated, and
// projects only that head's rows. The rows' gradients of the ranks sharing a head are partial sums
// (each from its own query heads), so the weight passes through copyToRegion (its gradient summed
// over the group) and so does the input (its gradient, like a column-parallel layer's, summed too).
import { ArgumentError } from '../../errors.js';
import { linear, slice } from '../../ops/index.js';
import { normal } from '../../nn/init.js';
import { Module, type Parameter } from '../../nn/module.js';
import { newParameter } from '../../nn/layers.js';
import type { AttentionHeads } from '../../nn/gpt.js';
import type { Generator } from '../../random.js';
import type { Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { sequenceGatheredLinear } from './layers.js';
import { copyToRegion } from './mappings.js';

/**
 * Throws an ArgumentError unless `tp` ranks can split Llama's attention: the query heads divide by tp,
 * and the key/value heads either divide by tp (split) or divide tp (replicated, each rank one head).
 */
export function checkKvHeadsSplit(attention: AttentionHeads, tp: number): void {
  const { heads, kvHeads } = attention;
  if (heads % tp !== 0) throw new ArgumentError(`tensor parallelism over ${tp} ranks must divide the ${heads} attention heads`);
  if (kvHeads % tp !== 0 && tp % kvHeads !== 0) {
    throw new ArgumentError(`tensor parallelism over ${tp} ranks: the ${kvHeads} key/value heads must divide by ${tp} (split) or divide ${tp} (replicated)`);
  }
}

/**
 * A key or value projection under tensor parallelism with fewer key/value heads than ranks: the whole
 * weight [kvHeads·D, C] on every rank (drawn N(0, std) at full size, as one process draws it), of
 * which rank r projects the rows of head ⌊r·kvHeads/tp⌋. Output [B, T, D].
 */
export class ReplicatedKvLinear extends Module {
  /** The whole weight [kvHeads·headDim, inFeatures], the same on every rank. */
  readonly weight: Parameter;
  readonly #group: CollectiveGroup;
  readonly #rows: [number, number];
  readonly #sequenceParallel: boolean;
  constructor(inFeatures: number, attention: AttentionHeads, opts: { group: CollectiveGroup; std: number; generator: Generator; device?: string; dtype?: string; sequenceParallel?: boolean }) {
    super();
    const { kvHeads, headDim } = attention;
    const tp = opts.group.size;
    this.weight = newParameter([kvHeads * headDim, inFeatures], { device: opts.device, dtype: opts.dtype, generator: opts.generator }, 'ReplicatedKvLinear');
    normal(this.weight, 0, opts.std, opts.generator);
    const head = Math.floor((opts.group.rank * kvHeads) / tp);
    this.#rows = [head * headDim, (head + 1) * headDim];
    this.#group = opts.group;
    this.#sequenceParallel = opts.sequenceParallel ?? false;
  }
  /** x [B, T', C] → [B, T, headDim]: this rank's key/value head over the whole sequence. */
  forward(x: Tensor): Tensor {
    const w = slice(copyToRegion(this.weight, this.#group), 0, this.#rows[0], this.#rows[1]);
    return this.#sequenceParallel ? sequenceGatheredLinear(x, w, null, this.#group) : linear(copyToRegion(x, this.#group), w);
  }
}
