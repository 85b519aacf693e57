// nt.parallel.tp: tensor parallelism the Megatron way, sequence parallelism included — the column- and
// row-parallel linear layers, the collectives that enter and leave their regions, the vocabulary-parallel
// embedding and losses, and a GPT (or Llama, through tensorParallelGPTOptions) split over a group.
// The seams these are built from (tensorParallelLinearFactory, vocabParallelLayout, sequenceParallelLayout,
// tensorParallelParameters, sequenceGatheredLinear, vocabRange, SEQUENCE_DIM) are in nodetron/internal.
export {
  copyToRegion, reduceFromRegion, scatterToRegion, gatherFromRegion,
  scatterToSequenceRegion, gatherFromSequenceRegion, reduceScatterToSequenceRegion,
} from './mappings.js';
export { ColumnParallelLinear, RowParallelLinear, type ParallelLinearOptions } from './layers.js';
export {
  VocabParallelEmbedding, vocabParallelCrossEntropy, vocabParallelLinearCrossEntropy,
  type VocabParallelEmbeddingOptions, type VocabParallelCrossEntropyOptions, type VocabParallelLinearCrossEntropyOptions,
} from './vocab.js';
export { checkTensorParallelConfig, tensorParallelGPTOptions, tensorParallelGPT, clipTensorParallelGradNorm, type TensorParallelOptions } from './gpt.js';
