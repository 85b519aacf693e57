// The model shapes `nodetron plan` knows (GPT-2 sizes, Llama-2 7B/13B/70B), reading a config.json
// (Hugging Face GPT-2 or Llama keys, or the planner's own), and counting the parameters each
// pipeline stage and tensor-parallel rank holds.
import { readFileSync } from 'node:fs';
import { ArgumentError } from '../errors.js';
import { moeLayerParameters } from '../nn/counts.js';
import { partitionLayers } from '../parallel/pipeline/placement.js';

/** A decoder-only transformer's shape, as the planner sees it. */
export interface PlanModel {
  /** The model's name (as `nodetron plan` shows it). */
  name: string;
  /** Transformer layers. */
  nLayer: number;
  /** Attention heads. */
  nHead: number;
  /** Key/value heads (grouped-query attention); default nHead. */
  nKvHead?: number;
  /** Embedding width. */
  nEmbd: number;
  /** MLP hidden width (GPT-2: 4·nEmbd). */
  ffn: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** Gated MLP (SwiGLU: three matrices, no biases, RMSNorm, rotary positions) instead of GPT-2's GELU MLP. */
  gated: boolean;
  /** The LM head shares the token embedding's table (GPT-2) instead of holding its own (Llama). */
  tied: boolean;
  /** Biases in linear layers and LayerNorms (GPT-2). */
  bias: boolean;
  /** Learned position table rows (GPT-2's wpe; 0 for rotary positions). */
  positions: number;
  /** The sequence length the model is usually trained at (the plan's default --seq). */
  seqLen: number;
  /** Mixture of experts in the MLP slot (Mixtral, Qwen-MoE, nodetron's GPTConfig.moe); absent for a dense model. */
  moe?: PlanMoE;
}

/** The MoE part of a model's shape. */
export interface PlanMoE {
  /** Routed experts per MoE layer. */
  experts: number;
  /** Experts each token goes through. */
  topK: number;
  /** Each expert's hidden width (a gated expert: three matrices of nEmbd × ffn). */
  ffn: number;
  /** Hidden width of the shared experts every token goes through (0: none). */
  sharedFfn: number;
  /** Every n-th layer is an MoE layer (1: all). */
  every: number;
}

const gpt2 = (name: string, nLayer: number, nHead: number, nEmbd: number): PlanModel => ({
  // The vocabulary padded to 50304 as nanoGPT and the GPT example do (it divides by any tp up to 64).
  name, nLayer, nHead, nEmbd, ffn: 4 * nEmbd, vocabSize: 50304, gated: false, tied: true, bias: true, positions: 1024, seqLen: 1024,
});
const llama = (name: string, nLayer: number, nHead: number, nEmbd: number, ffn: number, nKvHead = nHead): PlanModel => ({
  name, nLayer, nHead, nKvHead, nEmbd, ffn, vocabSize: 32000, gated: true, tied: false, bias: false, positions: 0, seqLen: 4096,
});

/** The named models: GPT-2's four sizes (Radford et al. 2019) and Llama 2's 7B, 13B and 70B (Touvron et al. 2023). */
export const PLAN_MODELS: Readonly<Record<string, PlanModel>> = {
  gpt2: gpt2('gpt2', 12, 12, 768),
  'gpt2-medium': gpt2('gpt2-medium', 24, 16, 1024),
  'gpt2-large': gpt2('gpt2-large', 36, 20, 1280),
  'gpt2-xl': gpt2('gpt2-xl', 48, 25, 1600),
  '7b': llama('7b', 32, 32, 4096, 11008),
  '13b': llama('13b', 40, 40, 5120, 13824),
  '70b': llama('70b', 80, 64, 8192, 28672, 8),
};

/**
 * A named model, or a config.json: Hugging Face GPT-2 keys (n_layer, n_head, n_embd, vocab_size,
 * n_positions), Llama keys (num_hidden_layers, num_attention_heads, num_key_value_heads,
 * hidden_size, intermediate_size, vocab_size, max_position_embeddings, tie_word_embeddings) or the
 * PlanModel fields themselves. An unknown name, an unreadable file or missing keys throw an ArgumentError.
 */
export function resolveModel(spec: string): PlanModel {
  if (typeof spec !== 'string') throw new ArgumentError(`plan: the model must be a name (${Object.keys(PLAN_MODELS).join(', ')}) or a config.json path, got ${typeof spec}`);
  if (Object.hasOwn(PLAN_MODELS, spec)) return { ...PLAN_MODELS[spec]! };
  if (!spec.endsWith('.json')) throw new ArgumentError(`plan: unknown model ${JSON.stringify(spec)} (${Object.keys(PLAN_MODELS).join(', ')}, or a config.json)`);
  let c: Record<string, unknown>;
  try { c = JSON.parse(readFileSync(spec, 'utf8')) as Record<string, unknown>; } catch (e) {
    throw new ArgumentError(`plan: cannot read the model config ${spec}: ${(e as Error).message}`);
  }
  return modelFromConfig(c, spec);
}

