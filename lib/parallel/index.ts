// Parallelism (nt.parallel): the TP × CP × PP × DP mesh (expert parallelism carved out of DP), the layout a
// job trains under, the trainer of any layout and data-parallel gradient buckets here; one namespace per
// kind of parallelism beside them — nt.parallel.tp (tensor and sequence), .pp (pipeline), .cp (context),
// .ep (expert), .zero (ZeRO) — for the GPT, Llama and other CausalLMs. What the package's own commands and
// tests build on besides (schedule tables, the mesh's Megatron-style accessors, …) is in nodetron/internal.
// Where each thing lives (lib/parallel/…):
//   mesh.ts                    the TP × CP × PP × DP mesh and its process groups, expert ones too (Megatron's parallel_state)
//   layout.ts                  checking a layout request (--tp/--pp/--dp/--zero…) and joining the job with it
//   trainer.ts                 ParallelTrainer: one rank's training step for any layout (its checks: trainer-checks.ts)
//   families.ts                the trainer's parameter families (parameters, group, sync, optimizer) and its one step path's pieces
//   tensor parallel (TP)       tensor-parallel/ (nt.parallel.tp: index.ts): mappings.ts (region collectives, sequence parallel too),
//                              layers.ts (column/row-parallel linear), vocab.ts (embedding, cross-entropy), gpt.ts
//   sequence parallel (SP)     tensor-parallel/mappings.ts (…SequenceRegion) and gpt.ts (sequenceParallelLayout)
//   pipeline parallel (PP)     pipeline/ (nt.parallel.pp: index.ts): schedules.ts (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V), gpt-stage.ts
//                              (any CausalLM cut into stages)
//   context parallel (CP)      context-parallel/ (nt.parallel.cp: index.ts): ring.ts (ring attention), ulysses.ts (Ulysses all-to-all),
//                              gpt.ts (the GPT's ContextLayout, a batch's tokens per rank)
//   data parallel (DP)         data-parallel/buffer.ts: GradBuffer, all-reduce on the bucket engine
//   gradient buckets           buckets.ts: the one bucket engine (hooks, noSync, rebuild, in-order launch);
//                              its sync is all-reduce (DP) or reduce-scatter (ZeRO 1, 2)
//   ZeRO (any stage)           zero/ (nt.parallel.zero: index.ts); zero/optimizer.ts: ZeroOptimizer, the entry point building ZeroStage12Optimizer or
//                              ZeroStage3Optimizer (one ShardedOptimizer interface); zero/chunks.ts: the shard layout
//   ZeRO stage 1 and 2         zero/stage1-2.ts: sharded optimizer state (1) and gradients (2), reduce-scatter buckets
//   ZeRO stage 3               zero/stage3.ts: parameters partitioned, gathered unit by unit
//   flat buffers               flat.ts: parameters packed back to back, bucket splitting
//   expert parallel (EP)       expert-parallel.ts (nt.parallel.ep): MoE experts split over ranks, the autograd all-to-all of rows
//   collectives in autograd    finishSync (lib/distributed/finish-sync.ts): every layer above finishes its
//                              collectives with it (one behaviour on failure)
// The group interface all of it runs over is CollectiveGroup (lib/distributed/group.ts); nt.distributed's
// ProcessGroup implements it; the in-process and file-backed groups for tests are in lib/testing (nodetron/testing).
export {
  MeshLayout, ParallelState, initializeParallel, parallelState, isParallelInitialized, destroyParallel,
  type ParallelDim, type ParallelLayout, type MeshCoords, type MeshCoordsInput, type InitializeParallelOptions, type ExpertGroups,
} from './mesh.js';
export type { CollectiveGroup, CollectiveWork, WorldGroup } from '../distributed/group.js';
export type { ReduceOp } from '../distributed/collectives.js';
export {
  resolveTrainingLayout, layoutProblems, batchSlice, describeLayout, initParallelTraining,
  type TrainingLayout, type LayoutModelShape, type LayoutShape, type LayoutRequest, type LayoutFlags, type ParallelTraining, type PipelineScheduleName, type ContextParallelMode,
} from './layout.js';
export {
  ParallelTrainer, type ParallelTrainerOptions, type TrainerStepResult, type TrainingPrecision, type TrainerHoldings, type ExpertHoldings, type ReplicaPlace,
  type TrainerRecoveryState,
} from './trainer.js';
export type { BucketOrder } from './families.js';
export { DEFAULT_BUCKET_BYTES } from './buckets.js';
// A bucket's layout (GradBucket.layout), as a type: building one is internal (nodetron/internal).
export type { FlatLayout, FlatEntry } from './flat.js';
export { GradBuffer, type GradBufferOptions, type GradBucket } from './data-parallel/buffer.js';
export * as tp from './tensor-parallel/index.js';
export * as pp from './pipeline/index.js';
export * as cp from './context-parallel/index.js';
export * as ep from './expert-parallel.js';
export * as zero from './zero/index.js';
