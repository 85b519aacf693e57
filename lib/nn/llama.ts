// Llama (Touvron et al.; Hugging Face's LlamaForCausalLM): token embedding, pre-RMSNorm blocks of
// grouped-query attention with rotary position embeddings (rotate-half layout) and a SwiGLU MLP, a final
// RMSNorm and an untied (or tied) LM head; no biases. Configured like Hugging Face's LlamaConfig
// (snake_case or camelCase). Built through the CausalLM seams (lib/nn/causal-lm.ts): a LinearFactory for every
// projection (tensor parallelism substitutes its split layers, with the key/value heads split or
// replicated), a VocabLayout for the table, the head and the loss, a SequenceLayout for the norms and
// residuals; it is a CausalLM, so pipeline stages, the parallel trainer and nt.train.setup take it as
// they take the GPT. The MLP is a replaceable module (LlamaOptions.mlp); with numLocalExperts > 0 the
// config makes Mixtral or Qwen2-MoE: nt.nn.MoE (router, SwiGLU experts, Qwen2-MoE's sigmoid-gated
// shared expert) in the MLP slot of the blocks isLlamaMoEBlock names, its auxiliary losses reaching the
// training loss as the GPT's do, its experts split by expert parallelism (CausalLMOptions.moeParallel).
import { recompute } from '../autograd/index.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { add, cat, groupedQueryAttention, rmsNorm, rope, swiglu } from '../ops/index.js';
import { residualStream } from '../ops/autocast.js';
import { tensor } from '../creation.js';
import { traceLayer } from '../observe/trace.js';
import { Generator } from '../random.js';
import { checkTensor, type Tensor } from '../tensor.js';
import {
  generateTokens, lookUpTokens, modelParts, type AttentionHeads, type CausalLM, type CausalLMOptions, type CausalLMOutput, type GenerateOptions,
  type ContextLayout, type LinearFactory, type LinearFactoryModel, type LinearLike, type ModelShape, type ParameterCounts, type StageModules, type SequenceLayout, type TokenEmbedding, type VocabLayout,
} from './causal-lm.js';
import { RMSNorm, type LayerOptions } from './layers.js';
import { Module, type Parameter } from './module.js';
import { decoderFlopsPerToken, decoderParameterCounts, type DecoderShape } from './counts.js';
import { addMoEStats, MoE, moeLayers, type MoEConfig, type MoEParallel, type MoEStats } from './moe.js';

/**
 * A Llama's shape, as Hugging Face's LlamaConfig names it (camelCase here; {@link llamaConfig} also
 * reads a config.json's snake_case).
 */
export interface LlamaConfig {
  /** Vocabulary size. */
  vocabSize: number;
  /** Width of the residual stream (hidden_size). */
  hiddenSize: number;
  /** Hidden units of the SwiGLU MLP (intermediate_size). */
  intermediateSize: number;
  /** Transformer blocks (num_hidden_layers). */
  numHiddenLayers: number;
  /** Query heads (num_attention_heads); must divide hiddenSize. */
  numAttentionHeads: number;
  /** Key/value heads (num_key_value_heads; default numAttentionHeads; 1 is multi-query); must divide numAttentionHeads. */
  numKeyValueHeads?: number;
  /** Base of the rotary angles (rope_theta, default 10000). */
  ropeTheta?: number;
  /** RMSNorm's epsilon (rms_norm_eps, default 1e-6). */
  rmsNormEps?: number;
  /** Tie the LM head to the token table (tie_word_embeddings, default false). */
  tieWordEmbeddings?: boolean;
  /** Longest context (max_position_embeddings). */
  maxPositionEmbeddings: number;
  /** Standard deviation of the weights' normal initialization (initializer_range, default 0.02). */
  initializerRange?: number;
  /** Recompute each block's activations in backward instead of storing them. */
  recompute?: boolean;
  /** Biases on the q, k and v projections (Qwen2-MoE's qkv_bias; default false). */
  qkvBias?: boolean;
  // --- mixture of experts (Mixtral's MixtralConfig, Qwen2-MoE's Qwen2MoeConfig); numLocalExperts 0: every block dense.
  /** Routed experts per MoE block (num_local_experts, or Qwen2-MoE's num_experts; default 0: no MoE). */
  numLocalExperts?: number;
  /** Experts per token (num_experts_per_tok, default 2; at most numLocalExperts). */
  numExpertsPerTok?: number;
  /** Hidden units of each expert's SwiGLU (moe_intermediate_size; default intermediateSize, as Mixtral's experts). */
  moeIntermediateSize?: number;
  /** Hidden units of the shared expert every token goes through, gated per token by a sigmoid (shared_expert_intermediate_size; default 0: none). */
  sharedExpertIntermediateSize?: number;
  /** Every n-th block (blocks n-1, 2n-1, ...) holds the MoE, the others the dense MLP (decoder_sparse_step, default 1). */
  decoderSparseStep?: number;
  /** Blocks that keep the dense MLP whatever decoderSparseStep says (mlp_only_layers, default []). */
  mlpOnlyLayers?: number[];
  /** Renormalize the k chosen router probabilities to sum to 1 (norm_topk_prob; default true as Mixtral; Qwen2-MoE's default is false). */
  normTopkProb?: boolean;
  /** Coefficient of the Switch load-balancing loss of each MoE block, added to the training loss (router_aux_loss_coef, default 0.001). */
  routerAuxLossCoef?: number;
  /** Coefficient of the router z-loss of each MoE block (nodetron's; default 0, as neither Hugging Face model has one). */
  routerZLossCoef?: number;
  /** Multiplicative jitter on the router's input in training (router_jitter_noise): only 0 is computed. */
  routerJitterNoise?: number;
}

