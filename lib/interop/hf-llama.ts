// Hugging Face LlamaForCausalLM checkpoints. exportLlamaHF writes a directory that transformers'
// LlamaForCausalLM.from_pretrained loads: config.json and model.safetensors (or shards
// model-0000i-of-0000n.safetensors with model.safetensors.index.json when maxShardBytes is given), with
// save_pretrained's names (model.layers.<i>.self_attn.q_proj.weight, ..., lm_head.weight left out when
// tied). importLlamaHF reads such a directory (exportLlamaHF's, save_pretrained's, the Hub's sharded
// ones) into a new nt.nn.Llama, in f32, bf16 or f16.
//
// Rotary layout: Hugging Face's checkpoints are in the rotate-half layout (transformers'
// convert_llama_weights_to_hf.py permutes Meta's q/k rows from interleaved pairs to halves), which is
// the layout nodetron's rope computes, so q_proj and k_proj are read and written as they are. Meta's
// original consolidated.*.pth files (interleaved pairs) are not read: convert them with transformers first.
import { mkdirSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { dtypeSize, parseDType } from '../dtype.js';
import { ArgumentError, DTypeError, ShapeError, StateError } from '../errors.js';
import { DTYPE_OF_SAFETENSORS, SAFETENSORS_DTYPE_OF, type SafetensorsTensor, writeSafetensors } from '../io/safetensors.js';
import { Llama, llamaConfig, type CheckedLlamaConfig } from '../nn/llama.js';
import { fmtShape, sameShape } from '../shape.js';
import { bytesOf, loadBytes } from '../io/tensor-bytes.js';
import { writeAtomically, writeJSONAtomically } from './gpt2.js';
import { HFCheckpoint, readHFJSON, tensorSetProblems, type HFDType, type ImportHFOptions } from './hf.js';

const TORCH_DTYPE: Record<HFDType, string> = { f32: 'float32', bf16: 'bfloat16', f16: 'float16' };
const isHFDType = (d: unknown): d is HFDType => typeof d === 'string' && Object.hasOwn(TORCH_DTYPE, d);

/** Options of {@link exportLlamaHF}. */
export interface ExportLlamaHFOptions {
  /** The dtype of the saved tensors (default: the model's, f32 when it is not one of f32, bf16, f16). */
  dtype?: HFDType;
  /** Split the weights into shards of at most this many bytes (a tensor is never split), with model.safetensors.index.json. Default: one file. */
  maxShardBytes?: number;
}

const BLOCK: Record<string, string> = {
  'inputLayernorm.weight': 'input_layernorm.weight', 'postAttentionLayernorm.weight': 'post_attention_layernorm.weight',
  'selfAttn.qProj.weight': 'self_attn.q_proj.weight', 'selfAttn.kProj.weight': 'self_attn.k_proj.weight',
  'selfAttn.vProj.weight': 'self_attn.v_proj.weight', 'selfAttn.oProj.weight': 'self_attn.o_proj.weight',
  'mlp.gateProj.weight': 'mlp.gate_proj.weight', 'mlp.upProj.weight': 'mlp.up_proj.weight', 'mlp.downProj.weight': 'mlp.down_proj.weight',
};

/** Hugging Face's LlamaForCausalLM name of a nodetron Llama parameter (`layers.0.selfAttn.qProj.weight` → `model.layers.0.self_attn.q_proj.weight`). */
export function llamaHFName(name: string): string {
  if (name === 'embedTokens.weight') return 'model.embed_tokens.weight';
  if (name === 'norm.weight') return 'model.norm.weight';
  if (name === 'lmHead.weight') return 'lm_head.weight';
  const m = /^layers\.(\d+)\.(.+)$/.exec(name);
  if (m && Object.hasOwn(BLOCK, m[2]!)) return `model.layers.${m[1]}.${BLOCK[m[2]!]}`;
  throw new ArgumentError(`llamaHFName: '${name}' is not a Llama parameter`);
}

/** The parameters (name, shape) of a whole Llama of this config, in the model's order. */
function llamaParams(c: CheckedLlamaConfig): { name: string; shape: number[] }[] {
  const C = c.hiddenSize, D = C / c.numAttentionHeads, F = c.intermediateSize;
  const out = [{ name: 'embedTokens.weight', shape: [c.vocabSize, C] }];
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = (n: string, shape: number[]) => out.push({ name: `layers.${i}.${n}`, shape });
    p('inputLayernorm.weight', [C]);
    p('selfAttn.qProj.weight', [c.numAttentionHeads * D, C]);
    p('selfAttn.kProj.weight', [c.numKeyValueHeads * D, C]);
    p('selfAttn.vProj.weight', [c.numKeyValueHeads * D, C]);
    p('selfAttn.oProj.weight', [C, c.numAttentionHeads * D]);
    p('postAttentionLayernorm.weight', [C]);
    p('mlp.gateProj.weight', [F, C]);
    p('mlp.upProj.weight', [F, C]);
    p('mlp.downProj.weight', [C, F]);
  }
  out.push({ name: 'norm.weight', shape: [C] });
  if (!c.tieWordEmbeddings) out.push({ name: 'lmHead.weight', shape: [c.vocabSize, C] });
  return out;
}

