// nt.train.setup: one entry point for training a GPT under any TP × PP × DP × ZeRO layout. It reads the
// layout (options, command line or environment), joins the job, builds this rank's part of the model
// (tensor-parallel options, pipeline stage), the ParallelTrainer, the data loader wired to the data-
// and tensor-parallel ranks, the learning-rate schedule and the checkpoints (model, optimizer, data
// position, schedule, random generators, layout), and returns a TrainingRun: step, evaluate, save,
// resume, generate, export, close. Progress lines (loss, tokens/s, MFU, memory, ETA) go out on rank 0.
//
// The pieces live in one file each: options.ts (the options' types and their check), assembly.ts
// (building this rank's model, trainer and data from them; setup itself), run.ts (the TrainingRun:
// the training loop, evaluation, checkpoints) and main.ts (a training script's entry and exit code).
// This file is the public entry that gathers them.
export {
  type ModelShard, type Batch, type TokenData, type BatchSource, type CheckpointOptions, type LearningRate, type TrainSetupOptions,
} from './options.js';
export { setup } from './assembly.js';
export { TrainingRun, type StepResult, type RunHistory } from './run.js';
export { main } from './main.js';
