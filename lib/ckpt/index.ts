// Checkpoints (`nt.ckpt`): sharded, asynchronous saves of a run under any layout, loaded under any
// other; the parts arithmetic is exported for tools. docs/checkpoint-format.md describes the files.
export { Checkpointer, save, load, type CheckpointerOptions, type SaveResult } from './checkpoint.js';
export { latest, listCheckpoints, readManifest, stepDirName, type Manifest, type ManifestTensor, type ManifestPart } from './format.js';
export { readTensor, type LoadResult } from './load.js';
export { type CheckpointItems, type Stateful, type ShardedTrainingState } from './items.js';
export { plainState, zeroState, trainerState, type StatePart, type RankState, type StepCounter } from './parts.js';
export { partIntervals, coverageProblem, localShape, type Interval, type PartSpec } from './intervals.js';