/** A checked LlamaConfig: every optional field filled. */
export type CheckedLlamaConfig = Required<LlamaConfig>;

/**
 * config.json's names of the LlamaConfig fields (Hugging Face's LlamaConfig, MixtralConfig and
 * Qwen2MoeConfig: num_experts is Qwen2-MoE's num_local_experts): the one table of them, which
 * llamaConfig reads and interop's HF_CONFIG_KEYS (lib/interop/hf-common.ts) takes the Llamas' names from.
 */
export const LLAMA_CONFIG_JSON_KEYS: Readonly<Record<string, keyof LlamaConfig>> = {
  vocab_size: 'vocabSize', hidden_size: 'hiddenSize', intermediate_size: 'intermediateSize', num_hidden_layers: 'numHiddenLayers',
  num_attention_heads: 'numAttentionHeads', num_key_value_heads: 'numKeyValueHeads', rope_theta: 'ropeTheta', rms_norm_eps: 'rmsNormEps',
  tie_word_embeddings: 'tieWordEmbeddings', max_position_embeddings: 'maxPositionEmbeddings', initializer_range: 'initializerRange',
  qkv_bias: 'qkvBias', num_local_experts: 'numLocalExperts', num_experts: 'numLocalExperts', num_experts_per_tok: 'numExpertsPerTok',
  moe_intermediate_size: 'moeIntermediateSize', shared_expert_intermediate_size: 'sharedExpertIntermediateSize', decoder_sparse_step: 'decoderSparseStep',
  mlp_only_layers: 'mlpOnlyLayers', norm_topk_prob: 'normTopkProb', router_aux_loss_coef: 'routerAuxLossCoef', router_jitter_noise: 'routerJitterNoise',
};
const CAMEL = new Set<string>([...Object.values(LLAMA_CONFIG_JSON_KEYS), 'recompute', 'routerZLossCoef']);

/**
 * Checks a Llama config given in camelCase or Hugging Face's snake_case (a config.json's fields; keys
 * of neither form that a LlamaConfig has, such as architectures or torch_dtype, are ignored) and fills
 * the defaults. Bad values throw one ArgumentError naming every problem (key/value heads that do not
 * divide the heads, a width the heads do not divide, an odd head dim...).
 */
