// What the Hugging Face readers and writers of every model family share (lib/interop/hf.ts: GPT-2,
// hf-llama.ts: Llama, Mixtral, Qwen2-MoE): the registry of families each family's file adds itself to
// (registerHFFamily), the dtypes a directory holds and config.json's names for them, the one reader of
// a config.json (a directory's, and the planner's `--model config.json`) and its one table of names for
// a decoder's dimensions, import options, where each tensor of a checkpoint lives (model.safetensors or
// shards), filling a new model's parameters, and JSON files written atomically.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type DType, parseDType } from '../dtype.js';
import { ArgumentError, DTypeError, StateError } from '../errors.js';
import { writeAll, writeFileAtomically } from '../io/files.js';
import { SafetensorsFile } from '../io/safetensors.js';
import { LLAMA_CONFIG_JSON_KEYS, type LlamaConfig } from '../nn/llama.js';
import type { Module, Parameter } from '../nn/module.js';

/** The dtypes a Hugging Face export can hold. */
export type HFDType = 'f32' | 'bf16' | 'f16';

/** Options of {@link importHF}. */
export interface ImportHFOptions {
  /** Device of the model (default cpu). */
  device?: string;
  /** Dtype of the model's parameters (default f32, as from_pretrained gives); the file's dtype is cast to it. */
  dtype?: DType | string;
  /** The model's dropout (default: config.json's resid_pdrop). */
  dropout?: number;
}

/** The torch_dtype config.json names for each dtype an export can hold (its keys are the HFDTypes). */
export const TORCH_DTYPE: Record<HFDType, string> = { f32: 'float32', bf16: 'bfloat16', f16: 'float16' };
/** Whether `d` is one of the dtypes a Hugging Face directory holds here. */
export const isHFDType = (d: unknown): d is HFDType => typeof d === 'string' && Object.hasOwn(TORCH_DTYPE, d);

/** The dtype an export writes: `requested`, else the model's own (`own`) when a directory can hold it, else f32. */
export function exportDType(own: DType, requested: unknown, call: string): HFDType {
  const dtype = requested ?? (isHFDType(own) ? own : 'f32');
  if (!isHFDType(dtype)) throw new ArgumentError(`${call}: dtype must be one of ${Object.keys(TORCH_DTYPE).join(', ')}, got ${JSON.stringify(dtype)}`);
  return dtype;
}

/** A Hugging Face directory whose import options and config.json passed openHFDirectory's checks. */
export interface OpenedHFDirectory {
  /** The directory. */
  dir: string;
  /** The dtype of the model to build. */
  dtype: HFDType;
  /** `dir`/config.json, for messages. */
  configPath: string;
  /** Its JSON object, its fields not yet checked. */
  config: unknown;
}

/**
 * A model family's Hugging Face reader and writer, found by config.json's model_type the way
 * transformers' Auto classes find a class (lib/interop/hf-auto.ts lists them).
 */
export interface HFFamily<M extends Module = Module, O = object> {
  /** The family, in messages. */
  name: string;
  /** The nodetron class, in messages ('nn.GPT'). */
  className: string;
  /** The model_type values of the config.json files it reads. */
  modelTypes: readonly string[];
  /** Whether `model` is one of its models (exportHF picks the writer by it). */
  owns(model: unknown): model is M;
  /** Builds the model a directory holds. */
  read(opened: OpenedHFDirectory, opts: ImportHFOptions): M;
  /** Writes the model to a directory transformers loads. */
  write(model: M, dir: string, opts: O): void;
  /**
   * What its config.json implies about the decoder beyond the dimensions HF_CONFIG_KEYS names: the
   * planner (`nodetron plan --model config.json`) reads a config of this family's model_type with it.
   */
  decoder?: HFDecoderTraits;
}

