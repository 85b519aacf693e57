// What a decoder-only language model is to the rest of nodetron, whatever its family (the GPT in
// gpt.ts, Llama in llama.ts): the CausalLM contract pipeline stages, tensor-parallel layouts, the
// trainer, checkpoints and nt.train.setup program against, and the seams a model is built through so
// that the parallel code never enters the model — a LinearFactory for every projection (tensor
// parallelism substitutes its split layers), a VocabLayout for the token table, the tied head and the
// loss, a SequenceLayout for the regions between them (sequence parallelism), a ContextLayout for the
// positions and attention (context parallelism). Also what every family shares: the token lookup,
// the options' defaults, and sampling (generate).
import { noGrad } from '../autograd/index.js';
import { rand, tensor } from '../creation.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { crossEntropy, linear, linearCrossEntropy } from '../ops/index.js';
import { scope } from '../memory.js';
import { Generator } from '../random.js';
import { checkTensor, type Tensor } from '../tensor.js';
import { constant, normal } from './init.js';
import { Embedding, Linear, type LayerOptions } from './layers.js';
import { Module, type Parameter } from './module.js';
import type { MoEParallel } from './moe.js';

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

/** The model dimensions a LinearFactory receives as `config` (tensor parallelism checks that its group divides them). */
export type LinearFactoryModel = Pick<ModelShape, 'nHead' | 'nEmbd' | 'vocabSize'>;

/**
 * Builds the linear layers of a block; the default is a plain Linear with weights N(0, std) and zero
 * biases. A factory must draw exactly one N(0, std) sample of the full [outFeatures, inFeatures]
 * weight from layer.generator (and nothing else), so every way of building the model starts from
 * the same weights for a seed.
 */
export type LinearFactory = (inFeatures: number, outFeatures: number,
  opts: { role: LinearRole; bias: boolean; std: number; layer: LayerOptions; config: Readonly<LinearFactoryModel>; attention?: AttentionHeads }) => LinearLike;

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