export function llamaConfig(input: LlamaConfig | Record<string, unknown>): CheckedLlamaConfig {
  if (input === null || typeof input !== 'object') {
    throw new ArgumentError(`LlamaConfig: the config must be an object { vocabSize, hiddenSize, intermediateSize, numHiddenLayers, numAttentionHeads, maxPositionEmbeddings, ... }, got ${input === null ? 'null' : typeof input}`);
  }
  const c: Partial<Record<keyof LlamaConfig, unknown>> = {};
  for (const [k, v] of Object.entries(input)) {
    if (v === undefined) continue;
    const key = (Object.hasOwn(LLAMA_CONFIG_JSON_KEYS, k) ? LLAMA_CONFIG_JSON_KEYS[k] : undefined) ?? (CAMEL.has(k) ? (k as keyof LlamaConfig) : undefined);
    if (key === undefined) continue;
    if (key in c && c[key] !== v) throw new ArgumentError(`LlamaConfig: ${k} is given twice with different values (${String(c[key])} and ${String(v)})`);
    c[key] = v;
  }
  const problems: string[] = [];
  const posInt = (k: keyof LlamaConfig, fallback?: number): number => {
    const v = c[k] ?? fallback;
    if (!Number.isInteger(v) || (v as number) <= 0) { problems.push(`${k} must be a positive integer, got ${String(v)}`); return 1; }
    return v as number;
  };
  const vocabSize = posInt('vocabSize'), hiddenSize = posInt('hiddenSize'), intermediateSize = posInt('intermediateSize');
  const numHiddenLayers = posInt('numHiddenLayers'), numAttentionHeads = posInt('numAttentionHeads');
  const numKeyValueHeads = posInt('numKeyValueHeads', numAttentionHeads), maxPositionEmbeddings = posInt('maxPositionEmbeddings');
  const num = (k: keyof LlamaConfig, fallback: number): number => {
    const v = c[k] ?? fallback;
    if (typeof v !== 'number' || !(v > 0) || !Number.isFinite(v)) { problems.push(`${k} must be a finite number > 0, got ${String(v)}`); return fallback; }
    return v;
  };
  const ropeTheta = num('ropeTheta', 10000), rmsNormEps = num('rmsNormEps', 1e-6), initializerRange = num('initializerRange', 0.02);
  const bool = (k: keyof LlamaConfig): boolean => {
    const v = c[k] ?? false;
    if (typeof v !== 'boolean') { problems.push(`${k} must be a boolean, got ${String(v)}`); return false; }
    return v;
  };
  const tieWordEmbeddings = bool('tieWordEmbeddings'), recomputeBlocks = bool('recompute'), qkvBias = bool('qkvBias');
  // Mixture of experts.
  const count = (k: keyof LlamaConfig, fallback: number, min: number): number => {
    const v = c[k] ?? fallback;
    if (!Number.isInteger(v) || (v as number) < min) { problems.push(`${k} must be an integer >= ${min}, got ${String(v)}`); return fallback; }
    return v as number;
  };
  const coef = (k: keyof LlamaConfig, fallback: number): number => {
    const v = c[k] ?? fallback;
    if (typeof v !== 'number' || !(v >= 0) || !Number.isFinite(v)) { problems.push(`${k} must be a finite number >= 0, got ${String(v)}`); return fallback; }
    return v;
  };
  const numLocalExperts = count('numLocalExperts', 0, 0), numExpertsPerTok = count('numExpertsPerTok', Math.min(2, Math.max(1, numLocalExperts)), 1);
  const moeIntermediateSize = count('moeIntermediateSize', intermediateSize, 1), sharedExpertIntermediateSize = count('sharedExpertIntermediateSize', 0, 0);
  const decoderSparseStep = count('decoderSparseStep', 1, 1);
  const routerAuxLossCoef = coef('routerAuxLossCoef', 0.001), routerZLossCoef = coef('routerZLossCoef', 0), routerJitterNoise = coef('routerJitterNoise', 0);
  const normTopkProb = c.normTopkProb === undefined ? true : bool('normTopkProb');
  const only = c.mlpOnlyLayers ?? [];
  let mlpOnlyLayers: number[] = [];
  if (!Array.isArray(only) || !only.every((i) => Number.isInteger(i) && i >= 0 && i < numHiddenLayers)) {
    problems.push(`mlpOnlyLayers must be an array of block indices 0..${numHiddenLayers - 1}, got ${JSON.stringify(only)}`);
  } else mlpOnlyLayers = [...new Set(only as number[])].sort((a, b) => a - b);
  if (numLocalExperts > 0 && numExpertsPerTok > numLocalExperts) problems.push(`numExpertsPerTok (${numExpertsPerTok}) must not exceed numLocalExperts (${numLocalExperts})`);
  if (routerJitterNoise !== 0) problems.push(`routerJitterNoise ${routerJitterNoise} is not computed (only 0: no router jitter)`);
  if (numLocalExperts > 0 && decoderSparseStep > numHiddenLayers) problems.push(`decoderSparseStep (${decoderSparseStep}) exceeds numHiddenLayers (${numHiddenLayers}), so no block would hold the experts`);
  if (numAttentionHeads % numKeyValueHeads !== 0) problems.push(`numKeyValueHeads (${numKeyValueHeads}) must divide numAttentionHeads (${numAttentionHeads})`);
  if (hiddenSize % numAttentionHeads !== 0) problems.push(`numAttentionHeads (${numAttentionHeads}) must divide hiddenSize (${hiddenSize})`);
  else if ((hiddenSize / numAttentionHeads) % 2 !== 0) problems.push(`the head dim hiddenSize / numAttentionHeads = ${hiddenSize / numAttentionHeads} must be even (rotary embeddings rotate pairs)`);
  if (problems.length) throw new ArgumentError(`LlamaConfig: ${problems.join('; ')}`);
  return {
    vocabSize, hiddenSize, intermediateSize, numHiddenLayers, numAttentionHeads, numKeyValueHeads, ropeTheta, rmsNormEps, tieWordEmbeddings,
    maxPositionEmbeddings, initializerRange, recompute: recomputeBlocks, qkvBias, numLocalExperts, numExpertsPerTok, moeIntermediateSize,
    sharedExpertIntermediateSize, decoderSparseStep, mlpOnlyLayers, normTopkProb, routerAuxLossCoef, routerZLossCoef, routerJitterNoise,
  };
}

