// nt.train: one entry point for training a GPT or Llama under any layout (setup → TrainingRun), the layout
// flags from the command line and the environment, and the progress line's arithmetic (model FLOPs, MFU;
// parameter counts and FLOPs per token are nt.nn's). It builds on ParallelTrainer (lib/parallel/trainer.ts:
// one rank's step of a layout); one process's plain step is nt.trainStep (lib/step.ts). The flags' tables
// (LAYOUT_FLAGS, LAYOUT_ENV) are in nodetron/internal; the example's loss plots are examples/gpt/plot.ts.
export {
  setup, main, TrainingRun,
  type TrainSetupOptions, type ModelShard, type Batch, type TokenData, type BatchSource, type CheckpointOptions, type LearningRate, type StepResult, type RunHistory,
} from './setup.js';
export { layoutFromArgs, parseArgs, LAYOUT_HELP, type LayoutArgs, type OptionKind, type ParsedOptions } from './flags.js';
export { modelFlopsPerToken, detectPeakFlops, formatProgress, formatDuration, type ProgressOptions, type ProgressSample, type MoEProgress } from './progress.js';
