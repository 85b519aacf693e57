// nt.train.setup's options: their types (the model factory's shard, batches, token data, checkpoints,
// the learning rate), their check before any process is joined or anything is built, and the decision
// every rank takes together on a problem (each rank's problems agreed, so all throw at once).
import type { ProcessGroup } from '../distributed/group.js';
import { agreeAll } from '../distributed/agree.js';
import { ArgumentError } from '../errors.js';
import type { GPT, GPTOptions } from '../nn/gpt.js';
import type { CausalLM } from '../nn/causal-lm.js';
import type { Parameter } from '../nn/module.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { CosineWithWarmupOptions } from '../optim/schedule.js';
import { resolveTrainingLayout, type LayoutModelShape, type TrainingLayout } from '../parallel/layout.js';
import type { ZeroParamGroup } from '../parallel/zero/optimizer.js';
import type { Tensor } from '../tensor.js';
import { layoutFromArgs, type LayoutArgs } from './flags.js';
import type { ProgressOptions } from './progress.js';

/**
 * What the model factory receives: spread it into the GPT's options (`new nt.nn.GPT(config, shard)`).
 * It holds the seed and device, the tensor-parallel layers of this rank's group (when tp > 1) and
 * recomputation (when the layout asks for it).
 */
export interface ModelShard extends GPTOptions {
  /** The initialization seed (the same on every rank: each builds its slices of the same weights). */
  seed: number;
  /** The device of this rank's parameters. */
  device: string;
}

/** A batch of token ids: int32 `[rows, seqLen]` inputs and their next tokens as targets. */
export interface Batch {
  /** Token ids, int32 `[rows, seqLen]`. */
  inputs: Tensor;
  /** The next token of each input position, int32 `[rows, seqLen]`. */
  targets: Tensor;
}

/** Token shards to train on (llm.c's format, as `nodetron data tokenize` writes them). */
export interface TokenData {
  /** Training shards, in order. */
  train: string[];
  /** Validation shards: {@link TrainingRun.evaluate} reads from them (the same windows every time). */
  val?: string[];
  /** Seed of the training order (default: the run's seed). */
  seed?: number;
  /** Shuffle the windows every epoch (default true). */
  shuffle?: boolean;
  /** Batches per validation loss (default 4). */
  evalBatches?: number;
  /** Seed of the validation windows' order (default 7). */
  evalSeed?: number;
  /**
   * Evaluate after every `evalEvery` steps and after the last (needs `val` and the run's `steps`);
   * the loss is printed and returned by {@link TrainingRun.step}. Default: only when asked.
   */
  evalEvery?: number;
}

/** A source of global batches: given the step (0-based), every rank returns the same `[batchSize, seqLen]` batch; the run slices its rows. */
export type BatchSource = (step: number) => Batch | Promise<Batch>;

/** Checkpoints of a run: sharded, written in the background, loadable under any other layout. */
export interface CheckpointOptions {
  /** Directory the checkpoints go to (`dir/step-N/`); leave it out to only resume. */
  dir?: string;
  /** Save after every `every` steps (default 50) and after the last step (when `steps` is known). */
  every?: number;
  /** Complete checkpoints kept (default 3). */
  keep?: number;
  /**
   * Start from the newest complete checkpoint: 'auto' under `dir`, or under the directory given. A
   * damaged one is skipped for the one before it; with none, the run starts at step 0. Default: no resume.
   */
  resume?: 'auto' | string | false;
}

/** A learning-rate schedule: a constant, a function of the step (0-based), or nanoGPT's cosine with linear warm-up. */
export type LearningRate = number | ((step: number) => number) | (Omit<CosineWithWarmupOptions, 'maxSteps'> & {
  /** Step at which the cosine reaches minLr (default: the run's steps). */
  maxSteps?: number;
});

