// GPT-2: learned positions, pre-LayerNorm blocks (or MegaScale's parallel block), causal (optionally
// sliding-window) attention, tied LM head, GPT-2/nanoGPT init, optional recomputation per block.
// Built through the CausalLM seams (lib/nn/causal-lm.ts): linear layers from a factory so tensor
// parallelism can substitute Column/RowParallelLinear (attention derives its head count from the local
// weight shape), the vocabulary (token table, tied head, loss) from a VocabLayout so it can be split
// across processes too, and a SequenceLayout that lets the regions between them (norms, residuals,
// dropout) hold a chunk of the sequence per process.
import { recompute } from '../autograd/index.js';
import { arange, tensor } from '../creation.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { geluMlp } from '../ops/matmul.js';
import { add, addLayerNorm, attentionPacked, embedding, gelu, layerNorm, linearGelu } from '../ops/index.js';
import { residualStream } from '../ops/autocast.js';
import { Generator } from '../random.js';
import { checkTensor, type Tensor } from '../tensor.js';
import { normal } from './init.js';
import { Dropout, Embedding, LayerNorm, Linear, type LayerOptions } from './layers.js';
import { Module, type Parameter } from './module.js';
import { addMoEStats, checkMoEConfig, MoE, moeLayers, type MoEConfig, type MoEParallel, type MoEStats } from './moe.js';
import { traceLayer } from '../observe/trace.js';
import { decoderFlopsPerToken, decoderParameterCounts, type DecoderShape } from './counts.js';
import {
  lookUpTokens, modelParts, generateTokens, type CausalLM, type CausalLMOptions, type CausalLMOutput, type CausalLMLogitsOutput,
  type ContextLayout, type GenerateOptions, type LinearFactory, type LinearLike, type ModelShape, type ParameterCounts, type SequenceLayout, type StageModules, type TokenEmbedding,
  type VocabLayout, wholeSequence,
} from './causal-lm.js';

/** The shape and options of a GPT model. */
export interface GPTConfig {
  /** Vocabulary size (rows of the token table and of the tied LM head). */
  vocabSize: number;
  /** Longest context (positions table size). */
  blockSize: number;
  /** Number of transformer blocks. */
  nLayer: number;
  /** Attention heads per block (must divide nEmbd). */
  nHead: number;
  /** Embedding width (channels). */
  nEmbd: number;
  /** Dropout probability of the embeddings, attention output and MLP output (0: none). */
  dropout: number;
  /** Biases in Linear and LayerNorm layers. */
  bias: boolean;
  /** MegaScale's parallel block: x + attn(ln(x)) + mlp(ln(x)) with one LayerNorm. */
  parallelBlock?: boolean;
  /** Sliding-window attention: each position sees at most this many positions (itself included). */
  window?: number;
  /** Recompute each block's activations in backward instead of storing them. */
  recompute?: boolean;
  /**
   * With targets, compute the loss with the fused head (linearCrossEntropy, or the vocabulary-parallel
   * one): the [B·T, V] logits and their gradient never exist whole, and forward returns no logits.
   * Default true; false computes the logits, then the loss, and returns both.
   */
  fusedHead?: boolean;
  /**
   * Mixture of experts (lib/nn/moe.ts) in the MLP slot of every `moe.every`-th block (blocks every-1,
   * 2·every-1, ...; default every block); the other blocks keep the dense MLP.
   */
  moe?: MoEConfig;
}

// The model contract and its seams moved to causal-lm.ts under family-neutral names; these keep the
// names the GPT gave them, for code written against them.
export {
  defaultLinearFactory, defaultVocabLayout, wholeSequence, padVocab, lookUpTokens, modelParts, generateTokens, sample,
  type LinearRole, type LinearLike, type LinearFactory, type LinearFactoryModel, type AttentionHeads, type TokenEmbedding, type VocabLayout, type SequenceLayout,
  type ContextLayout, type ModelShape, type StageModules, type CausalLM, type GenerateOptions,
} from './causal-lm.js';
/** The GPT's options: those of every CausalLM. */
export type GPTOptions = CausalLMOptions;
/** What {@link GPT.forward} returns (a CausalLMOutput). */
export type GPTOutput = CausalLMOutput;
/** What {@link GPT.forward} returns without targets (a CausalLMLogitsOutput). */
export type GPTLogitsOutput = CausalLMLogitsOutput;

