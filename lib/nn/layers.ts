// The basic layers: Linear, Embedding, LayerNorm, RMSNorm, Dropout (PyTorch layouts and default inits).
import { isFloating } from '../dtype.js';
import { ArgumentError, DTypeError } from '../errors.js';
import { dropout, embedding, layerNorm, linear, rmsNorm, type DropoutOptions } from '../ops/index.js';
import { checkGenerator, type Generator, defaultGenerator } from '../random.js';
import { emptyOn, resolveOptions, type Tensor } from '../tensor.js';
import { constant, normal, uniform } from './init.js';
import { Module, Parameter } from './module.js';

/** Where a layer's parameters live and which generator initializes them. */
export interface LayerOptions {
  /** Device (default cpu). */
  device?: string;
  /** Parameter dtype (default f32). */
  dtype?: string;
  /** Generator of the initialization (default: the global one). */
  generator?: Generator;
}

function positiveInt(v: number, call: string, what: string): number {
  if (!Number.isInteger(v) || v <= 0) throw new ArgumentError(`${call}: ${what} must be a positive integer, got ${v}`);
  return v;
}

/** An uninitialized parameter of a shape, on the layer's device and dtype. */
export function newParameter(shape: number[], opts: LayerOptions, call: string): Parameter {
  const { dtype, device } = resolveOptions(opts, call);
  if (!isFloating(dtype)) throw new DTypeError(`${call}: parameters are floating point (f32, bf16, f16), not ${dtype}`);
  if (opts.generator !== undefined) checkGenerator(opts.generator, call);
  return new Parameter(emptyOn(shape, dtype, device));
}

/**
 * Whether a layer draws its default initialization. A caller that fills the parameters itself
 * passes false, so the generator advances only by the caller's draws (which keeps a model's draws
 * independent of how its layers are built, e.g. split across a tensor-parallel group).
 */
export interface InitOption {
  /** Default true; false leaves the parameters uninitialized and draws nothing. */
  initialize?: boolean;
}

/** y = x W^T + b with W [out, in]; init U(-1/sqrt(in), 1/sqrt(in)) for both, as PyTorch. */
export class Linear extends Module {
  /** Weight [outFeatures, inFeatures]. */
  readonly weight: Parameter;
  /** Bias [outFeatures], or null when created with `bias: false`. */
  readonly bias: Parameter | null;
  /**
   * Creates the layer and draws its initialization (unless `initialize: false`). Throws ArgumentError for a
   * non-positive size.
   * @param inFeatures Size of the input's last dimension.
   * @param outFeatures Size of the output's last dimension.
   * @param opts Device, dtype, generator, `initialize`, and `bias` (default true).
   */
  constructor(readonly inFeatures: number, readonly outFeatures: number, opts: LayerOptions & InitOption & { bias?: boolean } = {}) {
    super();
    positiveInt(inFeatures, 'Linear', 'inFeatures');
    positiveInt(outFeatures, 'Linear', 'outFeatures');
    const gen = opts.generator ?? defaultGenerator;
    const bound = 1 / Math.sqrt(inFeatures);
    const init = (p: Parameter) => (opts.initialize === false ? p : (uniform(p, -bound, bound, gen) as Parameter));
    this.weight = init(newParameter([outFeatures, inFeatures], opts, 'Linear'));
    this.bias = opts.bias === false ? null : init(newParameter([outFeatures], opts, 'Linear'));
  }
  /** x [..., inFeatures] → [..., outFeatures]. */
  forward(x: Tensor): Tensor { return linear(x, this.weight, this.bias ?? undefined); }
}

/** A lookup table [numEmbeddings, dim]; init N(0, 1) as PyTorch. */
export class Embedding extends Module {
  /** The table [numEmbeddings, embeddingDim]. */
  readonly weight: Parameter;
  /**
   * Creates the table and draws its initialization (unless `initialize: false`). Throws ArgumentError for a
   * non-positive size.
   * @param numEmbeddings Rows of the table (vocabulary size).
   * @param embeddingDim Width of each row.
   * @param opts Device, dtype, generator, `initialize`.
   */
  constructor(readonly numEmbeddings: number, readonly embeddingDim: number, opts: LayerOptions & InitOption = {}) {
    super();
    positiveInt(numEmbeddings, 'Embedding', 'numEmbeddings');
    positiveInt(embeddingDim, 'Embedding', 'embeddingDim');
    const w = newParameter([numEmbeddings, embeddingDim], opts, 'Embedding');
    this.weight = opts.initialize === false ? w : (normal(w, 0, 1, opts.generator ?? defaultGenerator) as Parameter);
  }
  /** ids: i32 of any shape → [...ids.shape, dim]. */
  forward(ids: Tensor): Tensor { return embedding(ids, this.weight); }
}