/** The config.json of a LlamaForCausalLM holding this config, its tensors saved as `dtype`. */
export function llamaHFConfig(config: CheckedLlamaConfig, dtype: HFDType = 'f32'): Record<string, unknown> {
  if (!isHFDType(dtype)) throw new DTypeError(`llamaHFConfig: dtype must be f32, bf16 or f16, got ${String(dtype)}`);
  const c = llamaConfig(config);
  return {
    architectures: ['LlamaForCausalLM'],
    attention_bias: false,
    attention_dropout: 0,
    head_dim: c.hiddenSize / c.numAttentionHeads,
    hidden_act: 'silu',
    hidden_size: c.hiddenSize,
    initializer_range: c.initializerRange,
    intermediate_size: c.intermediateSize,
    max_position_embeddings: c.maxPositionEmbeddings,
    mlp_bias: false,
    model_type: 'llama',
    num_attention_heads: c.numAttentionHeads,
    num_hidden_layers: c.numHiddenLayers,
    num_key_value_heads: c.numKeyValueHeads,
    pretraining_tp: 1,
    rms_norm_eps: c.rmsNormEps,
    // transformers 4 reads rope_theta, transformers 5 rope_parameters.
    rope_parameters: { rope_theta: c.ropeTheta, rope_type: 'default' },
    rope_scaling: null,
    rope_theta: c.ropeTheta,
    tie_word_embeddings: c.tieWordEmbeddings,
    dtype: TORCH_DTYPE[dtype],
    torch_dtype: TORCH_DTYPE[dtype],
    use_cache: true,
    vocab_size: c.vocabSize,
  };
}

/**
 * Writes `dir`/config.json and the weights (model.safetensors, or shards with
 * model.safetensors.index.json under opts.maxShardBytes) so that LlamaForCausalLM.from_pretrained(dir)
 * loads the model. The model must be whole (not a tensor-parallel slice or a pipeline stage: gather it first).
 */