/** Whether block `index` of a Llama of this config holds a mixture of experts (Qwen2-MoE's rule: experts, not in mlpOnlyLayers, (index + 1) % decoderSparseStep == 0). */
export function isLlamaMoEBlock(config: CheckedLlamaConfig, index: number): boolean {
  return config.numLocalExperts > 0 && !config.mlpOnlyLayers.includes(index) && (index + 1) % config.decoderSparseStep === 0;
}

/** The nt.nn.MoE config of a Llama's MoE blocks (null without experts). */
export function llamaMoEConfig(config: CheckedLlamaConfig): MoEConfig | null {
  if (config.numLocalExperts === 0) return null;
  const shared = config.sharedExpertIntermediateSize;
  return {
    experts: config.numLocalExperts, topK: config.numExpertsPerTok, hidden: config.moeIntermediateSize, normalizeTopK: config.normTopkProb,
    auxLossCoef: config.routerAuxLossCoef, zLossCoef: config.routerZLossCoef,
    ...(shared > 0 ? { sharedExperts: 1, sharedHidden: shared, sharedGate: true } : {}),
  };
}

/** The dimensions a LinearFactory receives as `config` (tensor parallelism checks its heads, width and vocabulary). */
function factoryModel(c: CheckedLlamaConfig): LinearFactoryModel {
  return { nHead: c.numAttentionHeads, nEmbd: c.hiddenSize, vocabSize: c.vocabSize };
}

/** What {@link LlamaBlock} needs of its MLP: x [B, T', C] → [B, T', C] (a mixture of experts may take its place). */
export interface LlamaMLPLike extends Module {
  /** x [B, T', C] → [B, T', C]. */
  forward(x: Tensor): Tensor;
}

/** Builds a block's MLP (default: {@link LlamaMLP}); `layer` is the block's index. */
export type LlamaMLPFactory = (config: CheckedLlamaConfig, opts: { layer: LayerOptions; factory: LinearFactory; index: number }) => LlamaMLPLike;

/** The Llama config fields the parameter and FLOP counts read. */
export type LlamaCountConfig = Pick<LlamaConfig, 'vocabSize' | 'hiddenSize' | 'intermediateSize' | 'numHiddenLayers' | 'numAttentionHeads' | 'numKeyValueHeads' | 'tieWordEmbeddings'
  | 'qkvBias' | 'numLocalExperts' | 'numExpertsPerTok' | 'moeIntermediateSize' | 'sharedExpertIntermediateSize' | 'decoderSparseStep' | 'mlpOnlyLayers'>;

/**
 * A Llama's shape as lib/nn/counts.ts counts it: no biases but q/k/v's under qkvBias, RMSNorm scales,
 * rotary positions (no table), a SwiGLU MLP, the head tied or not, and the MoE blocks isLlamaMoEBlock
 * places (numLocalExperts > 0: router, experts of moeIntermediateSize, the sigmoid-gated shared expert).
 * Reads the config's fields as given, with llamaConfig's defaults for the optional ones.
 */
export function llamaDecoderShape(config: LlamaCountConfig): DecoderShape {
  const { vocabSize, hiddenSize: width, intermediateSize: ffn, numHiddenLayers: layers, numAttentionHeads: heads } = config;
  const shape: DecoderShape = {
    layers, width, heads, kvHeads: config.numKeyValueHeads ?? heads, ffn, vocab: vocabSize, gated: true, bias: false, tied: config.tieWordEmbeddings === true,
    positions: 0, qkvBias: config.qkvBias === true,
  };
  const e = config.numLocalExperts ?? 0, step = config.decoderSparseStep ?? 1, only = config.mlpOnlyLayers ?? [];
  if (e > 0) {
    let moeLayers = 0;
    for (let i = 0; i < layers; i++) if (!only.includes(i) && (i + 1) % step === 0) moeLayers++;
    const shared = config.sharedExpertIntermediateSize ?? 0;
    shape.moe = { layers: moeLayers, experts: e, topK: Math.min(config.numExpertsPerTok ?? 2, e), hidden: config.moeIntermediateSize ?? ffn, sharedHidden: shared, sharedGate: shared > 0 };
  }
  return shape;
}