/** A family's decoder, as far as its config.json's dimensions do not say it (HFFamily.decoder). */
export interface HFDecoderTraits {
  /** A gated MLP (SwiGLU: three matrices) instead of GPT-2's two. */
  gated: boolean;
  /** Biases in every linear layer and LayerNorm (GPT-2) instead of bias-free layers. */
  bias: boolean;
  /** Whether the head is tied to the token table when config.json has no tie_word_embeddings. */
  tied: boolean;
  /** A learned position table of HF_CONFIG_KEYS.positions rows (GPT-2) instead of rotary positions. */
  learnedPositions: boolean;
}

/** The registered families, in registration order (hf-auto.ts's importHF and exportHF search them). */
const FAMILIES: HFFamily<Module, never>[] = [];

/**
 * Adds a model family's Hugging Face reader and writer to those importHF, exportHF and the planner find
 * (by config.json's model_type, by the model's class): each family's file registers its own when it
 * is loaded (GPT-2: hf.ts, the Llamas: hf-llama.ts), so a new family is added by its own file alone.
 * A model_type another family reads already is an ArgumentError; registering the same family again does nothing.
 */
export function registerHFFamily<M extends Module, O>(family: HFFamily<M, O>): void {
  const f = family as unknown as HFFamily<Module, never>;
  if (FAMILIES.includes(f)) return;
  if (f === null || typeof f !== 'object' || typeof f.name !== 'string' || !Array.isArray(f.modelTypes) || typeof f.owns !== 'function' || typeof f.read !== 'function' || typeof f.write !== 'function') {
    throw new ArgumentError('registerHFFamily: a family is { name, className, modelTypes, owns, read, write }');
  }
  for (const other of FAMILIES) {
    const taken = f.modelTypes.filter((t) => other.modelTypes.includes(t));
    if (taken.length) throw new ArgumentError(`registerHFFamily: ${f.name}'s model_type ${taken.map((t) => `'${t}'`).join(', ')} is read by ${other.name} already`);
  }
  FAMILIES.push(f);
}

/** The registered families (see registerHFFamily). */
export function hfFamilies(): readonly HFFamily<Module, never>[] {
  return FAMILIES;
}

/** The registered family that reads config.json's `modelType`, or undefined. */
export function hfFamilyOf(modelType: unknown): HFFamily<Module, never> | undefined {
  return FAMILIES.find((f) => typeof modelType === 'string' && f.modelTypes.includes(modelType));
}

/**
 * The checks every importer makes before it reads a tensor: `dir` and `opts` well formed, the model's
 * dtype one of f32, bf16, f16, and `dir`/config.json present and a JSON object. Returns the dtype, the config's
 * path (for messages) and its JSON.
 */
export function openHFDirectory(dir: unknown, opts: unknown, call: string): OpenedHFDirectory {
  if (typeof dir !== 'string' || dir === '') throw new ArgumentError(`${call}: dir must be a non-empty path`);
  if (opts === null || typeof opts !== 'object') throw new ArgumentError(`${call}: options must be an object like { dtype: 'bf16' }`);
  // Options are checked before any file is read.
  const dtype = parseDType((opts as ImportHFOptions).dtype ?? 'f32', call);
  if (!isHFDType(dtype)) throw new DTypeError(`${call}: dtype must be f32, bf16 or f16, got ${dtype}`);
  const configPath = join(dir, 'config.json');
  if (!existsSync(configPath)) throw new StateError(`${call}: ${dir} has no config.json`);
  return { dir, dtype, configPath, config: readHFConfig(configPath, call) };
}

/**
 * A config.json as a JSON object: the one reader of a Hugging Face config, whoever reads it (the
 * importers through openHFDirectory and readHFJSON, the planner's `--model config.json`). StateError
 * (naming `call`, and `what` the file is when given) when it cannot be read, is not JSON or not an object.
 */
export function readHFConfig(path: string, call: string, what?: string): Record<string, unknown> {
  const json = readHFJSON(path, call, what);
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`${call}: ${what ? `${what} ` : ''}${path} is not a JSON object`);
  return json as Record<string, unknown>;
}

