// Hugging Face interop against a tiny GPT-2 that transformers saved (test/golden/interop/hf-tiny, from
// scripts/golden/interop.py): importHF gives its logits; exportHF writes the same tensor names, shapes,
// dtypes and bytes that save_pretrained wrote; round trips are bit-exact in every dtype; the Hub's
// naming variants, bf16 files, a tied lm_head and sharded checkpoints load; every malformed directory
// and every model GPT-2 cannot hold is refused with the tensor or setting named.
import { copyFileSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { SafetensorsFile, type SafetensorsTensor, writeSafetensors } from '../../lib/io/safetensors.js';
import { bytesOf } from '../../lib/io/tensor-bytes.js';
import { expectSameWeights, f32, golden, HF_DIR, logitsOf, relErr, scratch } from './helpers.js';

const { exportHF, importHF } = nt.interop;
const work = scratch('nt-hf-');
let n = 0;
const fresh = () => join(work, `d${n++}`);

/** Every tensor of a safetensors file: name → dtype, shape and bytes. */
function tensorsOf(path: string): Map<string, SafetensorsTensor> {
  using f = SafetensorsFile.open(path);
  return new Map(f.names.map((name) => {
    const e = f.entry(name);
    return [name, { name, dtype: e.dtype, shape: e.shape, data: f.readBytes(name) }];
  }));
}

const goldenConfig = () => JSON.parse(readFileSync(join(HF_DIR, 'config.json'), 'utf8')) as Record<string, unknown>;

/** A directory holding the golden config (edited) and these tensors. */
function variant(tensors: Iterable<SafetensorsTensor>, edit: (c: Record<string, unknown>) => void = () => {}): string {
  const dir = fresh();
  mkdirSync(dir);
  const c = goldenConfig();
  edit(c);
  writeFileSync(join(dir, 'config.json'), JSON.stringify(c));
  writeSafetensors(join(dir, 'model.safetensors'), [...tensors], { format: 'pt' });
  return dir;
}

const goldenTensors = () => tensorsOf(join(HF_DIR, 'model.safetensors'));

describe('importHF', () => {
  it('reads the transformers checkpoint: config and logits match', () => {
    const model = importHF(HF_DIR);
    expect(model.config).toEqual({ vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0.1, bias: true });
    expect(model.training).toBe(true);
    const got = logitsOf(model);
    expect(got.length).toBe(golden.batch * golden.seq * 64);
    expect(relErr(got, f32(golden.logits))).toBeLessThan(1e-4);
    model.dispose();
  });

  it('casts to the requested dtype and takes a dropout override', () => {
    using ref = importHF(HF_DIR);
    using m = importHF(HF_DIR, { dtype: 'bf16', dropout: 0 });
    expect(m.config.dropout).toBe(0);
    expect(m.wte.weight.dtype).toBe('bf16');
    expectSameWeights(m, ref, 'bf16');
  });

  it('reads the Hub naming: no transformer. prefix, mask buffers, a tied lm_head.weight', () => {
    const t = goldenTensors();
    const out: SafetensorsTensor[] = [];
    for (const [name, v] of t) out.push({ ...v, name: name.replace(/^transformer\./, '') });
    out.push({ name: 'h.0.attn.bias', dtype: 'F32', shape: [1, 1, 16, 16], data: new Float32Array(256) });
    out.push({ name: 'h.1.attn.masked_bias', dtype: 'F32', shape: [], data: Float32Array.of(-1e4) });
    out.push({ ...t.get('transformer.wte.weight')!, name: 'lm_head.weight' });
    using ref = importHF(HF_DIR);
    using m = importHF(variant(out));
    expectSameWeights(m, ref);
  });

  it('reads bf16 and f16 files (as written by exportHF) exactly', () => {
    using ref = importHF(HF_DIR);
    for (const dtype of ['bf16', 'f16'] as const) {
      const dir = fresh();
      exportHF(ref, dir, { dtype });
      const st = tensorsOf(join(dir, 'model.safetensors'));
      expect(new Set([...st.values()].map((v) => v.dtype))).toEqual(new Set([dtype.toUpperCase()]));
      expect(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')).torch_dtype).toBe(dtype === 'bf16' ? 'bfloat16' : 'float16');
      using m = importHF(dir, { dtype });
      expectSameWeights(m, ref, dtype);
      // Importing to f32 holds the same values; exporting it again in that dtype gives the same file.
      using wide = importHF(dir);
      const again = fresh();
      exportHF(wide, again, { dtype });
      expect(readFileSync(join(again, 'model.safetensors')).equals(readFileSync(join(dir, 'model.safetensors')))).toBe(true);
    }
  });

  it('reads a sharded checkpoint (model.safetensors.index.json)', () => {
    const t = [...goldenTensors().values()];
    const dir = fresh();
    mkdirSync(dir);
    copyFileSync(join(HF_DIR, 'config.json'), join(dir, 'config.json'));
    const half = Math.floor(t.length / 2);
    const shards = [t.slice(0, half), t.slice(half)];
    const weightMap: Record<string, string> = {};
    shards.forEach((s, i) => {
      const file = `model-0000${i + 1}-of-00002.safetensors`;
      writeSafetensors(join(dir, file), s, { format: 'pt' });
      for (const x of s) weightMap[x.name] = file;
    });
    writeFileSync(join(dir, 'model.safetensors.index.json'), JSON.stringify({ metadata: {}, weight_map: weightMap }));
    using ref = importHF(HF_DIR);
    using m = importHF(dir);
    expectSameWeights(m, ref);
  });

  it('refuses an lm_head.weight that is not the token table', () => {
    const t = goldenTensors();
    const head = Float32Array.from(new Float32Array(t.get('transformer.wte.weight')!.data.buffer.slice(0)));
    head[5 * 32 + 7] = head[5 * 32 + 7]! + 1;
    const dir = variant([...t.values(), { name: 'lm_head.weight', dtype: 'F32', shape: [64, 32], data: head }]);
    expect(() => importHF(dir)).toThrow(nt.ArgumentError);
    expect(() => importHF(dir)).toThrow(/lm_head\.weight' differs from 'transformer\.wte\.weight' \(row 5, column 7/);
    expect(() => importHF(variant(t.values(), (c) => { c.tie_word_embeddings = false; }))).toThrow(/tie_word_embeddings false but holds no lm_head/);
  });

  it('names missing, unexpected and misshaped tensors', () => {
    const t = goldenTensors();
    const without = [...t.values()].filter((x) => x.name !== 'transformer.h.1.mlp.c_fc.bias');
    expect(() => importHF(variant(without))).toThrow(nt.StateError);
    expect(() => importHF(variant(without))).toThrow(/missing tensors: transformer\.h\.1\.mlp\.c_fc\.bias/);
    const extra = [...t.values(), { name: 'transformer.h.2.ln_1.weight', dtype: 'F32' as const, shape: [32], data: new Float32Array(32) }];
    expect(() => importHF(variant(extra))).toThrow(/unexpected tensors: transformer\.h\.2\.ln_1\.weight/);
    // A Linear-oriented [out, in] c_fc weight where GPT-2 stores Conv1D [in, out].
    const fc = t.get('transformer.h.0.mlp.c_fc.weight')!;
    const flipped = [...t.values()].map((x) => (x === fc ? { ...x, shape: [128, 32] } : x));
    expect(() => importHF(variant(flipped))).toThrow(nt.ShapeError);
    expect(() => importHF(variant(flipped))).toThrow(/'transformer\.h\.0\.mlp\.c_fc\.weight' is \[128, 32\], expected \[32, 128\] \(Conv1D \[in, out\]\)/);
    // config.json says more positions than the file holds.
    expect(() => importHF(variant(t.values(), (c) => { c.n_positions = 32; }))).toThrow(/'transformer\.wpe\.weight' is \[16, 32\], expected \[32, 32\]/);
    // A tensor spelled twice.
    const twice = [...t.values(), { ...t.get('transformer.ln_f.bias')!, name: 'ln_f.bias' }];
    expect(() => importHF(variant(twice))).toThrow(/holds 'ln_f\.bias' twice/);
    const ints = [...t.values()].map((x) => (x.name === 'transformer.ln_f.bias' ? { ...x, dtype: 'I32' as const } : x));
    expect(() => importHF(variant(ints))).toThrow(/'transformer\.ln_f\.bias' is I32; GPT-2 weights must be F32, BF16 or F16/);
  });

  it('refuses configs nodetron cannot compute, and incomplete directories', () => {
    const t = [...goldenTensors().values()];
    const cases: Array<[(c: Record<string, unknown>) => void, RegExp]> = [
      [(c) => { c.model_type = 'bert'; }, /has model_type "bert"; nodetron reads 'gpt2' \(GPT-2\); 'llama', 'mixtral', 'qwen2_moe' \(Llama\)/],
      [(c) => { c.activation_function = 'relu'; }, /activation_function is "relu"/],
      [(c) => { c.layer_norm_epsilon = 1e-6; }, /layer_norm_epsilon is 0\.000001/],
      [(c) => { c.n_inner = 100; }, /n_inner is 100/],
      [(c) => { c.scale_attn_by_inverse_layer_idx = true; }, /scale_attn_by_inverse_layer_idx/],
      [(c) => { c.n_head = 3; }, /n_embd 32 is not divisible by n_head 3/],
      [(c) => { delete c.n_layer; }, /n_layer must be a positive integer, got undefined/],
    ];
    for (const [edit, re] of cases) {
      const dir = variant(t, edit);
      expect(() => importHF(dir)).toThrow(nt.StateError);
      expect(() => importHF(dir)).toThrow(re);
    }
    const empty = fresh();
    mkdirSync(empty);
    expect(() => importHF(empty)).toThrow(/has no config\.json/);
    copyFileSync(join(HF_DIR, 'config.json'), join(empty, 'config.json'));
    writeFileSync(join(empty, 'pytorch_model.bin'), '');
    expect(() => importHF(empty)).toThrow(/no model\.safetensors or model\.safetensors\.index\.json \(pytorch_model\.bin is not read/);
    const cut = variant(t);
    const bytes = readFileSync(join(cut, 'model.safetensors'));
    writeFileSync(join(cut, 'model.safetensors'), bytes.subarray(0, bytes.length - 4));
    expect(() => importHF(cut)).toThrow(/truncated/);
    const badJson = variant(t);
    writeFileSync(join(badJson, 'config.json'), '{"model_type": "gpt2",');
    expect(() => importHF(badJson)).toThrow(/config\.json is not JSON/);
    expect(() => importHF(HF_DIR, { dropout: 1.5 })).toThrow(nt.ArgumentError);
  });
});

describe('exportHF', () => {
  it('writes what save_pretrained wrote: names, shapes, dtypes, bytes, metadata and config', () => {
    using model = importHF(HF_DIR);
    const dir = fresh();
    exportHF(model, dir);
    expect(readdirSync(dir).sort()).toEqual(['config.json', 'model.safetensors']);
    const want = goldenTensors(), got = tensorsOf(join(dir, 'model.safetensors'));
    expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
    for (const [name, w] of want) {
      const g = got.get(name)!;
      expect([g.dtype, g.shape], name).toEqual([w.dtype, w.shape]);
      expect(Buffer.from(g.data as Uint8Array).equals(Buffer.from(w.data as Uint8Array)), name).toBe(true);
    }
    using f = SafetensorsFile.open(join(dir, 'model.safetensors'));
    expect(f.header.metadata).toEqual({ format: 'pt' });
    const config = JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>;
    const gold = goldenConfig();
    for (const k of ['model_type', 'architectures', 'n_embd', 'n_head', 'n_layer', 'n_positions', 'vocab_size', 'activation_function',
      'layer_norm_epsilon', 'tie_word_embeddings', 'n_inner', 'scale_attn_weights', 'resid_pdrop', 'embd_pdrop']) {
      expect(config[k], k).toEqual(gold[k]);
    }
    expect(config).toMatchObject({ n_ctx: 16, attn_pdrop: 0, torch_dtype: 'float32', bos_token_id: null, eos_token_id: null });
  });

  it('round-trips a trained-looking model bit for bit, any size', () => {
    const config = { vocabSize: 50, blockSize: 24, nLayer: 3, nHead: 4, nEmbd: 48, dropout: 0, bias: true };
    using model = new nt.nn.GPT(config, { seed: 7 });
    // Perturb every parameter so no LayerNorm is (1, 0) and no bias is zero.
    nt.noGrad(() => {
      for (const [i, [, p]] of model.namedParameters().entries()) {
        using noise = nt.randn(p.shape, { seed: 100 + i, std: 0.05 });
        using sum = nt.add(p, noise);
        p.backend.copy(p.storage, 0, sum.storage, 0, p.nbytes);
      }
    });
    const dir = fresh();
    exportHF(model, dir);
    const st = tensorsOf(join(dir, 'model.safetensors'));
    expect(st.get('transformer.h.2.mlp.c_proj.weight')!.shape).toEqual([192, 48]);
    // c_attn is qkv's transpose: element [in j, out i] of the file is qkv.weight[i, j].
    const qkv = model.h[1]!.attn.qkv.weight.toArraySync();
    const cAttn = new Float32Array((st.get('transformer.h.1.attn.c_attn.weight')!.data as Uint8Array).slice().buffer);
    expect(cAttn[5 * 144 + 100]).toBe(qkv[100 * 48 + 5]);
    using back = importHF(dir);
    expectSameWeights(back, model);
  });

  it('refuses models GPT-2 cannot hold, and bad options', () => {
    const base = { vocabSize: 16, blockSize: 8, nLayer: 1, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
    const cases: Array<[Partial<nt.nn.GPTConfig>, RegExp]> = [
      [{ bias: false }, /bias: false/],
      [{ parallelBlock: true }, /parallel block/],
      [{ window: 4 }, /sliding window of 4/],
    ];
    for (const [change, re] of cases) {
      using m = new nt.nn.GPT({ ...base, ...change });
      expect(() => exportHF(m, fresh())).toThrow(nt.ArgumentError);
      expect(() => exportHF(m, fresh())).toThrow(re);
      expect(() => nt.interop.writeLlmc(m, join(work, 'x.bin'))).toThrow(re);
    }
    using m = new nt.nn.GPT({ ...base, window: 8 });
    exportHF(m, fresh());
    expect(() => exportHF(m, fresh(), { dtype: 'i32' as never })).toThrow(/dtype must be one of f32, bf16, f16/);
    expect(() => exportHF({} as never, fresh())).toThrow(/model must be an nn\.GPT/);
    // A bf16 model exports as bf16 unless told otherwise.
    using half = new nt.nn.GPT(base, { dtype: 'bf16' });
    const dir = fresh();
    exportHF(half, dir);
    expect(tensorsOf(join(dir, 'model.safetensors')).get('transformer.wte.weight')!.dtype).toBe('BF16');
    expect(Buffer.from(bytesOf(half.wte.weight, 'bf16')).equals(Buffer.from(tensorsOf(join(dir, 'model.safetensors')).get('transformer.wte.weight')!.data as Uint8Array))).toBe(true);
  });
});
