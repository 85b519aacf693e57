// Checkpoints (`nt.ckpt`): sharded, asynchronous saves of a run under any layout, loaded under any
// other; the parts arithmetic is exported for tools.
export {
  Checkpointer, save, load, latest, listCheckpoints, readManifest, readTensor, stepDirName,
  type CheckpointItems, type CheckpointerOptions, type Manifest, type ManifestTensor, type ManifestPart, type SaveResult, type LoadResult,
  type Stateful, type ShardedTrainingState,
} from './checkpoint.js';
export { plainState, zeroState, trainerState, type StatePart, type RankState, type StepCounter } from './parts.js';
export { partIntervals, coverageProblem, localShape, type Interval, type PartSpec } from './intervals.js';