/** config.json's names of a Llama config field, in the order of nn/llama.ts's table (the one list of the Llamas' names). */
const llamaKeys = (field: keyof LlamaConfig): string[] => Object.entries(LLAMA_CONFIG_JSON_KEYS).filter(([, f]) => f === field).map(([k]) => k);

/**
 * config.json's names for a decoder's dimensions in every family nodetron reads, the first present
 * taken: GPT-2's (n_layer, n_head, n_embd, n_inner, n_positions, n_ctx; transformers' GPT2Config takes
 * the Llama names as aliases of them), Llama's and Mixtral's (num_hidden_layers, num_attention_heads,
 * num_key_value_heads, hidden_size, intermediate_size, max_position_embeddings, num_local_experts,
 * num_experts_per_tok), Qwen2-MoE's (num_experts, moe_intermediate_size, shared_expert_intermediate_size,
 * decoder_sparse_step); the Llamas' names are those of nn/llama.ts's LLAMA_CONFIG_JSON_KEYS. The
 * planner reads them leniently (hfConfigNumber), GPT-2's reader strictly (hfConfigInteger).
 */
export const HF_CONFIG_KEYS = {
  layers: ['n_layer', ...llamaKeys('numHiddenLayers')],
  heads: ['n_head', ...llamaKeys('numAttentionHeads')],
  kvHeads: llamaKeys('numKeyValueHeads'),
  width: ['n_embd', ...llamaKeys('hiddenSize')],
  vocab: llamaKeys('vocabSize'),
  ffn: [...llamaKeys('intermediateSize'), 'n_inner'],
  positions: ['n_positions', ...llamaKeys('maxPositionEmbeddings')],
  context: ['n_positions', ...llamaKeys('maxPositionEmbeddings'), 'n_ctx'],
  experts: llamaKeys('numLocalExperts'),
  topK: llamaKeys('numExpertsPerTok'),
  expertFfn: llamaKeys('moeIntermediateSize'),
  sharedExpertFfn: llamaKeys('sharedExpertIntermediateSize'),
  sparseStep: llamaKeys('decoderSparseStep'),
} as const satisfies Record<string, readonly string[]>;

/** A dimension of a config.json: the number under the first of its HF_CONFIG_KEYS names that holds one (undefined: none does). */
export function hfConfigNumber(config: Readonly<Record<string, unknown>>, dim: keyof typeof HF_CONFIG_KEYS): number | undefined {
  for (const k of HF_CONFIG_KEYS[dim]) if (typeof config[k] === 'number') return config[k] as number;
  return undefined;
}

/**
 * A dimension a family's reader requires: the value under the first of its HF_CONFIG_KEYS names
 * present, a positive integer; else a StateError `${call}: ${where}: <name> must be a positive integer`
 * naming the name present (or the first one when none is).
 */
export function hfConfigInteger(config: Readonly<Record<string, unknown>>, dim: keyof typeof HF_CONFIG_KEYS, call: string, where: string): number {
  const names: readonly string[] = HF_CONFIG_KEYS[dim];
  const key = names.find((k) => config[k] !== undefined) ?? names[0]!;
  const v = config[key];
  if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) throw new StateError(`${call}: ${where}: ${key} must be a positive integer, got ${JSON.stringify(v)}`);
  return v;
}

