// GPT-2: learned positions, pre-LayerNorm blocks (or MegaScale's parallel block), causal (optionally
// sliding-window) attention, tied LM head, GPT-2/nanoGPT init, optional recomputation per block.
// Linear layers come from a factory so tensor parallelism can substitute Column/RowParallelLinear
// (attention derives its head count from the local weight shape), and the vocabulary (token table,
// tied head, loss) from a VocabLayout so it can be split across processes too; a SequenceLayout lets
// the regions between them (norms, residuals, dropout) hold a chunk of the sequence per process.
import { noGrad, recompute } from '../autograd/index.js';
import { arange, rand, tensor } from '../creation.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { geluMlp } from '../ops/matmul.js';
import { add, addLayerNorm, attentionPacked, crossEntropy, embedding, gelu, layerNorm, linear, linearCrossEntropy, linearGelu } from '../ops/index.js';
import { scope } from '../memory.js';
import { Generator } from '../random.js';
import { checkTensor, type Tensor } from '../tensor.js';
import { constant, normal } from './init.js';
import { Dropout, Embedding, LayerNorm, Linear, type LayerOptions } from './layers.js';
import { Module, type Parameter } from './module.js';
import { addMoEStats, checkMoEConfig, MoE, moeLayers, type MoEConfig, type MoEParallel, type MoEStats } from './moe.js';
import { traceLayer } from '../observe/trace.js';

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

/** The role of a linear layer in a block, which tells a tensor-parallel factory how to split it. */
export type LinearRole = 'attn.qkv' | 'attn.proj' | 'mlp.fc' | 'mlp.proj'
  // Llama's (lib/nn/llama.ts): separate q, k, v projections (k and v of the key/value heads), the output
  // projection, and the SwiGLU MLP's gate, up and down projections.
  | 'attn.q' | 'attn.k' | 'attn.v' | 'attn.o' | 'mlp.gate' | 'mlp.up' | 'mlp.down';

/** What a block needs of a linear layer: its weight (for the local shape) and forward. */
export interface LinearLike extends Module {
  /** The layer's weight [outFeatures, inFeatures] as held here (a tensor-parallel layer holds a slice). */
  readonly weight: Parameter;
  /** x [..., inFeatures] → [..., outFeatures] (a parallel layer may gather or split the sequence). */
  forward(x: Tensor): Tensor;
}

/**
 * Builds the linear layers of a block; the default is a plain Linear with weights N(0, std) and zero
 * biases. A factory must draw exactly one N(0, std) sample of the full [outFeatures, inFeatures]
 * weight from layer.generator (and nothing else), so every way of building the model starts from
 * the same weights for a seed.
 */
export type LinearFactory = (inFeatures: number, outFeatures: number,
  opts: { role: LinearRole; bias: boolean; std: number; layer: LayerOptions; config: Readonly<GPTConfig>; attention?: AttentionHeads }) => LinearLike;

/**
 * The attention heads a linear layer serves (Llama's q, k, v and o projections pass it): tensor
 * parallelism splits k and v by key/value heads, or gives every rank the key/value head its query
 * heads read when there are fewer key/value heads than ranks.
 */
export interface AttentionHeads {
  /** Query heads. */
  heads: number;
  /** Key/value heads (dividing heads). */
  kvHeads: number;
  /** Channels per head. */
  headDim: number;
}

/** The default LinearFactory: a plain Linear with weights N(0, std) and zero biases. */
export const defaultLinearFactory: LinearFactory = (inF, outF, { bias, std, layer }) => {
  const l = new Linear(inF, outF, { ...layer, bias, initialize: false });
  normal(l.weight, 0, std, layer.generator);
  if (l.bias) constant(l.bias, 0);
  return l;
};

/** What the model needs of its token embedding: the table it ties to the LM head, and the lookup. */
export interface TokenEmbedding extends Module {
  /** The token table [vocabSize, nEmbd] (or the part held here), tied to the LM head. */
  readonly weight: Parameter;
  /** ids: i32 [B, T] → [B, T, nEmbd]. */
  forward(ids: Tensor): Tensor;
}

/**
 * Where the vocabulary lives: the token table, the tied LM head, the loss and the logits users read.
 * The default holds all of it in this process; a vocabulary-parallel layout (lib/parallel's
 * tensorParallelGPT) holds a slice of the table per rank, and then the head's logits are that slice.
 */
