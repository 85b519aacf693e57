// Pipeline schedules (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1 and ZB-V) as tables of actions
// — a micro-batch's forward (F), backward (B; with ZB-H1 and ZB-V only its input gradient) or weight
// gradient (W) on one of the rank's model chunks — that one runner executes: activations go forward
// and their gradients backward by tagged point-to-point send/recv in the pipeline group.
//
// One job a file: placement.ts (layers and chunks per rank, virtual stages), tables.ts (each
// schedule's per-rank tables), simulation.ts (a table on an ideal machine: bubble, activations in
// flight, deadlocks; the papers' formulas), messages.ts (the point-to-point messages, and their
// order and batches on groups without tags: NCCL) and runner.ts (a rank running its table). This
// file is the public entry that gathers them.
export {
  partitionLayers, chunkLayers, schedulePlacement, virtualStageOf, rankOfVirtualStage, type ChunkPlacement, type VirtualStagePlace,
} from './placement.js';
export {
  SCHEDULE_KINDS, ZBV_PROFILES, splitsBackward, checkSchedule, scheduleTables, type ScheduleKind, type PipelineAction, type ScheduleShape,
} from './tables.js';
export { simulateSchedule, formulaBubble, type ActionCosts, type ScheduleSimulation } from './simulation.js';
export {
  untaggedPlans, simulateUntagged, messageSent, messageNeeded, type PipelineMessage, type MessageBatch, type MessageShape, type PlanStep,
} from './messages.js';
export {
  runSchedule, gpipe, oneForwardOneBackward, interleaved1F1B, zeroBubbleH1, zeroBubbleV, forwardOnly, type PipelineStage,
} from './runner.js';
