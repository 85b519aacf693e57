// Parameter arithmetic of a decoder-only transformer, pure (no tensors, nothing loaded), from its shape
// alone: one MoE layer's MLP slot, a layer's attention, MLP and norms on one of tp tensor-parallel
// ranks, a pipeline stage's parameters (embeddings on the first stage, final norm and head on the
// last), the routed experts a share of layers holds, the whole model's total and active parameters.
// Model FLOPs per token. The GPT's and Llama's counts (gpt.ts, llama.ts: CausalLM.parameterCounts and
// flopsPerToken, nn.gptParameterCount, nn.llamaParameterCount...) and the planner (lib/plan/models.ts,
// which works from configs without a model) take them from here; a new family describes its shape as a
// DecoderShape and counts with them too.

/** One MoE layer's shape, as its parameters see it. */
export interface MoELayerShape {
  /** Width of the residual stream (C). */
  width: number;
  /** Routed experts (the router is [experts, C]). */
  experts: number;
  /** Routed experts counted: all of them, the top-k a token goes through, or one rank's share under expert parallelism. */
  routed: number;
  /** Hidden width of each routed SwiGLU expert (three C × hidden matrices). */
  hidden: number;
  /** Hidden width of the shared experts' one SwiGLU MLP (0: none). */
  sharedHidden: number;
  /** Whether the shared experts' output is gated by a [1, C] weight (Qwen2-MoE's shared_expert_gate). */
  sharedGate: boolean;
}

/** Parameters of one MoE layer's MLP slot: the router, `routed` SwiGLU experts, the shared experts and their gate. */
export function moeLayerParameters(s: MoELayerShape): number {
  return s.experts * s.width + s.routed * 3 * s.width * s.hidden + 3 * s.width * s.sharedHidden + (s.sharedGate ? s.width : 0);
}

/** A decoder-only transformer's shape, as its parameter counts see it (whatever the family). */
export interface DecoderShape {
  /** Transformer layers (L). */
  layers: number;
  /** Width of the residual stream (C). */
  width: number;
  /** Attention heads. */
  heads: number;
  /** Key/value heads (grouped-query attention; `heads` without it). */
  kvHeads: number;
  /** Hidden width of a dense layer's MLP. */
  ffn: number;
  /** Vocabulary size (the token table is [vocab, C]). */
  vocab: number;
  /** A gated MLP (SwiGLU: three matrices) instead of two (GPT-2's GELU MLP). */
  gated: boolean;
  /** Biases in every linear layer and LayerNorm (GPT-2) instead of bias-free layers and RMSNorm scales. */
  bias: boolean;
  /** The head shares the token table (counted once) instead of holding its own. */
  tied: boolean;
  /** Rows of a learned position table (0: rotary positions). */
  positions: number;
  /** Biases on q, k and v alone in a model without other biases (Qwen2-MoE's qkv_bias). */
  qkvBias?: boolean;
  /** Norms in each layer (default 2; a GPT's parallelBlock shares one between attention and the MLP). */
  layerNorms?: number;
  /** Mixture of experts in the MLP slot of some layers; absent for a dense model. */
  moe?: DecoderMoE;
}

/** The MoE part of a decoder's shape. */
export interface DecoderMoE {
  /** Layers whose MLP slot is a mixture of experts (the others are dense). */
  layers: number;
  /** Routed experts per MoE layer. */
  experts: number;
  /** Experts each token goes through. */
  topK: number;
  /** Each routed expert's hidden width. */
  hidden: number;
  /** Hidden width of the shared experts' one SwiGLU MLP (0: none). */
  sharedHidden: number;
  /** Whether the shared experts' output is gated (counted only when set). */
  sharedGate: boolean;
}

/**
 * Attention's parameters in one layer on one of tp tensor-parallel ranks: q, k, v column-parallel
 * (k and v split over tp when it divides the key/value heads; with fewer heads than ranks every rank
 * holds them all, as nt.nn.Llama's tensor-parallel layout replicates them) and the row-parallel
 * output projection (its bias replicated).
 */
export function attentionParameters(s: DecoderShape, tp = 1): { qkv: number; proj: number } {
  const h = s.width, kv = s.kvHeads * (h / s.heads), b = s.bias ? 1 : 0;
  const kvPerRank = s.kvHeads % tp === 0 ? kv / tp : kv;
  const qkv = (h * h + b * h) / tp + 2 * (h * kvPerRank + b * kvPerRank);
  return { qkv: s.qkvBias && !s.bias ? qkv + h / tp + 2 * kvPerRank : qkv, proj: (h * h) / tp + b * h };
}

/** A dense MLP's parameters on one of tp ranks: the column-parallel input (two matrices when gated) and the row-parallel output (its bias replicated). */
export function mlpParameters(s: DecoderShape, tp = 1): { input: number; output: number } {
  const h = s.width, b = s.bias ? 1 : 0;
  return { input: ((s.gated ? 2 : 1) * (h * s.ffn + b * s.ffn)) / tp, output: (s.ffn * h) / tp + b * h };
}

/** A layer's norms (LayerNorm weight and bias, or an RMSNorm scale; two unless `layerNorms` says), whole on every rank. */
export function layerNormParameters(s: DecoderShape): number {
  return (s.layerNorms ?? 2) * s.width * (s.bias ? 2 : 1);
}

