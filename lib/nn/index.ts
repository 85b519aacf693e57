// Layers and models: Module/Parameter, Linear, Embedding, LayerNorm, Dropout, GPT-2, mixture of experts, initializers.
export { Module, Parameter, type LoadStateDictOptions, type LoadStateDictResult, type TensorSplit } from './module.js';
export { Linear, Embedding, LayerNorm, Dropout, type LayerOptions, type InitOption } from './layers.js';
export {
  GPT, Block, CausalSelfAttention, MLP, isMoEBlock, defaultLinearFactory, defaultVocabLayout, wholeSequence, padVocab, sample,
  type GPTConfig, type GPTOptions, type GPTOutput, type GPTLogitsOutput, type GenerateOptions, type LinearFactory, type LinearLike, type LinearRole,
  type TokenEmbedding, type VocabLayout, type SequenceLayout, type ContextLayout,
} from './gpt.js';
export {
  MoE, SwiGLUExpert, checkMoEConfig, routeTopK, splitRows, scaleGrad, swigluComposed, moeAuxLossScale, setMoEAuxLossScale, addMoEStats, moeLayers,
  type MoEConfig, type MoEOptions, type MoEParallel, type MoEStats, type Routing,
} from './moe.js';
export * as init from './init.js';