/** A PlanModel from a parsed config object (see resolveModel for the keys). */
export function modelFromConfig(c: Record<string, unknown>, name = 'config'): PlanModel {
  const num = (...keys: string[]): number | undefined => {
    for (const k of keys) if (typeof c[k] === 'number') return c[k] as number;
    return undefined;
  };
  const nLayer = num('nLayer', 'n_layer', 'num_hidden_layers'), nHead = num('nHead', 'n_head', 'num_attention_heads');
  const nEmbd = num('nEmbd', 'n_embd', 'hidden_size'), vocabSize = num('vocabSize', 'vocab_size');
  const missing = Object.entries({ layers: nLayer, heads: nHead, width: nEmbd, vocabulary: vocabSize }).filter(([, v]) => !(Number.isInteger(v) && v! > 0)).map(([k]) => k);
  if (missing.length) throw new ArgumentError(`plan: the model config ${name} lacks a positive integer ${missing.join(', ')} (n_layer/num_hidden_layers, n_head/num_attention_heads, n_embd/hidden_size, vocab_size)`);
  const llamaLike = typeof c.intermediate_size === 'number' || c.model_type === 'llama' || c.gated === true;
  const gated = typeof c.gated === 'boolean' ? c.gated : llamaLike;
  const ffn = num('ffn', 'intermediate_size', 'n_inner') ?? 4 * nEmbd!;
  const positions = num('positions') ?? (gated ? 0 : num('n_positions', 'max_position_embeddings') ?? 1024);
  const seqLen = num('seqLen', 'n_positions', 'max_position_embeddings', 'n_ctx') ?? 1024;
  // MoE: Mixtral (num_local_experts, num_experts_per_tok), Qwen2-MoE (num_experts, moe_intermediate_size,
  // shared_expert_intermediate_size, decoder_sparse_step) or a GPTConfig's moe object.
  const own = typeof c.moe === 'object' && c.moe !== null ? c.moe as Record<string, unknown> : null;
  const ownNum = (k: string) => (own && typeof own[k] === 'number' ? own[k] as number : undefined);
  const experts = ownNum('experts') ?? num('num_local_experts', 'num_experts');
  let moe: PlanMoE | undefined;
  if (experts !== undefined) {
    const topK = ownNum('topK') ?? num('num_experts_per_tok') ?? 2;
    if (!Number.isInteger(experts) || experts < 1 || !Number.isInteger(topK) || topK < 1 || topK > experts) {
      throw new ArgumentError(`plan: the model config ${name} has ${experts} experts and top-k ${topK}: experts must be a positive integer and 1 <= top-k <= experts`);
    }
    const sharedExperts = ownNum('sharedExperts') ?? 0;
    const expertFfn = ownNum('hidden') ?? num('moe_intermediate_size') ?? (own ? 4 * nEmbd! : ffn);
    moe = { experts, topK, ffn: expertFfn, sharedFfn: num('shared_expert_intermediate_size') ?? sharedExperts * expertFfn, every: ownNum('every') ?? num('decoder_sparse_step') ?? 1 };
  }
  return {
    name, nLayer: nLayer!, nHead: nHead!, nKvHead: num('nKvHead', 'num_key_value_heads') ?? nHead!, nEmbd: nEmbd!, ffn, vocabSize: vocabSize!,
    gated, tied: typeof c.tied === 'boolean' ? c.tied : typeof c.tie_word_embeddings === 'boolean' ? c.tie_word_embeddings : !gated,
    bias: typeof c.bias === 'boolean' ? c.bias : !gated, positions, seqLen, ...(moe ? { moe } : {}),
  };
}

/** MoE layers of the model (0 for a dense one). */
export function moeLayerCount(m: PlanModel): number {
  return m.moe ? Math.floor(m.nLayer / m.moe.every) : 0;
}

/** One MoE layer's MLP-slot parameters on one of ep expert-parallel ranks (router and shared experts whole, routed experts / ep); `active`: those one token goes through. */
function moeSlotParams(m: PlanModel, ep: number, active = false): number {
  const e = m.moe!;
  // The planner's shared experts have no gate (a Qwen2-MoE's [1, C] gate per layer is left out of its estimates).
  return moeLayerParameters({ width: m.nEmbd, experts: e.experts, routed: active ? e.topK : e.experts / ep, hidden: e.ffn, sharedHidden: e.sharedFfn, sharedGate: false });
}

/** The routed experts' parameters over the whole model (0 for a dense model). */
export function expertParams(m: PlanModel): number {
  return m.moe ? moeLayerCount(m) * m.moe.experts * 3 * m.nEmbd * m.moe.ffn : 0;
}

/** The parameters one token goes through (an MoE model's topK experts per layer, not the others); totalParams for a dense model. */
export function activeParams(m: PlanModel): number {
  if (!m.moe) return totalParams(m);
  const perLayer = moeSlotParams(m, 1, true) - moeSlotParams(m, 1);
  return totalParams(m) + moeLayerCount(m) * perLayer;
}

