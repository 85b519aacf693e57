// Hugging Face GPT-2 checkpoints (Llama's: hf-llama.ts; nt.interop's importHF and exportHF, hf-auto.ts, pick
// the family). exportHF writes a directory that transformers'
// GPT2LMHeadModel.from_pretrained loads: model.safetensors with the names save_pretrained gives
// (transformer.h.<i>.attn.c_attn.weight, ...), the Conv1D weights in GPT-2's [in, out] orientation
// (nodetron's Linear is [out, in], like torch.nn.Linear), the tied head left out as save_pretrained
// leaves it out, and config.json. importHF reads such a directory back into a nodetron GPT: one
// written by exportHF or save_pretrained, or the Hub's own gpt2 checkpoints (names without the
// `transformer.` prefix, attention-mask buffers, a separate lm_head.weight equal to the token table,
// a sharded model.safetensors.index.json), in f32, bf16 or f16.
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { dtypeSize } from '../dtype.js';
import { ArgumentError, DTypeError, ShapeError, StateError } from '../errors.js';
import { DTYPE_OF_SAFETENSORS, SAFETENSORS_DTYPE_OF, type SafetensorsTensor, writeSafetensors } from '../io/safetensors.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { exportDType, fillParameters, HFCheckpoint, hfConfigInteger, isHFDType, registerHFFamily, tensorSetProblems, TORCH_DTYPE, writeJSONAtomically, type HFDType, type HFFamily, type ImportHFOptions, type OpenedHFDirectory } from './hf-common.js';
import { fmtShape, sameShape } from '../shape.js';
import { checkGPT2, GPT2_LAYER_NORM_EPS, gpt2Params, transposeBytes } from './gpt2.js';
import { writeAtomically } from '../io/files.js';
import { bytesOf, loadBytes, valuesOf } from '../io/tensor-bytes.js';

/** Options of {@link exportHF}. */
export interface ExportHFOptions {
  /** The dtype of the saved tensors (default: the model's, f32 when it is not one of these). */
  dtype?: HFDType;
}

/** GPT-2's token ids for <|endoftext|> (bos and eos), written when the vocabulary holds it. */
const GPT2_EOT = 50256;

/** The prefix save_pretrained gives GPT2LMHeadModel's body (the Hub's original gpt2 files have none). */
const PREFIX = 'transformer.';

/** Activations that compute GELU's tanh form, nodetron's gelu (lib/ops/activation.ts). */
const TANH_GELUS = new Set(['gelu_new', 'gelu_pytorch_tanh', 'gelu_fast']);

const BLOCK_NAMES: Record<string, string> = {
  'ln1.weight': 'ln_1.weight', 'ln1.bias': 'ln_1.bias',
  'attn.qkv.weight': 'attn.c_attn.weight', 'attn.qkv.bias': 'attn.c_attn.bias',
  'attn.proj.weight': 'attn.c_proj.weight', 'attn.proj.bias': 'attn.c_proj.bias',
  'ln2.weight': 'ln_2.weight', 'ln2.bias': 'ln_2.bias',
  'mlp.fc.weight': 'mlp.c_fc.weight', 'mlp.fc.bias': 'mlp.c_fc.bias',
  'mlp.proj.weight': 'mlp.c_proj.weight', 'mlp.proj.bias': 'mlp.c_proj.bias',
};

/** GPT-2's name (without the `transformer.` prefix) of a nodetron GPT parameter. */
export function hfName(name: string): string {
  if (name === 'lnF.weight') return 'ln_f.weight';
  if (name === 'lnF.bias') return 'ln_f.bias';
  const m = /^h\.(\d+)\.(.+)$/.exec(name);
  if (m && Object.hasOwn(BLOCK_NAMES, m[2]!)) return `h.${m[1]}.${BLOCK_NAMES[m[2]!]}`;
  if (name === 'wte.weight' || name === 'wpe.weight') return name;
  throw new ArgumentError(`hfName: '${name}' is not a GPT-2 parameter`);
}

