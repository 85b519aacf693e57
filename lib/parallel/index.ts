// Parallelism: the TP × PP × DP mesh, tensor-parallel mappings, layers and GPT, data-parallel gradient buckets, ZeRO, and test groups.
export {
  MeshLayout, ParallelState, initializeParallel, rangeAcrossRanks, parallelState, isParallelInitialized, destroyParallel,
  tpRank, tpSize, tpGroup, ppRank, ppSize, ppGroup, dpRank, dpSize, dpGroup,
  type ParallelDim, type ParallelLayout, type MeshCoords, type InitializeParallelOptions,
} from './mesh.js';
export type { ProcessGroup, WorldGroup, Work, ReduceOp } from './group.js';
export { localWorld, runLocalRanks, LOCAL_TIMEOUT_MS } from './local-group.js';
export { GradBuffer, DEFAULT_BUCKET_BYTES, type GradBufferOptions, type GradBucket } from './data-parallel/buffer.js';
export { ZeroOptimizer, zeroMemoryFormula, type ZeroStage, type ZeroOptions, type ZeroParamGroup, type ZeroMemoryBytes, type InnerOptimizerFactory, type ZeroAttachOptions, type GradNormScope } from './zero/optimizer.js';
export type { ReduceStats } from './zero/gradient-shards.js';
export { defaultUnits, type GatherStats } from './zero/stage3.js';
export { FlatLayout, copyElements, type FlatEntry } from './flat.js';
export { fileWorld } from './file-group.js';
export {
  copyToRegion, reduceFromRegion, scatterToRegion, gatherFromRegion,
  scatterToSequenceRegion, gatherFromSequenceRegion, reduceScatterToSequenceRegion, SEQUENCE_DIM,
} from './tensor-parallel/mappings.js';
export { ColumnParallelLinear, RowParallelLinear, sequenceGatheredLinear, type ParallelLinearOptions } from './tensor-parallel/layers.js';
export {
  VocabParallelEmbedding, vocabParallelCrossEntropy, vocabRange,
  type VocabParallelEmbeddingOptions, type VocabParallelCrossEntropyOptions,
} from './tensor-parallel/vocab.js';
export {
  checkTensorParallelConfig, tensorParallelLinearFactory, vocabParallelLayout, sequenceParallelLayout, tensorParallelGPTOptions, tensorParallelGPT,
  tensorParallelParameters, clipTensorParallelGradNorm, type TensorParallelOptions,
} from './tensor-parallel/gpt.js';
export { gpipe, oneForwardOneBackward, forwardOnly, partitionLayers, type PipelineStage } from './pipeline/schedules.js';
export { GPTStage, type PipelineModule } from './pipeline/gpt-stage.js';
export {
  resolveTrainingLayout, batchSlice, describeLayout, initParallelTraining, ParallelTrainer,
  type TrainingLayout, type LayoutModelShape, type LayoutFlags, type ParallelTraining, type ParallelTrainerOptions,
  type PipelineScheduleName, type TrainerStepResult,
} from './layout.js';