/**
 * Parameters of a Llama of this configuration, all of them (a tied head counted once): RMSNorm scales
 * only, q/k/v biases under qkvBias. MoE blocks (numLocalExperts > 0, as nt.nn.isLlamaMoEBlock places them)
 * count the router, the experts (with `active`, only the numExpertsPerTok a token goes through) and the
 * gated shared expert. lib/nn/counts.ts's decoderParameterCounts of the shape llamaDecoderShape gives.
 */
export function llamaParameterCount(config: LlamaCountConfig, active = false): number {
  const counts = decoderParameterCounts(llamaDecoderShape(config));
  return active ? counts.active : counts.total;
}

/**
 * A Llama's model FLOPs per trained token at `seqLen`: 6·N (N without the token table, a lookup; the
 * untied head's table counted; under MoE the parameters a token goes through) plus 12·L·H·D·T for
 * attention's two matrix products, as for the GPT (lib/nn/counts.ts's decoderFlopsPerToken).
 */
export function llamaFlopsPerToken(config: LlamaCountConfig, seqLen: number): number {
  return decoderFlopsPerToken(llamaDecoderShape(config), seqLen);
}

/** Options of {@link Llama}: every CausalLM's (seed, device, dtype, tensor-parallel seams) plus the MLP's factory. */
export interface LlamaOptions extends CausalLMOptions {
  /** Builds each block's MLP (default: the SwiGLU LlamaMLP). */
  mlp?: LlamaMLPFactory;
}

/**
 * Llama's attention: q, k, v projections (k and v of the key/value heads), rotary embeddings on q and k,
 * grouped-query flash attention, the output projection. Under context parallelism (a ContextLayout of
 * more than one part) rope rotates each token by its global position and attention runs over the
 * context-parallel group (ring attention or Ulysses) on a packed q, k, v whose key/value heads are
 * repeated to the query heads (the GQA sharing written out; their gradients sum back).
 */