/** Where each tensor of a checkpoint lives: model.safetensors, or the shards a model.safetensors.index.json names. */
export class HFCheckpoint {
  readonly files = new Map<string, SafetensorsFile>();
  /** Tensor name (as stored) → its file. */
  readonly where = new Map<string, SafetensorsFile>();
  /** Opens `dir`'s weights; `call` names the importer in errors. */
  constructor(readonly dir: string, readonly call = 'importHF') {
    try {
      const single = join(dir, 'model.safetensors'), index = join(dir, 'model.safetensors.index.json');
      if (existsSync(single)) {
        const f = this.#open(single);
        for (const name of f.names) this.where.set(name, f);
      } else if (existsSync(index)) {
        const json = readHFJSON(index, this.call) as { weight_map?: unknown };
        const map = json?.weight_map;
        if (map === null || typeof map !== 'object' || Object.values(map).some((v) => typeof v !== 'string' || v.includes('/') || v.includes('\\'))) {
          throw new StateError(`${this.call}: ${index} has no weight_map of tensor names to file names in ${dir}`);
        }
        for (const [name, file] of Object.entries(map as Record<string, string>)) {
          const f = this.files.get(file) ?? this.#open(join(dir, file), file);
          if (!f.header.tensors.has(name)) throw new StateError(`${this.call}: ${index} puts '${name}' in ${file}, which has no such tensor`);
          this.where.set(name, f);
        }
      } else {
        const bin = existsSync(join(dir, 'pytorch_model.bin')) ? ' (pytorch_model.bin is not read: save the model with safe_serialization=True)' : '';
        throw new StateError(`${this.call}: ${dir} has no model.safetensors or model.safetensors.index.json${bin}`);
      }
    } catch (e) {
      this.close();
      throw e;
    }
  }
  #open(path: string, key = path): SafetensorsFile {
    const f = SafetensorsFile.open(path);
    this.files.set(key, f);
    return f;
  }
  close(): void {
    for (const f of this.files.values()) f.close();
    this.files.clear();
  }
}

/** The JSON at `path`; StateError (naming `call`, and `what` the file is when given) when it cannot be read or parsed. */
export function readHFJSON(path: string, call = 'importHF', what?: string): unknown {
  const file = what ? `${what} ${path}` : path;
  let text: string;
  try { text = readFileSync(path, 'utf8'); } catch (e) { throw new StateError(`${call}: cannot read ${file}: ${(e as Error).message}`); }
  try { return JSON.parse(text); } catch (e) { throw new StateError(`${call}: ${file} is not JSON (${(e as Error).message})`); }
}

/**
 * Fills a freshly built model's parameters from a checkpoint: fill(parameter, entry) for each expected
 * entry (by its nodetron name); when one fails, the model is disposed and the error passed on.
 */
export function fillParameters<M extends Module, E extends { name: string }>(model: M, expected: readonly E[], fill: (param: Parameter, entry: E) => void): M {
  try {
    const params = new Map(model.namedParameters());
    for (const e of expected) fill(params.get(e.name)!, e);
  } catch (e) {
    model.dispose();
    throw e;
  }
  return model;
}

/** "missing tensors: …; unexpected tensors: …" for an import's error, naming what is there: null when nothing is missing or unexpected. */
export function tensorSetProblems(missing: readonly string[], unexpected: readonly string[]): string | null {
  const parts: string[] = [];
  if (missing.length > 0) parts.push(`missing tensors: ${missing.join(', ')}`);
  if (unexpected.length > 0) parts.push(`unexpected tensors: ${unexpected.join(', ')}`);
  return parts.length > 0 ? parts.join('; ') : null;
}

/**
 * Writes `value` as indented JSON (and a final newline) to `path` atomically and durably (writeFileAtomically) (config.json, a shard index). Integer values of the keys in `floatKeys` are written with a
 * decimal point (0.0, not 0): transformers 5 validates a config's float fields strictly and refuses an int.
 */
export function writeJSONAtomically(path: string, value: unknown, floatKeys: ReadonlySet<string> = new Set()): void {
  const MARK = 'nodetron-float:';
  let text = JSON.stringify(value, (k, v: unknown) => (floatKeys.has(k) && typeof v === 'number' && Number.isInteger(v) && Math.abs(v) < 1e15 ? `${MARK}${v}` : v), 2);
  if (floatKeys.size > 0) text = text.replace(new RegExp(`"${MARK}(-?\\d+)"`, 'g'), '$1.0');
  writeFileAtomically(path, (fd) => writeAll(fd, Buffer.from(text + '\n'), 0));
}

