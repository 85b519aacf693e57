// The planner counts with the models' own arithmetic (lib/nn/counts.ts) and reads config.json with
// interop's one reader: its totals and active counts equal nn.GPT's and nn.Llama's for the same
// configs (a Qwen2-MoE differs by exactly the q/k/v biases and shared-expert gates the planner leaves
// out), lib/nn/counts.ts alone gives both models' counts from their configs (parallel blocks, gated
// shared experts, q/k/v biases, dense-only layers), a layer's parameters split over tensor- and
// expert-parallel ranks add back up to the whole,
// and a config file the importers refuse as no JSON object the planner refuses too.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { attentionParameters, decoderParameterCounts, layerParameters, mlpParameters, type DecoderShape } from '../../lib/nn/counts.js';
import { HF_CONFIG_KEYS, hfConfigNumber, readHFConfig } from '../../lib/interop/hf-common.js';
import { decoderShape } from '../../lib/plan/models.js';

const dir = mkdtempSync(join(tmpdir(), 'nt-plan-counts-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("the planner's counts are the models' counts", () => {
  it('a GPT, dense and with experts (shared experts without a gate): total and active equal gptParameterCount and gptActiveParameterCount', () => {
    const gpts = [
      { vocabSize: 50304, blockSize: 1024, nLayer: 12, nHead: 12, nEmbd: 768, bias: true },
      { vocabSize: 4096, blockSize: 256, nLayer: 6, nHead: 6, nEmbd: 384, bias: true, moe: { experts: 8, topK: 2, every: 2, hidden: 512 } },
      { vocabSize: 4096, blockSize: 128, nLayer: 4, nHead: 4, nEmbd: 256, bias: true, moe: { experts: 4, topK: 1, hidden: 256, sharedExperts: 2 } },
    ];
    for (const g of gpts) {
      const m = plan.modelFromConfig({ nLayer: g.nLayer, nHead: g.nHead, nEmbd: g.nEmbd, vocabSize: g.vocabSize, positions: g.blockSize, ...(g.moe ? { moe: g.moe } : {}) }, 'gpt');
      expect(plan.totalParams(m)).toBe(nt.nn.gptParameterCount(g));
      expect(plan.activeParams(m)).toBe(nt.nn.gptActiveParameterCount(g));
    }
  });

  it('a Llama (tied, untied, grouped-query) and a Mixtral read from config.json keys: equal llamaParameterCount', () => {
    const llama = { model_type: 'llama', hidden_size: 1024, intermediate_size: 2816, num_hidden_layers: 6, num_attention_heads: 16, num_key_value_heads: 4, vocab_size: 32000, max_position_embeddings: 2048 };
    const mixtral = { ...llama, model_type: 'mixtral', num_local_experts: 8, num_experts_per_tok: 2, moe_intermediate_size: 2816 };
    for (const json of [llama, { ...llama, tie_word_embeddings: true }, { ...llama, num_key_value_heads: 16 }, mixtral]) {
      const m = plan.modelFromConfig(json, json.model_type);
      const config = nt.nn.llamaConfig(json);
      expect(plan.totalParams(m)).toBe(nt.nn.llamaParameterCount(config));
      expect(plan.activeParams(m)).toBe(nt.nn.llamaParameterCount(config, true));
    }
  });

  it('a Qwen2-MoE: the planner leaves out exactly its q/k/v biases and shared-expert gates', () => {
    const json = {
      model_type: 'qwen2_moe', hidden_size: 512, intermediate_size: 1408, num_hidden_layers: 4, num_attention_heads: 8, num_key_value_heads: 4, vocab_size: 1000,
      max_position_embeddings: 512, num_experts: 6, num_experts_per_tok: 2, moe_intermediate_size: 256, shared_expert_intermediate_size: 1024, qkv_bias: true,
    };
    const m = plan.modelFromConfig(json, 'qwen');
    const left = 4 * ((8 + 2 * 4) * (512 / 8) + 512);
    expect(nt.nn.llamaParameterCount(nt.nn.llamaConfig(json)) - plan.totalParams(m)).toBe(left);
    expect(nt.nn.llamaParameterCount(nt.nn.llamaConfig(json), true) - plan.activeParams(m)).toBe(left);
  });
});

