// The model shapes `nodetron plan` knows (GPT-2 sizes, Llama-2 7B/13B/70B), reading a config.json
// (Hugging Face keys, the family its model_type names telling what they do not, or the planner's own), and the parameters each pipeline stage and
// tensor-parallel rank holds: counted by lib/nn/counts.ts (the models' own counts) from the model's shape.
import { ArgumentError, StateError } from '../errors.js';
import { HF_CONFIG_KEYS, hfConfigNumber, readHFConfig } from '../interop/hf-common.js';
import { hfFamilyOf } from '../interop/hf-auto.js';
import {
  decoderParameterCounts, largestModuleParameters, layerParameters, routedExpertParameters, stageParameters, type DecoderShape, type StageParameters,
} from '../nn/counts.js';
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
 * A named model, or a config.json read by interop's one config reader (readHFConfig): Hugging Face
 * GPT-2 keys (n_layer, n_head, n_embd, vocab_size, n_positions), Llama keys (num_hidden_layers,
 * num_attention_heads, num_key_value_heads, hidden_size, intermediate_size, vocab_size,
 * max_position_embeddings, tie_word_embeddings) and the MoE keys of Mixtral and Qwen2-MoE (HF_CONFIG_KEYS), or
 * the PlanModel fields themselves. An unknown name, a file that cannot be read or is not a JSON object,
 * or missing keys throw an ArgumentError.
 */
export function resolveModel(spec: string): PlanModel {
  if (typeof spec !== 'string') throw new ArgumentError(`plan: the model must be a name (${Object.keys(PLAN_MODELS).join(', ')}) or a config.json path, got ${typeof spec}`);
  if (Object.hasOwn(PLAN_MODELS, spec)) return { ...PLAN_MODELS[spec]! };
  if (!spec.endsWith('.json')) throw new ArgumentError(`plan: unknown model ${JSON.stringify(spec)} (${Object.keys(PLAN_MODELS).join(', ')}, or a config.json)`);
  let c: Record<string, unknown>;
  try { c = readHFConfig(spec, 'plan', 'the model config'); } catch (e) {
    // A bad --model is the caller's argument.
    if (e instanceof StateError) throw new ArgumentError(e.message);
    throw e;
  }
  return modelFromConfig(c, spec);
}

/** A PlanModel from a parsed config object (see resolveModel for the keys). */
export function modelFromConfig(c: Record<string, unknown>, name = 'config'): PlanModel {
  // The planner's own key (a PlanModel field) first, then config.json's names (interop's HF_CONFIG_KEYS).
  const num = (own: string | null, dim?: keyof typeof HF_CONFIG_KEYS): number | undefined =>
    (own !== null && typeof c[own] === 'number' ? c[own] as number : undefined) ?? (dim ? hfConfigNumber(c, dim) : undefined);
  const nLayer = num('nLayer', 'layers'), nHead = num('nHead', 'heads');
  const nEmbd = num('nEmbd', 'width'), vocabSize = num('vocabSize', 'vocab');
  const missing = Object.entries({ layers: nLayer, heads: nHead, width: nEmbd, vocabulary: vocabSize }).filter(([, v]) => !(Number.isInteger(v) && v! > 0)).map(([k]) => k);
  if (missing.length) throw new ArgumentError(`plan: the model config ${name} lacks a positive integer ${missing.join(', ')} (n_layer/num_hidden_layers, n_head/num_attention_heads, n_embd/hidden_size, vocab_size)`);
  // What the dimensions do not say comes from the planner's own keys, else from the family config.json's
  // model_type names (its registered HFFamily's decoder traits: registerHFFamily), else is guessed from
  // the keys: a gated MLP, no biases, an untied head and rotary positions when it names intermediate_size.
  const ownGated = typeof c.gated === 'boolean' ? c.gated : undefined;
  const traits = ownGated === undefined ? hfFamilyOf(c.model_type)?.decoder : undefined;
  const gated = ownGated ?? traits?.gated ?? typeof c.intermediate_size === 'number';
  const ffn = num('ffn', 'ffn') ?? 4 * nEmbd!;
  const positions = num('positions') ?? ((traits ? traits.learnedPositions : !gated) ? num(null, 'positions') ?? 1024 : 0);
  const seqLen = num('seqLen', 'context') ?? 1024;
  // MoE: Mixtral (num_local_experts, num_experts_per_tok), Qwen2-MoE (num_experts, moe_intermediate_size,
  // shared_expert_intermediate_size, decoder_sparse_step) or a GPTConfig's moe object.
  const own = typeof c.moe === 'object' && c.moe !== null ? c.moe as Record<string, unknown> : null;
  const ownNum = (k: string) => (own && typeof own[k] === 'number' ? own[k] as number : undefined);
  const experts = ownNum('experts') ?? num(null, 'experts');
  let moe: PlanMoE | undefined;
  if (experts !== undefined) {
    const topK = ownNum('topK') ?? num(null, 'topK') ?? 2;
    if (!Number.isInteger(experts) || experts < 1 || !Number.isInteger(topK) || topK < 1 || topK > experts) {
      throw new ArgumentError(`plan: the model config ${name} has ${experts} experts and top-k ${topK}: experts must be a positive integer and 1 <= top-k <= experts`);
    }
    const sharedExperts = ownNum('sharedExperts') ?? 0;
    const expertFfn = ownNum('hidden') ?? num(null, 'expertFfn') ?? (own ? 4 * nEmbd! : ffn);
    moe = { experts, topK, ffn: expertFfn, sharedFfn: num(null, 'sharedExpertFfn') ?? sharedExperts * expertFfn, every: ownNum('every') ?? num(null, 'sparseStep') ?? 1 };
  }
  return {
    name, nLayer: nLayer!, nHead: nHead!, nKvHead: num('nKvHead', 'kvHeads') ?? nHead!, nEmbd: nEmbd!, ffn, vocabSize: vocabSize!,
    gated, tied: typeof c.tied === 'boolean' ? c.tied : typeof c.tie_word_embeddings === 'boolean' ? c.tie_word_embeddings : traits?.tied ?? !gated,
    bias: typeof c.bias === 'boolean' ? c.bias : traits?.bias ?? !gated, positions, seqLen, ...(moe ? { moe } : {}),
  };
}

