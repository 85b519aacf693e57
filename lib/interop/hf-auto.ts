// nt.interop's importHF and exportHF: the model family of a Hugging Face directory found by its
// config.json's model_type (as transformers' AutoModelForCausalLM finds a class), and that of a model
// by its class. A family is one HFFamily (lib/interop/hf-common.ts) that its own file registers
// (registerHFFamily) when it is loaded: GPT-2 (hf.ts) and the Llamas (hf-llama.ts: Llama, Mixtral,
// Qwen2-MoE), loaded here; a new family's file registers itself and nothing here changes.
import { ArgumentError, StateError } from '../errors.js';
import type { CausalLM } from '../nn/causal-lm.js';
import { hfFamilies, hfFamilyOf, openHFDirectory, type ImportHFOptions } from './hf-common.js';
// The built-in families register themselves when their files load.
import './hf.js';
import './hf-llama.js';
import type { ExportHFOptions } from './hf.js';
import type { ExportLlamaHFOptions } from './hf-llama.js';

export { hfFamilyOf } from './hf-common.js';

/**
 * Reads a Hugging Face directory (config.json and model.safetensors, or a sharded index) into a new
 * nodetron model of the family its config.json's model_type names: an nn.GPT for 'gpt2', an nn.Llama
 * for 'llama', 'mixtral' and 'qwen2_moe' (and a registered family's model for its own); in training
 * mode like any new model (from_pretrained returns eval mode: call eval() for inference). Tensors may
 * be f32, bf16 or f16 and are cast to opts.dtype. Every missing, unexpected or misshaped tensor is
 * named: StateError for missing and unexpected ones, ShapeError for shapes. A GPT-2's separate
 * lm_head.weight must equal the token table (nodetron's GPT ties its head), else ArgumentError.
 * Narrow the result with instanceof.
 */
export function importHF(dir: string, opts: ImportHFOptions = {}): CausalLM {
  const opened = openHFDirectory(dir, opts, 'importHF');
  const json = opened.config;
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`importHF: ${opened.configPath} is not a JSON object`);
  const type = (json as { model_type?: unknown }).model_type;
  const family = hfFamilyOf(type);
  if (!family) {
    throw new StateError(`importHF: ${opened.configPath} has model_type ${JSON.stringify(type)}; nodetron reads ${hfFamilies().map((f) => `${f.modelTypes.map((t) => `'${t}'`).join(', ')} (${f.name})`).join('; ')}`);
  }
  return family.read(opened, opts) as unknown as CausalLM;
}

/**
 * Writes `model` to `dir` as the Hugging Face class of its family, loadable by transformers'
 * from_pretrained: an nn.GPT as GPT2LMHeadModel (exportHF's checks of a GPT-2: biases, two LayerNorms
 * per block, no sliding window, default layouts), an nn.Llama as LlamaForCausalLM, MixtralForCausalLM
 * or Qwen2MoeForCausalLM (exportLlamaHF), a registered family's model as its writer says. Each file is
 * written under a temporary name and renamed into place; the directory is created when missing.
 */
export function exportHF(model: CausalLM, dir: string, opts: ExportHFOptions & ExportLlamaHFOptions = {}): void {
  const family = hfFamilies().find((f) => f.owns(model));
  if (!family) throw new ArgumentError(`exportHF: model must be an ${hfFamilies().map((f) => f.className).join(' or an ')}`);
  (family.write as (m: CausalLM, d: string, o: object) => void)(model, dir, opts);
}
