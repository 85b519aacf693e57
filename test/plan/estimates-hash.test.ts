// The planner's estimates pinned by a hash: the models it reads (named ones and config.json keys of
// GPT-2, Llama, Mixtral, Qwen2-MoE and its own), their parameter counts (whole, per layer, per stage,
// per tensor- and expert-parallel rank), FLOPs, per-stage memory and ranked layouts over a grid, as
// exact JSON numbers. A refactoring of the planner's arithmetic must leave every one bit-identical.
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { plan } from '../../lib/internal.js';

const mixtral = {
  model_type: 'mixtral', hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8,
  vocab_size: 32000, num_local_experts: 8, num_experts_per_tok: 2, max_position_embeddings: 4096, tie_word_embeddings: false,
};
const qwen = {
  model_type: 'qwen2_moe', hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 24, num_attention_heads: 16, num_key_value_heads: 16, vocab_size: 151936,
  num_experts: 60, num_experts_per_tok: 4, moe_intermediate_size: 1408, shared_expert_intermediate_size: 5632, decoder_sparse_step: 1, max_position_embeddings: 8192,
};
/** Config objects as `nodetron plan --model config.json` reads them. */
const CONFIGS: Record<string, Record<string, unknown>> = {
  mixtral,
  qwen,
  'qwen-no-type': { ...qwen, model_type: undefined },
  'qwen-step2': { ...qwen, decoder_sparse_step: 2 },
  'hf-gpt2': { model_type: 'gpt2', n_layer: 6, n_head: 12, n_embd: 768, vocab_size: 50257, n_positions: 1024, n_ctx: 1024 },
  'hf-gpt2-inner': { model_type: 'gpt2', n_layer: 4, n_head: 8, n_embd: 512, n_inner: 1536, vocab_size: 50257, n_positions: 512 },
  'hf-llama-gqa': { model_type: 'llama', hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 22, num_attention_heads: 32, num_key_value_heads: 4, vocab_size: 32000, max_position_embeddings: 2048, tie_word_embeddings: false },
  'hf-llama-tied': { model_type: 'llama', hidden_size: 1024, intermediate_size: 2816, num_hidden_layers: 8, num_attention_heads: 16, num_key_value_heads: 2, vocab_size: 32000, max_position_embeddings: 4096, tie_word_embeddings: true },
  'llama-typed-only': { model_type: 'llama', hidden_size: 512, num_hidden_layers: 4, num_attention_heads: 8, vocab_size: 1000 },
  own: { nLayer: 6, nHead: 6, nEmbd: 384, vocabSize: 4096, ffn: 1536, gated: false, tied: true, bias: true, positions: 256, seqLen: 256 },
  'own-gated': { nLayer: 5, nHead: 4, nKvHead: 2, nEmbd: 256, vocabSize: 3000, gated: true, seqLen: 512 },
  'gpt-moe': { nLayer: 4, nHead: 4, nEmbd: 64, vocabSize: 256, moe: { experts: 8, topK: 2, hidden: 128, every: 2 } },
  'gpt-moe-shared': { nLayer: 4, nHead: 4, nEmbd: 256, vocabSize: 50304, moe: { experts: 4, topK: 2, hidden: 512, sharedExperts: 1 } },
};

function models(): plan.PlanModel[] {
  return [...Object.keys(plan.PLAN_MODELS).map((n) => plan.resolveModel(n)), ...Object.entries(CONFIGS).map(([n, c]) => plan.modelFromConfig(c, n))];
}

/** Every estimate the grid gives, in a fixed order. */
function estimates(): unknown[] {
  const out: unknown[] = [];
  for (const m of models()) {
    const row: Record<string, unknown> = {
      model: m, total: plan.totalParams(m), active: plan.activeParams(m), experts: plan.expertParams(m), largest: plan.largestLayerParams(m), moeLayers: plan.moeLayerCount(m),
      flops: (['none', 'selective', 'full'] as const).map((r) => plan.stepFlops(m, 64, m.seqLen, r)),
    };
    const layers: unknown[] = [];
    for (const tp of [1, 2, 4, 8]) for (const ep of [1, 2, 4]) if (!m.moe ? ep === 1 : m.moe.experts % ep === 0) layers.push([tp, ep, plan.layerParams(m, tp, ep)]);
    row.layers = layers;
    const stages: unknown[] = [];
    for (const pp of [1, 2, 3, 4]) {
      if (pp > m.nLayer) continue;
      for (const tp of [1, 2, 4]) for (let s = 0; s < pp; s++) {
        stages.push([pp, tp, s, plan.stageParams(m, tp, pp, s), plan.stageExpertParams(m, pp, s, m.moe ? 2 : 1)]);
        if (2 * pp <= m.nLayer) stages.push([pp, tp, s, 'v', plan.stageParams(m, tp, pp, s, 1, 'v')]);
      }
    }
    row.stages = stages;
    const mem: unknown[] = [];
    const base: plan.PlanLayout = { dp: 2, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };
    const layouts: plan.PlanLayout[] = [
      base, { ...base, zero: 1 }, { ...base, zero: 3, recompute: 'full' }, { ...base, dp: 1, tp: 2, sequenceParallel: true, recompute: 'selective' },
      ...(m.nLayer >= 2 ? [{ ...base, dp: 1, pp: 2, microBatches: 4 }, { ...base, dp: 1, pp: 2, microBatches: 4, schedule: 'zb-h1' as const, zero: 0 as const }] : []),
      ...(m.moe && m.moe.experts % 2 === 0 ? [{ ...base, ep: 2, zero: 1 as const }] : []),
    ];
    for (const l of layouts) {
      for (const dtype of ['bf16', 'f32'] as const) {
        for (const model of ['megatron', 'nodetron'] as const) {
          try {
            mem.push(plan.estimateStages(m, l, { seq: Math.min(m.seqLen, 512), microBatchSize: 2, dtype, model, bf16Path: 'native', backend: 'cuda' }));
          } catch (e) { mem.push(`${(e as Error).name}: ${(e as Error).message}`); }
        }
      }
    }
    row.memory = mem;
    out.push(row);
  }
  const dev = plan.resolveDevice('h100');
  for (const [name, gpus, seq] of [['gpt2-xl', 8, 1024], ['7b', 16, 4096], ['mixtral', 16, 4096]] as const) {
    const m = name === 'mixtral' ? plan.modelFromConfig(mixtral, 'mixtral') : plan.resolveModel(name);
    const c = plan.planLayouts(m, { gpus, gpuMemory: 80 * 2 ** 30, seq, globalBatch: 64, dtype: 'bf16', device: dev, bf16Path: 'native' });
    out.push(c.map(({ command: _c, commandNote: _n, ...rest }) => rest));
  }
  return out;
}

describe("the planner's estimates", () => {
  it('hash the same as before the planner took its counts from lib/nn/counts.ts', () => {
    const digest = createHash('sha256').update(JSON.stringify(estimates())).digest('hex');
    expect(digest).toBe('9836791b892642eca45bcf56d7fbd793a331bc94d754a16f8966378b603bce2a');
  });
});
