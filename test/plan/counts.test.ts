// The planner counts with the models' own arithmetic (lib/nn/counts.ts) and reads config.json with
// interop's one reader: its totals and active counts equal nn.GPT's and nn.Llama's for the same
// configs (a Qwen2-MoE differs by exactly the q/k/v biases and shared-expert gates the planner leaves
// out). counts.ts is checked against the models themselves, not a copy of its arithmetic: the GPT's and
// Llama's counts (and FLOPs per token) equal the sizes of the parameters a built model holds, for dense,
// biasless, parallel-block, grouped-query, tied, q/k/v-biased and MoE configs (the experts a token skips
// counted from the MoE layers' own parameters), and a pipeline stage's count equals what the trainer's
// stage holds. A layer's parameters split over tensor- and expert-parallel ranks add back up to the
// whole, and a config file the importers refuse as no JSON object the planner refuses too.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { attentionParameters, decoderParameterCounts, layerParameters, mlpParameters, stageParameters, type DecoderShape } from '../../lib/nn/counts.js';
import { GPTStage } from '../../lib/parallel/pipeline/gpt-stage.js';
import { gptDecoderShape } from '../../lib/nn/gpt.js';
import { llamaDecoderShape } from '../../lib/nn/llama.js';
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

  it("the models' counts (counts.ts) equal the parameters the models hold: GPTs (no biases, parallel blocks, gated shared experts, MoE in 1 of 3 layers) and Llamas (tied, GQA, q/k/v biases, dense-only layers, Mixtral)", () => {
    const g = { vocabSize: 97, blockSize: 24, nLayer: 4, nHead: 4, nEmbd: 16, dropout: 0, bias: true };
    const gpts: nt.nn.GPTConfig[] = [
      g, { ...g, bias: false }, { ...g, parallelBlock: true, nHead: 2 },
      { ...g, moe: { experts: 4, topK: 2, every: 2, hidden: 8, sharedExperts: 1, sharedHidden: 12, sharedGate: true } },
      { ...g, nLayer: 3, bias: false, moe: { experts: 3, topK: 1, every: 2, hidden: 20, sharedExperts: 2 } },
    ];
    const l = { vocab_size: 53, hidden_size: 32, intermediate_size: 48, num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 64 };
    const qwen = { ...l, num_experts: 4, num_experts_per_tok: 2, moe_intermediate_size: 16, shared_expert_intermediate_size: 24, qkv_bias: true };
    const llamas = [
      l, { ...l, tie_word_embeddings: true, num_key_value_heads: 4 }, { ...l, num_key_value_heads: 1 }, qwen,
      { ...qwen, decoder_sparse_step: 2, mlp_only_layers: [1] }, { ...l, num_local_experts: 3, num_experts_per_tok: 2, num_hidden_layers: 3 },
    ];
    const models: Array<[string, () => nt.nn.CausalLM, number]> = [
      ...gpts.map((c, i) => [`gpt ${i}`, () => new nt.nn.GPT(c), c.moe?.topK ?? 0] as [string, () => nt.nn.CausalLM, number]),
      ...llamas.map((c, i) => [`llama ${i}`, () => new nt.nn.Llama(c), 'num_experts_per_tok' in c ? c.num_experts_per_tok : 0] as [string, () => nt.nn.CausalLM, number]),
    ];
    for (const [name, build, topK] of models) {
      const m = build();
      try {
        const named = m.namedParameters();
        const size = (re: RegExp) => named.filter(([n]) => re.test(n)).reduce((a, [, p]) => a + p.size, 0);
        const total = size(/./);
        // Of each MoE layer's routed experts a token goes through topK; every expert of a layer is the same size.
        let inactive = 0;
        for (const moe of nt.nn.moeLayers(m)) {
          const own = moe.namedParameters();
          const sum = (re: RegExp) => own.filter(([n]) => re.test(n)).reduce((acc, [, p]) => acc + p.size, 0);
          const experts = moe.config.experts, expert = sum(/^experts\.0\./);
          expect(sum(/^experts\./), name).toBe(experts * expert);
          inactive += (experts - topK) * expert;
        }
        expect(m.parameterCounts, name).toEqual({ total, active: total - inactive });
        // FLOPs: 6 per parameter a token goes through, the lookup tables (positions; an untied input table) left out, and attention.
        const s = m.shape, lookups = size(/^wpe\./) + (m.tiedWeight ? 0 : size(/^embedTokens\./));
        for (const t of [1, 7, s.blockSize]) expect(m.flopsPerToken(t), name).toBe(6 * (total - inactive - lookups) + 12 * s.nLayer * s.nEmbd * t);
      } finally { m.dispose(); }
    }
    // The public count functions are the same arithmetic.
    for (const c of gpts) expect([nt.nn.gptParameterCount(c), nt.nn.gptActiveParameterCount(c)]).toEqual([new nt.nn.GPT(c).parameterCounts.total, new nt.nn.GPT(c).parameterCounts.active]);
    for (const c of llamas) expect(nt.nn.llamaParameterCount(nt.nn.llamaConfig(c))).toBe(decoderParameterCounts(llamaDecoderShape(nt.nn.llamaConfig(c))).total);
  });

  it("a pipeline stage's parameters (stageParameters) are those the trainer's stage holds: tied and untied heads, every stage of pp = 1..3", () => {
    const gpt: nt.nn.GPTConfig = { vocabSize: 61, blockSize: 16, nLayer: 5, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
    const llama = { vocab_size: 61, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 5, num_attention_heads: 4, num_key_value_heads: 2, max_position_embeddings: 16 };
    const cases: Array<[string, () => nt.nn.CausalLM, DecoderShape]> = [
      ['gpt', () => new nt.nn.GPT(gpt), gptDecoderShape(gpt)],
      ['llama', () => new nt.nn.Llama(llama), llamaDecoderShape(nt.nn.llamaConfig(llama))],
      ['llama tied', () => new nt.nn.Llama({ ...llama, tie_word_embeddings: true }), llamaDecoderShape(nt.nn.llamaConfig({ ...llama, tie_word_embeddings: true }))],
    ];
    for (const [name, build, shape] of cases) {
      for (const pp of [1, 2, 3]) {
        for (let stage = 0; stage < pp; stage++) {
          const s = new GPTStage(build(), stage, pp);
          try {
            const counted = stageParameters(shape, { layers: s.layers[1] - s.layers[0], first: stage === 0, last: stage === pp - 1 });
            expect(counted.total, `${name} pp ${pp} stage ${stage}`).toBe(s.numParameters());
          } finally { s.dispose(); }
        }
      }
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