/**
 * Parameters of one transformer layer held by one of tp tensor-parallel ranks (and of ep expert-parallel
 * ranks: an MoE model's layers averaged over its dense and MoE layers, the routed experts split ep ways).
 */
export function layerParams(m: PlanModel, tp = 1, ep = 1): number {
  const h = m.nEmbd, hd = h / m.nHead, kvHeads = m.nKvHead ?? m.nHead, kv = kvHeads * hd;
  const b = m.bias ? 1 : 0;
  // Key/value heads split over tp when it divides them; with fewer heads than ranks every rank holds
  // them all (nt.nn.Llama's tensor-parallel layout replicates k and v, each rank using one head).
  const kvPerRank = kvHeads % tp === 0 ? kv / tp : kv;
  const qkv = (h * h + b * h) / tp + 2 * (h * kvPerRank + b * kvPerRank);
  const proj = (h * h) / tp + b * h; // row-parallel: the bias is replicated
  const mlpIn = ((m.gated ? 2 : 1) * (h * m.ffn + b * m.ffn)) / tp;
  const mlpOut = (m.ffn * h) / tp + b * h;
  const norms = 2 * h * (m.bias ? 2 : 1); // LayerNorm weight+bias, or RMSNorm weight
  if (!m.moe) return qkv + proj + mlpIn + mlpOut + norms;
  // Experts are not split by tensor parallelism (every tp rank holds its expert-parallel share whole).
  const moeShare = moeLayerCount(m) / m.nLayer;
  return qkv + proj + norms + (1 - moeShare) * (mlpIn + mlpOut) + moeShare * moeSlotParams(m, ep);
}

/** The parameters of one pipeline stage on one tensor-parallel rank, by part. */
export interface StageParams {
  /** Transformer layers of the stage. */
  layers: number;
  /** Parameters of those layers. */
  layerParams: number;
  /** Token and position embedding parameters (first stage only). */
  embedding: number;
  /** Final norm and LM head parameters (last stage only; a tied head counts its table when pp > 1). */
  head: number;
  /** The sum of the above. */
  total: number;
}

/** Layers per stage under zb-v's V: stage s holds chunks s and 2·pp − 1 − s of 2·pp. */
export function vStageLayers(nLayer: number, pp: number): number[] {
  const chunks = stageLayers(nLayer, 2 * pp);
  return Array.from({ length: pp }, (_, s) => chunks[s]! + chunks[2 * pp - 1 - s]!);
}

/** Layers per stage: the trainer's own partitionLayers (the first stages take the remainder). */
export function stageLayers(nLayer: number, pp: number): number[] {
  return partitionLayers(nLayer, pp).map(([start, end]) => end - start);
}

/**
 * Parameters pipeline stage `stage` of `pp` holds on one of `tp` ranks: its layers, the token (and
 * position) embedding on the first stage, the final norm and the head on the last (a tied head is
 * the last stage's own copy of the token table when pp > 1, as GPTStage keeps it).
 */
export function stageParams(m: PlanModel, tp: number, pp: number, stage: number, ep = 1, placement: 'loop' | 'v' = 'loop'): StageParams {
  const layers = placement === 'v' ? vStageLayers(m.nLayer, pp)[stage]! : stageLayers(m.nLayer, pp)[stage]!;
  const table = (m.vocabSize * m.nEmbd) / tp;
  // Under zb-v's V the first stage holds both ends of the model (one copy of a tied table).
  const first = stage === 0, last = placement === 'v' ? stage === 0 : stage === pp - 1;
  const embedding = first ? table + m.positions * m.nEmbd : 0;
  const head = last ? (m.bias ? 2 : 1) * m.nEmbd + (m.tied ? (first ? 0 : table) : table) : 0;
  const lp = layers * layerParams(m, tp, ep);
  return { layers, layerParams: lp, embedding, head, total: lp + embedding + head };
}

/**
 * The routed experts' parameters that pipeline stage `stage` of `pp` holds on one of `ep`
 * expert-parallel ranks (part of stageParams' total; 0 for a dense model). ZeRO shards them over the
 * expert-data-parallel group (dp/ep ranks), the rest of the stage over dp · cp.
 */
export function stageExpertParams(m: PlanModel, pp: number, stage: number, ep = 1): number {
  if (!m.moe) return 0;
  const layers = stageLayers(m.nLayer, pp)[stage]!;
  return layers * (moeLayerCount(m) / m.nLayer) * (m.moe.experts / ep) * 3 * m.nEmbd * m.moe.ffn;
}

/** All parameters of the model (a tied table counted once). */
export function totalParams(m: PlanModel): number {
  return stageParams(m, 1, 1, 0).total;
}

/** The largest single module's parameters (DeepSpeed's largest_layer_params: here the token table, or one layer's MLP input matrix if larger). */
export function largestLayerParams(m: PlanModel): number {
  const b = m.bias ? 1 : 0;
  return Math.max(m.vocabSize * m.nEmbd, (m.gated ? 2 : 1) * (m.nEmbd * m.ffn + b * m.ffn));
}