/** Whether block `index` of a model with this config holds an MoE in its MLP slot. */
export function isMoEBlock(config: Pick<GPTConfig, 'moe'>, index: number): boolean {
  const every = config.moe?.every ?? 1;
  return config.moe !== undefined && (index + 1) % every === 0;
}

/**
 * Dropout over x [B, T', C], the sequence layout's chunk of a sequence: the chunk's part of the
 * mask one process holding the whole sequence would draw, so both drop the same entries.
 */
function dropChunk(drop: Dropout, x: Tensor, sequence: SequenceLayout): Tensor {
  if (sequence.parts === 1) return drop.forward(x);
  const extent = x.shape[1]! * sequence.parts;
  return drop.forward(x, { dim: 1, start: sequence.chunk(extent).start, extent });
}

/** ln over x with its parameters as the sequence layout applies them. */
function normalize(ln: LayerNorm, x: Tensor, sequence: SequenceLayout): Tensor {
  return layerNorm(x, sequence.replicated(ln.weight), ln.bias ? sequence.replicated(ln.bias) : undefined, ln.eps);
}

const INIT_STD = 0.02;

/**
 * Causal multi-head self-attention: a fused QKV projection, attention (sliding-window when config.window is set),
 * output projection and dropout.
 */
export class CausalSelfAttention extends Module {
  /** The fused query/key/value projection, C → 3C. */
  readonly qkv: LinearLike;
  /** The output projection, C → C. */
  readonly proj: LinearLike;
  /** Dropout of the output. */
  readonly dropout: Dropout;
  /** Channels per head: nEmbd / nHead. */
  readonly headDim: number;
  readonly #sequence: SequenceLayout;
  readonly #context: ContextLayout | null;
  /**
   * Builds the layer's linear layers through `factory`.
   * @param config The model's config.
   * @param layer Device, dtype and generator of the parameters.
   * @param factory Builds the linear layers.
   * @param sequence How the sequence is held (default: wholeSequence).
   * @param context How the sequence is split over context-parallel processes (default: not).
   */
  constructor(readonly config: GPTConfig, layer: LayerOptions, factory: LinearFactory, sequence: SequenceLayout = wholeSequence, context: ContextLayout | null = null) {
    super();
    this.#sequence = sequence;
    this.#context = context && context.parts > 1 ? context : null;
    const { nEmbd: c, nHead, nLayer, bias } = config;
    this.headDim = c / nHead;
    this.qkv = factory(c, 3 * c, { role: 'attn.qkv', bias, std: INIT_STD, layer, config });
    this.proj = factory(c, c, { role: 'attn.proj', bias, std: INIT_STD / Math.sqrt(2 * nLayer), layer, config });
    this.dropout = new Dropout(config.dropout, layer.generator);
  }
  /** x [B, T, C] → [B, T, C] (under sequence parallelism, chunks of T: the QKV layer gathers the whole sequence). */
  forward(x: Tensor): Tensor {
    const qkvOut = this.qkv.forward(x);
    const localHeads = this.qkv.weight.shape[0]! / (3 * this.headDim);
    // Heads gathered from the packed projection and merged back in one op (no split/permute copies).
    const merged = this.#context ? this.#context.attention(qkvOut, localHeads) : attentionPacked(qkvOut, localHeads, { causal: true, window: this.config.window });
    return dropChunk(this.dropout, this.proj.forward(merged), this.#sequence);
  }
}

/** A Linear whose forward is Linear's own (not a subclass with another forward). */
function isPlainLinear(l: LinearLike): l is Linear {
  return l instanceof Linear && l.forward === Linear.prototype.forward;
}

/** The feed-forward block: C → 4C, GELU, 4C → C, dropout. */
export class MLP extends Module {
  /** The expanding projection, C → 4C. */
  readonly fc: LinearLike;
  /** The contracting projection, 4C → C. */
  readonly proj: LinearLike;
  /** Dropout of the output. */
  readonly dropout: Dropout;
  readonly #sequence: SequenceLayout;
  constructor(config: GPTConfig, layer: LayerOptions, factory: LinearFactory, sequence: SequenceLayout = wholeSequence) {
    super();
    this.#sequence = sequence;
    const { nEmbd: c, nLayer, bias } = config;
    this.fc = factory(c, 4 * c, { role: 'mlp.fc', bias, std: INIT_STD, layer, config });
    this.proj = factory(4 * c, c, { role: 'mlp.proj', bias, std: INIT_STD / Math.sqrt(2 * nLayer), layer, config });
    this.dropout = new Dropout(config.dropout, layer.generator);
  }
  /** x [B, T, C] → [B, T, C]. */
  forward(x: Tensor): Tensor {
    // Plain Linears (not subclasses with their own forward) run as fused ops: on cuda both layers as
    // geluMlp (cuBLASLt's epilogues make the bias gradients and GELU's backward inside the GEMMs, and no
    // [rows, 4C] gradient of the hidden layer is stored); elsewhere the first layer's GEMM, bias and GELU
    // as linearGelu (on cpu the two-op form holds less at its peak: the output gradient and dW2 are freed
    // before the hidden layer's backward runs).
    const fc = this.fc, proj = this.proj;
    if (x.deviceInfo.type === 'cuda' && isPlainLinear(fc) && isPlainLinear(proj)) return dropChunk(this.dropout, geluMlp(x, fc.weight, fc.bias, proj.weight, proj.bias), this.#sequence);
    const hidden = isPlainLinear(fc) ? linearGelu(x, fc.weight, fc.bias) : gelu(fc.forward(x));
    return dropChunk(this.dropout, this.proj.forward(hidden), this.#sequence);
  }
}

/**
 * A transformer block: pre-LayerNorm attention and MLP with residuals, or MegaScale's parallel block (one LayerNorm, x
 * + attn(ln(x)) + mlp(ln(x))) when config.parallelBlock.
 */
export class Block extends Module {
  /** LayerNorm before attention (before both branches in the parallel block). */
  readonly ln1: LayerNorm;
  /** The attention layer. */
  readonly attn: CausalSelfAttention;
  /** LayerNorm before the MLP; null in the parallel block. */
  readonly ln2: LayerNorm | null;
  /** The MLP, or a mixture of experts in its slot (config.moe). */
  readonly mlp: MLP | MoE;
  /** Dropout of the MoE's output (the dense MLP has its own); null for a dense block. */
  readonly #moeDropout: Dropout | null;
  readonly #sequence: SequenceLayout;
  /**
   * Builds the block's layers.
   * @param config The model's config.
   * @param layer Device, dtype and generator of the parameters.
   * @param factory Builds the linear layers.
   * @param sequence How the sequence is held (default: wholeSequence).
   * @param context How the sequence is split over context-parallel processes (default: not).
   * @param index The block's index in the model (which blocks hold an MoE, config.moe.every).
   * @param moeParallel Expert parallelism for an MoE block.
   */
  constructor(readonly config: GPTConfig, layer: LayerOptions, factory: LinearFactory, sequence: SequenceLayout = wholeSequence, context: ContextLayout | null = null,
    index = 0, moeParallel?: MoEParallel) {
    super();
    this.#sequence = sequence;
    this.ln1 = new LayerNorm(config.nEmbd, { ...layer, bias: config.bias });
    this.attn = new CausalSelfAttention(config, layer, factory, sequence, context);
    this.ln2 = config.parallelBlock ? null : new LayerNorm(config.nEmbd, { ...layer, bias: config.bias });
    if (isMoEBlock(config, index)) {
      this.mlp = new MoE(config.nEmbd, config.moe!, { ...layer, std: INIT_STD, downStd: INIT_STD / Math.sqrt(2 * config.nLayer), parallel: moeParallel });
      this.#moeDropout = new Dropout(config.dropout, layer.generator);
    } else {
      this.mlp = new MLP(config, layer, factory, sequence);
      this.#moeDropout = null;
    }
  }
  /** The MLP slot over h [B, T, C]. */
  #mlp(h: Tensor): Tensor {
    return this.#moeDropout ? dropChunk(this.#moeDropout, this.mlp.forward(h), this.#sequence) : this.mlp.forward(h);
  }
  /** x [B, T, C] → [B, T, C]. */
  forward(x: Tensor): Tensor {
    const seq = this.#sequence;
    if (this.ln2 === null) {
      const h = normalize(this.ln1, x, seq);
      return add(add(x, this.attn.forward(h)), this.#mlp(h));
    }
    // The attention residual's add and ln2 run as one pass (addLayerNorm).
    const ln2 = this.ln2;
    const { sum: x1, out: h } = addLayerNorm(x, this.attn.forward(normalize(this.ln1, x, seq)), seq.replicated(ln2.weight),
      ln2.bias ? seq.replicated(ln2.bias) : undefined, ln2.eps);
    return add(x1, this.#mlp(h));
  }
}

/**
 * GPT-2: token and learned position embeddings, a stack of blocks, a final LayerNorm and an LM head tied to the token
 * table; GPT-2/nanoGPT initialization.
 */
export class GPT extends Module implements CausalLM {
  readonly family = 'gpt' as const;
  readonly blockPrefix = 'h';
  /** Token embedding (tied to the LM head). */
  readonly wte: TokenEmbedding;
  /** Position embedding [blockSize, nEmbd]. */
  readonly wpe: Embedding;
  /** Dropout of the embedding sum. */
  readonly drop: Dropout;
  /** The transformer blocks. */
  readonly h: Block[];
  /** The final LayerNorm. */
  readonly lnF: LayerNorm;
  /** The checked config (recompute as overridden by the options). */
  readonly config: Readonly<GPTConfig>;
  /** Where the vocabulary lives. */
  readonly vocabLayout: VocabLayout;
  /** How the sequence is held. */
  readonly sequenceLayout: SequenceLayout;
  /** How the sequence is split over context-parallel processes (null: not). */
  readonly contextLayout: ContextLayout | null;
  /** The generator of the initialization and of dropout (checkpoints save its position). */
  readonly generator: Generator;

  constructor(config: GPTConfig, opts: GPTOptions = {}) {
    super();
    this.config = checkConfig(opts.recompute === undefined ? config : { ...config, recompute: opts.recompute });
    const { generator, layer, factory, vocabLayout, sequenceLayout } = modelParts(opts);
    this.generator = generator;
    this.vocabLayout = vocabLayout;
    this.sequenceLayout = sequenceLayout;
    this.contextLayout = opts.contextLayout && opts.contextLayout.parts > 1 ? opts.contextLayout : null;
    if (this.contextLayout && (this.config.window || this.config.dropout > 0)) {
      throw new ArgumentError(`GPT: context parallelism (${this.contextLayout.parts} parts) needs plain causal attention and no dropout, but the config has ${this.config.window ? `window ${this.config.window}` : `dropout ${this.config.dropout}`}`);
    }
    this.wte = this.vocabLayout.embedding(config.vocabSize, config.nEmbd, { std: INIT_STD, layer });
    this.wpe = new Embedding(config.blockSize, config.nEmbd, { ...layer, initialize: false });
    normal(this.wpe.weight, 0, INIT_STD, generator);
    this.drop = new Dropout(config.dropout, generator);
    const moeParallel = typeof opts.moeParallel === 'function' ? (this.config.moe ? opts.moeParallel(this.config.moe.experts) : undefined) : opts.moeParallel;
    this.h = Array.from({ length: config.nLayer }, (_, i) => new Block(this.config, layer, factory, this.sequenceLayout, this.contextLayout, i, moeParallel));
    this.lnF = new LayerNorm(config.nEmbd, { ...layer, bias: config.bias });
  }

  /**
   * idx: i32 [B, T] token ids; targets: i32 [B, T] (optional). Without targets: the logits
   * (vocabulary-sharded under a parallel VocabLayout). With targets: the mean loss, computed by the
   * fused head without logits unless config.fusedHead is false.
   */
  forward(idx: Tensor): GPTLogitsOutput;
  forward(idx: Tensor, targets?: Tensor): GPTOutput;
  forward(idx: Tensor, targets?: Tensor): GPTOutput {
    return this.head(this.forwardBlocks(this.embed(idx)), targets);
  }

  // forward() in three parts, so that a pipeline stage runs only the part it holds (lib/parallel/pipeline/gpt-stage.ts).

  /** Token plus position embeddings of idx (i32 [B, T]) → [B, T, C] (the sequence layout's chunk of T). */
  embed(idx: Tensor): Tensor {
    const { tokens, t, start, count } = lookUpTokens(this, 'GPT.forward', idx, this.wte, ['blockSize', this.config.blockSize]);
    // Each chunk adds its own positions, so every position embedding is added exactly once.
    using pos = this.contextLayout ? tensor(this.contextLayout.positions(t).subarray(start, start + count), [count], { device: idx.device })
      : arange(start, start + count, 1, { device: idx.device });
    return dropChunk(this.drop, add(tokens, embedding(pos, this.sequenceLayout.replicated(this.wpe.weight))), this.sequenceLayout);
  }

  /** Blocks [start, end) over x [B, T, C] (T: the sequence layout's chunk; recomputed in backward when config.recompute). */
  forwardBlocks(x: Tensor, start = 0, end = this.h.length): Tensor {
    x = residualStream(x); // 16 bits under autocast's lowPrecisionResidual
    for (const [j, block] of this.h.slice(start, end).entries()) {
      x = traceLayer('block', start + j, () => (this.config.recompute && this.training ? recompute((y: Tensor) => block.forward(y), x) : block.forward(x)));
    }
    return x;
  }

  /**
   * Final LayerNorm and the tied LM head over x [B, T, C] (T: the sequence layout's chunk; the
   * logits cover the whole sequence); the mean cross-entropy when targets are given, from the fused
   * head (no logits) unless config.fusedHead is false.
   */
  head(x: Tensor): GPTLogitsOutput;
  head(x: Tensor, targets?: Tensor): GPTOutput;
  head(x: Tensor, targets?: Tensor): GPTOutput {
    const layout = this.vocabLayout;
    const hidden = normalize(this.lnF, x, this.sequenceLayout);
    const b = x.shape[0]!, t = x.shape[1]! * this.sequenceLayout.parts;
    if (targets !== undefined) {
      checkTensor(targets, 'GPT.forward', 'targets');
      if (targets.dtype !== 'i32' || targets.ndim !== 2 || targets.shape[0] !== b || targets.shape[1] !== t) {
        throw new ShapeError(`GPT.forward: targets must be i32 [${b}, ${t}], got ${targets.describe()}`);
      }
      if (this.config.fusedHead !== false && layout.headLoss) return { logits: null, loss: layout.headLoss(hidden, this.wte.weight, targets) };
    }
    const logits = layout.logits(hidden, this.wte.weight);
    if (targets === undefined) return { logits, loss: null };
    return { logits, loss: layout.loss(logits.reshape([b * t, logits.shape[2]!]), targets.reshape([b * t])) };
  }

  /** The routing statistics of the MoE blocks since the last call, summed over the blocks (then reset); null without config.moe. */
  takeMoEStats(): MoEStats | null {
    const layers = moeLayers(this);
    if (layers.length === 0) return null;
    return layers.map((l) => l.takeStats()).reduce(addMoEStats);
  }

  /** Full-vocabulary logits [B, T, vocabSize] from forward's (gathered across the group under a vocabulary-parallel layout). */
  gatherLogits(logits: Tensor): Tensor {
    return this.vocabLayout.gather(logits);
  }

  /** The GPT's dimensions (nKvHead = nHead, MLP width 4·nEmbd), its window, dropout and experts when it has them. */
  get shape(): ModelShape {
    const c = this.config;
    return {
      nLayer: c.nLayer, nHead: c.nHead, nKvHead: c.nHead, nEmbd: c.nEmbd, ffnHidden: 4 * c.nEmbd, vocabSize: c.vocabSize, blockSize: c.blockSize,
      ...(c.window ? { window: c.window } : {}), ...(c.dropout ? { dropout: c.dropout } : {}), ...(c.moe ? { moeExperts: c.moe.experts } : {}),
    };
  }
  /** Its parameters from its config (a whole model's, whatever this process holds): all of them, and those one token goes through. */
  get parameterCounts(): ParameterCounts {
    return decoderParameterCounts(gptDecoderShape(this.config));
  }
  /** Model FLOPs per trained token at `seqLen` ({@link gptFlopsPerToken}). */
  flopsPerToken(seqLen: number): number { return gptFlopsPerToken(this.config, seqLen); }
  /** The blocks (h). */
  get blocks(): readonly Module[] { return this.h; }
  /** The tied token table (the GPT's head is always tied). */
  get tiedWeight(): Parameter { return this.wte.weight; }
  /** wte (first and last stage), wpe (first), lnF (last). */
  stageModules(first: boolean, last: boolean): StageModules {
    const before: Array<[string, Module]> = [];
    // The token embedding is both the first stage's input table and the last stage's output head.
    if (first || last) before.push(['wte', this.wte]);
    if (first) before.push(['wpe', this.wpe]);
    return { before, after: last ? [['lnF', this.lnF]] : [] };
  }
  /** A new GPT of this config with other options. */
  rebuild(opts: GPTOptions): GPT { return new GPT(this.config, opts); }

  /**
   * Appends maxNewTokens sampled tokens to each row of idx (i32 [B, T]); returns the ids as arrays.
   * Context is cropped to blockSize; sampling draws from a Philox generator seeded by `seed`.
   * Under tensor parallelism every rank of the group calls it with the same arguments (the logits
   * are gathered each step) and gets the same tokens. Under sequence parallelism the context is
   * padded at its end to a multiple of the group size (causal attention keeps the padding out of
   * the logits read) and cropped to the largest such multiple within blockSize.
   */
  generate(idx: Tensor, maxNewTokens: number, opts: GenerateOptions = {}): number[][] {
    if (this.contextLayout) throw new StateError('generate: the model splits the sequence over context-parallel processes; sample from a copy built without contextLayout (same parameters)');
    return generateTokens(this, idx, maxNewTokens, opts);
  }
}

/** Parameters of a GPT of this configuration, all of them (the tied head counted once). */
export function gptParameterCount(config: Pick<GPTConfig, 'vocabSize' | 'blockSize' | 'nLayer' | 'nEmbd' | 'bias' | 'parallelBlock' | 'moe'>): number {
  return decoderParameterCounts(gptDecoderShape(config)).total;
}

/**
 * Parameters one token goes through (MoE: the router, its topK experts and the shared experts, not
 * the other experts); gptParameterCount for a dense GPT.
 */
export function gptActiveParameterCount(config: Pick<GPTConfig, 'vocabSize' | 'blockSize' | 'nLayer' | 'nEmbd' | 'bias' | 'parallelBlock' | 'moe'>): number {
  return decoderParameterCounts(gptDecoderShape(config)).active;
}

/** The GPT config fields its parameter and FLOP counts read. */
type GPTCountConfig = Pick<GPTConfig, 'vocabSize' | 'blockSize' | 'nLayer' | 'nEmbd' | 'bias' | 'parallelBlock' | 'moe'> & { nHead?: number };

/**
 * A GPT's shape as lib/nn/counts.ts counts it: learned positions, a GELU MLP of 4·nEmbd, the head tied
 * to the token table, biases and LayerNorms as config.bias says (one LayerNorm per block under
 * parallelBlock), and the MoE blocks isMoEBlock places (their shared experts gated only when sharedGate).
 * The head count does not change a count (every head's width is nEmbd / nHead); nHead is 1 when absent.
 */
export function gptDecoderShape(config: GPTCountConfig): DecoderShape {
  const { nEmbd: c, moe } = config, heads = config.nHead ?? 1;
  const shape: DecoderShape = {
    layers: config.nLayer, width: c, heads, kvHeads: heads, ffn: 4 * c, vocab: config.vocabSize, gated: false, bias: config.bias !== false, tied: true,
    positions: config.blockSize, layerNorms: config.parallelBlock ? 1 : 2,
  };
  if (moe) {
    const hidden = moe.hidden ?? 4 * c, shared = moe.sharedExperts ?? 0;
    shape.moe = {
      layers: Math.floor(config.nLayer / (moe.every ?? 1)), experts: moe.experts, topK: moe.topK, hidden,
      sharedHidden: shared > 0 ? moe.sharedHidden ?? shared * hidden : 0, sharedGate: shared > 0 && moe.sharedGate === true,
    };
  }
  return shape;
}

/**
 * Model FLOPs per trained token (forward and backward) at sequence length `seqLen`: 6·N for the
 * parameters (N without the position table, which is a lookup) plus 12·L·C·T for attention's two
 * matrix products (T: the positions each one attends to, the window when it is shorter). Recomputation
 * is not counted (model FLOPs, not hardware FLOPs). lib/nn/counts.ts's decoderFlopsPerToken.
 */
export function gptFlopsPerToken(config: Pick<GPTConfig, 'vocabSize' | 'blockSize' | 'nLayer' | 'nEmbd' | 'bias' | 'parallelBlock' | 'window' | 'moe'>, seqLen: number): number {
  return decoderFlopsPerToken(gptDecoderShape(config), seqLen, config.window);
}

function checkConfig(c: GPTConfig): GPTConfig {
  if (c === null || typeof c !== 'object') throw new ArgumentError(`GPTConfig: the config must be an object { vocabSize, blockSize, nLayer, nHead, nEmbd, ... }, got ${c === null ? 'null' : typeof c}`);
  for (const k of ['vocabSize', 'blockSize', 'nLayer', 'nHead', 'nEmbd'] as const) {
    if (!Number.isInteger(c[k]) || c[k] <= 0) throw new ArgumentError(`GPTConfig: ${k} must be a positive integer, got ${c[k]}`);
  }
  if (c.nEmbd % c.nHead !== 0) throw new ArgumentError(`GPTConfig: nEmbd (${c.nEmbd}) must be divisible by nHead (${c.nHead})`);
  if (!(c.dropout >= 0 && c.dropout < 1)) throw new ArgumentError(`GPTConfig: dropout must be in [0, 1), got ${c.dropout}`);
  if (c.window !== undefined && (!Number.isInteger(c.window) || c.window < 1)) throw new ArgumentError(`GPTConfig: window must be a positive integer`);
  if (c.moe !== undefined) {
    checkMoEConfig(c.moe, 'GPTConfig.moe');
    if ((c.moe.every ?? 1) > c.nLayer) throw new ArgumentError(`GPTConfig.moe: every (${c.moe.every}) exceeds nLayer (${c.nLayer}), so no block would hold the experts`);
  }
  return { ...c };
}