/** Whether GPT-2 stores this nodetron parameter as a Conv1D weight ([in, out], the transpose of nodetron's [out, in]). */
export function isConv1D(name: string): boolean {
  return /^h\.\d+\.(attn\.qkv|attn\.proj|mlp\.fc|mlp\.proj)\.weight$/.test(name);
}

/** The config.json of a GPT2LMHeadModel holding this GPT config, with its tensors saved as `dtype`. */
export function hfConfig(c: Readonly<GPTConfig>, dtype: HFDType = 'f32'): Record<string, unknown> {
  if (dtype !== 'f32' && dtype !== 'bf16' && dtype !== 'f16') throw new DTypeError(`hfConfig: dtype must be f32, bf16 or f16, got ${String(dtype)}`);
  if (c === null || typeof c !== 'object') throw new ArgumentError(`hfConfig: config must be a GPT config object`);
  const eot = c.vocabSize > GPT2_EOT ? GPT2_EOT : null;
  return {
    activation_function: 'gelu_new',
    architectures: ['GPT2LMHeadModel'],
    // nodetron's GPT drops after the embeddings and after each residual branch, never attention probabilities.
    attn_pdrop: 0,
    bos_token_id: eot,
    embd_pdrop: c.dropout,
    eos_token_id: eot,
    initializer_range: 0.02,
    layer_norm_epsilon: GPT2_LAYER_NORM_EPS,
    model_type: 'gpt2',
    n_ctx: c.blockSize,
    n_embd: c.nEmbd,
    n_head: c.nHead,
    n_inner: null,
    n_layer: c.nLayer,
    n_positions: c.blockSize,
    reorder_and_upcast_attn: false,
    resid_pdrop: c.dropout,
    scale_attn_by_inverse_layer_idx: false,
    scale_attn_weights: true,
    tie_word_embeddings: true,
    torch_dtype: TORCH_DTYPE[dtype],
    use_cache: true,
    vocab_size: c.vocabSize,
  };
}

/**
 * Writes `dir`/model.safetensors and `dir`/config.json (the directory is created when missing; each
 * file is written under a temporary name and renamed into place) so that
 * GPT2LMHeadModel.from_pretrained(dir) loads the model. The model must be a whole GPT-2: biases,
 * two LayerNorms per block, no sliding window, default vocabulary and linear layouts.
 */
function exportGPT2(model: GPT, dir: string, opts: ExportHFOptions): void {
  const params = checkGPT2(model, 'exportHF');
  if (typeof dir !== 'string' || dir === '') throw new ArgumentError(`exportHF: dir must be a non-empty path`);
  const dtype = exportDType(model.wte.weight.dtype, opts.dtype, 'exportHF');
  const size = dtypeSize(dtype);
  const tensors: SafetensorsTensor[] = [];
  for (const { name, shape } of gpt2Params(model.config)) {
    let data = bytesOf(params.get(name)!, dtype);
    let saved = shape;
    if (isConv1D(name)) {
      data = transposeBytes(data, shape[0]!, shape[1]!, size);
      saved = [shape[1]!, shape[0]!];
    }
    tensors.push({ name: PREFIX + hfName(name), dtype: SAFETENSORS_DTYPE_OF[dtype], shape: saved, data });
  }
  mkdirSync(dir, { recursive: true });
  writeAtomically(join(dir, 'model.safetensors'), (tmp) => writeSafetensors(tmp, tensors, { format: 'pt' }));
  writeJSONAtomically(join(dir, 'config.json'), hfConfig(model.config, dtype));
}

