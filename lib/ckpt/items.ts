// What a checkpoint holds (CheckpointItems) and how it is read: the model (a Module, or a trainer
// that says what this rank holds), the optimizer, and the positions of the data, schedule, scaler and
// random generators.
import { ArgumentError } from '../errors.js';
import type { Module } from '../nn/module.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Generator } from '../random.js';
import type { GradScaler, MasterWeights } from '../amp.js';
import type { CollectiveGroup } from '../distributed/group.js';
import type { TrainerHoldings } from '../parallel/trainer.js';
import { plainState, trainerState, type RankState } from './parts.js';

/** Anything whose position a checkpoint keeps: a data loader, a learning-rate schedule. */
export interface Stateful {
  /** The position to save (JSON-serializable). */
  state(): unknown;
  /** Restores a position that state() returned. */
  loadState(state: never): void;
}

/** A model that knows its own layout: ParallelTrainer (any TP × PP × DP × ZeRO layout). */
export interface ShardedTrainingState {
  /** What this rank holds of the training state (its model, optimizer or ZeRO shards, replicas): parts.ts's trainerState reads it. */
  checkpointHoldings(): TrainerHoldings<{ lr: number }>;
  /** The group of all ranks taking part in the checkpoint (null in one process). */
  readonly world: CollectiveGroup | null;
}

/** What a checkpoint holds. Everything but `model` is optional. */
export interface CheckpointItems {
  /** A ParallelTrainer (its model and optimizer, as this rank holds them), or a Module in one process. */
  model: Module | ShardedTrainingState;
  /** The optimizer of a Module (a trainer brings its own). */
  optimizer?: Optimizer<{ lr: number }>;
  /** A data loader whose position is saved (e.g. a TokenLoader). */
  loader?: Stateful;
  /** A learning-rate schedule whose position is saved. */
  scheduler?: Stateful;
  /** A loss scaler whose scale is saved. */
  scaler?: GradScaler;
  /** Random generators by name (the model's dropout generator, nt.defaultGenerator...): each rank's own are saved. */
  rng?: Record<string, Generator>;
  /** bf16/f16 compute copies, refreshed from the loaded f32 masters after a load. */
  masterWeights?: MasterWeights;
  /** Anything JSON-serializable (saved from rank 0, returned by load). */
  extra?: unknown;
  /** The layout, for the record (`nodetron` reads it back in messages). */
  layout?: unknown;
}

/** The items must name a model: a Module, or a trainer's sharded state. */
export function checkItems(items: CheckpointItems): void {
  if (items === null || typeof items !== 'object') throw new ArgumentError(`checkpoint: items must be an object like { model, optimizer, ... }, got ${items === null ? 'null' : typeof items}`);
  const m = items.model as unknown;
  if (m === null || typeof m !== 'object' || (typeof (m as Partial<ShardedTrainingState>).checkpointHoldings !== 'function' && typeof (m as Partial<Module>).namedParameters !== 'function')) {
    throw new ArgumentError('checkpoint: items.model must be a Module (e.g. a GPT) or a ParallelTrainer');
  }
}

/** The group of the ranks saving together (null in one process). */
export function worldOf(items: CheckpointItems): CollectiveGroup | null {
  checkItems(items);
  const m = items.model as Partial<ShardedTrainingState>;
  return typeof m.checkpointHoldings === 'function' ? (m.world ?? null) : null;
}

/** What this rank saves or loads: a trainer\'s holdings, or a Module and its optimizer. */
export function rankState(items: CheckpointItems, forLoad: boolean): RankState {
  checkItems(items);
  const m = items.model as Partial<ShardedTrainingState>;
  if (typeof m.checkpointHoldings === 'function') {
    if (items.optimizer) throw new ArgumentError('checkpoint: a trainer brings its own optimizer; pass optimizer only with a Module');
    return trainerState(m.checkpointHoldings!(), { forLoad });
  }
  return plainState(items.model as Module, items.optimizer ?? null, { forLoad });
}