export class LlamaAttention extends Module {
  /** Query projection, C → heads·D. */
  readonly qProj: LinearLike;
  /** Key projection, C → kvHeads·D. */
  readonly kProj: LinearLike;
  /** Value projection, C → kvHeads·D. */
  readonly vProj: LinearLike;
  /** Output projection, heads·D → C. */
  readonly oProj: LinearLike;
  /** Channels per head. */
  readonly headDim: number;
  readonly #theta: number;
  readonly #context: ContextLayout | null;
  constructor(config: CheckedLlamaConfig, layer: LayerOptions, factory: LinearFactory, context: ContextLayout | null = null) {
    super();
    this.#context = context && context.parts > 1 ? context : null;
    const c = config.hiddenSize, H = config.numAttentionHeads, KV = config.numKeyValueHeads, D = c / H;
    this.headDim = D;
    this.#theta = config.ropeTheta;
    const attention: AttentionHeads = { heads: H, kvHeads: KV, headDim: D };
    const opts = { bias: false, std: config.initializerRange, layer, config: factoryModel(config), attention };
    const qkv = { ...opts, bias: config.qkvBias };
    this.qProj = factory(c, H * D, { ...qkv, role: 'attn.q' });
    this.kProj = factory(c, KV * D, { ...qkv, role: 'attn.k' });
    this.vProj = factory(c, KV * D, { ...qkv, role: 'attn.v' });
    this.oProj = factory(H * D, c, { ...opts, role: 'attn.o' });
  }
  /**
   * x [B, T', C] → [B, T', C]. The projections give [B, T, heads·D] (the whole sequence: under sequence
   * parallelism they gather it), viewed [B, T, heads, D] for rope and attention without copies.
   * `positions` (i32 [T] or [B, T]) overrides positions 0..T-1 (under context parallelism, the
   * default is this process's tokens' global positions).
   */
  forward(x: Tensor, positions?: Tensor): Tensor {
    const D = this.headDim, context = this.#context;
    const q = this.qProj.forward(x), k = this.kProj.forward(x), v = this.vProj.forward(x);
    const [B, T] = q.shape as [number, number];
    const heads = q.shape[2]! / D, kvHeads = k.shape[2]! / D;
    // The context-parallel positions tensor is released here; rope keeps its own reference for backward.
    using global = context && !positions ? tensor(context.positions(T), [T], { device: x.device }) : null;
    const pos = positions ?? global;
    const ropeOpts = { theta: this.#theta, ...(pos ? { positions: pos } : {}) };
    const qr = rope(q.view([B, T, heads, D]), ropeOpts), kr = rope(k.view([B, T, kvHeads, D]), ropeOpts);
    if (context) return this.oProj.forward(context.attention(packHeads(qr, kr, v, heads, kvHeads, D), heads));
    const o = groupedQueryAttention(qr, kr, v.view([B, T, kvHeads, D]), { causal: true });
    return this.oProj.forward(o.view([B, T, heads * D]));
  }
}

/**
 * q [B, T, H, D], k [B, T, KV, D] and v [B, T, KV·D] packed as attentionPacked's qkv [B, T, 3·H·D]
 * ([B, T, 3, H, D]), each key/value head repeated for the H/KV query heads that read it (query head h
 * reads key/value head floor(h / (H/KV)), as groupedQueryAttention shares them).
 */
function packHeads(q: Tensor, k: Tensor, v: Tensor, H: number, KV: number, D: number): Tensor {
  const [B, T] = q.shape as [number, number];
  const g = H / KV;
  const widen = (t: Tensor): Tensor => {
    if (g === 1) return t.view([B, T, 1, H, D]);
    const one = t.view([B, T, 1, KV, 1, D]);
    return cat(Array.from({ length: g }, () => one), 4).view([B, T, 1, H, D]);
  };
  return cat([q.view([B, T, 1, H, D]), widen(k), widen(v)], 2).view([B, T, 3 * H * D]);
}

/** Llama's SwiGLU MLP: down(silu(gate(x))·up(x)). */
export class LlamaMLP extends Module {
  /** Gate projection, C → intermediateSize (through silu). */
  readonly gateProj: LinearLike;
  /** Up projection, C → intermediateSize. */
  readonly upProj: LinearLike;
  /** Down projection, intermediateSize → C. */
  readonly downProj: LinearLike;
  constructor(config: CheckedLlamaConfig, layer: LayerOptions, factory: LinearFactory) {
    super();
    const c = config.hiddenSize, f = config.intermediateSize;
    const opts = { bias: false, std: config.initializerRange, layer, config: factoryModel(config) };
    this.gateProj = factory(c, f, { ...opts, role: 'mlp.gate' });
    this.upProj = factory(c, f, { ...opts, role: 'mlp.up' });
    this.downProj = factory(f, c, { ...opts, role: 'mlp.down' });
  }
  /** x [B, T', C] → [B, T', C]. */
  forward(x: Tensor): Tensor {
    return this.downProj.forward(swiglu(this.gateProj.forward(x), this.upProj.forward(x)));
  }
}

/** A Llama block: x + attn(rmsNorm(x)), then + mlp(rmsNorm(·)). */
export class LlamaBlock extends Module {
  /** RMSNorm before attention. */
  readonly inputLayernorm: RMSNorm;
  /** The attention layer. */
  readonly selfAttn: LlamaAttention;
  /** RMSNorm before the MLP. */
  readonly postAttentionLayernorm: RMSNorm;
  /** The MLP (SwiGLU by default; replaceable through LlamaOptions.mlp). */
  readonly mlp: LlamaMLPLike;
  readonly #sequence: SequenceLayout;
  constructor(config: CheckedLlamaConfig, layer: LayerOptions, factory: LinearFactory, sequence: SequenceLayout, mlp: LlamaMLPFactory, index: number,
    context: ContextLayout | null = null) {
    super();
    this.#sequence = sequence;
    const norm = { ...layer, eps: config.rmsNormEps };
    this.inputLayernorm = new RMSNorm(config.hiddenSize, norm);
    this.selfAttn = new LlamaAttention(config, layer, factory, context);
    this.postAttentionLayernorm = new RMSNorm(config.hiddenSize, norm);
    this.mlp = mlp(config, { layer, factory, index });
  }
  /** x [B, T', C] → [B, T', C] (T': the sequence layout's chunk). */
  forward(x: Tensor, positions?: Tensor): Tensor {
    const seq = this.#sequence;
    const n1 = this.inputLayernorm, n2 = this.postAttentionLayernorm;
    const h = add(x, this.selfAttn.forward(rmsNorm(x, seq.replicated(n1.weight), n1.eps), positions));
    return add(h, this.mlp.forward(rmsNorm(h, seq.replicated(n2.weight), n2.eps)));
  }
}

/** The dense SwiGLU MLP, or in the blocks isLlamaMoEBlock names a mixture of experts (the GPT's nt.nn.MoE: router, SwiGLU experts, the gated shared expert). */
function defaultMLP(moeParallel: CausalLMOptions['moeParallel']): LlamaMLPFactory {
  let parallel: MoEParallel | undefined;
  return (config, { layer, factory, index }) => {
    const moe = llamaMoEConfig(config);
    if (!moe || !isLlamaMoEBlock(config, index)) return new LlamaMLP(config, layer, factory);
    parallel ??= typeof moeParallel === 'function' ? moeParallel(moe.experts) : moeParallel;
    return new MoE(config.hiddenSize, moe, { ...layer, std: config.initializerRange, parallel });
  };
}

/**
 * Llama (Hugging Face's LlamaForCausalLM): `new nt.nn.Llama(config, { seed })`; forward(idx, targets)
 * gives the mean cross-entropy from the fused head (no logits) or, without targets, the logits.
 * Parameter names follow Hugging Face's in camelCase (`layers.0.selfAttn.qProj.weight`, `norm.weight`,
 * `lmHead.weight`); every weight is drawn N(0, initializerRange) (HF's _init_weights), norms are ones.
 */
export class Llama extends Module implements CausalLM {
  readonly family = 'llama' as const;
  readonly blockPrefix = 'layers';
  /** The token table. */
  readonly embedTokens: TokenEmbedding;
  /** The blocks. */
  readonly layers: LlamaBlock[];
  /** The final RMSNorm. */
  readonly norm: RMSNorm;
  /** The untied LM head's table [vocabSize, hiddenSize] (laid out like the token table); null when tied to embedTokens. */
  readonly lmHead: TokenEmbedding | null;
  /** The checked config (recompute as overridden by the options). */
  readonly config: Readonly<CheckedLlamaConfig>;
  readonly vocabLayout: VocabLayout;
  readonly sequenceLayout: SequenceLayout;
  /** How the sequence is split over context-parallel processes (null: not). */
  readonly contextLayout: ContextLayout | null;
  readonly generator: Generator;
  readonly #opts: LlamaOptions;
  /** The routed experts of the MoE layers its MLP factory built (undefined: none). */
  readonly #moeExperts: number | undefined;