/** The nodetron GPT config of a GPT-2 config.json (read from `where`, for messages); StateError for anything nodetron's GPT cannot hold. */
export function configFromHF(json: unknown, where: string, dropout?: number): GPTConfig {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`importHF: ${where} is not a JSON object`);
  const j = json as Record<string, unknown>;
  if (j.model_type !== 'gpt2') throw new StateError(`importHF: ${where} has model_type ${JSON.stringify(j.model_type)}; only 'gpt2' is read`);
  // The dimensions under interop's one table of config.json names (GPT-2's first, then the aliases GPT2Config takes).
  const int = (dim: 'width' | 'heads' | 'layers' | 'positions' | 'vocab'): number => hfConfigInteger(j, dim, 'importHF', where);
  const [nEmbd, nHead, nLayer, blockSize, vocabSize] = [int('width'), int('heads'), int('layers'), int('positions'), int('vocab')];
  if (nEmbd % nHead !== 0) throw new StateError(`importHF: ${where}: n_embd ${nEmbd} is not divisible by n_head ${nHead}`);
  const refuse = (what: string) => { throw new StateError(`importHF: ${where}: ${what}, which nodetron's GPT does not compute`); };
  const act = j.activation_function ?? 'gelu_new';
  if (typeof act !== 'string' || !TANH_GELUS.has(act)) refuse(`activation_function is ${JSON.stringify(act)} (nodetron's GELU is the tanh form, gelu_new)`);
  if (j.n_inner !== undefined && j.n_inner !== null && j.n_inner !== 4 * nEmbd) refuse(`n_inner is ${JSON.stringify(j.n_inner)}, not 4 · n_embd`);
  const eps = j.layer_norm_epsilon ?? GPT2_LAYER_NORM_EPS;
  if (eps !== GPT2_LAYER_NORM_EPS) refuse(`layer_norm_epsilon is ${JSON.stringify(eps)} (nodetron's LayerNorm uses ${GPT2_LAYER_NORM_EPS})`);
  if (j.scale_attn_weights === false) refuse('scale_attn_weights is false');
  if (j.scale_attn_by_inverse_layer_idx === true) refuse('scale_attn_by_inverse_layer_idx is true');
  if (j.add_cross_attention === true) refuse('add_cross_attention is true');
  const drop = dropout ?? j.resid_pdrop ?? 0.1;
  if (typeof drop !== 'number' || !(drop >= 0 && drop < 1)) {
    if (dropout !== undefined) throw new ArgumentError(`importHF: dropout must be in [0, 1), got ${dropout}`);
    throw new StateError(`importHF: ${where}: resid_pdrop must be in [0, 1), got ${JSON.stringify(j.resid_pdrop)}`);
  }
  return { vocabSize, blockSize, nLayer, nHead, nEmbd, dropout: drop, bias: true };
}

/** Tensors of GPT-2 checkpoints that are not parameters: the causal-mask buffers older transformers saved. */
const BUFFER = /^h\.\d+\.attn\.(bias|masked_bias)$/;

/**
 * Reads a GPT-2 directory (config.json and model.safetensors, or a sharded index) into a new nodetron
 * GPT, in training mode like any new GPT (from_pretrained returns eval mode: call eval() for
 * inference). Tensors may be f32, bf16 or f16 and are cast to opts.dtype. Every missing, unexpected or
 * misshaped tensor is named: StateError for missing and unexpected ones, ShapeError for shapes; a
 * separate lm_head.weight must equal the token table (nodetron's head is tied), else ArgumentError.
 */
