// Parameter arithmetic the model families share, pure (no tensors, nothing loaded): what one mixture-of-
// experts layer holds. The GPT's and Llama's counts (gpt.ts, llama.ts: CausalLM.parameterCounts and
// flopsPerToken) and the planner (lib/plan/models.ts, which works from configs without a model) all
// take it from here.

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
