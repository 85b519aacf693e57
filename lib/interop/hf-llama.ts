// Hugging Face LlamaForCausalLM checkpoints. exportLlamaHF writes a directory that transformers'
// LlamaForCausalLM.from_pretrained loads: config.json and model.safetensors (or shards
// model-0000i-of-0000n.safetensors with model.safetensors.index.json when maxShardBytes is given), with
// save_pretrained's names (model.layers.<i>.self_attn.q_proj.weight, ..., lm_head.weight left out when
// tied). importLlamaHF reads such a directory (exportLlamaHF's, save_pretrained's, the Hub's sharded
// ones) into a new nt.nn.Llama, in f32, bf16 or f16.
//
// The mixture-of-experts Llamas go the same way: a Llama with numLocalExperts > 0 is written as
// MixtralForCausalLM (every block MoE, no shared expert: model.layers.<i>.block_sparse_moe.gate.weight,
// .experts.<e>.w1/w2/w3.weight for gate/down/up) or Qwen2MoeForCausalLM (q/k/v biases, dense blocks by
// decoder_sparse_step and mlp_only_layers, the sigmoid-gated shared expert: mlp.gate.weight,
// mlp.experts.<e>.gate_proj/up_proj/down_proj.weight, mlp.shared_expert.*, mlp.shared_expert_gate.weight),
// the per-expert names save_pretrained writes (transformers 5 fuses the experts in memory and splits
// them again on save); importLlamaHF reads model_type llama, mixtral and qwen2_moe.
//
// Rotary layout: Hugging Face's checkpoints are in the rotate-half layout (transformers'
// convert_llama_weights_to_hf.py permutes Meta's q/k rows from interleaved pairs to halves), which is
// the layout nodetron's rope computes, so q_proj and k_proj are read and written as they are. Meta's
// original consolidated.*.pth files (interleaved pairs) are not read: convert them with transformers first.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { dtypeSize } from '../dtype.js';
import { ArgumentError, DTypeError, ShapeError, StateError } from '../errors.js';
import { DTYPE_OF_SAFETENSORS, SAFETENSORS_DTYPE_OF, type SafetensorsTensor, writeSafetensors } from '../io/safetensors.js';
import { isLlamaMoEBlock, Llama, llamaConfig, type CheckedLlamaConfig } from '../nn/llama.js';
import { fmtShape, sameShape } from '../shape.js';
import { bytesOf, loadBytes } from '../io/tensor-bytes.js';
import { writeAtomically } from '../io/files.js';
import { exportDType, fillParameters, HFCheckpoint, isHFDType, openHFDirectory, registerHFFamily, tensorSetProblems, TORCH_DTYPE, writeJSONAtomically, type HFDType, type HFFamily, type ImportHFOptions, type OpenedHFDirectory } from './hf-common.js';

/** Options of {@link exportLlamaHF}. */
export interface ExportLlamaHFOptions {
  /** The dtype of the saved tensors (default: the model's, f32 when it is not one of f32, bf16, f16). */
  dtype?: HFDType;
  /** Split the weights into shards of at most this many bytes (a tensor is never split), with model.safetensors.index.json. Default: one file. */
  maxShardBytes?: number;
  /** The Hugging Face class to write (default: LlamaForCausalLM without experts, MixtralForCausalLM when it holds the model, else Qwen2MoeForCausalLM); one that cannot hold the model is an ArgumentError. */
  architecture?: LlamaHFArchitecture;
}

const BLOCK: Record<string, string> = {
  'inputLayernorm.weight': 'input_layernorm.weight', 'postAttentionLayernorm.weight': 'post_attention_layernorm.weight',
  'selfAttn.qProj.weight': 'self_attn.q_proj.weight', 'selfAttn.kProj.weight': 'self_attn.k_proj.weight',
  'selfAttn.vProj.weight': 'self_attn.v_proj.weight', 'selfAttn.oProj.weight': 'self_attn.o_proj.weight',
  'selfAttn.qProj.bias': 'self_attn.q_proj.bias', 'selfAttn.kProj.bias': 'self_attn.k_proj.bias', 'selfAttn.vProj.bias': 'self_attn.v_proj.bias',
  'mlp.gateProj.weight': 'mlp.gate_proj.weight', 'mlp.upProj.weight': 'mlp.up_proj.weight', 'mlp.downProj.weight': 'mlp.down_proj.weight',
};

