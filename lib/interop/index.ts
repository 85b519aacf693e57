// nt.interop: nodetron's GPT and Llama to and from other tools' files — Hugging Face GPT-2 and
// LlamaForCausalLM directories (safetensors + config.json, loadable by transformers) and llm.c model files.
export { exportHF, importHF } from './hf-auto.js';
export { hfConfig, hfName, isConv1D, configFromHF, type ExportHFOptions } from './hf.js';
export type { ImportHFOptions, HFDType } from './hf-common.js';
export { exportLlamaHF, importLlamaHF, llamaHFConfig, llamaHFName, llamaHFArchitecture, llamaConfigFromHF, type ExportLlamaHFOptions, type LlamaHFArchitecture } from './hf-llama.js';
export {
  writeLlmc, readLlmc, readLlmcHeader, LLMC_MAGIC, LLMC_VERSIONS, LLMC_HEADER_BYTES, LLMC_VOCAB_MULTIPLE,
  type LlmcHeader, type WriteLlmcOptions, type ReadLlmcOptions,
} from './llmc.js';