describe('lib/nn/counts.ts', () => {
  const gpt: DecoderShape = { layers: 4, width: 256, heads: 8, kvHeads: 8, ffn: 1024, vocab: 1000, gated: false, bias: true, tied: true, positions: 128 };
  const gqa: DecoderShape = { ...gpt, kvHeads: 2, gated: true, bias: false, tied: false, positions: 0 };

  it("tp ranks' layer shares add up to the whole layer plus the biases and norms every rank holds", () => {
    for (const tp of [1, 2, 4, 8]) {
      // Replicated on every rank: the two row-parallel biases and the norms.
      expect(tp * layerParameters(gpt, tp) - (tp - 1) * (2 * 256 + 4 * 256)).toBe(layerParameters(gpt));
    }
    // Two key/value heads split over 2 ranks; over 4 and 8 every rank holds both.
    const kv = 2 * 256 * 2 * 32;
    expect(2 * attentionParameters(gqa, 2).qkv).toBe(attentionParameters(gqa).qkv);
    for (const tp of [4, 8]) expect(tp * attentionParameters(gqa, tp).qkv - (tp - 1) * kv).toBe(attentionParameters(gqa).qkv);
    expect(mlpParameters(gqa).input).toBe(2 * 256 * 1024);
  });

  it('ep ranks each hold 1/ep of the routed experts; active counts the top-k of each MoE layer', () => {
    const moe: DecoderShape = { ...gqa, moe: { layers: 2, experts: 8, topK: 2, hidden: 64, sharedHidden: 0, sharedGate: false } };
    const expert = 3 * 256 * 64;
    // Averaged over the 4 layers, 2 of them MoE: each rank of ep = 4 holds 6 fewer experts per MoE layer.
    expect(layerParameters(moe, 1, 1) - layerParameters(moe, 1, 4)).toBe((2 / 4) * 6 * expert);
    const { total, active } = decoderParameterCounts(moe);
    expect(total - active).toBe(2 * 6 * expert);
    expect(decoderParameterCounts(gqa)).toEqual({ total: 4 * layerParameters(gqa) + 2 * 1000 * 256 + 256, active: 4 * layerParameters(gqa) + 2 * 1000 * 256 + 256 });
  });

  it("a decoder's counts equal nn.GPT's (parallel blocks, gated shared experts) and nn.Llama's (q/k/v biases, dense-only layers) from the same config", () => {
    type GPTConfig = Parameters<typeof nt.nn.gptParameterCount>[0];
    const gptShape = (c: GPTConfig): DecoderShape => {
      const moe = c.moe, hidden = moe?.hidden ?? 4 * c.nEmbd, shared = moe?.sharedExperts ?? 0;
      return {
        layers: c.nLayer, width: c.nEmbd, heads: 4, kvHeads: 4, ffn: 4 * c.nEmbd, vocab: c.vocabSize, gated: false, bias: c.bias ?? true, tied: true, positions: c.blockSize,
        layerNorms: c.parallelBlock ? 1 : 2,
        ...(moe ? { moe: { layers: Math.floor(c.nLayer / (moe.every ?? 1)), experts: moe.experts, topK: moe.topK, hidden, sharedHidden: shared > 0 ? moe.sharedHidden ?? shared * hidden : 0, sharedGate: shared > 0 && moe.sharedGate === true } } : {}),
      };
    };
    const g = { vocabSize: 500, blockSize: 64, nLayer: 4, nEmbd: 32, bias: true };
    for (const c of [g, { ...g, bias: false }, { ...g, parallelBlock: true }, { ...g, moe: { experts: 4, topK: 2, every: 2, hidden: 16, sharedExperts: 1, sharedHidden: 24, sharedGate: true } }] as GPTConfig[]) {
      expect(decoderParameterCounts(gptShape(c))).toEqual({ total: nt.nn.gptParameterCount(c), active: nt.nn.gptActiveParameterCount(c) });
    }
    const llamaShape = (c: nt.nn.CheckedLlamaConfig): DecoderShape => {
      const e = c.numLocalExperts ?? 0, step = c.decoderSparseStep ?? 1, only = c.mlpOnlyLayers ?? [], shared = c.sharedExpertIntermediateSize ?? 0;
      const moeLayers = Array.from({ length: c.numHiddenLayers }, (_, i) => i).filter((i) => !only.includes(i) && (i + 1) % step === 0).length;
      return {
        layers: c.numHiddenLayers, width: c.hiddenSize, heads: c.numAttentionHeads, kvHeads: c.numKeyValueHeads, ffn: c.intermediateSize, vocab: c.vocabSize,
        gated: true, bias: false, tied: c.tieWordEmbeddings, positions: 0, qkvBias: c.qkvBias,
        ...(e > 0 ? { moe: { layers: moeLayers, experts: e, topK: Math.min(c.numExpertsPerTok ?? 2, e), hidden: c.moeIntermediateSize ?? c.intermediateSize, sharedHidden: shared, sharedGate: shared > 0 } } : {}),
      };
    };
    const l = { vocab_size: 300, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64 };
    const qwen = { ...l, num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 16, shared_expert_intermediate_size: 24, qkv_bias: true };
    for (const json of [l, { ...l, tie_word_embeddings: true }, qwen, { ...qwen, decoder_sparse_step: 2, mlp_only_layers: [1] }]) {
      const c = nt.nn.llamaConfig(json);
      expect(decoderParameterCounts(llamaShape(c))).toEqual({ total: nt.nn.llamaParameterCount(c), active: nt.nn.llamaParameterCount(c, true) });
    }
  });

  it('the planner hands its model to them whole (decoderShape)', () => {
    const m = plan.resolveModel('70b');
    expect(decoderShape(m)).toEqual({ layers: 80, width: 8192, heads: 64, kvHeads: 8, ffn: 28672, vocab: 32000, gated: true, bias: false, tied: false, positions: 0 });
  });
});