/** The options of {@link setup}. */
export interface TrainSetupOptions<H extends { lr: number }> {
  /**
   * Builds the model on every rank: `(shard) => new nt.nn.GPT(config, shard)`,
   * `(shard) => new nt.nn.Llama(config, shard)`, or any model family's CausalLM (docs/architecture.md,
   * "Adding a model family"), built with the shard's options (its tensor-parallel layers, device and seed).
   */
  model: (shard: ModelShard) => CausalLM;
  /** Builds the optimizer from parameter groups (ZeRO passes this rank's shards): `(groups) => new nt.optim.AdamW(groups, {...})`. */
  optimizer: (groups: ZeroParamGroup<H>[]) => Optimizer<H>;
  /** Sequences per step over all data-parallel ranks (the global batch). */
  batchSize: number;
  /** Tokens per sequence (default: the model's blockSize). */
  seqLen?: number;
  /**
   * The parallel layout. Default: read from the command line (`--tp 2 --pp 2 --dp 2 --zero 1 --sp
   * --micro-batches 4 --schedule 1f1b --offload --recompute`) over the environment (NODETRON_TP …),
   * see {@link layoutFromArgs}; dp defaults to what the world leaves.
   */
  layout?: LayoutArgs;
  /** Where the layout flags are read from when `layout` is not given (default process.argv.slice(2)). */
  argv?: readonly string[];
  /** Training data: token shards (the run builds a TokenLoader per rank), or a source of global batches. Without it, pass batches to step(). */
  data?: TokenData | BatchSource;
  /** Total optimizer steps, when known: for ETA, the cosine schedule's end, the last checkpoint and evaluation. */
  steps?: number;
  /** Learning rate per step (default: whatever the optimizer was built with). */
  lr?: LearningRate;
  /** Clip the gradient norm of the whole model to this (default: no clipping). */
  maxGradNorm?: number;
  /**
   * Parameter groups from the model's named parameters (this rank's part). Default: nanoGPT's,
   * weight decay on matrices except the position table, none (`weightDecay: 0`) on the rest.
   */
  paramGroups?: (named: Array<[string, Parameter]>) => ZeroParamGroup<H>[];
  /** Initialization (and default data) seed (default 1337). */
  seed?: number;
  /** Device of the model and batches (default 'cpu'). */
  device?: string;
  /** Checkpoints. */
  checkpoint?: CheckpointOptions;
  /** Progress lines on rank 0 (default every 10 steps to console.log); false: none. */
  progress?: ProgressOptions | false;
  /** Gradient bucket size in bytes (data-parallel and ZeRO 1/2 communication). */
  bucketBytes?: number;
  /**
   * In-job recovery (default: `--recover` / NODETRON_RECOVER, else 'off'). 'memory': after every step
   * each rank's state is copied to another process's memory; when a rank is lost the job goes on
   * without a restart (a replacement takes its place from that copy, every rank rolls back to the last
   * step all hold). Needs `nodetron launch --spares N`. See docs/recovery.md.
   */
  recover?: 'memory' | 'off';
  /**
   * In-job recovery: copy the state every N steps (default: `--recover-every`, else 1). Each copy costs
   * a pass over the rank's state and its transfer (docs/recovery.md has the measured cost); a lost rank
   * then costs up to N steps.
   */
  recoverEvery?: number;
}

// Errors every rank throws together (after agreeing): main() lets every rank print before leaving.
export const collectiveErrors = new WeakSet<object>();

/**
 * Every rank's problems in one decision: with more than one process the ranks agree (collective
 * over `world`) and all throw, naming this rank's problems or the ranks that had some; with
 * `settings`, ranks started with different ones all throw too.
 */
export async function agreeOnSetup(world: ProcessGroup | null, problems: string[], what: string, settings?: string): Promise<void> {
  try {
    await agreeAll(world, problems.length > 0 ? new ArgumentError(`nt.train.setup: ${problems.join('; ')}`) : null, {
      failedElsewhere: (ranks) => new ArgumentError(`nt.train.setup: ${what} rejected on ${ranks} (see the error there); every rank stops`),
      ...(settings === undefined ? {} : { settings, mismatch: () => new ArgumentError(`nt.train.setup: the ranks were started with different ${what} (this rank: ${settings})`) }),
    });
  } catch (e) {
    if (world && world.size > 1) collectiveErrors.add(e as object);
    throw e;
  }
}

export const isInt = (v: unknown, min: number) => typeof v === 'number' && Number.isInteger(v) && v >= min;

/** What {@link checkOptions} found: the problems (every rank reports them together), the layout flags and the layout. */
export interface CheckedOptions {
  problems: string[];
  flags: LayoutArgs;
  /** The layout against the world and the batch (the model's shape is checked once it is built); null when rejected. */
  layout: TrainingLayout | null;
}