/** The Hugging Face classes a nodetron Llama is written as: a dense Llama, Mixtral (every block MoE), Qwen2-MoE (a gated shared expert). */
export type LlamaHFArchitecture = 'LlamaForCausalLM' | 'MixtralForCausalLM' | 'Qwen2MoeForCausalLM';
const MODEL_TYPE: Record<LlamaHFArchitecture, string> = { LlamaForCausalLM: 'llama', MixtralForCausalLM: 'mixtral', Qwen2MoeForCausalLM: 'qwen2_moe' };
const ARCH_OF_TYPE: Record<string, LlamaHFArchitecture> = { llama: 'LlamaForCausalLM', mixtral: 'MixtralForCausalLM', qwen2_moe: 'Qwen2MoeForCausalLM' };
/** config.json's float fields (transformers 5 refuses an integer in them: written 0.0, not 0). */
const FLOAT_KEYS = new Set(['initializer_range', 'rms_norm_eps', 'rope_theta', 'attention_dropout', 'router_aux_loss_coef', 'router_jitter_noise']);
const isArch = (a: unknown): a is LlamaHFArchitecture => typeof a === 'string' && Object.hasOwn(MODEL_TYPE, a);

/** What `arch` cannot hold of this config (empty when it holds it all). */
function architectureProblems(c: CheckedLlamaConfig, arch: LlamaHFArchitecture): string[] {
  const p: string[] = [];
  if (arch === 'LlamaForCausalLM') {
    if (c.numLocalExperts > 0) p.push(`it has ${c.numLocalExperts} experts (numLocalExperts)`);
    if (c.qkvBias) p.push('its q/k/v projections have biases (qkvBias)');
  } else if (arch === 'MixtralForCausalLM') {
    if (c.numLocalExperts === 0) p.push('it has no experts (numLocalExperts 0)');
    if (c.sharedExpertIntermediateSize > 0) p.push('it has a shared expert');
    if (c.qkvBias) p.push('its q/k/v projections have biases (qkvBias)');
    if (c.decoderSparseStep !== 1 || c.mlpOnlyLayers.length > 0) p.push('some blocks are dense (decoderSparseStep, mlpOnlyLayers): Mixtral\'s are all MoE');
    if (!c.normTopkProb) p.push('normTopkProb is false (Mixtral renormalizes the top-k weights)');
  } else {
    if (c.numLocalExperts === 0) p.push('it has no experts (numLocalExperts 0)');
    if (c.sharedExpertIntermediateSize === 0) p.push('it has no shared expert (sharedExpertIntermediateSize 0; Qwen2-MoE\'s blocks hold one)');
  }
  return p;
}

/** The Hugging Face class a Llama of this config is exported as (LlamaForCausalLM without experts, MixtralForCausalLM when Mixtral holds it, else Qwen2MoeForCausalLM). */
export function llamaHFArchitecture(config: CheckedLlamaConfig): LlamaHFArchitecture {
  const c = llamaConfig(config);
  for (const arch of ['LlamaForCausalLM', 'MixtralForCausalLM', 'Qwen2MoeForCausalLM'] as const) if (architectureProblems(c, arch).length === 0) return arch;
  throw new ArgumentError(`llamaHFArchitecture: no Hugging Face class holds this Llama: ${['LlamaForCausalLM', 'MixtralForCausalLM', 'Qwen2MoeForCausalLM'].map((a) => `${a}: ${architectureProblems(c, a as LlamaHFArchitecture).join(', ')}`).join('; ')}`);
}

/**
 * Hugging Face's name of a nodetron Llama parameter in a LlamaForCausalLM (`layers.0.selfAttn.qProj.weight`
 * → `model.layers.0.self_attn.q_proj.weight`), MixtralForCausalLM (`layers.0.mlp.experts.3.gate` →
 * `model.layers.0.block_sparse_moe.experts.3.w1.weight`, the router → `block_sparse_moe.gate.weight`) or
 * Qwen2MoeForCausalLM (`mlp.experts.3.gate_proj.weight`, `mlp.shared_expert.*`, `mlp.shared_expert_gate.weight`).
 */
