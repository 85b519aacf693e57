// Layers and models: Module/Parameter, Linear, Embedding, LayerNorm, Dropout, GPT-2, initializers.
export { Module, Parameter, type LoadStateDictOptions, type LoadStateDictResult } from './module.js';
export { Linear, Embedding, LayerNorm, Dropout, type LayerOptions } from './layers.js';
export {
  GPT, Block, CausalSelfAttention, MLP, defaultLinearFactory, sample,
  type GPTConfig, type GPTOptions, type GPTOutput, type GenerateOptions, type LinearFactory, type LinearLike, type LinearRole,
} from './gpt.js';
export * as init from './init.js';
