// Hugging Face MixtralForCausalLM and Qwen2MoeForCausalLM interop against tiny models transformers saved
// (test/golden/moe/, from scripts/golden/moe.py): importLlamaHF gives their logits (Mixtral f32 sharded
// with an index and bf16; Qwen2-MoE with q/k/v biases, a dense block by mlp_only_layers, the gated shared
// expert, top-k not renormalized; Qwen2-MoE with decoder_sparse_step 2, multi-query, tied, bf16);
// exportLlamaHF writes save_pretrained's names, shapes and config, one file or shards, and round trips
// are bit-exact; directories of another family, settings nt.nn.Llama does not compute, and exports a
// class cannot hold are refused by name. (That an export loads in transformers with the golden logits is
// checked by `python3 scripts/golden/moe.py --verify DIR`, not here: the suite runs without Python.)
import { mkdirSync, readdirSync, readFileSync, writeFileSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { SafetensorsFile } from '../../lib/io/safetensors.js';
import { expectSameLlamaWeights, f32, llamaGolden, relErr, scratch, HF_DIR } from './helpers.js';

const { exportLlamaHF, importLlamaHF, exportHF, importHF, llamaHFArchitecture } = nt.interop;
const { dir: GOLDEN, golden, logitsOf } = llamaGolden('moe');
const work = scratch('nt-moe-hf-');
let n = 0;
const fresh = () => join(work, `d${n++}`);

function expectSameWeights(a: nt.nn.Llama, b: nt.nn.Llama, dtype: nt.DType = 'f32'): void {
  expectSameLlamaWeights(a, b, dtype, true);
}

function namesAndShapes(dir: string): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const f of readdirSync(dir).filter((x) => x.endsWith('.safetensors'))) {
    using s = SafetensorsFile.open(join(dir, f));
    for (const k of s.names) out.set(k, s.entry(k).shape);
  }
  return out;
}