export function llamaHFName(name: string, architecture: LlamaHFArchitecture = 'LlamaForCausalLM'): string {
  if (!isArch(architecture)) throw new ArgumentError(`llamaHFName: architecture must be one of ${Object.keys(MODEL_TYPE).join(', ')}, got ${String(architecture)}`);
  if (name === 'embedTokens.weight') return 'model.embed_tokens.weight';
  if (name === 'norm.weight') return 'model.norm.weight';
  if (name === 'lmHead.weight') return 'lm_head.weight';
  const m = /^layers\.(\d+)\.(.+)$/.exec(name);
  if (m) {
    const at = `model.layers.${m[1]}.`, rest = m[2]!;
    if (Object.hasOwn(BLOCK, rest)) return at + BLOCK[rest];
    const mixtral = architecture === 'MixtralForCausalLM', qwen = architecture === 'Qwen2MoeForCausalLM';
    if (rest === 'mlp.router' && (mixtral || qwen)) return `${at}${mixtral ? 'block_sparse_moe' : 'mlp'}.gate.weight`;
    const e = /^mlp\.experts\.(\d+)\.(gate|up|down)$/.exec(rest);
    if (e && mixtral) return `${at}block_sparse_moe.experts.${e[1]}.${{ gate: 'w1', down: 'w2', up: 'w3' }[e[2] as 'gate' | 'up' | 'down']}.weight`;
    if (e && qwen) return `${at}mlp.experts.${e[1]}.${e[2]}_proj.weight`;
    const sh = /^mlp\.shared\.(gate|up|down)$/.exec(rest);
    if (sh && qwen) return `${at}mlp.shared_expert.${sh[1]}_proj.weight`;
    if (rest === 'mlp.sharedGate' && qwen) return `${at}mlp.shared_expert_gate.weight`;
  }
  throw new ArgumentError(`llamaHFName: '${name}' is not a parameter of a ${architecture}`);
}

/** The parameters (name, shape) of a whole Llama of this config. */
function llamaParams(c: CheckedLlamaConfig): { name: string; shape: number[] }[] {
  const C = c.hiddenSize, D = C / c.numAttentionHeads, F = c.intermediateSize, M = c.moeIntermediateSize, S = c.sharedExpertIntermediateSize;
  const out = [{ name: 'embedTokens.weight', shape: [c.vocabSize, C] }];
  for (let i = 0; i < c.numHiddenLayers; i++) {
    const p = (n: string, shape: number[]) => out.push({ name: `layers.${i}.${n}`, shape });
    p('inputLayernorm.weight', [C]);
    p('selfAttn.qProj.weight', [c.numAttentionHeads * D, C]);
    p('selfAttn.kProj.weight', [c.numKeyValueHeads * D, C]);
    p('selfAttn.vProj.weight', [c.numKeyValueHeads * D, C]);
    if (c.qkvBias) {
      p('selfAttn.qProj.bias', [c.numAttentionHeads * D]);
      p('selfAttn.kProj.bias', [c.numKeyValueHeads * D]);
      p('selfAttn.vProj.bias', [c.numKeyValueHeads * D]);
    }
    p('selfAttn.oProj.weight', [C, c.numAttentionHeads * D]);
    p('postAttentionLayernorm.weight', [C]);
    if (isLlamaMoEBlock(c, i)) {
      p('mlp.router', [c.numLocalExperts, C]);
      for (let e = 0; e < c.numLocalExperts; e++) {
        p(`mlp.experts.${e}.gate`, [M, C]);
        p(`mlp.experts.${e}.up`, [M, C]);
        p(`mlp.experts.${e}.down`, [C, M]);
      }
      if (S > 0) {
        p('mlp.shared.gate', [S, C]);
        p('mlp.shared.up', [S, C]);
        p('mlp.shared.down', [C, S]);
        p('mlp.sharedGate', [1, C]);
      }
    } else {
      p('mlp.gateProj.weight', [F, C]);
      p('mlp.upProj.weight', [F, C]);
      p('mlp.downProj.weight', [C, F]);
    }
  }
  out.push({ name: 'norm.weight', shape: [C] });
  if (!c.tieWordEmbeddings) out.push({ name: 'lmHead.weight', shape: [c.vocabSize, C] });
  return out;
}

