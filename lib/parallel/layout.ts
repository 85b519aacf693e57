// Training layouts: checking a TP × PP × DP (+ ZeRO, offload, micro-batches) request against a model,
// a world and a batch before anything trains, and joining the job with the checked layout's mesh.
// The training step of one rank of any layout is ParallelTrainer (trainer.ts).
import * as dist from '../distributed/init.js';
import { readLaunchEnv } from '../distributed/env.js';
import { ArgumentError } from '../errors.js';
import { initializeParallel, type ParallelState } from './mesh.js';
import { agreeAll } from '../distributed/agree.js';
import { checkTensorParallelConfig } from './tensor-parallel/gpt.js';

/** The pipeline schedules: GPipe (all forwards, then all backwards) or 1F1B (one forward, one backward). */
export type PipelineScheduleName = 'gpipe' | '1f1b';

/**
 * A checked training layout: how the world splits into tensor-, pipeline- and data-parallel ranks, and how each rank
 * trains.
 */
export interface TrainingLayout {
  /** Tensor-parallel ranks. */
  tp: number;
  /** Pipeline stages. */
  pp: number;
  /** Data-parallel ranks. */
  dp: number;
  /** Sequence parallelism: the regions between tensor-parallel layers hold 1/tp of the sequence (needs tp > 1). */
  sequenceParallel: boolean;
  /** ZeRO stage: 0 (replicated optimizer state), 1 (sharded state), 2 (and gradients) or 3 (and parameters). */
  zero: 0 | 1 | 2 | 3;
  /** Keep ZeRO shards and their update in host memory. */
  offload: boolean;
  /** Micro-batches each rank's batch is split into per step (pipeline schedule, gradient accumulation). */
  microBatches: number;
  /** The pipeline schedule. */
  schedule: PipelineScheduleName;
  /** Expert-parallel ranks (a divisor of dp), present when > 1: the MoE experts split over ep data-parallel ranks. */
  ep?: number;
}

/** The model dimensions a layout must divide. */
export interface LayoutModelShape {
  /** Transformer blocks. */
  nLayer: number;
  /** Attention heads. */
  nHead: number;
  /** Embedding width. */
  nEmbd: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** The sequence length trained on (a GPTConfig's context): sequence parallelism needs it to divide by tp. */
  blockSize?: number;
  /** The MoE layers' routed experts (a GPTConfig's moe.experts): expert parallelism needs ep to divide them. */
  moeExperts?: number;
}

/** Layout flags as a command line gives them; unset ones take defaults (dp: whatever the world leaves). */
export interface LayoutFlags {
  /** Tensor-parallel ranks (`--tp`, default 1). */
  tp?: number;
  /** Pipeline stages (`--pp`, default 1). */
  pp?: number;
  /** Data-parallel ranks (`--dp`, default: the world size / (tp·pp)). */
  dp?: number;
  /** Sequence parallelism (`--sp`; needs tp > 1). */
  sequenceParallel?: boolean;
  /** ZeRO stage 0-3 (`--zero`, default 0). */
  zero?: number;
  /** ZeRO shards in host memory (`--offload`). */
  offload?: boolean;
  /** Micro-batches per step (`--micro-batches`, default 1). */
  microBatches?: number;
  /** Pipeline schedule, gpipe or 1f1b (`--schedule`, default 1f1b). */
  schedule?: string;
  /** Expert-parallel ranks (`--ep`, default 1): must divide dp and the model's experts. */
  ep?: number;
}

/**
 * Resolves and checks a layout. Every problem is listed in one ArgumentError, so every rank (each
 * runs the same check on the same inputs) fails the same way before any communication.
 */
export function resolveTrainingLayout(flags: LayoutFlags, model: LayoutModelShape, worldSize: number, globalBatch: number): TrainingLayout {
  const problems: string[] = [];
  const intFlag = (name: string, v: number | undefined, fallback: number, min: number): number => {
    if (v === undefined) return fallback;
    if (!Number.isInteger(v) || v < min) { problems.push(`--${name} must be an integer >= ${min}, got ${v}`); return fallback; }
    return v;
  };
  const tp = intFlag('tp', flags.tp, 1, 1), pp = intFlag('pp', flags.pp, 1, 1);
  const dp = intFlag('dp', flags.dp, Math.max(1, Math.floor(worldSize / (tp * pp))), 1);
  const zero = intFlag('zero', flags.zero, 0, 0);
  const microBatches = intFlag('micro-batches', flags.microBatches, 1, 1);
  const ep = intFlag('ep', flags.ep, 1, 1);
  if (ep > 1) {
    if (dp % ep !== 0) problems.push(`--ep ${ep} must divide the data-parallel size dp = ${dp} (expert-parallel groups are carved out of the data-parallel ranks)`);
    if (model.moeExperts === undefined) problems.push(`--ep ${ep} splits MoE experts over ranks, but the model has no MoE layers (set moe in the model config)`);
    else if (model.moeExperts % ep !== 0) problems.push(`--ep ${ep} must divide the model's ${model.moeExperts} experts`);
    if (zero > 0) problems.push(`--zero ${zero} with --ep ${ep} is not supported yet (expert weights would need sharding over the expert-data-parallel group)`);
  }
  if (model.moeExperts !== undefined && (flags.sequenceParallel ?? false)) problems.push('--sp with MoE layers is not supported yet (each tensor-parallel rank would route a different chunk of the sequence)');
  const schedule = flags.schedule ?? '1f1b';
  if (schedule !== 'gpipe' && schedule !== '1f1b') problems.push(`--schedule must be gpipe or 1f1b, got ${schedule}`);
  if (zero > 3) problems.push(`--zero must be 0, 1, 2 or 3, got ${zero}`);
  if (zero > 0 && dp === 1) problems.push(`--zero ${zero} shards over the data-parallel ranks, but dp = 1`);
  const offload = flags.offload ?? false;
  if (offload && zero === 0) problems.push('--offload moves ZeRO shards to host memory, so it needs --zero 1, 2 or 3');
  if (tp * pp * dp !== worldSize) problems.push(`tp·pp·dp = ${tp}·${pp}·${dp} = ${tp * pp * dp} but the job has ${worldSize} processes (launch with --nproc-per-node ${tp * pp * dp})`);
  try { checkTensorParallelConfig(model, tp); } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    problems.push(`--tp ${tp}: ${e.message}`);
  }
  const sequenceParallel = flags.sequenceParallel ?? false;
  if (sequenceParallel && tp === 1) problems.push('--sp splits the sequence over the tensor-parallel ranks, but tp = 1');
  if (sequenceParallel && tp > 1) {
    if (model.blockSize === undefined) problems.push('--sp needs the sequence length (the model shape\'s blockSize) to check that tp divides it');
    else if (model.blockSize % tp !== 0) problems.push(`--sp: the sequence length ${model.blockSize} is not a multiple of --tp ${tp}`);
  }
  if (pp > model.nLayer) problems.push(`--pp ${pp} is more pipeline stages than the model's ${model.nLayer} layers`);
  if (globalBatch % (dp * microBatches) !== 0) {
    problems.push(microBatches === 1 ? `--dp ${dp} does not divide the global batch of ${globalBatch} sequences`
      : `dp·micro-batches = ${dp}·${microBatches} does not divide the global batch of ${globalBatch} sequences`);
  }
  if (problems.length > 0) throw new ArgumentError(`training layout: ${problems.join('; ')}`);
  return { tp, pp, dp, sequenceParallel, zero: zero as 0 | 1 | 2 | 3, offload, microBatches, schedule: schedule as PipelineScheduleName, ...(ep > 1 ? { ep } : {}) };
}