export interface VocabLayout {
  /** The token table [vocabSize, nEmbd] (or the part held here), drawn N(0, std) once at full size from layer.generator. */
  embedding(vocabSize: number, nEmbd: number, opts: { std: number; layer: LayerOptions }): TokenEmbedding;
  /** Logits over the vocabulary held here: final hidden states x [B, T, C] times the tied table. */
  logits(x: Tensor, table: Tensor): Tensor;
  /** Mean cross-entropy of logits [N, vocabulary held here] against full-vocabulary targets i32 [N]. */
  loss(logits: Tensor, targets: Tensor): Tensor;
  /** Full-vocabulary logits [..., vocabSize] from the output of `logits`. */
  gather(logits: Tensor): Tensor;
  /**
   * The fused head: the mean cross-entropy of the logits of x [B, T', C] (final hidden states, the
   * sequence layout's chunk) and the tied table against targets i32 [B, T], without materializing
   * the logits. A layout without it gets `loss(logits(x, table), targets)`.
   */
  headLoss?(x: Tensor, table: Tensor, targets: Tensor): Tensor;
}

/** The whole vocabulary in this process: an Embedding, a plain tied linear head and crossEntropy. */
export const defaultVocabLayout: VocabLayout = {
  embedding(vocabSize, nEmbd, { std, layer }) {
    const e = new Embedding(vocabSize, nEmbd, { ...layer, initialize: false });
    normal(e.weight, 0, std, layer.generator);
    return e;
  },
  logits: (x, table) => linear(x, table),
  loss: (logits, targets) => crossEntropy(logits, targets),
  gather: (logits) => logits,
  headLoss: (x, table, targets) => linearCrossEntropy(x, table, targets),
};

/**
 * How the regions outside the linear layers and the vocabulary (LayerNorms, residual adds, dropout,
 * the embedding sum) hold the sequence. The default holds all of it. Sequence parallelism
 * (lib/parallel's tensorParallelGPT with sequenceParallel) holds one chunk of the positions per
 * rank: its VocabLayout's embedding then returns that chunk, its column-parallel layers and its
 * logits gather the whole sequence, and its row-parallel layers return the chunk.
 */
export interface SequenceLayout {
  /** The number of equal chunks a sequence is split into (1: all of it here); sequence lengths must be multiples of it. */
  readonly parts: number;
  /** The positions [start, start + seqLen / parts) of a sequence of seqLen tokens held here; a ShapeError when parts does not divide seqLen. */
  chunk(seqLen: number): { start: number; count: number };
  /**
   * What a layer applies in place of a parameter every process holds whole but uses on its chunk
   * only (norms, positions): identity forward, and backward sums the gradient over the processes
   * holding the other chunks, so p.grad is the whole sequence's when its post-accumulate hooks fire.
   */
  replicated(p: Parameter): Tensor;
}

/** The whole sequence in this process. */
export const wholeSequence: SequenceLayout = {
  parts: 1,
  chunk: (seqLen) => ({ start: 0, count: seqLen }),
  replicated: (p) => p,
};

/**
 * How the sequence is split over context-parallel processes (lib/parallel's contextParallelLayout):
 * each holds some of a sequence's tokens, in an order of its own, through the whole model; positions
 * are the tokens' global ones and attention runs over all the processes' tokens (ring attention or
 * Ulysses). The default, none, holds every token in order.
 */
export interface ContextLayout {
  /** Processes the sequence is split over (1: none). */
  readonly parts: number;
  /** The global positions of this process's tokens, in its order, when it holds `localLen` tokens of a sequence of localLen·parts. */
  positions(localLen: number): Int32Array;
  /** Causal attention of this process's tokens over the whole sequence: qkv [B, t, 3·heads·D] → [B, t, heads·D], as attentionPacked. */
  attention(qkv: Tensor, heads: number): Tensor;
}

