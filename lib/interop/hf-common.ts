// What the Hugging Face readers and writers of every model family share (lib/interop/hf.ts: GPT-2,
// hf-llama.ts: Llama, Mixtral, Qwen2-MoE): the dtypes a directory holds and config.json's names for
// them, the one reader of a config.json (a directory's, and the planner's `--model config.json`) and
// its names for a decoder's dimensions, import options, where each tensor of a checkpoint lives
// (model.safetensors or shards), filling a new model's parameters, and JSON files written atomically.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { type DType, parseDType } from '../dtype.js';
import { ArgumentError, DTypeError, StateError } from '../errors.js';
import { writeAll, writeFileAtomically } from '../io/files.js';
import { SafetensorsFile } from '../io/safetensors.js';
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

/**
 * config.json's names for a decoder's dimensions in every family nodetron reads, the first present
 * taken: GPT-2's (n_layer, n_head, n_embd, n_inner, n_positions, n_ctx), Llama's and Mixtral's
 * (num_hidden_layers, num_attention_heads, num_key_value_heads, hidden_size, intermediate_size,
 * max_position_embeddings, num_local_experts, num_experts_per_tok), Qwen2-MoE's (num_experts,
 * moe_intermediate_size, shared_expert_intermediate_size, decoder_sparse_step).
 */
export const HF_CONFIG_KEYS = {
  layers: ['n_layer', 'num_hidden_layers'],
  heads: ['n_head', 'num_attention_heads'],
  kvHeads: ['num_key_value_heads'],
  width: ['n_embd', 'hidden_size'],
  vocab: ['vocab_size'],
  ffn: ['intermediate_size', 'n_inner'],
  positions: ['n_positions', 'max_position_embeddings'],
  context: ['n_positions', 'max_position_embeddings', 'n_ctx'],
  experts: ['num_local_experts', 'num_experts'],
  topK: ['num_experts_per_tok'],
  expertFfn: ['moe_intermediate_size'],
  sharedExpertFfn: ['shared_expert_intermediate_size'],
  sparseStep: ['decoder_sparse_step'],
} as const satisfies Record<string, readonly string[]>;

/** A dimension of a config.json: the number under the first of its HF_CONFIG_KEYS names that holds one (undefined: none does). */
export function hfConfigNumber(config: Readonly<Record<string, unknown>>, dim: keyof typeof HF_CONFIG_KEYS): number | undefined {
  for (const k of HF_CONFIG_KEYS[dim]) if (typeof config[k] === 'number') return config[k] as number;
  return undefined;
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