describe('Hugging Face Mixtral and Qwen2-MoE interop', () => {
  for (const name of ['mixtral', 'mixtral-bf16', 'qwen2-moe', 'qwen2-moe-step2']) {
    it(`${name}: importLlamaHF gives transformers' logits`, () => {
      const m = importLlamaHF(join(GOLDEN, name));
      const got = logitsOf(m);
      expect(relErr(got, f32(golden.models[name]!.logits))).toBeLessThan(2e-5);
      m.dispose();
    });
  }

  it('the configs become the MoE Llamas they describe', () => {
    const mx = importLlamaHF(join(GOLDEN, 'mixtral'));
    expect(readdirSync(join(GOLDEN, 'mixtral')).filter((f) => f.endsWith('.safetensors')).length).toBeGreaterThan(1);
    expect(mx.config).toMatchObject({ numLocalExperts: 4, numExpertsPerTok: 2, moeIntermediateSize: 16, sharedExpertIntermediateSize: 0, normTopkProb: true, qkvBias: false, routerAuxLossCoef: 0.02, routerZLossCoef: 0 });
    expect(mx.layers.every((b) => b.mlp instanceof nt.nn.MoE)).toBe(true);
    expect(llamaHFArchitecture(mx.config)).toBe('MixtralForCausalLM');
    mx.dispose();
    const q = importLlamaHF(join(GOLDEN, 'qwen2-moe'));
    expect(q.config).toMatchObject({ numLocalExperts: 4, intermediateSize: 40, moeIntermediateSize: 16, sharedExpertIntermediateSize: 24, mlpOnlyLayers: [1], normTopkProb: false, qkvBias: true });
    expect(q.layers.map((b) => b.mlp instanceof nt.nn.MoE)).toEqual([true, false, true]);
    expect(llamaHFArchitecture(q.config)).toBe('Qwen2MoeForCausalLM');
    q.dispose();
    const s = importLlamaHF(join(GOLDEN, 'qwen2-moe-step2'));
    expect(s.layers.map((b) => b.mlp instanceof nt.nn.MoE)).toEqual([false, true]);
    expect(s.lmHead).toBeNull();
    s.dispose();
  });

  for (const name of ['mixtral', 'qwen2-moe']) {
    it(`${name}: exportLlamaHF writes save_pretrained's names, shapes and config; round trips are bit-exact (one file, shards, bf16)`, () => {
      const m = importLlamaHF(join(GOLDEN, name));
      const one = fresh();
      exportHF(m, one);
      expect(namesAndShapes(one)).toEqual(namesAndShapes(join(GOLDEN, name)));
      const cfg = JSON.parse(readFileSync(join(one, 'config.json'), 'utf8'));
      const ref = JSON.parse(readFileSync(join(GOLDEN, name, 'config.json'), 'utf8'));
      expect(cfg.rope_parameters.rope_theta).toBe(ref.rope_parameters.rope_theta);
      const keys = ['architectures', 'model_type', 'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads',
        'rms_norm_eps', 'tie_word_embeddings', 'max_position_embeddings', 'hidden_act', 'num_experts_per_tok', 'router_aux_loss_coef'];
      const own = name === 'mixtral' ? ['num_local_experts', 'router_jitter_noise'] : ['num_experts', 'moe_intermediate_size', 'shared_expert_intermediate_size', 'decoder_sparse_step', 'mlp_only_layers', 'norm_topk_prob', 'qkv_bias', 'use_sliding_window'];
      for (const k of [...keys, ...own]) expect(cfg[k], k).toEqual(ref[k]);
      const back = importLlamaHF(one);
      expectSameWeights(back, m);
      back.dispose();
      const sharded = fresh();
      exportLlamaHF(m, sharded, { maxShardBytes: 30_000 });
      const files = readdirSync(sharded);
      expect(files).toContain('model.safetensors.index.json');
      expect(files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f)).length).toBeGreaterThan(1);
      const index = JSON.parse(readFileSync(join(sharded, 'model.safetensors.index.json'), 'utf8'));
      expect(Object.keys(index.weight_map).sort()).toEqual([...namesAndShapes(join(GOLDEN, name)).keys()].sort());
      const back2 = importLlamaHF(sharded);
      expectSameWeights(back2, m);
      back2.dispose();
      const half = fresh();
      exportLlamaHF(m, half, { dtype: 'bf16' });
      expect(JSON.parse(readFileSync(join(half, 'config.json'), 'utf8')).torch_dtype).toBe('bfloat16');
      const back3 = importLlamaHF(half, { dtype: 'bf16' });
      expectSameWeights(back3, m, 'bf16');
      back3.dispose();
      m.dispose();
    });
  }

  it('a model trained here exports as the class that holds it; one a class cannot hold is refused', () => {
    const base = { vocabSize: 32, hiddenSize: 16, intermediateSize: 24, numHiddenLayers: 2, numAttentionHeads: 4, maxPositionEmbeddings: 8 };
    const dense = new nt.nn.Llama(base), mx = new nt.nn.Llama({ ...base, numLocalExperts: 4 }), qw = new nt.nn.Llama({ ...base, numLocalExperts: 4, sharedExpertIntermediateSize: 8 });
    const qkvOnly = new nt.nn.Llama({ ...base, qkvBias: true });
    try {
      expect([dense, mx, qw].map((m) => llamaHFArchitecture(m.config))).toEqual(['LlamaForCausalLM', 'MixtralForCausalLM', 'Qwen2MoeForCausalLM']);
      expect(() => exportLlamaHF(qw, fresh(), { architecture: 'MixtralForCausalLM' })).toThrow(/a MixtralForCausalLM cannot hold this model: it has a shared expert/);
      expect(() => exportLlamaHF(mx, fresh(), { architecture: 'Qwen2MoeForCausalLM' })).toThrow(/it has no shared expert/);
      expect(() => exportLlamaHF(mx, fresh(), { architecture: 'LlamaForCausalLM' })).toThrow(/it has 4 experts/);
      expect(() => exportLlamaHF(qkvOnly, fresh())).toThrow(/no Hugging Face class holds this Llama/);
      const dir = fresh();
      exportLlamaHF(mx, dir);
      expect(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')).model_type).toBe('mixtral');
      // transformers 5 refuses an int in a float field: 0.0, not 0.
      const text = readFileSync(join(dir, 'config.json'), 'utf8');
      expect(text).toMatch(/"router_jitter_noise": 0\.0,\n/);
      expect(text).toMatch(/"rope_theta": 10000\.0,\n/);
    } finally { for (const m of [dense, mx, qw, qkvOnly]) m.dispose(); }
  });

  it('refuses a checkpoint of another family, settings nt.nn.Llama does not compute, missing and misshaped tensors', () => {
    expect(() => importLlamaHF(HF_DIR)).toThrow(/model_type "gpt2"; only 'llama', 'mixtral' and 'qwen2_moe' are read/);
    // importHF reads Mixtral and Qwen2-MoE by their model_type: the same Llama importLlamaHF builds.
    for (const name of ['mixtral-bf16', 'qwen2-moe']) {
      const auto = importHF(join(GOLDEN, name)), direct = importLlamaHF(join(GOLDEN, name));
      try {
        expect(auto).toBeInstanceOf(nt.nn.Llama);
        expectSameWeights(auto as nt.nn.Llama, direct);
      } finally { auto.dispose(); direct.dispose(); }
    }
    const edited = (from: string, edit: (c: Record<string, unknown>) => void) => {
      const dir = fresh();
      mkdirSync(dir);
      const c = JSON.parse(readFileSync(join(GOLDEN, from, 'config.json'), 'utf8'));
      edit(c);
      writeFileSync(join(dir, 'config.json'), JSON.stringify(c));
      copyFileSync(join(GOLDEN, from, 'model.safetensors'), join(dir, 'model.safetensors'));
      return dir;
    };
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.model_type = 'qwen2'; }))).toThrow(/model_type "qwen2"/);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.router_jitter_noise = 0.01; }))).toThrow(/routerJitterNoise 0\.01 is not computed/);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.sliding_window = 4; }))).toThrow(/sliding_window is 4/);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.num_experts_per_tok = 5; }))).toThrow(/numExpertsPerTok \(5\) must not exceed numLocalExperts \(4\)/);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.num_local_experts = 5; }))).toThrow(/missing tensors: model\.layers\.0\.block_sparse_moe\.experts\.4\.w1\.weight/);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.num_local_experts = 3; }))).toThrow(/unexpected tensors: .*experts\.3\./);
    expect(() => importLlamaHF(edited('mixtral-bf16', (c) => { c.intermediate_size = 8; }))).toThrow(nt.ShapeError);
    expect(() => importLlamaHF(edited('qwen2-moe-step2', (c) => { c.use_sliding_window = true; }))).toThrow(/use_sliding_window is true/);
    expect(() => importLlamaHF(edited('qwen2-moe-step2', (c) => { c.shared_expert_intermediate_size = 0; }))).toThrow(/shared_expert_intermediate_size is 0/);
    expect(() => importLlamaHF(edited('qwen2-moe-step2', (c) => { c.decoder_sparse_step = 1; }))).toThrow(/missing tensors: model\.layers\.0\.mlp\.gate\.weight/);
    expect(() => importLlamaHF(edited('qwen2-moe-step2', (c) => { c.qkv_bias = false; }))).toThrow(/unexpected tensors: .*self_attn\.q_proj\.bias/);
  });
});
