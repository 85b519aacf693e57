// The planner's MoE shapes: Mixtral and Qwen2-MoE configs read from their Hugging Face keys, total
// and active parameters against the published counts (Mixtral 8x7B: 46.7B and 12.9B), the routed
// experts split by expert parallelism, FLOPs from the active parameters, and the GPT's own config.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const mixtral = {
  model_type: 'mixtral', hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8,
  vocab_size: 32000, num_local_experts: 8, num_experts_per_tok: 2, max_position_embeddings: 4096, tie_word_embeddings: false,
};

describe('nodetron plan with MoE models', () => {
  it('Mixtral 8x7B: 46.7B parameters, 12.9B active per token (Jiang et al. 2024)', () => {
    const m = nt.plan.modelFromConfig(mixtral, 'mixtral');
    expect(m.moe).toEqual({ experts: 8, topK: 2, ffn: 14336, sharedFfn: 0, every: 1 });
    expect(nt.plan.totalParams(m) / 1e9).toBeCloseTo(46.7, 1);
    expect(nt.plan.activeParams(m) / 1e9).toBeCloseTo(12.9, 1);
    expect(nt.plan.expertParams(m)).toBe(32 * 8 * 3 * 4096 * 14336);
  });

  it('expert parallelism divides the routed experts of a layer, not the router or attention', () => {
    const m = nt.plan.modelFromConfig(mixtral, 'mixtral');
    const perExpert = 3 * 4096 * 14336;
    expect(nt.plan.layerParams(m, 1, 1) - nt.plan.layerParams(m, 1, 4)).toBe(8 * perExpert - 2 * perExpert);
    const dense = nt.plan.modelFromConfig({ ...mixtral, num_local_experts: undefined, model_type: 'llama' }, 'dense');
    expect(dense.moe).toBeUndefined();
    // The dense twin's MLP is one expert without the router: each MoE layer adds 7 experts and the router.
    expect(nt.plan.layerParams(m) - nt.plan.layerParams(dense)).toBe(7 * perExpert + 8 * 4096);
  });

  it('FLOPs per step count the active experts only', () => {
    const m = nt.plan.modelFromConfig(mixtral, 'mixtral');
    const dense = nt.plan.modelFromConfig({ ...mixtral, num_local_experts: undefined, model_type: 'llama' }, 'dense');
    const moe = nt.plan.stepFlops(m, 8, 4096, 'none'), one = nt.plan.stepFlops(dense, 8, 4096, 'none');
    // Top-2 is about one more expert's MLP per token than the dense model: between 1x and 2x the FLOPs.
    expect(moe / one).toBeGreaterThan(1.4);
    expect(moe / one).toBeLessThan(1.9);
  });

  it('Qwen2-MoE keys (shared experts, sparse step) and a GPTConfig moe object', () => {
    const q = nt.plan.modelFromConfig({ hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 24, num_attention_heads: 16, vocab_size: 151936,
      num_experts: 60, num_experts_per_tok: 4, moe_intermediate_size: 1408, shared_expert_intermediate_size: 5632, decoder_sparse_step: 1 }, 'qwen');
    expect(q.moe).toEqual({ experts: 60, topK: 4, ffn: 1408, sharedFfn: 5632, every: 1 });
    const g = nt.plan.modelFromConfig({ nLayer: 4, nHead: 4, nEmbd: 64, vocabSize: 256, moe: { experts: 8, topK: 2, hidden: 128, every: 2 } }, 'gpt');
    expect(g.moe).toEqual({ experts: 8, topK: 2, ffn: 128, sharedFfn: 0, every: 2 });
    expect(nt.plan.moeLayerCount(g)).toBe(2);
    expect(() => nt.plan.modelFromConfig({ ...mixtral, num_experts_per_tok: 9 }, 'bad')).toThrow(/1 <= top-k <= experts/);
  });
});