export function exportLlamaHF(model: Llama, dir: string, opts: ExportLlamaHFOptions = {}): void {
  if (!(model instanceof Llama)) throw new ArgumentError('exportLlamaHF: model must be an nt.nn.Llama');
  if (typeof dir !== 'string' || dir === '') throw new ArgumentError('exportLlamaHF: dir must be a non-empty path');
  if (opts === null || typeof opts !== 'object') throw new ArgumentError('exportLlamaHF: options must be an object like { dtype: \'bf16\' }');
  const own = model.embedTokens.weight.dtype;
  const dtype = opts.dtype ?? (isHFDType(own) ? own : 'f32');
  if (!isHFDType(dtype)) throw new ArgumentError(`exportLlamaHF: dtype must be one of f32, bf16, f16, got ${JSON.stringify(dtype)}`);
  const maxShard = opts.maxShardBytes;
  if (maxShard !== undefined && (!Number.isInteger(maxShard) || maxShard <= 0)) throw new ArgumentError(`exportLlamaHF: maxShardBytes must be a positive integer, got ${maxShard}`);
  const params = new Map(model.namedParameters());
  const tensors: SafetensorsTensor[] = [];
  for (const { name, shape } of llamaParams(model.config)) {
    const p = params.get(name);
    if (!p || p.disposed || !sameShape(p.shape, shape)) {
      throw new ArgumentError(`exportLlamaHF: the model does not hold the whole ${name} ${fmtShape(shape)} (got ${p ? p.describe() : 'nothing'}); export a whole model, not a tensor-parallel slice or a pipeline stage`);
    }
    tensors.push({ name: llamaHFName(name), dtype: SAFETENSORS_DTYPE_OF[dtype], shape, data: bytesOf(p, dtype) });
  }
  mkdirSync(dir, { recursive: true });
  if (maxShard === undefined) {
    writeAtomically(join(dir, 'model.safetensors'), (tmp) => writeSafetensors(tmp, tensors, { format: 'pt' }));
  } else {
    const shards: SafetensorsTensor[][] = [[]];
    let bytes = 0;
    for (const t of tensors) {
      if (bytes > 0 && bytes + t.data.byteLength > maxShard) { shards.push([]); bytes = 0; }
      shards[shards.length - 1]!.push(t);
      bytes += t.data.byteLength;
    }
    const n = shards.length, pad = (i: number) => String(i).padStart(5, '0');
    const weightMap: Record<string, string> = {};
    shards.forEach((shard, i) => {
      const file = `model-${pad(i + 1)}-of-${pad(n)}.safetensors`;
      writeAtomically(join(dir, file), (tmp) => writeSafetensors(tmp, shard, { format: 'pt' }));
      for (const t of shard) weightMap[t.name] = file;
    });
    const total = tensors.reduce((s, t) => s + t.data.byteLength, 0);
    writeJSONAtomically(join(dir, 'model.safetensors.index.json'), { metadata: { total_size: total }, weight_map: weightMap });
  }
  writeJSONAtomically(join(dir, 'config.json'), llamaHFConfig(model.config, dtype));
}

/** The Llama config of a LlamaForCausalLM config.json (read from `where`, for messages); StateError for what nt.nn.Llama does not compute. */
export function llamaConfigFromHF(json: unknown, where: string): CheckedLlamaConfig {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`importLlamaHF: ${where} is not a JSON object`);
  const j = json as Record<string, unknown>;
  if (j.model_type !== 'llama') throw new StateError(`importLlamaHF: ${where} has model_type ${JSON.stringify(j.model_type)}; only 'llama' is read (a checkpoint of another family)`);
  const refuse = (what: string) => { throw new StateError(`importLlamaHF: ${where}: ${what}, which nt.nn.Llama does not compute`); };
  if ((j.hidden_act ?? 'silu') !== 'silu') refuse(`hidden_act is ${JSON.stringify(j.hidden_act)} (Llama's MLP is SwiGLU with silu)`);
  if (j.attention_bias === true) refuse('attention_bias is true');
  if (j.mlp_bias === true) refuse('mlp_bias is true');
  if (j.rope_scaling !== undefined && j.rope_scaling !== null) refuse(`rope_scaling is ${JSON.stringify(j.rope_scaling)} (plain rotary embeddings only)`);
  // transformers 5 writes rope_parameters { rope_type, rope_theta } in place of rope_theta.
  const rp = j.rope_parameters;
  let fields: Record<string, unknown> = j;
  if (rp !== undefined && rp !== null) {
    if (typeof rp !== 'object' || Array.isArray(rp)) throw new StateError(`importLlamaHF: ${where}: rope_parameters must be an object, got ${JSON.stringify(rp)}`);
    const { rope_type: type = 'default', rope_theta: theta, ...rest } = rp as Record<string, unknown>;
    if (type !== 'default' || Object.keys(rest).length > 0) refuse(`rope_parameters is ${JSON.stringify(rp)} (plain rotary embeddings only)`);
    if (theta !== undefined && j.rope_theta !== undefined && theta !== j.rope_theta) throw new StateError(`importLlamaHF: ${where}: rope_theta ${String(j.rope_theta)} and rope_parameters.rope_theta ${String(theta)} differ`);
    if (theta !== undefined) fields = { ...j, rope_theta: theta };
  }
  let config: CheckedLlamaConfig;
  try { config = llamaConfig(fields); } catch (e) {
    if (e instanceof ArgumentError) throw new StateError(`importLlamaHF: ${where}: ${e.message}`);
    throw e;
  }
  if (j.head_dim !== undefined && j.head_dim !== null && j.head_dim !== config.hiddenSize / config.numAttentionHeads) {
    refuse(`head_dim is ${JSON.stringify(j.head_dim)}, not hidden_size / num_attention_heads = ${config.hiddenSize / config.numAttentionHeads}`);
  }
  return config;
}