  constructor(config: LlamaConfig | Record<string, unknown>, opts: LlamaOptions = {}) {
    super();
    const checked = llamaConfig(config);
    this.config = opts.recompute === undefined ? checked : { ...checked, recompute: opts.recompute };
    this.#opts = opts;
    const c = this.config;
    const { generator, layer, factory, vocabLayout, sequenceLayout } = modelParts(opts);
    this.generator = generator;
    this.vocabLayout = vocabLayout;
    this.sequenceLayout = sequenceLayout;
    this.contextLayout = opts.contextLayout && opts.contextLayout.parts > 1 ? opts.contextLayout : null;
    const std = c.initializerRange;
    this.embedTokens = this.vocabLayout.embedding(c.vocabSize, c.hiddenSize, { std, layer });
    const mlp = opts.mlp ?? defaultMLP(opts.moeParallel);
    this.layers = Array.from({ length: c.numHiddenLayers }, (_, i) => new LlamaBlock(c, layer, factory, this.sequenceLayout, mlp, i, this.contextLayout));
    this.norm = new RMSNorm(c.hiddenSize, { ...layer, eps: c.rmsNormEps });
    // Untied: a second table of the vocabulary's layout (drawn after the blocks, as HF initializes lm_head last).
    this.lmHead = c.tieWordEmbeddings ? null : this.vocabLayout.embedding(c.vocabSize, c.hiddenSize, { std, layer });
    this.#moeExperts = moeLayers(this)[0]?.config.experts;
  }