/** How a CausalLM is built: its seed, device and dtype, and the seams the parallel layouts substitute. */
export interface CausalLMOptions extends LayerOptions {
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

/** The vocabulary size rounded up to a multiple (nanoGPT pads GPT-2's 50257 to 50304 = 64·786) so it splits evenly and GEMMs align. */
export function padVocab(vocabSize: number, multiple: number): number {
  if (!Number.isInteger(vocabSize) || vocabSize <= 0) throw new ArgumentError(`padVocab: vocabSize must be a positive integer, got ${vocabSize}`);
  if (!Number.isInteger(multiple) || multiple <= 0) throw new ArgumentError(`padVocab: multiple must be a positive integer, got ${multiple}`);
  return Math.ceil(vocabSize / multiple) * multiple;
}

/** What a CausalLM's forward returns. */
export interface CausalLMOutput {
  /**
   * [B, T, vocabSize]; under a vocabulary-parallel layout [B, T, vocabSize / tp], this rank's
   * contiguous slice of the vocabulary (gatherLogits gives the full rows). Null when targets
   * were given and the fused head computed the loss (config.fusedHead, the default): call forward
   * without targets for logits.
   */
  logits: Tensor | null;
  /** Mean cross-entropy over all positions, when targets were given. */
  loss: Tensor | null;
}

/** What a CausalLM's forward returns without targets: the logits, and no loss. */
export interface CausalLMLogitsOutput extends CausalLMOutput {
  /** [B, T, vocabSize] (this rank's vocabulary slice under a vocabulary-parallel layout). */
  logits: Tensor;
  /** No targets, no loss. */
  loss: null;
}

/** Options of a CausalLM's generate. */
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

/** A model's parameters (CausalLM.parameterCounts). */
export interface ParameterCounts {
  /** All of them, a tied table counted once. */
  total: number;
  /** Those one token goes through: under MoE the router, its top-k experts and the shared experts, not the other experts; `total` for a dense model. */
  active: number;
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
  /** The model family ('gpt', 'llama', or a new family's own name); checkpoints record it. */
  readonly family: string;
  /** The checked config. */
  readonly config: Readonly<object>;
  /**
   * Its dimensions, and what layouts must know beyond them (a sliding window, dropout, MoE experts):
   * nt.train.setup checks every model's layout against this alone.
   */
  readonly shape: ModelShape;
  /**
   * Its parameters, counted from its config (a whole model's, whatever part this process holds): all
   * of them (a tied table once), and those one token goes through (under MoE its top-k experts, not
   * the others; `total` for a dense model).
   */
  readonly parameterCounts: ParameterCounts;
  /**
   * Model FLOPs per trained token (forward and backward) at sequence length `seqLen`: 6 per parameter
   * a token goes through (a lookup table not counted) plus attention's two matrix products;
   * recomputation not counted (model FLOPs, not hardware FLOPs). Progress lines' MFU divides by it.
   */
  flopsPerToken(seqLen: number): number;
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
  head(x: Tensor, targets?: Tensor): CausalLMOutput;
  /** Logits, and the loss when targets are given. */
  forward(idx: Tensor, targets?: Tensor): CausalLMOutput;
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
  rebuild(opts: CausalLMOptions): CausalLM;
  /** Appends sampled tokens (see generateTokens). */
  generate(idx: Tensor, maxNewTokens: number, opts?: GenerateOptions): number[][];
}

/** The CausalLM members a model must have, by kind: the contract as a list, which isCausalLM checks. */
const CAUSAL_LM_METHODS = ['flopsPerToken', 'embed', 'forwardBlocks', 'head', 'forward', 'gatherLogits', 'stageModules', 'rebuild', 'generate'] as const;
const CAUSAL_LM_FIELDS = ['config', 'shape', 'parameterCounts', 'blocks', 'generator', 'vocabLayout', 'sequenceLayout', 'contextLayout', 'tiedWeight'] as const;

/**
 * What `model` lacks of the CausalLM contract (empty when it is one): a Module with a family name, a
 * blockPrefix, the fields and the methods above. nt.train.setup takes any model of any family that
 * passes (the GPT, nt.nn.Llama, or a family of one's own), as the pipeline stage and the trainer do.
 */
export function causalLMProblems(model: unknown): string[] {
  if (model === null || typeof model !== 'object') return [`it is ${model === null ? 'null' : typeof model}, not a model`];
  const m = model as Record<string, unknown>;
  const problems: string[] = [];
  if (!(model instanceof Module)) problems.push('it is not an nt.nn.Module');
  for (const k of ['family', 'blockPrefix'] as const) if (typeof m[k] !== 'string' || m[k] === '') problems.push(`${k} is not a non-empty string`);
  const missingFields = CAUSAL_LM_FIELDS.filter((k) => !(k in m));
  if (missingFields.length) problems.push(`it has no ${missingFields.join(', ')}`);
  const missingMethods = CAUSAL_LM_METHODS.filter((k) => typeof m[k] !== 'function');
  if (missingMethods.length) problems.push(`it has no method ${missingMethods.join(', ')}`);
  return problems;
}

/** Whether `model` is a CausalLM (see causalLMProblems): what nt.train.setup checks a factory's model by, whatever its family. */
export function isCausalLM(model: unknown): model is CausalLM {
  return causalLMProblems(model).length === 0;
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
export function modelParts(opts: CausalLMOptions): { generator: Generator; layer: LayerOptions; factory: LinearFactory; vocabLayout: VocabLayout; sequenceLayout: SequenceLayout } {
  const generator = opts.generator ?? new Generator(opts.seed ?? 0);
  return {
    generator, layer: { device: opts.device, dtype: opts.dtype, generator }, factory: opts.linearFactory ?? defaultLinearFactory,
    vocabLayout: opts.vocabLayout ?? defaultVocabLayout, sequenceLayout: opts.sequenceLayout ?? wholeSequence,
  };
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

