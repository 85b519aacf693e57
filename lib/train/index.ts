// nt.train: one entry point for training a GPT under any layout (setup → TrainingRun), the layout flags
// from the command line and the environment, and the progress line's arithmetic (model FLOPs, MFU).
// It builds on ParallelTrainer (lib/parallel/trainer.ts: one rank's step of a layout); one process's
// plain step is nt.trainStep (lib/step.ts).
export {
  setup, main, TrainingRun,
  type TrainSetupOptions, type ModelShard, type Batch, type TokenData, type BatchSource, type CheckpointOptions, type LearningRate, type StepResult,
} from './setup.js';
export { layoutFromArgs, parseArgs, LAYOUT_FLAGS, LAYOUT_ENV, LAYOUT_HELP, type LayoutArgs, type OptionKind, type ParsedOptions } from './flags.js';
export {
  gptParameterCount, gptActiveParameterCount, gptFlopsPerToken, llamaParameterCount, llamaFlopsPerToken, type LlamaCountConfig, modelFlopsPerToken, detectPeakFlops, formatProgress, formatDuration, type ProgressOptions, type ProgressSample, type MoEProgress,
} from './progress.js';
export { terminalPlot, lineChartSvg, niceTicks, type PlotSeries, type PlotReference, type PlotOptions, type TerminalPlotOptions, type SvgPlotOptions } from './plot.js';
