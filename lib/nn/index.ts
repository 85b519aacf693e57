// Layers and models: Module/Parameter, Linear, Embedding, LayerNorm, RMSNorm, Dropout, GPT-2, Llama, mixture of experts, initializers.
export { Module, Parameter, type LoadStateDictOptions, type LoadStateDictResult, type TensorSplit } from './module.js';
export { Linear, Embedding, LayerNorm, RMSNorm, Dropout, type LayerOptions, type InitOption } from './layers.js';
export {
  GPT, Block, CausalSelfAttention, MLP, isMoEBlock, defaultLinearFactory, defaultVocabLayout, wholeSequence, padVocab, sample, generateTokens,
  type GPTConfig, type GPTOptions, type GPTOutput, type GPTLogitsOutput, type GenerateOptions, type LinearFactory, type LinearLike, type LinearRole,
  type TokenEmbedding, type VocabLayout, type SequenceLayout, type ContextLayout, type CausalLM, type ModelShape, type AttentionHeads, type StageModules,
} from './gpt.js';
export {
  MoE, SwiGLUExpert, checkMoEConfig, routeTopK, splitRows, scaleGrad, moeAuxLossScale, setMoEAuxLossScale, addMoEStats, moeLayers,
  type MoEConfig, type MoEOptions, type MoEParallel, type MoEStats, type Routing,
} from './moe.js';
export {
  Llama, LlamaBlock, LlamaAttention, LlamaMLP, llamaConfig, isLlamaMoEBlock, llamaMoEConfig, type LlamaConfig, type CheckedLlamaConfig, type LlamaOptions, type LlamaMLPFactory, type LlamaMLPLike,
} from './llama.js';
export * as init from './init.js';
