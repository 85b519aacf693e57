// Hugging Face LlamaForCausalLM interop against tiny models transformers saved (test/golden/llama/, from
// scripts/golden/llama.py): importLlamaHF gives their logits (f32 sharded with an index, bf16, tied and
// multi-query); exportLlamaHF writes save_pretrained's names, shapes and config, one file or shards,
// and round trips are bit-exact; directories of another family or with settings Llama does not compute
// are refused by name. (That an export loads in transformers with the golden logits is checked by
// `python3 scripts/golden/llama.py --verify DIR`, not here: the suite runs without Python.)
import { mkdirSync, readdirSync, readFileSync, writeFileSync, copyFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { SafetensorsFile } from '../../lib/io/safetensors.js';
import { expectSameLlamaWeights, f32, llamaGolden, relErr, scratch, HF_DIR } from './helpers.js';

const { exportLlamaHF, importLlamaHF, exportHF, importHF } = nt.interop;
const { dir: GOLDEN, golden, logitsOf } = llamaGolden('llama');
const work = scratch('nt-llama-hf-');
let n = 0;
const fresh = () => join(work, `d${n++}`);

function expectSameWeights(a: nt.nn.Llama, b: nt.nn.Llama, dtype: nt.DType = 'f32'): void {
  expectSameLlamaWeights(a, b, dtype);
}

describe('Hugging Face Llama interop', () => {
  for (const name of ['hf-tiny', 'hf-tiny-bf16', 'hf-tied']) {
    it(`${name}: importLlamaHF gives transformers' logits`, () => {
      const m = importLlamaHF(join(GOLDEN, name));
      const got = logitsOf(m);
      expect(relErr(got, f32(golden.models[name]!.logits))).toBeLessThan(2e-5);
      m.dispose();
    });
  }
  it('the golden f32 model is sharded with an index; the tied one holds no lm_head', () => {
    expect(readdirSync(join(GOLDEN, 'hf-tiny')).filter((f) => f.endsWith('.safetensors')).length).toBeGreaterThan(1);
    const m = importLlamaHF(join(GOLDEN, 'hf-tied'));
    expect(m.lmHead).toBeNull();
    expect(m.config).toMatchObject({ numKeyValueHeads: 1, tieWordEmbeddings: true, ropeTheta: 500 });
    m.dispose();
  });
  it('exportLlamaHF writes save_pretrained\'s names, shapes and config; round trips are bit-exact (one file, shards, bf16)', () => {
    const m = importLlamaHF(join(GOLDEN, 'hf-tiny'));
    const one = fresh();
    exportHF(m, one);
    // The same tensor names and shapes as transformers wrote.
    const theirs = new Map<string, number[]>();
    for (const f of readdirSync(join(GOLDEN, 'hf-tiny')).filter((x) => x.endsWith('.safetensors'))) {
      using s = SafetensorsFile.open(join(GOLDEN, 'hf-tiny', f));
      for (const k of s.names) theirs.set(k, s.entry(k).shape);
    }
    using ours = SafetensorsFile.open(join(one, 'model.safetensors'));
    expect(new Map(ours.names.map((k) => [k, ours.entry(k).shape]))).toEqual(theirs);
    const cfg = JSON.parse(readFileSync(join(one, 'config.json'), 'utf8'));
    const ref = JSON.parse(readFileSync(join(GOLDEN, 'hf-tiny', 'config.json'), 'utf8'));
    expect(cfg.rope_parameters?.rope_theta ?? cfg.rope_theta).toBe(ref.rope_parameters?.rope_theta ?? ref.rope_theta);
    for (const k of ['model_type', 'vocab_size', 'hidden_size', 'intermediate_size', 'num_hidden_layers', 'num_attention_heads', 'num_key_value_heads', 'rms_norm_eps', 'tie_word_embeddings', 'max_position_embeddings', 'hidden_act']) {
      expect(cfg[k], k).toEqual(ref[k]);
    }
    const back = importLlamaHF(one);
    expectSameWeights(back, m);
    back.dispose();
    const sharded = fresh();
    exportLlamaHF(m, sharded, { maxShardBytes: 30_000 });
    const files = readdirSync(sharded);
    expect(files).toContain('model.safetensors.index.json');
    expect(files.filter((f) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(f)).length).toBeGreaterThan(1);
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
  it('refuses a checkpoint of another family, settings Llama does not compute, missing and misshaped tensors', () => {
    expect(() => importLlamaHF(HF_DIR)).toThrow(/model_type "gpt2"; only 'llama', 'mixtral' and 'qwen2_moe' are read/);
    // importHF reads every family by its model_type, as transformers' Auto classes do: the same Llama importLlamaHF builds.
    const auto = importHF(join(GOLDEN, 'hf-tied')), direct = importLlamaHF(join(GOLDEN, 'hf-tied'));
    try {
      expect(auto).toBeInstanceOf(nt.nn.Llama);
      expectSameWeights(auto as nt.nn.Llama, direct);
    } finally { auto.dispose(); direct.dispose(); }
    expect(() => importHF(join(GOLDEN, 'hf-tied'), { dropout: 0.1 })).toThrow(/holds a Llama, which has no dropout/);
    const edited = (edit: (c: Record<string, unknown>) => void, files = ['model.safetensors']) => {
      const dir = fresh();
      mkdirSync(dir);
      const c = JSON.parse(readFileSync(join(GOLDEN, 'hf-tied', 'config.json'), 'utf8'));
      edit(c);
      writeFileSync(join(dir, 'config.json'), JSON.stringify(c));
      for (const f of files) copyFileSync(join(GOLDEN, 'hf-tied', f), join(dir, f));
      return dir;
    };
    expect(() => importLlamaHF(edited((c) => { c.rope_scaling = { rope_type: 'llama3', factor: 8 }; }))).toThrow(/rope_scaling/);
    expect(() => importLlamaHF(edited((c) => { c.rope_parameters = { rope_type: 'llama3', rope_theta: 500, factor: 8 }; }))).toThrow(/rope_parameters is/);
    expect(() => importLlamaHF(edited((c) => { c.hidden_act = 'gelu'; }))).toThrow(/hidden_act/);
    expect(() => importLlamaHF(edited((c) => { c.num_key_value_heads = 3; }))).toThrow(/numKeyValueHeads \(3\) must divide/);
    expect(() => importLlamaHF(edited((c) => { c.num_hidden_layers = 3; }))).toThrow(/missing tensors: model\.layers\.2\./);
    expect(() => importLlamaHF(edited((c) => { c.tie_word_embeddings = false; }))).toThrow(/missing tensors: lm_head\.weight/);
    expect(() => importLlamaHF(edited((c) => { c.intermediate_size = 40; }))).toThrow(nt.ShapeError);
    expect(() => importLlamaHF(edited(() => {}, []))).toThrow(/no model\.safetensors/);
  });
});