export interface GPTOptions extends LayerOptions {
  /** Seed of the initialization (used when no generator is given); default 0. */
  seed?: number | bigint;
  /** Builds the blocks' linear layers (default: defaultLinearFactory; tensor parallelism substitutes its own). */
  linearFactory?: LinearFactory;
  /** Where the vocabulary lives (default: defaultVocabLayout, all of it here). */
  vocabLayout?: VocabLayout;
  /** How the sequence is held between the linear layers (default: wholeSequence). */
  sequenceLayout?: SequenceLayout;
  /** How the sequence is split over context-parallel processes (default: not at all). */
  contextLayout?: ContextLayout;
  /** Recompute each block's activations in backward; overrides config.recompute when given. */
  recompute?: boolean;
  /**
   * Expert parallelism and router count sums for the MoE blocks (lib/parallel/expert-parallel.ts), or
   * a function of the config's number of experts giving it (what nt.train.setup passes); default: all experts here.
   */
  moeParallel?: MoEParallel | ((experts: number) => MoEParallel);
}

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

/** The vocabulary size rounded up to a multiple (nanoGPT pads GPT-2's 50257 to 50304 = 64·786) so it splits evenly and GEMMs align. */
export function padVocab(vocabSize: number, multiple: number): number {
  if (!Number.isInteger(vocabSize) || vocabSize <= 0) throw new ArgumentError(`padVocab: vocabSize must be a positive integer, got ${vocabSize}`);
  if (!Number.isInteger(multiple) || multiple <= 0) throw new ArgumentError(`padVocab: multiple must be a positive integer, got ${multiple}`);
  return Math.ceil(vocabSize / multiple) * multiple;
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

/** What {@link GPT.forward} returns. */
export interface GPTOutput {
  /**
   * [B, T, vocabSize]; under a vocabulary-parallel layout [B, T, vocabSize / tp], this rank's
   * contiguous slice of the vocabulary (GPT.gatherLogits gives the full rows). Null when targets
   * were given and the fused head computed the loss (config.fusedHead, the default): call forward
   * without targets for logits.
   */
  logits: Tensor | null;
  /** Mean cross-entropy over all positions, when targets were given. */
  loss: Tensor | null;
}

/** What {@link GPT.forward} returns without targets: the logits, and no loss. */
export interface GPTLogitsOutput extends GPTOutput {
  /** [B, T, vocabSize] (this rank's vocabulary slice under a vocabulary-parallel layout). */
  logits: Tensor;
  /** No targets, no loss. */
  loss: null;
}

/** Options of {@link GPT.generate}. */
export interface GenerateOptions {
  /** Divides the logits before sampling (default 1; must be > 0). */
  temperature?: number;
  /** Sample only among the k most likely tokens. */
  topK?: number;
  /** Seed of the sampling draws (default 0). */
  seed?: number | bigint;
}

/** The dimensions of a decoder-only language model that layouts, the planner and progress lines read. */
export interface ModelShape {
  /** Transformer blocks. */
  nLayer: number;
  /** Attention (query) heads. */
  nHead: number;
  /** Key/value heads (nHead without grouped-query attention). */
  nKvHead: number;
  /** Width of the residual stream. */
  nEmbd: number;
  /** Hidden units of the MLP. */
  ffnHidden: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** Longest context. */
  blockSize: number;
  /** Sliding-window attention, when the model has it (a GPTConfig's window): context parallelism refuses it. */
  window?: number;
  /** Dropout probability, when nonzero (a GPTConfig's dropout): context parallelism refuses it. */
  dropout?: number;
  /** The routed experts of its MoE layers, when it has any: expert parallelism must divide them; sp and cp refuse them. */
  moeExperts?: number;
}

/** The named modules a pipeline stage holds besides its blocks (CausalLM.stageModules). */
export interface StageModules {
  /** Before the blocks, on the first stage: the embeddings (and, on the last, a tied table). */
  before: Array<[string, Module]>;
  /** After the blocks, on the last stage: the final norm and the head. */
  after: Array<[string, Module]>;
}

/**
 * What the parallel machinery (pipeline stages, tensor-parallel layouts, nt.train.setup) needs of a
 * decoder-only model: the GPT and nt.nn.Llama both are one. forward = head(forwardBlocks(embed(idx))).
 */
export interface CausalLM extends Module {
  /** The model family ('gpt' or 'llama'); checkpoints record it. */
  readonly family: 'gpt' | 'llama';
  /** The checked config. */
  readonly config: Readonly<object>;
  /**
   * Its dimensions, and what layouts must know beyond them (a sliding window, dropout, MoE experts):
   * nt.train.setup checks every model's layout against this alone.
   */
  readonly shape: ModelShape;
  /** The transformer blocks, named `${blockPrefix}.i`. */
  readonly blocks: readonly Module[];
  /** The field holding the blocks ('h' for the GPT, 'layers' for Llama). */
  readonly blockPrefix: string;
  /** The generator of the initialization and of dropout. */
  readonly generator: Generator;
  /** Where the vocabulary lives. */
  readonly vocabLayout: VocabLayout;
  /** How the sequence is held. */
  readonly sequenceLayout: SequenceLayout;
  /** How the sequence is split over context-parallel processes (null: not split). */
  readonly contextLayout: ContextLayout | null;
  /** Token ids i32 [B, T] → the first block's input [B, T', C]. */
  embed(idx: Tensor): Tensor;
  /** Blocks [start, end) over x. */
  forwardBlocks(x: Tensor, start?: number, end?: number): Tensor;
  /** The final norm and the LM head; the loss when targets are given. */
  head(x: Tensor, targets?: Tensor): GPTOutput;
  /** Logits, and the loss when targets are given. */
  forward(idx: Tensor, targets?: Tensor): GPTOutput;
  /** Full-vocabulary logits from forward's. */
  gatherLogits(logits: Tensor): Tensor;
  /**
   * The named modules a pipeline stage holds besides its blocks: `before` them on the first stage
   * (the embeddings) and `after` them on the last (final norm, head); a tied table on both.
   */
  stageModules(first: boolean, last: boolean): StageModules;
  /** The token table when the LM head is tied to it (held by the first and the last stage), else null. */
  readonly tiedWeight: Parameter | null;
  /** A new model of the same config built with other options (a whole copy for a split model's export). */
  rebuild(opts: GPTOptions): CausalLM;
  /** Appends sampled tokens (see GPT.generate). */
  generate(idx: Tensor, maxNewTokens: number, opts?: GenerateOptions): number[][];
}


/**
 * The first part of both models' embed(): checks token ids idx (i32 [B, T]) against the context
 * limit (T times the context-parallel parts) and looks them up in the token table; returns the
 * embeddings of the sequence layout's chunk [start, start + count) of the t positions.
 */
export function lookUpTokens(model: Pick<CausalLM, 'contextLayout' | 'sequenceLayout'>, call: string, idx: Tensor, table: TokenEmbedding,
  [limitName, limit]: readonly [string, number]): { tokens: Tensor; t: number; start: number; count: number } {
  checkTensor(idx, call, 'idx');
  if (idx.ndim !== 2 || idx.dtype !== 'i32') throw new ArgumentError(`${call}: idx must be i32 [B, T], got ${idx.describe()}`);
  const t = idx.shape[1]!, cp = model.contextLayout?.parts ?? 1;
  if (t * cp > limit) {
    throw new ShapeError(`${call}: sequence length ${t * cp}${cp > 1 ? ` (${t} tokens on each of ${cp} context-parallel processes)` : ''} exceeds ${limitName} ${limit}`);
  }
  const { start, count } = model.sequenceLayout.chunk(t);
  const tokens = table.forward(idx);
  if (tokens.shape[1] !== count) {
    throw new StateError(`${call}: the token embedding gave ${tokens.describe()}, but the sequence layout holds ${count} of the ${t} positions here (pair the vocabulary and sequence layouts)`);
  }
  return { tokens, t, start, count };
}

/**
 * What a model's constructor takes from its options (the GPT's and nt.nn.Llama's): the generator (the
 * options' own, else one seeded with `seed`), the layers' device and dtype, the linear factory and the
 * vocabulary and sequence layouts, with their defaults.
 */
export function modelParts(opts: GPTOptions): { generator: Generator; layer: LayerOptions; factory: LinearFactory; vocabLayout: VocabLayout; sequenceLayout: SequenceLayout } {
  const generator = opts.generator ?? new Generator(opts.seed ?? 0);
  return {
    generator, layer: { device: opts.device, dtype: opts.dtype, generator }, factory: opts.linearFactory ?? defaultLinearFactory,
    vocabLayout: opts.vocabLayout ?? defaultVocabLayout, sequenceLayout: opts.sequenceLayout ?? wholeSequence,
  };
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

/**
 * Samples maxNewTokens tokens after each row of idx with any CausalLM (the GPT's and Llama's generate): see GPT.generate.
 */
export function generateTokens(model: CausalLM, idx: Tensor, maxNewTokens: number, { temperature = 1, topK, seed = 0 }: GenerateOptions = {}): number[][] {
  if (!Number.isInteger(maxNewTokens) || maxNewTokens < 0) throw new ArgumentError(`generate: maxNewTokens must be an integer >= 0`);
  if (!(temperature > 0)) throw new ArgumentError(`generate: temperature must be > 0, got ${temperature}`);
  if (topK !== undefined && (!Number.isInteger(topK) || topK < 1)) throw new ArgumentError(`generate: topK must be a positive integer`);
  checkTensor(idx, 'generate', 'idx');
  if (idx.ndim !== 2 || idx.dtype !== 'i32') throw new ArgumentError(`generate: idx must be i32 [B, T], got ${idx.describe()}`);
  const [b, t0] = idx.shape as [number, number];
  const flat = Array.from(idx.toArraySync());
  const rows = Array.from({ length: b }, (_, i) => flat.slice(i * t0, (i + 1) * t0));
  const gen = new Generator(seed);
  const wasTraining = model.training;
  model.eval();
  try {
    noGrad(() => {
      const multiple = model.sequenceLayout.parts;
      const longest = Math.floor(model.shape.blockSize / multiple) * multiple;
      if (longest === 0) throw new ShapeError(`generate: blockSize ${model.shape.blockSize} holds no sequence whose length is a multiple of ${multiple}`);
      for (let step = 0; step < maxNewTokens; step++) {
        const ctx = rows.map((r) => r.slice(-longest));
        const t = ctx[0]!.length, padded = Math.ceil(t / multiple) * multiple;
        const ids = Int32Array.from(ctx.flatMap((r) => [...r, ...new Array<number>(padded - t).fill(0)]));
        // Every intermediate of the forward pass is released with the step's scope.
        const all = scope(() => model.gatherLogits(model.forward(tensor(ids, [b, padded], { device: idx.device })).logits!).toArraySync());
        const u = uniformDraws(b, gen);
        const v = model.shape.vocabSize;
        for (let i = 0; i < b; i++) rows[i]!.push(sample(all.subarray((i * padded + t - 1) * v, (i * padded + t) * v) as Float32Array, temperature, topK, u[i]!));
      }
    });
  } finally {
    model.train(wasTraining);
  }
  return rows;
}

/** n uniform numbers in [0, 1) from the Philox generator. */
function uniformDraws(n: number, gen: Generator): Float32Array {
  const u = rand([n], { generator: gen });
  try { return u.toArraySync() as Float32Array; } finally { u.dispose(); }
}

/** Samples one token id from logits with temperature and top-k, using the uniform number u in [0, 1). */
export function sample(logits: Float32Array, temperature: number, topK: number | undefined, u: number): number {
  if (!(logits instanceof Float32Array) || logits.length === 0) throw new ArgumentError('sample: logits must be a non-empty Float32Array');
  if (!(temperature > 0) || !Number.isFinite(temperature)) throw new ArgumentError(`sample: temperature must be a finite number > 0, got ${temperature}`);
  if (topK !== undefined && (!Number.isInteger(topK) || topK < 1)) throw new ArgumentError(`sample: topK must be an integer >= 1, got ${topK}`);
  if (!(u >= 0 && u < 1)) throw new ArgumentError(`sample: u must be a uniform number in [0, 1), got ${u}`);
  const scaled = Float64Array.from(logits, (x) => x / temperature);
  let threshold = -Infinity;
  if (topK !== undefined && topK < scaled.length) threshold = [...scaled].sort((a, b) => b - a)[topK - 1]!;
  let max = -Infinity;
  for (const x of scaled) if (x >= threshold && x > max) max = x;
  let total = 0;
  const w = scaled.map((x) => (x >= threshold ? Math.exp(x - max) : 0));
  for (const x of w) total += x;
  let acc = 0;
  const target = u * total;
  for (let i = 0; i < w.length; i++) {
    acc += w[i]!;
    if (acc > target && w[i]! > 0) return i;
  }
  for (let i = w.length - 1; i >= 0; i--) if (w[i]! > 0) return i;
  return 0;
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