function importGPT2({ dir, dtype, configPath, config: json }: OpenedHFDirectory, opts: ImportHFOptions): GPT {
  const raw = json as Record<string, unknown>;
  const config = configFromHF(raw, configPath, opts.dropout);
  const ckpt = new HFCheckpoint(dir);
  try {
    // Stored name → the name without its prefix; two spellings of one tensor are refused.
    const byName = new Map<string, string>();
    const unexpected: string[] = [];
    for (const stored of ckpt.where.keys()) {
      const name = stored.startsWith(PREFIX) ? stored.slice(PREFIX.length) : stored;
      if (BUFFER.test(name)) continue;
      if (byName.has(name)) throw new StateError(`importHF: ${dir} holds '${name}' twice ('${byName.get(name)}' and '${stored}')`);
      byName.set(name, stored);
    }
    const expected = gpt2Params(config).map((p) => ({ ...p, hf: hfName(p.name) }));
    const known = new Set([...expected.map((p) => p.hf), 'lm_head.weight']);
    for (const [name, stored] of byName) if (!known.has(name)) unexpected.push(stored);
    const missing = expected.filter((p) => !byName.has(p.hf)).map((p) => PREFIX + p.hf);
    const problems = tensorSetProblems(missing, unexpected);
    if (problems) throw new StateError(`importHF: ${dir} does not hold the GPT-2 its config.json describes (n_layer ${config.nLayer}); ${problems}`);
    const entry = (name: string) => {
      const stored = byName.get(name)!;
      const e = ckpt.where.get(stored)!.entry(stored);
      const d = DTYPE_OF_SAFETENSORS[e.dtype];
      if (!isHFDType(d)) throw new StateError(`importHF: tensor '${stored}' is ${e.dtype}; GPT-2 weights must be F32, BF16 or F16`);
      return { stored, e, dtype: d };
    };
    const misshaped: string[] = [];
    for (const p of expected) {
      const { stored, e } = entry(p.hf);
      const want = isConv1D(p.name) ? [p.shape[1]!, p.shape[0]!] : p.shape;
      if (!sameShape(e.shape, want)) misshaped.push(`'${stored}' is ${fmtShape(e.shape)}, expected ${fmtShape(want)}${isConv1D(p.name) ? ' (Conv1D [in, out])' : ''}`);
    }
    if (byName.has('lm_head.weight')) {
      const { stored, e } = entry('lm_head.weight');
      if (!sameShape(e.shape, [config.vocabSize, config.nEmbd])) misshaped.push(`'${stored}' is ${fmtShape(e.shape)}, expected ${fmtShape([config.vocabSize, config.nEmbd])}`);
    }
    if (misshaped.length > 0) {
      throw new ShapeError(`importHF: ${dir}: tensors do not match config.json (n_embd ${config.nEmbd}, n_positions ${config.blockSize}, vocab_size ${config.vocabSize}): ${misshaped.join('; ')}`);
    }
    const read = (name: string) => {
      const { stored, dtype: d } = entry(name);
      return { bytes: ckpt.where.get(stored)!.readBytes(stored), dtype: d, stored };
    };
    if (byName.has('lm_head.weight') || raw.tie_word_embeddings === false) checkTied(byName.has('lm_head.weight') ? read('lm_head.weight') : null, read('wte.weight'), config, dir);
    return fillParameters(new GPT(config, { device: opts.device, dtype }), expected, (param, p) => {
      const { bytes, dtype: d } = read(p.hf);
      loadBytes(param, isConv1D(p.name) ? transposeBytes(bytes, p.shape[1]!, p.shape[0]!, dtypeSize(d)) : bytes, d);
    });
  } finally {
    ckpt.close();
  }
}

/** An untied head cannot be held by nodetron's GPT: lm_head.weight must equal the token table element for element. */
function checkTied(head: { bytes: Uint8Array; dtype: HFDType; stored: string } | null, wte: { bytes: Uint8Array; dtype: HFDType; stored: string },
  c: GPTConfig, dir: string): void {
  if (head === null) throw new ArgumentError(`importHF: ${dir}: config.json sets tie_word_embeddings false but holds no lm_head.weight; nodetron's GPT ties its head to the token table`);
  const shape = [c.vocabSize, c.nEmbd];
  const a = valuesOf(head.bytes, shape, head.dtype), b = valuesOf(wte.bytes, shape, wte.dtype);
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) {
      throw new ArgumentError(`importHF: ${dir}: '${head.stored}' differs from '${wte.stored}' (row ${Math.floor(i / c.nEmbd)}, column ${i % c.nEmbd}: ${a[i]} vs ${b[i]}); nodetron's GPT ties its LM head to the token table, so an untied model cannot be imported`);
    }
  }
}

/** GPT-2's Hugging Face reader and writer (importHF and exportHF find it by model_type 'gpt2' and nn.GPT). */
export const gpt2HF: HFFamily<GPT, ExportHFOptions> = {
  name: 'GPT-2', className: 'nn.GPT', modelTypes: ['gpt2'],
  owns: (model): model is GPT => model instanceof GPT,
  read: importGPT2,
  write: exportGPT2,
  decoder: { gated: false, bias: true, tied: true, learnedPositions: true },
};
registerHFFamily(gpt2HF);