/** One MoE layer's MLP slot on one of ep expert-parallel ranks (router and shared experts whole, routed experts / ep); `active`: those one token goes through. */
export function moeSlotParameters(s: DecoderShape, ep = 1, active = false): number {
  const e = s.moe!;
  return moeLayerParameters({ width: s.width, experts: e.experts, routed: active ? e.topK : e.experts / ep, hidden: e.hidden, sharedHidden: e.sharedHidden, sharedGate: e.sharedGate });
}

/**
 * Parameters of one layer on one of tp tensor-parallel ranks (and of ep expert-parallel ranks): for an
 * MoE model the average over its dense and MoE layers, the routed experts split ep ways and not by
 * tensor parallelism (every tp rank holds its expert-parallel share whole).
 */
export function layerParameters(s: DecoderShape, tp = 1, ep = 1): number {
  const { qkv, proj } = attentionParameters(s, tp), { input, output } = mlpParameters(s, tp), norms = layerNormParameters(s);
  if (!s.moe) return qkv + proj + input + output + norms;
  const moeShare = s.moe.layers / s.layers;
  return qkv + proj + norms + (1 - moeShare) * (input + output) + moeShare * moeSlotParameters(s, ep);
}

/** The parameters of one pipeline stage on one tensor-parallel rank, by part. */
export interface StageParameters {
  /** Transformer layers of the stage. */
  layers: number;
  /** Parameters of those layers. */
  layerParams: number;
  /** Token and position embedding parameters (first stage only). */
  embedding: number;
  /** Final norm and LM head parameters (last stage only; a tied head counts its table when the stage does not hold the embedding). */
  head: number;
  /** The sum of the above. */
  total: number;
}

/**
 * Parameters a pipeline stage of `layers` layers holds on one of tp ranks (ep: expert-parallel ranks):
 * the token (and position) embedding when it is `first`, the final norm and the head when it is `last`
 * (a tied head is the stage's own copy of the token table unless it is also first).
 */
export function stageParameters(s: DecoderShape, o: { layers: number; first: boolean; last: boolean; tp?: number; ep?: number }): StageParameters {
  const tp = o.tp ?? 1, table = (s.vocab * s.width) / tp;
  const embedding = o.first ? table + s.positions * s.width : 0;
  const head = o.last ? (s.bias ? 2 : 1) * s.width + (s.tied ? (o.first ? 0 : table) : table) : 0;
  const lp = o.layers * layerParameters(s, tp, o.ep ?? 1);
  return { layers: o.layers, layerParams: lp, embedding, head, total: lp + embedding + head };
}

/** The routed experts' parameters of `moeLayers` MoE layers (a fraction: a stage's share) on one of ep expert-parallel ranks; 0 for a dense model. */
export function routedExpertParameters(s: DecoderShape, moeLayers: number, ep = 1): number {
  return s.moe ? moeLayers * (s.moe.experts / ep) * 3 * s.width * s.moe.hidden : 0;
}

/**
 * The whole model's parameters, each kind of layer counted exactly (no averaging over dense and MoE
 * layers): all of them (a tied table once), and those one token goes through (an MoE layer's router,
 * top-k experts and shared experts, not the other experts; `total` for a dense model). The GPT's and
 * Llama's parameterCounts (nn.gptParameterCount, nn.llamaParameterCount) are this.
 */
export function decoderParameterCounts(s: DecoderShape): { total: number; active: number } {
  const { qkv, proj } = attentionParameters(s), { input, output } = mlpParameters(s);
  const moeLayers = s.moe ? s.moe.layers : 0;
  const table = s.vocab * s.width;
  const outside = table + s.positions * s.width + (s.bias ? 2 : 1) * s.width + (s.tied ? 0 : table);
  const common = outside + s.layers * (qkv + proj + layerNormParameters(s)) + (s.layers - moeLayers) * (input + output);
  if (!s.moe) return { total: common, active: common };
  return { total: common + moeLayers * moeSlotParameters(s), active: common + moeLayers * moeSlotParameters(s, 1, true) };
}

/**
 * Model FLOPs per trained token (forward and backward) at sequence length `seqLen`: 6 per parameter a
 * token goes through, lookups left out (the position table, and the token table unless the head is tied
 * to it), plus 12·L·C·T for attention's two matrix products (T: the positions each token attends to, the
 * sliding `window` when it is shorter). Recomputation not counted (model FLOPs, not hardware FLOPs), as
 * nanoGPT and PaLM count them. The GPT's and Llama's flopsPerToken are this.
 */
export function decoderFlopsPerToken(s: DecoderShape, seqLen: number, window?: number): number {
  const lookups = s.positions * s.width + (s.tied ? 0 : s.vocab * s.width);
  const attended = window !== undefined ? Math.min(window, seqLen) : seqLen;
  return 6 * (decoderParameterCounts(s).active - lookups) + 12 * s.layers * s.width * attended;
}

/** The largest single module's parameters (DeepSpeed's largest_layer_params): the token table, or a dense layer's MLP input if larger. */
export function largestModuleParameters(s: DecoderShape): number {
  return Math.max(s.vocab * s.width, mlpParameters(s).input);
}