describe("one config.json reader (interop's)", () => {
  const write = (name: string, text: string) => { const p = join(dir, name); writeFileSync(p, text); return p; };

  it('the planner reads a config.json file as modelFromConfig reads its object', () => {
    const json = { model_type: 'gpt2', n_layer: 6, n_head: 12, n_embd: 768, vocab_size: 50257, n_positions: 1024 };
    const path = write('gpt2.json', JSON.stringify(json));
    expect(readHFConfig(path, 'plan')).toEqual(json);
    expect(plan.resolveModel(path)).toEqual(plan.modelFromConfig(json, path));
    expect(hfConfigNumber(json, 'layers')).toBe(6);
    expect(hfConfigNumber({ num_hidden_layers: 3 }, 'layers')).toBe(3);
    expect(HF_CONFIG_KEYS.context).toEqual(['n_positions', 'max_position_embeddings', 'n_ctx']);
  });

  it('a file that is not a JSON object: the planner (ArgumentError) and importHF (StateError) refuse it alike', () => {
    const path = write('list.json', '[1, 2]');
    expect(() => plan.resolveModel(path)).toThrow(nt.ArgumentError);
    expect(() => plan.resolveModel(path)).toThrow(/^plan: the model config .*list\.json is not a JSON object$/);
    const hf = join(dir, 'hf');
    mkdirSync(hf);
    writeFileSync(join(hf, 'config.json'), '[1, 2]');
    expect(() => nt.interop.importHF(hf)).toThrow(nt.StateError);
    expect(() => nt.interop.importHF(hf)).toThrow(/^importHF: .*config\.json is not a JSON object$/);
    expect(() => plan.resolveModel(join(dir, 'missing.json'))).toThrow(/^plan: cannot read the model config .*missing\.json: /);
    expect(() => plan.resolveModel(write('bad.json', '{'))).toThrow(/^plan: the model config .*bad\.json is not JSON/);
  });
});