/** The rows [start, start + count) of a global batch that data-parallel rank `dpRank` of `dpSize` trains on. */
export function batchSlice(globalBatch: number, dpRank: number, dpSize: number): {
  /** First row. */
  start: number;
  /** Number of rows (globalBatch / dpSize). */
  count: number;
} {
  if (!Number.isInteger(globalBatch) || globalBatch % dpSize !== 0) throw new ArgumentError(`batchSlice: the batch of ${globalBatch} does not split over ${dpSize} data-parallel ranks`);
  if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank >= dpSize) throw new ArgumentError(`batchSlice: dpRank ${dpRank} is outside [0, ${dpSize})`);
  const count = globalBatch / dpSize;
  return { start: dpRank * count, count };
}

/** Short text of a layout for logs: `tp=2 sp pp=2 dp=1 zero=0 micro-batches=4 (1f1b)`. */
export function describeLayout(l: TrainingLayout): string {
  return `tp=${l.tp}${l.sequenceParallel ? ' sp' : ''} pp=${l.pp} dp=${l.dp}${(l.ep ?? 1) > 1 ? ` ep=${l.ep}` : ''} zero=${l.zero}${l.offload ? ' offload' : ''} micro-batches=${l.microBatches}${l.pp > 1 ? ` (${l.schedule})` : ''}`;
}

/** A joined training job: its layout, this rank and the mesh. */
export interface ParallelTraining {
  /** The checked layout. */
  layout: TrainingLayout;
  /** The world rank (0 without a launcher). */
  rank: number;
  /** The mesh, or null for a single process (no communication at all). */
  mesh: ParallelState | null;
}

/**
 * Checks the layout against the launch environment, then (for more than one process) joins the
 * job, checks that every rank resolved the same layout for the same model and batch, and builds the
 * mesh. A rank whose flags are rejected, or that disagrees with the others, makes every rank throw
 * an ArgumentError before any training communication (with more than one process, after joining
 * the job: a caller that catches it calls nt.distributed.destroy() before returning).
 */
export async function initParallelTraining(flags: LayoutFlags, model: LayoutModelShape, globalBatch: number): Promise<ParallelTraining> {
  const env = readLaunchEnv();
  let layout: TrainingLayout | null = null, rejected: unknown = null;
  try { layout = resolveTrainingLayout(flags, model, env.worldSize, globalBatch); } catch (e) { rejected = e; }
  if (env.worldSize === 1) {
    if (rejected) throw rejected;
    return { layout: layout!, rank: 0, mesh: null };
  }
  await dist.init();
  const { nLayer, nHead, nEmbd, vocabSize } = model;
  const mine = layout ? `${describeLayout(layout)}; model layers=${nLayer} heads=${nHead} width=${nEmbd} vocab=${vocabSize}; batch ${globalBatch}` : 'rejected';
  // The runtime stays up: the caller reports the error and leaves (nt.distributed.destroy(), or exit).
  await agreeAll(dist.world(), rejected as Error | null, {
    failedElsewhere: (ranks) => new ArgumentError(`training layout: layout flags rejected on ${ranks} (see the error there); every rank stops`),
    settings: mine,
    mismatch: () => new ArgumentError(`training layout: the ranks were started with different settings (this rank: ${mine})`),
  });
  const mesh = await initializeParallel({ tp: layout!.tp, pp: layout!.pp, dp: layout!.dp, ep: layout!.ep });
  return { layout: layout!, rank: env.rank, mesh };
}
