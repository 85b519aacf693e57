// Layers and models: Module/Parameter, Linear, Embedding, LayerNorm, RMSNorm, Dropout, the CausalLM contract and its seams, GPT-2, Llama, mixture of experts, initializers.
export { Module, Parameter, type LoadStateDictOptions, type LoadStateDictResult, type TensorSplit } from './module.js';
export { Linear, Embedding, LayerNorm, RMSNorm, Dropout, type LayerOptions, type InitOption } from './layers.js';
export {
  GPT, Block, CausalSelfAttention, MLP, isMoEBlock, gptParameterCount, gptActiveParameterCount, gptFlopsPerToken,
  type GPTConfig, type GPTOptions, type GPTOutput, type GPTLogitsOutput,
} from './gpt.js';
export {
  defaultLinearFactory, defaultVocabLayout, wholeSequence, padVocab, sample, generateTokens,
  type CausalLM, type CausalLMOptions, type CausalLMOutput, type CausalLMLogitsOutput, type GenerateOptions, type LinearFactory, type LinearFactoryModel,
  type LinearLike, type LinearRole, type TokenEmbedding, type VocabLayout, type SequenceLayout, type ContextLayout, type ModelShape, type ParameterCounts, type AttentionHeads, type StageModules,
} from './causal-lm.js';
export {
  MoE, SwiGLUExpert, checkMoEConfig, routeTopK, splitRows, scaleGrad, moeAuxLossScale, setMoEAuxLossScale, addMoEStats, moeLayers,
  type MoEConfig, type MoEOptions, type MoEParallel, type MoEStats, type MoEStepContext, type Routing,
} from './moe.js';
export {
  Llama, LlamaBlock, LlamaAttention, LlamaMLP, llamaConfig, isLlamaMoEBlock, llamaMoEConfig, llamaParameterCount, llamaFlopsPerToken, type LlamaCountConfig, type LlamaConfig, type CheckedLlamaConfig, type LlamaOptions, type LlamaMLPFactory, type LlamaMLPLike,
} from './llama.js';
export * as init from './init.js';