/** Normalization over the last dimension with a learned scale (ones) and shift (zeros, optional). */
export class LayerNorm extends Module {
  /** Scale [normalizedShape], initialized to ones. */
  readonly weight: Parameter;
  /** Shift [normalizedShape] (zeros), or null when created with `bias: false`. */
  readonly bias: Parameter | null;
  /** Added to the variance for numerical stability (default 1e-5). */
  readonly eps: number;
  /**
   * Creates the layer. Throws ArgumentError for a non-positive size or eps <= 0.
   * @param normalizedShape Size of the normalized (last) dimension.
   * @param opts Device, dtype, `eps` (default 1e-5), `bias` (default true).
   */
  constructor(readonly normalizedShape: number, opts: LayerOptions & { eps?: number; bias?: boolean } = {}) {
    super();
    positiveInt(normalizedShape, 'LayerNorm', 'normalizedShape');
    this.eps = opts.eps ?? 1e-5;
    if (!(this.eps > 0)) throw new ArgumentError(`LayerNorm: eps must be > 0, got ${this.eps}`);
    this.weight = constant(newParameter([normalizedShape], opts, 'LayerNorm'), 1) as Parameter;
    this.bias = opts.bias === false ? null : (constant(newParameter([normalizedShape], opts, 'LayerNorm'), 0) as Parameter);
  }
  /** Normalizes x [..., normalizedShape] over its last dimension, then scales and shifts. */
  forward(x: Tensor): Tensor { return layerNorm(x, this.weight, this.bias ?? undefined, this.eps); }
}

/** Root-mean-square normalization over the last dimension with a learned scale (ones), no shift (Llama's RMSNorm). */
export class RMSNorm extends Module {
  /** Scale [normalizedShape], initialized to ones. */
  readonly weight: Parameter;
  /** Added to the mean square for numerical stability (default 1e-6). */
  readonly eps: number;
  /**
   * Creates the layer. Throws ArgumentError for a non-positive size or eps <= 0.
   * @param normalizedShape Size of the normalized (last) dimension.
   * @param opts Device, dtype, `eps` (default 1e-6).
   */
  constructor(readonly normalizedShape: number, opts: LayerOptions & { eps?: number } = {}) {
    super();
    positiveInt(normalizedShape, 'RMSNorm', 'normalizedShape');
    this.eps = opts.eps ?? 1e-6;
    if (!(this.eps > 0)) throw new ArgumentError(`RMSNorm: eps must be > 0, got ${this.eps}`);
    this.weight = constant(newParameter([normalizedShape], opts, 'RMSNorm'), 1) as Parameter;
  }
  /** x/√(mean(x²) + eps)·weight over the last dimension. */
  forward(x: Tensor): Tensor { return rmsNorm(x, this.weight, this.eps); }
}

/** Zeroes elements with probability p in training (scaling the rest by 1/(1-p)); identity in eval. */
export class Dropout extends Module {
  /**
   * Throws ArgumentError unless 0 <= p < 1.
   * @param p Probability of zeroing an element.
   * @param generator Generator of the masks (default: the global one).
   */
  constructor(readonly p: number, readonly generator: Generator = defaultGenerator) {
    super();
    if (typeof p !== 'number' || !(p >= 0 && p < 1)) throw new ArgumentError(`Dropout: p must be in [0, 1), got ${p}`);
    checkGenerator(generator, 'Dropout');
  }
  /** With `part`, x is part of a larger tensor and gets that part of the larger tensor's mask (see the dropout op). */
  forward(x: Tensor, part?: DropoutOptions['part']): Tensor {
    return this.training && this.p > 0 ? dropout(x, this.p, { training: true, generator: this.generator, part }) : x;
  }
}
