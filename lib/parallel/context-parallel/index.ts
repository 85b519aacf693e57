// nt.parallel.cp: context parallelism — attention over a sequence split across a group, by ring
// attention (Megatron-core) or the Ulysses all-to-all (DeepSpeed), with the tokens each rank holds under
// either (ringChunks, ulyssesChunk), the GPT's ContextLayout for a group, and this rank's tokens of a
// batch. The GPT's choice between the two layouts (contextChunks) is in nodetron/internal.
export { ringAttentionPacked, ringChunks, type RingAttentionOptions, type TokenRange } from './ring.js';
export { ulyssesAttentionPacked, ulyssesChunk, type UlyssesAttentionOptions } from './ulysses.js';
export { contextParallelLayout, contextSlice } from './gpt.js';