  /** Its dimensions (no window, no dropout), and the experts of MoE layers an MLP factory built. */
  get shape(): ModelShape {
    const c = this.config;
    return {
      nLayer: c.numHiddenLayers, nHead: c.numAttentionHeads, nKvHead: c.numKeyValueHeads, nEmbd: c.hiddenSize, ffnHidden: c.intermediateSize,
      vocabSize: c.vocabSize, blockSize: c.maxPositionEmbeddings, ...(this.#moeExperts !== undefined ? { moeExperts: this.#moeExperts } : {}),
    };
  }
  /** Its parameters from its config (a whole model's, whatever this process holds): all of them, and those one token goes through. */
  get parameterCounts(): ParameterCounts {
    return decoderParameterCounts(llamaDecoderShape(this.config));
  }
  /** Model FLOPs per trained token at `seqLen` ({@link llamaFlopsPerToken}). */
  flopsPerToken(seqLen: number): number { return llamaFlopsPerToken(this.config, seqLen); }
  /** The blocks (layers). */
  get blocks(): readonly Module[] { return this.layers; }
  /** The token table when the head is tied to it. */
  get tiedWeight(): Parameter | null { return this.lmHead === null ? this.embedTokens.weight : null; }

  /** Token ids i32 [B, T] → [B, T', C] (T': the sequence layout's chunk). */
  embed(idx: Tensor): Tensor {
    return lookUpTokens(this, 'Llama.forward', idx, this.embedTokens, ['maxPositionEmbeddings', this.config.maxPositionEmbeddings]).tokens;
  }

  /** Blocks [start, end) over x [B, T', C] (recomputed in backward when config.recompute). */
  forwardBlocks(x: Tensor, start = 0, end = this.layers.length): Tensor {
    x = residualStream(x); // 16 bits under autocast's lowPrecisionResidual
    for (const [j, block] of this.layers.slice(start, end).entries()) {
      x = traceLayer('block', start + j, () => (this.config.recompute && this.training ? recompute((y: Tensor) => block.forward(y), x) : block.forward(x)));
    }
    return x;
  }

  /** The final RMSNorm and the LM head over x [B, T', C]; the mean cross-entropy from the fused head when targets are given. */
  head(x: Tensor, targets?: Tensor): CausalLMOutput {
    const layout = this.vocabLayout;
    const hidden = rmsNorm(x, this.sequenceLayout.replicated(this.norm.weight), this.norm.eps);
    const b = x.shape[0]!, t = x.shape[1]! * this.sequenceLayout.parts;
    const table = (this.lmHead ?? this.embedTokens).weight;
    if (targets !== undefined) {
      checkTensor(targets, 'Llama.forward', 'targets');
      if (targets.dtype !== 'i32' || targets.ndim !== 2 || targets.shape[0] !== b || targets.shape[1] !== t) {
        throw new ShapeError(`Llama.forward: targets must be i32 [${b}, ${t}], got ${targets.describe()}`);
      }
      if (layout.headLoss) return { logits: null, loss: layout.headLoss(hidden, table, targets) };
    }
    const logits = layout.logits(hidden, table);
    if (targets === undefined) return { logits, loss: null };
    return { logits, loss: layout.loss(logits.reshape([b * t, logits.shape[2]!]), targets.reshape([b * t])) };
  }

  /**
   * idx: i32 [B, T]; targets: i32 [B, T] (optional). Without targets: the logits [B, T, vocabSize]
   * (this rank's vocabulary slice under a vocabulary-parallel layout). With targets: the mean loss.
   */
  forward(idx: Tensor, targets?: Tensor): CausalLMOutput {
    return this.head(this.forwardBlocks(this.embed(idx)), targets);
  }

  /** Full-vocabulary logits from forward's. */
  gatherLogits(logits: Tensor): Tensor { return this.vocabLayout.gather(logits); }

  /** embedTokens (first stage, and last when tied), norm and lmHead (last). */
  stageModules(first: boolean, last: boolean): StageModules {
    const head = this.lmHead;
    const before: Array<[string, Module]> = first || (last && head === null) ? [['embedTokens', this.embedTokens]] : [];
    const after: Array<[string, Module]> = last ? [['norm', this.norm], ...(head ? [['lmHead', head] as [string, Module]] : [])] : [];
    return { before, after };
  }

  /** The routing statistics of the MoE blocks since the last call, summed over the blocks (then reset); null without MoE blocks. */
  takeMoEStats(): MoEStats | null {
    const layers = moeLayers(this);
    if (layers.length === 0) return null;
    return layers.map((l) => l.takeStats()).reduce(addMoEStats);
  }

  /** A new Llama of this config with other options (the MLP factory kept). */
  rebuild(opts: CausalLMOptions): Llama { return new Llama(this.config, { mlp: this.#opts.mlp, ...opts }); }

  /** Appends maxNewTokens sampled tokens to each row of idx (as GPT.generate). */
  generate(idx: Tensor, maxNewTokens: number, opts: GenerateOptions = {}): number[][] {
    if (this.contextLayout) throw new StateError('generate: the model splits the sequence over context-parallel processes; sample from a copy built without contextLayout (same parameters)');
    return generateTokens(this, idx, maxNewTokens, opts);
  }
}