/** MoE layers of the model (0 for a dense one). */
export function moeLayerCount(m: PlanModel): number {
  return m.moe ? Math.floor(m.nLayer / m.moe.every) : 0;
}

/**
 * The model's shape as lib/nn/counts.ts counts it (every count below is taken from there). The
 * planner's shared experts have no gate (a Qwen2-MoE's [1, C] gate per layer is left out of its
 * estimates), and it counts no q/k/v biases of a bias-free model.
 */
export function decoderShape(m: PlanModel): DecoderShape {
  const shape: DecoderShape = {
    layers: m.nLayer, width: m.nEmbd, heads: m.nHead, kvHeads: m.nKvHead ?? m.nHead, ffn: m.ffn, vocab: m.vocabSize,
    gated: m.gated, bias: m.bias, tied: m.tied, positions: m.positions,
  };
  if (m.moe) shape.moe = { layers: moeLayerCount(m), experts: m.moe.experts, topK: m.moe.topK, hidden: m.moe.ffn, sharedHidden: m.moe.sharedFfn, sharedGate: false };
  return shape;
}

/** The routed experts' parameters over the whole model (0 for a dense model). */
export function expertParams(m: PlanModel): number {
  return routedExpertParameters(decoderShape(m), moeLayerCount(m));
}

/** The parameters one token goes through (an MoE model's topK experts per layer, not the others); totalParams for a dense model. */
export function activeParams(m: PlanModel): number {
  return decoderParameterCounts(decoderShape(m)).active;
}

/**
 * Parameters of one transformer layer held by one of tp tensor-parallel ranks (and of ep expert-parallel
 * ranks: an MoE model's layers averaged over its dense and MoE layers, the routed experts split ep ways).
 */
export function layerParams(m: PlanModel, tp = 1, ep = 1): number {
  return layerParameters(decoderShape(m), tp, ep);
}

/** The parameters of one pipeline stage on one tensor-parallel rank, by part (lib/nn/counts.ts). */
export type StageParams = StageParameters;

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
  // Under zb-v's V the first stage holds both ends of the model (one copy of a tied table).
  const first = stage === 0, last = placement === 'v' ? stage === 0 : stage === pp - 1;
  return stageParameters(decoderShape(m), { layers, first, last, tp, ep });
}

/**
 * The routed experts' parameters that pipeline stage `stage` of `pp` holds on one of `ep`
 * expert-parallel ranks (part of stageParams' total; 0 for a dense model). ZeRO shards them over the
 * expert-data-parallel group (dp/ep ranks), the rest of the stage over dp · cp.
 */
export function stageExpertParams(m: PlanModel, pp: number, stage: number, ep = 1): number {
  if (!m.moe) return 0;
  const layers = stageLayers(m.nLayer, pp)[stage]!;
  return routedExpertParameters(decoderShape(m), layers * (moeLayerCount(m) / m.nLayer), ep);
}

/** All parameters of the model (a tied table counted once). */
export function totalParams(m: PlanModel): number {
  return decoderParameterCounts(decoderShape(m)).total;
}

/** The largest single module's parameters (DeepSpeed's largest_layer_params: here the token table, or one layer's MLP input matrix if larger). */
export function largestLayerParams(m: PlanModel): number {
  return largestModuleParameters(decoderShape(m));
}