/** Step 1: the options alone, before any process is joined or anything is built. */
export function checkOptions<H extends { lr: number }>(options: TrainSetupOptions<H>, worldSize: number): CheckedOptions {
  const problems: string[] = [];
  if (typeof options !== 'object' || options === null) throw new ArgumentError('nt.train.setup: options must be an object');
  if (typeof options.model !== 'function') problems.push('model must be a function (shard) => new nt.nn.GPT(config, shard) (or nt.nn.Llama)');
  if (typeof options.optimizer !== 'function') problems.push('optimizer must be a function (groups) => new nt.optim.AdamW(groups, ...)');
  if (!isInt(options.batchSize, 1)) problems.push(`batchSize (the global batch, in sequences) must be an integer >= 1, got ${String(options.batchSize)}`);
  if (options.steps !== undefined && !isInt(options.steps, 0)) problems.push(`steps must be an integer >= 0, got ${String(options.steps)}`);
  if (options.seqLen !== undefined && !isInt(options.seqLen, 1)) problems.push(`seqLen must be an integer >= 1, got ${String(options.seqLen)}`);
  if (options.maxGradNorm !== undefined && !(options.maxGradNorm > 0)) problems.push(`maxGradNorm must be > 0, got ${String(options.maxGradNorm)}`);
  const ck = options.checkpoint;
  if (ck) {
    if (ck.every !== undefined && !isInt(ck.every, 1)) problems.push(`checkpoint.every must be an integer >= 1, got ${String(ck.every)}`);
    if (ck.keep !== undefined && !isInt(ck.keep, 1)) problems.push(`checkpoint.keep must be an integer >= 1, got ${String(ck.keep)}`);
    if (ck.resume === 'auto' && !ck.dir) problems.push("checkpoint.resume 'auto' resumes from checkpoint.dir; give the directory (--save DIR)");
  }
  const data = options.data;
  if (data !== undefined && typeof data !== 'function' && (typeof data !== 'object' || !Array.isArray(data.train) || data.train.length === 0)) {
    problems.push('data must be { train: [token shard files], val?: [...] } or a function (step) => ({ inputs, targets })');
  }
  if (data && typeof data === 'object' && data.evalEvery !== undefined && !isInt(data.evalEvery, 1)) problems.push(`data.evalEvery must be an integer >= 1, got ${String(data.evalEvery)}`);
  if (data && typeof data === 'object' && data.evalBatches !== undefined && !isInt(data.evalBatches, 1)) problems.push(`data.evalBatches must be an integer >= 1, got ${String(data.evalBatches)}`);
  const progress = options.progress;
  if (progress && progress.every !== undefined && !isInt(progress.every, 1)) problems.push(`progress.every must be an integer >= 1, got ${String(progress.every)}`);
  const lr = options.lr;
  if (lr !== undefined && typeof lr === 'object' && lr.maxSteps === undefined && options.steps === undefined) problems.push('lr: a cosine schedule needs maxSteps, or the run\'s steps');
  let flags: LayoutArgs = {};
  try { flags = options.layout ?? layoutFromArgs(options.argv ?? process.argv.slice(2)); } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    problems.push(e.message);
  }
  const rec = options.recover ?? flags.recover;
  if (rec !== undefined && rec !== 'memory' && rec !== 'off') problems.push(`recover must be 'memory' or 'off', got ${JSON.stringify(rec)}`);
  const every = options.recoverEvery ?? flags.recoverEvery;
  if (every !== undefined && !isInt(every, 1)) problems.push(`recoverEvery must be an integer >= 1, got ${String(every)}`);
  if (rec === 'memory' && worldSize < 2) problems.push("recover 'memory' keeps each rank's state in another process: run under `nodetron launch --spares N` with at least 2 processes");
  // The layout against the world and the batch now (the model's shape is checked once it is built).
  const tp0 = isInt(flags.tp, 1) ? flags.tp! : 1, pp0 = isInt(flags.pp, 1) ? flags.pp! : 1;
  // (A probe that passes the model checks: with virtual stages, one layer per model chunk; with cp, a
  // sequence and heads that split; with ep, experts that split.)
  const v0 = flags.schedule === 'zb-v' ? 2 : isInt(flags.virtualStages, 1) ? flags.virtualStages! : 1;
  const cp0 = isInt(flags.cp, 1) ? flags.cp! : 1;
  const probe: LayoutModelShape = { nLayer: pp0 * v0, nHead: tp0 * cp0, nEmbd: tp0 * cp0, vocabSize: tp0, blockSize: tp0 * 2 * cp0,
    ...(isInt(flags.ep, 1) ? { moeExperts: flags.ep } : {}) };
  let layout: TrainingLayout | null = null;
  if (problems.length === 0) {
    try { layout = resolveTrainingLayout(flags, probe, worldSize, options.batchSize); } catch (e) {
      if (!(e instanceof ArgumentError)) throw e;
      problems.push(e.message);
    }
  }
  return { problems, flags, layout };
}