/**
 * The config.json of a LlamaForCausalLM, MixtralForCausalLM or Qwen2MoeForCausalLM holding this config
 * (default: {@link llamaHFArchitecture}'s choice), its tensors saved as `dtype`.
 */
export function llamaHFConfig(config: CheckedLlamaConfig, dtype: HFDType = 'f32', architecture?: LlamaHFArchitecture): Record<string, unknown> {
  if (!isHFDType(dtype)) throw new DTypeError(`llamaHFConfig: dtype must be f32, bf16 or f16, got ${String(dtype)}`);
  const c = llamaConfig(config);
  const arch = architecture ?? llamaHFArchitecture(c);
  if (!isArch(arch)) throw new ArgumentError(`llamaHFConfig: architecture must be one of ${Object.keys(MODEL_TYPE).join(', ')}, got ${String(arch)}`);
  const problems = architectureProblems(c, arch);
  if (problems.length > 0) throw new ArgumentError(`llamaHFConfig: a ${arch} cannot hold this Llama: ${problems.join('; ')}`);
  const common = {
    architectures: [arch],
    attention_dropout: 0,
    head_dim: c.hiddenSize / c.numAttentionHeads,
    hidden_act: 'silu',
    hidden_size: c.hiddenSize,
    initializer_range: c.initializerRange,
    max_position_embeddings: c.maxPositionEmbeddings,
    model_type: MODEL_TYPE[arch],
    num_attention_heads: c.numAttentionHeads,
    num_hidden_layers: c.numHiddenLayers,
    num_key_value_heads: c.numKeyValueHeads,
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
  if (arch === 'LlamaForCausalLM') return { ...common, attention_bias: false, intermediate_size: c.intermediateSize, mlp_bias: false, pretraining_tp: 1 };
  const moe = { num_experts_per_tok: c.numExpertsPerTok, router_aux_loss_coef: c.routerAuxLossCoef, output_router_logits: false };
  if (arch === 'MixtralForCausalLM') {
    // Mixtral's intermediate_size is its experts' width (every block is MoE).
    return { ...common, ...moe, intermediate_size: c.moeIntermediateSize, num_local_experts: c.numLocalExperts, router_jitter_noise: 0, sliding_window: null };
  }
  return {
    ...common, ...moe, intermediate_size: c.intermediateSize, moe_intermediate_size: c.moeIntermediateSize, shared_expert_intermediate_size: c.sharedExpertIntermediateSize,
    num_experts: c.numLocalExperts, decoder_sparse_step: c.decoderSparseStep, mlp_only_layers: c.mlpOnlyLayers, norm_topk_prob: c.normTopkProb, qkv_bias: c.qkvBias,
    use_sliding_window: false, sliding_window: null, max_window_layers: c.numHiddenLayers,
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
  const dtype = exportDType(model.embedTokens.weight.dtype, opts.dtype, 'exportLlamaHF');
  const maxShard = opts.maxShardBytes;
  if (maxShard !== undefined && (!Number.isInteger(maxShard) || maxShard <= 0)) throw new ArgumentError(`exportLlamaHF: maxShardBytes must be a positive integer, got ${maxShard}`);
  const arch = opts.architecture ?? llamaHFArchitecture(model.config);
  const problems = isArch(arch) ? architectureProblems(model.config, arch) : [`architecture must be one of ${Object.keys(MODEL_TYPE).join(', ')}, got ${JSON.stringify(arch)}`];
  if (problems.length > 0) throw new ArgumentError(`exportLlamaHF: a ${String(arch)} cannot hold this model: ${problems.join('; ')}`);
  const params = new Map(model.namedParameters());
  const tensors: SafetensorsTensor[] = [];
  for (const { name, shape } of llamaParams(model.config)) {
    const p = params.get(name);
    if (!p || p.disposed || !sameShape(p.shape, shape)) {
      throw new ArgumentError(`exportLlamaHF: the model does not hold the whole ${name} ${fmtShape(shape)} (got ${p ? p.describe() : 'nothing'}); export a whole model, not a tensor-parallel slice, an expert-parallel shard or a pipeline stage`);
    }
    tensors.push({ name: llamaHFName(name, arch), dtype: SAFETENSORS_DTYPE_OF[dtype], shape, data: bytesOf(p, dtype) });
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
  writeJSONAtomically(join(dir, 'config.json'), llamaHFConfig(model.config, dtype, arch), FLOAT_KEYS);
}

/** The Llama config of a LlamaForCausalLM, MixtralForCausalLM or Qwen2MoeForCausalLM config.json (read from `where`, for messages); StateError for what nt.nn.Llama does not compute. */
export function llamaConfigFromHF(json: unknown, where: string): CheckedLlamaConfig {
  return llamaFromHF(json, where).config;
}

function llamaFromHF(json: unknown, where: string): { config: CheckedLlamaConfig; arch: LlamaHFArchitecture } {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`importLlamaHF: ${where} is not a JSON object`);
  let j = json as Record<string, unknown>;
  const type = j.model_type;
  if (typeof type !== 'string' || !Object.hasOwn(ARCH_OF_TYPE, type)) {
    throw new StateError(`importLlamaHF: ${where} has model_type ${JSON.stringify(type)}; only 'llama', 'mixtral' and 'qwen2_moe' are read (a checkpoint of another family)`);
  }
  const arch = ARCH_OF_TYPE[type]!;
  const refuse = (what: string) => { throw new StateError(`importLlamaHF: ${where}: ${what}, which nt.nn.Llama does not compute`); };
  if ((j.hidden_act ?? 'silu') !== 'silu') refuse(`hidden_act is ${JSON.stringify(j.hidden_act)} (Llama's MLP is SwiGLU with silu)`);
  if (j.attention_bias === true) refuse('attention_bias is true');
  if (j.mlp_bias === true) refuse('mlp_bias is true');
  const nothing = (v: unknown) => v === undefined || v === null;
  if (arch === 'LlamaForCausalLM') {
    // Keys of the MoE families mean nothing in a Llama's config.json.
    const { num_local_experts: _a, num_experts: _b, qkv_bias: _c, shared_expert_intermediate_size: _d, moe_intermediate_size: _e, ...rest } = j;
    j = rest;
  } else if (arch === 'MixtralForCausalLM') {
    if (!nothing(j.sliding_window) && !(typeof j.sliding_window === 'number' && j.sliding_window >= (j.max_position_embeddings as number))) refuse(`sliding_window is ${JSON.stringify(j.sliding_window)} (full causal attention only)`);
    if (!(Number.isInteger(j.num_local_experts) && (j.num_local_experts as number) > 0)) throw new StateError(`importLlamaHF: ${where}: num_local_experts must be a positive integer, got ${JSON.stringify(j.num_local_experts)}`);
    // Mixtral: every block is MoE, experts of intermediate_size, the top-k weights renormalized, no shared expert, no q/k/v biases.
    const { num_experts: _a, shared_expert_intermediate_size: _b, decoder_sparse_step: _c, mlp_only_layers: _d, norm_topk_prob: _e, qkv_bias: _f, ...rest } = j;
    j = { ...rest, moe_intermediate_size: j.intermediate_size, norm_topk_prob: true };
  } else {
    if (j.use_sliding_window === true) refuse('use_sliding_window is true (full causal attention only)');
    if (!(Number.isInteger(j.num_experts) && (j.num_experts as number) > 0)) throw new StateError(`importLlamaHF: ${where}: num_experts must be a positive integer, got ${JSON.stringify(j.num_experts)}`);
    if (!(Number.isInteger(j.shared_expert_intermediate_size) && (j.shared_expert_intermediate_size as number) > 0)) {
      refuse(`shared_expert_intermediate_size is ${JSON.stringify(j.shared_expert_intermediate_size)} (Qwen2-MoE's blocks hold a shared expert)`);
    }
    // transformers' defaults: q/k/v biases (transformers 4 always has them), the top-k weights kept as they are.
    const { num_local_experts: _a, ...rest } = j;
    j = { ...rest, qkv_bias: j.qkv_bias ?? true, norm_topk_prob: j.norm_topk_prob ?? false };
  }
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
  return { config, arch };
}

/**
 * Reads a LlamaForCausalLM directory (config.json and model.safetensors, or a sharded index) into a
 * new nt.nn.Llama (training mode). Tensors may be f32, bf16 or f16 and are cast to opts.dtype. Missing
 * and unexpected tensors are named (StateError), wrong shapes too (ShapeError); a config.json of
 * another model family is a StateError. Rotary buffers (rotary_emb.inv_freq) that older exports hold are skipped.
 */
export function importLlamaHF(dir: string, opts: Omit<ImportHFOptions, 'dropout'> = {}): Llama {
  return readLlama(openHFDirectory(dir, opts, 'importLlamaHF'), opts);
}

function readLlama({ dir, dtype, configPath, config: json }: OpenedHFDirectory, opts: ImportHFOptions): Llama {
  if (opts.dropout !== undefined) throw new ArgumentError(`importHF: ${dir} holds a Llama, which has no dropout; leave out the dropout option`);
  const { config, arch } = llamaFromHF(json, configPath);
  const ckpt = new HFCheckpoint(dir, 'importLlamaHF');
  try {
    const expected = llamaParams(config).map((p) => ({ ...p, hf: llamaHFName(p.name, arch) }));
    const known = new Set(expected.map((p) => p.hf));
    // A tied model saved with its (equal) head anyway: the head is ignored, as from_pretrained ties it.
    if (config.tieWordEmbeddings) known.add('lm_head.weight');
    const unexpected = [...ckpt.where.keys()].filter((n) => !known.has(n) && !/rotary_emb\.inv_freq$/.test(n));
    const missing = expected.filter((p) => !ckpt.where.has(p.hf)).map((p) => p.hf);
    const problems = tensorSetProblems(missing, unexpected);
    if (problems) throw new StateError(`importLlamaHF: ${dir} does not hold the ${arch} its config.json describes (num_hidden_layers ${config.numHiddenLayers}, tie_word_embeddings ${config.tieWordEmbeddings}${config.numLocalExperts > 0 ? `, ${config.numLocalExperts} experts` : ''}); ${problems}`);
    const misshaped: string[] = [];
    for (const p of expected) {
      const e = ckpt.where.get(p.hf)!.entry(p.hf);
      if (!sameShape(e.shape, p.shape)) misshaped.push(`'${p.hf}' is ${fmtShape(e.shape)}, expected ${fmtShape(p.shape)}`);
      const d = DTYPE_OF_SAFETENSORS[e.dtype];
      if (!isHFDType(d)) throw new StateError(`importLlamaHF: tensor '${p.hf}' is ${e.dtype}; the weights must be F32, BF16 or F16`);
    }
    if (misshaped.length > 0) throw new ShapeError(`importLlamaHF: ${dir}: tensors do not match config.json: ${misshaped.join('; ')}`);
    return fillParameters(new Llama(config, { device: opts.device, dtype }), expected, (param, p) => {
      const f = ckpt.where.get(p.hf)!;
      const d = DTYPE_OF_SAFETENSORS[f.entry(p.hf).dtype] as HFDType;
      const bytes = f.readBytes(p.hf);
      if (bytes.byteLength !== dtypeSize(d) * p.shape.reduce((a, b) => a * b, 1)) throw new StateError(`importLlamaHF: '${p.hf}' holds ${bytes.byteLength} bytes`);
      loadBytes(param, bytes, d);
    });
  } finally {
    ckpt.close();
  }
}

/** The Llama family's Hugging Face reader and writer (importHF and exportHF find it by model_type llama, mixtral or qwen2_moe and nn.Llama). */
export const llamaHF: HFFamily<Llama, ExportLlamaHFOptions> = {
  name: 'Llama', className: 'nn.Llama', modelTypes: Object.keys(ARCH_OF_TYPE),
  owns: (model): model is Llama => model instanceof Llama,
  read: readLlama,
  write: exportLlamaHF,
  decoder: { gated: true, bias: false, tied: false, learnedPositions: false },
};
registerHFFamily(llamaHF);
