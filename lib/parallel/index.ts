// Parallelism: the TP × CP × PP × DP mesh (expert parallelism carved out of DP), tensor-, sequence-, context-,
// expert- and pipeline-parallel layers and schedules for the GPT and Llama, data-parallel gradient buckets, ZeRO.
// Where each thing lives (lib/parallel/…):
//   mesh.ts                    the TP × CP × PP × DP mesh and its process groups, expert ones too (Megatron's parallel_state)
//   layout.ts                  checking a layout request (--tp/--pp/--dp/--zero…) and joining the job with it
//   trainer.ts                 ParallelTrainer: one rank's training step for any layout (its checks: trainer-checks.ts)
//   families.ts                the trainer's parameter families (parameters, group, sync, optimizer) and its one step path's pieces
//   tensor parallel (TP)       tensor-parallel/: mappings.ts (region collectives, sequence parallel too),
//                              layers.ts (column/row-parallel linear), vocab.ts (embedding, cross-entropy), gpt.ts
//   sequence parallel (SP)     tensor-parallel/mappings.ts (…SequenceRegion) and gpt.ts (sequenceParallelLayout)
//   pipeline parallel (PP)     pipeline/: schedules.ts (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V), gpt-stage.ts
//                              (any CausalLM cut into stages)
//   context parallel (CP)      context-parallel/: ring.ts (ring attention), ulysses.ts (Ulysses all-to-all),
//                              gpt.ts (the GPT's ContextLayout, a batch's tokens per rank)
//   data parallel (DP)         data-parallel/buffer.ts: GradBuffer, all-reduce on the bucket engine
//   gradient buckets           buckets.ts: the one bucket engine (hooks, noSync, rebuild, in-order launch);
//                              its sync is all-reduce (DP) or reduce-scatter (ZeRO 1, 2)
//   ZeRO (any stage)           zero/optimizer.ts: ZeroOptimizer, the entry point building ZeroStage12Optimizer or
//                              ZeroStage3Optimizer (one ShardedOptimizer interface); zero/chunks.ts: the shard layout
//   ZeRO stage 1 and 2         zero/stage1-2.ts: sharded optimizer state (1) and gradients (2), reduce-scatter buckets
//   ZeRO stage 3               zero/stage3.ts: parameters partitioned, gathered unit by unit
//   flat buffers               flat.ts: parameters packed back to back, bucket splitting
//   expert parallel (EP)       expert-parallel.ts: MoE experts split over ranks, the autograd all-to-all of rows
//   collectives in autograd    finishSync (lib/distributed/finish-sync.ts): every layer above finishes its
//                              collectives with it (one behaviour on failure)
// The group interface all of it runs over is CollectiveGroup (lib/distributed/group.ts); nt.distributed's
// ProcessGroup implements it; the in-process and file-backed groups for tests are in lib/testing (nodetron/testing).
export {
  MeshLayout, ParallelState, initializeParallel, parallelState, isParallelInitialized, destroyParallel,
  tpRank, tpSize, tpGroup, ppRank, ppSize, ppGroup, dpRank, dpSize, dpGroup,
  type ParallelDim, type ParallelLayout, type MeshCoords, type MeshCoordsInput, type InitializeParallelOptions, type ExpertGroups,
} from './mesh.js';
export type { CollectiveGroup, CollectiveWork, WorldGroup } from '../distributed/group.js';
export { rangeAcrossRanks } from '../distributed/agree.js';
export type { ReduceOp } from '../distributed/collectives.js';
export { DEFAULT_BUCKET_BYTES } from './buckets.js';
// A bucket's layout (GradBucket.layout), as a type: building one is internal (nodetron/internal).
export type { FlatLayout, FlatEntry } from './flat.js';
export { GradBuffer, type GradBufferOptions, type GradBucket } from './data-parallel/buffer.js';
export {
  ZeroOptimizer, ZeroStage12Optimizer, ZeroStage3Optimizer, zeroMemoryFormula, type ShardedOptimizer, type ZeroOptimizerConstructor, type ZeroStage12Options,
  type ZeroStage3Options, type ZeroStepOptions, type ZeroStage, type ZeroOptions, type ZeroParamGroup, type ZeroMemoryBytes, type InnerOptimizerFactory, type ZeroAttachOptions, type GradNormScope } from './zero/optimizer.js';
export type { ReduceStats } from './zero/stage1-2.js';
export { defaultUnits, type GatherStats } from './zero/stage3.js';
export {
  copyToRegion, reduceFromRegion, scatterToRegion, gatherFromRegion,
  scatterToSequenceRegion, gatherFromSequenceRegion, reduceScatterToSequenceRegion, SEQUENCE_DIM,
} from './tensor-parallel/mappings.js';
export { ColumnParallelLinear, RowParallelLinear, sequenceGatheredLinear, type ParallelLinearOptions } from './tensor-parallel/layers.js';
export {
  VocabParallelEmbedding, vocabParallelCrossEntropy, vocabParallelLinearCrossEntropy, vocabRange,
  type VocabParallelEmbeddingOptions, type VocabParallelCrossEntropyOptions, type VocabParallelLinearCrossEntropyOptions,
} from './tensor-parallel/vocab.js';
export {
  checkTensorParallelConfig, tensorParallelLinearFactory, vocabParallelLayout, sequenceParallelLayout, tensorParallelGPTOptions, tensorParallelGPT,
  tensorParallelParameters, clipTensorParallelGradNorm, type TensorParallelOptions,
} from './tensor-parallel/gpt.js';
export {
  gpipe, oneForwardOneBackward, interleaved1F1B, zeroBubbleH1, zeroBubbleV, runSchedule, forwardOnly, partitionLayers, chunkLayers,
  scheduleTables, checkSchedule, simulateSchedule, formulaBubble, SCHEDULE_KINDS, virtualStageOf, rankOfVirtualStage, schedulePlacement, splitsBackward,
  type ChunkPlacement, type VirtualStagePlace, type PipelineStage, type ScheduleKind, type PipelineAction, type ScheduleShape, type ActionCosts, type ScheduleSimulation,
} from './pipeline/schedules.js';
export { GPTStage, type PipelineModule } from './pipeline/gpt-stage.js';
export { ringAttentionPacked, ringChunks, type RingAttentionOptions, type TokenRange } from './context-parallel/ring.js';
export { ulyssesAttentionPacked, ulyssesChunk, type UlyssesAttentionOptions } from './context-parallel/ulysses.js';
export { contextParallelLayout, contextChunks, contextSlice } from './context-parallel/gpt.js';
export {
  resolveTrainingLayout, layoutProblems, batchSlice, describeLayout, initParallelTraining,
  type TrainingLayout, type LayoutModelShape, type LayoutShape, type LayoutRequest, type LayoutFlags, type ParallelTraining, type PipelineScheduleName, type ContextParallelMode,
} from './layout.js';
export { expertParallel, allToAllRows, exchangeCounts, type ExpertParallelOptions } from './expert-parallel.js';
export { ParallelTrainer, type ParallelTrainerOptions, type TrainerStepResult, type TrainingPrecision, type TrainerHoldings, type ExpertHoldings, type ReplicaPlace } from './trainer.js';
