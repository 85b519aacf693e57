// nt.parallel.pp: pipeline parallelism — a model cut into stages (GPTStage: any CausalLM), the layers a
// stage holds (partitionLayers), and the schedules that run one step over the pipeline group (GPipe,
// 1F1B, interleaved 1F1B, ZB-H1, ZB-V; forwardOnly for evaluation), each a table of actions per rank
// (scheduleTables). The tables' checks, placement and simulation (schedules.ts gathers them all) are in
// nodetron/internal.
export { partitionLayers, type ChunkPlacement } from './placement.js';
export { scheduleTables, type ScheduleKind, type PipelineAction, type ScheduleShape } from './tables.js';
export { runSchedule, gpipe, oneForwardOneBackward, interleaved1F1B, zeroBubbleH1, zeroBubbleV, forwardOnly, type PipelineStage } from './runner.js';
export { GPTStage, type PipelineModule } from './gpt-stage.js';