/**
 * Reads a LlamaForCausalLM directory (config.json and model.safetensors, or a sharded index) into a
 * new nt.nn.Llama (training mode). Tensors may be f32, bf16 or f16 and are cast to opts.dtype. Missing
 * and unexpected tensors are named (StateError), wrong shapes too (ShapeError); a config.json of
 * another model family is a StateError. Rotary buffers (rotary_emb.inv_freq) that older exports hold are skipped.
 */
export function importLlamaHF(dir: string, opts: Omit<ImportHFOptions, 'dropout'> = {}): Llama {
  if (typeof dir !== 'string' || dir === '') throw new ArgumentError('importLlamaHF: dir must be a non-empty path');
  if (opts === null || typeof opts !== 'object') throw new ArgumentError('importLlamaHF: options must be an object like { dtype: \'bf16\' }');
  const dtype = parseDType(opts.dtype ?? 'f32', 'importLlamaHF');
  if (!isHFDType(dtype)) throw new DTypeError(`importLlamaHF: dtype must be f32, bf16 or f16, got ${dtype}`);
  const configPath = join(dir, 'config.json');
  if (!existsSync(configPath)) throw new StateError(`importLlamaHF: ${dir} has no config.json`);
  const config = llamaConfigFromHF(readHFJSON(configPath, 'importLlamaHF'), configPath);
  const ckpt = new HFCheckpoint(dir, 'importLlamaHF');
  try {
    const expected = llamaParams(config).map((p) => ({ ...p, hf: llamaHFName(p.name) }));
    const known = new Set(expected.map((p) => p.hf));
    // A tied model saved with its (equal) head anyway: the head is ignored, as from_pretrained ties it.
    if (config.tieWordEmbeddings) known.add('lm_head.weight');
    const unexpected = [...ckpt.where.keys()].filter((n) => !known.has(n) && !/rotary_emb\.inv_freq$/.test(n));
    const missing = expected.filter((p) => !ckpt.where.has(p.hf)).map((p) => p.hf);
    const problems = tensorSetProblems(missing, unexpected);
    if (problems) throw new StateError(`importLlamaHF: ${dir} does not hold the Llama its config.json describes (num_hidden_layers ${config.numHiddenLayers}, tie_word_embeddings ${config.tieWordEmbeddings}); ${problems}`);
    const misshaped: string[] = [];
    for (const p of expected) {
      const e = ckpt.where.get(p.hf)!.entry(p.hf);
      if (!sameShape(e.shape, p.shape)) misshaped.push(`'${p.hf}' is ${fmtShape(e.shape)}, expected ${fmtShape(p.shape)}`);
      const d = DTYPE_OF_SAFETENSORS[e.dtype];
      if (!isHFDType(d)) throw new StateError(`importLlamaHF: tensor '${p.hf}' is ${e.dtype}; Llama weights must be F32, BF16 or F16`);
    }
    if (misshaped.length > 0) throw new ShapeError(`importLlamaHF: ${dir}: tensors do not match config.json: ${misshaped.join('; ')}`);
    const model = new Llama(config, { device: opts.device, dtype });
    try {
      const params = new Map(model.namedParameters());
      for (const p of expected) {
        const f = ckpt.where.get(p.hf)!;
        const d = DTYPE_OF_SAFETENSORS[f.entry(p.hf).dtype] as HFDType;
        const bytes = f.readBytes(p.hf);
        if (bytes.byteLength !== dtypeSize(d) * p.shape.reduce((a, b) => a * b, 1)) throw new StateError(`importLlamaHF: '${p.hf}' holds ${bytes.byteLength} bytes`);
        loadBytes(params.get(p.name)!, bytes, d);
      }
    } catch (e) {
      model.dispose();
      throw e;
    }
    return model;
  } finally {
    ckpt.close();
  }
}
