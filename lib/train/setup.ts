// nt.train.setup: one entry point for training a GPT under any TP × PP × DP × ZeRO layout. It reads the
// layout (options, command line or environment), joins the job, builds this rank's part of the model
// (tensor-parallel options, pipeline stage), the ParallelTrainer, the data loader wired to the data-
// and tensor-parallel ranks, the learning-rate schedule and the checkpoints (model, optimizer, data
// position, schedule, random generators, layout), and returns a TrainingRun: step, evaluate, save,
// resume, generate, export, close. Progress lines (loss, tokens/s, MFU, memory, ETA) go out on rank 0.
import * as dist from '../distributed/init.js';
import { readLaunchEnv } from '../distributed/env.js';
import type { ProcessGroup } from '../distributed/group.js';
import { tensor } from '../creation.js';
import { ArgumentError, StateError } from '../errors.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { slice } from '../ops/index.js';
import { GPT, type CausalLM, type GenerateOptions, type GPTOptions } from '../nn/gpt.js';
import { Llama } from '../nn/llama.js';
import type { Parameter } from '../nn/module.js';
import type { Optimizer } from '../optim/optimizer.js';
import { cosineWithWarmup, type CosineWithWarmupOptions } from '../optim/schedule.js';
import { batchSlice, describeLayout, resolveTrainingLayout, type LayoutModelShape, type TrainingLayout } from '../parallel/layout.js';
import { destroyParallel, initializeParallel, isParallelInitialized, type ParallelState } from '../parallel/mesh.js';
import { agreeAll, agreeMax } from '../distributed/agree.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { schedulePlacement } from '../parallel/pipeline/schedules.js';
import { tensorParallelGPTOptions } from '../parallel/tensor-parallel/gpt.js';
import { contextParallelLayout } from '../parallel/context-parallel/gpt.js';
import { expertParallel } from '../parallel/expert-parallel.js';
import type { MoEStats } from '../nn/moe.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import type { ZeroParamGroup } from '../parallel/zero/optimizer.js';
import { Checkpointer, type SaveResult } from '../ckpt/checkpoint.js';
import type { CheckpointItems } from '../ckpt/items.js';
import type { LoadResult } from '../ckpt/load.js';
import { TokenLoader } from '../data/loader.js';
import { exportHF } from '../interop/hf-auto.js';
import type { Tensor } from '../tensor.js';
import { layoutFromArgs, type LayoutArgs } from './flags.js';
import { detectPeakFlops, formatProgress, modelFlopsPerToken, type MoEProgress, type ProgressOptions } from './progress.js';

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
   * Builds the model on every rank: `(shard) => new nt.nn.GPT(config, shard)` or
   * `(shard) => new nt.nn.Llama(config, shard)`. It must return an nt.nn.GPT or nt.nn.Llama built
   * with the shard's options (its tensor-parallel layers, device and seed).
   */
  model: (shard: ModelShard) => GPT | Llama;
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
}

/** What one step did. */
export interface StepResult {
  /** Steps done after this one (1-based number of the step). */
  step: number;
  /** The loss of the global batch (the same on every rank). */
  loss: number;
  /** The global gradient norm before clipping (when maxGradNorm is set). */
  gradNorm?: number;
  /** The learning rate used (when the run sets one). */
  lr?: number;
  /** The validation loss, when this step evaluated (TokenData.evalEvery). */
  valLoss?: number;
  /** The checkpoint saved after this step, if any. */
  saved?: SaveResult;
  /** MoE routing of the step on this rank (models with MoE layers; see ParallelTrainer's step result). */
  moe?: MoEStats;
}

// Errors every rank throws together (after agreeing): main() lets every rank print before leaving.
const collectiveErrors = new WeakSet<object>();

/**
 * Every rank's problems in one decision: with more than one process the ranks agree (collective
 * over `world`) and all throw, naming this rank's problems or the ranks that had some; with
 * `settings`, ranks started with different ones all throw too.
 */
async function agreeOnSetup(world: ProcessGroup | null, problems: string[], what: string, settings?: string): Promise<void> {
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

/** nanoGPT's grouping: weight decay on matrices except the position table, none on biases, LayerNorms and positions. */
function nanoGPTGroups<H extends { lr: number }>(named: Array<[string, Parameter]>): ZeroParamGroup<H>[] {
  const decay = named.filter(([n, p]) => p.ndim >= 2 && n !== 'wpe.weight').map(([, p]) => p);
  const decaySet = new Set(decay);
  return [{ params: decay } as unknown as ZeroParamGroup<H>, { params: named.map(([, p]) => p).filter((p) => !decaySet.has(p)), weightDecay: 0 } as unknown as ZeroParamGroup<H>];
}

const isInt = (v: unknown, min: number) => typeof v === 'number' && Number.isInteger(v) && v >= min;

/**
 * What set-up has built so far, released by one path, last built first: a set-up that fails after
 * building anything runs it, and so does {@link TrainingRun.close}. Every release runs even when one
 * throws; the first error is thrown after the rest.
 */
class Teardown {
  #releases: Array<() => void | Promise<void>> = [];

  /** Registers a release (run before the ones registered earlier). */
  add(release: () => void | Promise<void>): void { this.#releases.push(release); }

  /** Runs every release once, last registered first. */
  async run(): Promise<void> {
    const releases = this.#releases.reverse();
    this.#releases = [];
    let failure: { error: unknown } | null = null;
    for (const release of releases) {
      try { await release(); } catch (e) { failure ??= { error: e }; }
    }
    if (failure) throw failure.error;
  }
}

/** What {@link checkOptions} found: the problems (every rank reports them together), the layout flags and the layout. */
interface CheckedOptions {
  problems: string[];
  flags: LayoutArgs;
  /** The layout against the world and the batch (the model's shape is checked once it is built); null when rejected. */
  layout: TrainingLayout | null;
}

/** Step 1: the options alone, before any process is joined or anything is built. */
function checkOptions<H extends { lr: number }>(options: TrainSetupOptions<H>, worldSize: number): CheckedOptions {
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

/** This rank's part of the model and its trainer: what {@link buildParallelState} returns. */
interface ParallelParts<H extends { lr: number }> {
  mesh: ParallelState | null;
  /** The options the model factory received (a copy of the whole model is built with the same). */
  shard: ModelShard;
  full: CausalLM;
  stage: GPTStage;
  trainer: ParallelTrainer<H>;
  seqLen: number;
}

/**
 * Step 2: the mesh, this rank's model shard (built once), the GPT, its pipeline stage and the trainer.
 * Each is registered with `teardown` as soon as it exists.
 */
async function buildParallelState<H extends { lr: number }>(options: TrainSetupOptions<H>, flags: LayoutArgs, layout: TrainingLayout,
  worldSize: number, world: ProcessGroup | null, teardown: Teardown): Promise<ParallelParts<H>> {
  const mesh = world ? await initializeParallel({ tp: layout.tp, pp: layout.pp, dp: layout.dp, ...(layout.cp ? { cp: layout.cp } : {}), ...(layout.ep ? { ep: layout.ep } : {}) }) : null;
  if (mesh) teardown.add(() => { if (isParallelInitialized()) destroyParallel(); });

  // This rank's model: the tensor-parallel slices of its group, the layers of its pipeline stage.
  const shard: ModelShard = {
    seed: options.seed ?? 1337, device: options.device ?? 'cpu',
    ...(mesh && layout.tp > 1 ? tensorParallelGPTOptions(mesh.tpGroup, { sequenceParallel: layout.sequenceParallel }) : {}),
    ...(flags.recompute ? { recompute: true } : {}),
    ...(mesh && mesh.cpSize > 1 ? { contextLayout: contextParallelLayout(mesh.cpGroup, layout.cpMode) } : {}),
    // MoE layers: the experts split over the expert-parallel group, router counts summed over the data-parallel ranks.
    ...(mesh ? { moeParallel: (experts: number) => expertParallel({ experts, epGroup: mesh.epGroup, countGroup: mesh.dpGroup }) } : {}),
  };
  const problems: string[] = [];
  let full: CausalLM | null = null;
  // The model's owner: the GPT or Llama, then the pipeline stage that takes it over.
  let owner: { dispose(): void } | null = null;
  teardown.add(() => owner?.dispose());
  try {
    const built: unknown = options.model(shard);
    if (!(built instanceof GPT || built instanceof Llama)) {
      const what = built === null || typeof built !== 'object' ? String(built) : (built.constructor?.name ?? 'an object');
      problems.push(`model: the factory must return an nt.nn.GPT or nt.nn.Llama (shard) => new nt.nn.GPT(config, shard), got ${what}`);
      if (built && typeof (built as { dispose?: unknown }).dispose === 'function') (built as { dispose(): void }).dispose();
    } else {
      full = owner = built;
      if (shard.vocabLayout && full.vocabLayout !== shard.vocabLayout) problems.push('model: the factory must pass its shard argument to the GPT (new nt.nn.GPT(config, shard)): tp > 1 needs its tensor-parallel layers');
      if (shard.contextLayout && full.contextLayout !== shard.contextLayout) problems.push('model: the factory must pass its shard argument to the GPT (new nt.nn.GPT(config, shard)): cp > 1 needs its context-parallel attention');
    }
  } catch (e) {
    problems.push(`model: the factory threw ${(e as Error).name}: ${(e as Error).message}`);
  }
  const seqLen = options.seqLen ?? full?.shape.blockSize ?? 0;
  if (full) {
    // The model's shape carries what the layout checks need (window, dropout, MoE experts), whatever the family.
    if (seqLen > full.shape.blockSize) problems.push(`seqLen ${seqLen} exceeds the model's blockSize ${full.shape.blockSize}`);
    try { resolveTrainingLayout(flags, { ...full.shape, blockSize: seqLen }, worldSize, options.batchSize); } catch (e) {
      if (!(e instanceof ArgumentError)) throw e;
      problems.push(e.message);
    }
  }
  const c = full?.shape;
  await agreeOnSetup(world, problems, 'model', c ? `${full!.family} layers=${c.nLayer} heads=${c.nHead}/${c.nKvHead} width=${c.nEmbd} ffn=${c.ffnHidden} vocab=${c.vocabSize} ctx=${seqLen}` : 'rejected');

  const stage = owner = new GPTStage(full!, mesh?.ppRank ?? 0, layout.pp, layout.virtualStages, schedulePlacement(layout.schedule));
  let trainer: ParallelTrainer<H>;
  try {
    const groups = (options.paramGroups ?? nanoGPTGroups<H>)(stage.namedParameters());
    trainer = await ParallelTrainer.create<H>(stage, groups, {
      mesh, zero: layout.zero, offload: layout.offload, microBatches: layout.microBatches, schedule: layout.schedule, createOptimizer: options.optimizer,
      ...(layout.cpMode ? { cpMode: layout.cpMode } : {}),
      ...(flags.precision ? { precision: flags.precision } : {}),
      ...(options.maxGradNorm !== undefined ? { maxGradNorm: options.maxGradNorm } : {}), ...(options.bucketBytes ? { bucketBytes: options.bucketBytes } : {}),
    });
  } catch (e) {
    if (e instanceof ArgumentError && world) collectiveErrors.add(e);
    throw e;
  }
  teardown.add(() => trainer.dispose());
  return { mesh, shard, full: full!, stage, trainer, seqLen };
}

/** Step 3: this replica's data loader (null without token shards), its validation shards checked; registered with `teardown`. */
async function buildLoader<H extends { lr: number }>(options: TrainSetupOptions<H>, parts: ParallelParts<H>, layout: TrainingLayout,
  rows: { start: number; count: number }, world: ProcessGroup | null, teardown: Teardown): Promise<TokenLoader | null> {
  // One reader per tensor-parallel group.
  const { mesh, seqLen, shard: { seed, device } } = parts;
  const data = options.data, problems: string[] = [];
  let loader: TokenLoader | null = null;
  const loaderBase = { batchSize: rows.count, seqLen, dpRank: mesh?.dpRank ?? 0, dpSize: layout.dp, tpGroup: mesh?.tpGroup ?? null, device };
  if (data && typeof data === 'object') {
    try {
      loader = new TokenLoader({ ...loaderBase, files: data.train, seed: data.seed ?? seed, ...(data.shuffle !== undefined ? { shuffle: data.shuffle } : {}) });
      if (data.val) new TokenLoader({ ...loaderBase, files: data.val, seed: data.evalSeed ?? 7 }).close();
    } catch (e) {
      if (!(e instanceof ArgumentError || (e as NodeJS.ErrnoException).code === 'ENOENT' || e instanceof StateError)) throw e;
      problems.push(`data: ${(e as Error).message}`);
    }
  }
  if (loader) { const l = loader; teardown.add(() => l.close()); }
  await agreeOnSetup(world, problems, 'data');
  return loader;
}

/**
 * Sets up training of a GPT under the layout of the options, the command line or the environment:
 * joins the job (under `nodetron launch`), builds this rank's part of the model, the trainer, the data
 * loader, the schedule and the checkpoints, and resumes when asked. Collective: every rank calls it
 * with the same options. Bad input (a layout that does not fit the model, the world or the batch, a
 * flag without a value, a factory that does not return a GPT, missing data files...) throws an
 * ArgumentError on every rank before any training; {@link main} prints it and leaves the job.
 *
 * @example
 * ```ts
 * const run = await nt.train.setup({
 *   model: (shard) => new nt.nn.GPT(config, shard),
 *   optimizer: (groups) => new nt.optim.AdamW(groups, { lr: 3e-3, weightDecay: 0.1 }),
 *   batchSize: 8, steps: 100, data: { train: ['data/tok_train_000001.bin'] }, maxGradNorm: 1,
 * });
 * while (run.stepsDone < 100) await run.step();
 * await run.close();
 * ```
 */
export async function setup<H extends { lr: number }>(options: TrainSetupOptions<H>): Promise<TrainingRun<H>> {
  // 1. Validate the options.
  const env = readLaunchEnv();
  const { problems, flags, layout } = checkOptions(options, env.worldSize);
  // Join the job first, so every rank hears about any rank's problem.
  let world: ProcessGroup | null = null;
  if (env.worldSize > 1) {
    await dist.init();
    world = dist.world();
  }
  const settings = layout ? `${describeLayout(layout)}${flags.recompute ? ' recompute' : ''}${flags.precision === 'bf16' ? ' bf16' : ''}; batch ${options.batchSize}` : 'rejected';
  await agreeOnSetup(world, problems, 'layout flags', settings);
  const l = layout!;

  // Everything built from here on is released by `teardown`: on any failure below, and by TrainingRun.close.
  const teardown = new Teardown();
  try {
    // 2. Build the parallel state once: mesh, model shard, GPT, stage, trainer.
    const parts = await buildParallelState(options, flags, l, env.worldSize, world, teardown);
    // 3. Wire: this replica's rows and data, the run (schedule, checkpoints), the resume.
    const rows = batchSlice(options.batchSize, parts.mesh?.dpRank ?? 0, l.dp);
    const loader = await buildLoader(options, parts, l, rows, world, teardown);
    const run = new TrainingRun<H>(options, { ...parts, layout: l, rank: env.rank, worldSize: env.worldSize, loader, rows, teardown });
    const ck = options.checkpoint;
    if (ck?.resume) await run.resume(ck.resume === 'auto' ? ck.dir! : ck.resume);
    // The peak from here on is training's (weights, gradients, optimizer state, activations), not set-up's.
    resetPeakMemory(parts.shard.device);
    return run;
  } catch (e) {
    // The set-up's error is the one to report; a release that fails too is not.
    await teardown.run().catch(() => {});
    throw e;
  }
}

interface RunParts<H extends { lr: number }> extends ParallelParts<H> {
  layout: TrainingLayout;
  rank: number;
  worldSize: number;
  loader: TokenLoader | null;
  rows: { start: number; count: number };
  /** Releases everything set-up built; the run adds its checkpointer. */
  teardown: Teardown;
}

/**
 * A training run as {@link setup} built it, on one rank. Every method that trains, evaluates, saves
 * or gathers is collective: every rank calls it in the same order.
 */
export class TrainingRun<H extends { lr: number }> {
  /** The checked layout. */
  readonly layout: TrainingLayout;
  /** This process's rank in the job (0 without a launcher). */
  readonly rank: number;
  /** Processes in the job. */
  readonly worldSize: number;
  /** The mesh (null in one process). */
  readonly mesh: ParallelState | null;
  /** This rank's part of the model: its pipeline stage (of its tensor-parallel slices). */
  readonly model: GPTStage;
  /** The model the factory built, a GPT or a Llama (the stage holds its parameters; its generator is checkpointed). */
  readonly gpt: CausalLM;
  /** The trainer of the layout. */
  readonly trainer: ParallelTrainer<H>;
  /** The training data loader (null without token shards). */
  readonly loader: TokenLoader | null;
  /** Tokens per sequence. */
  readonly seqLen: number;
  /** Sequences per step, over all data-parallel ranks. */
  readonly batchSize: number;
  /** Total steps, when known. */
  readonly steps: number | undefined;
  /** Device of the model and batches. */
  readonly device: string;
  /** Model FLOPs per trained token ({@link modelFlopsPerToken}). */
  readonly flopsPerToken: number;
  /** This data-parallel replica's rows [start, start + count) of each global batch. */
  readonly rows: {
    /** The first row. */
    start: number;
    /** Rows per step (batchSize / dp). */
    count: number;
  };
  readonly #options: TrainSetupOptions<H>;
  /** The options the model factory received (seed, device, tensor-parallel layers, recomputation). */
  readonly #shard: ModelShard;
  /** Releases what set-up built (and the checkpointer): on close. */
  readonly #teardown: Teardown;
  readonly #checkpointer: Checkpointer | null;
  readonly #items: CheckpointItems;
  readonly #log: (line: string) => void;
  readonly #every: number;
  readonly #peakFlops: number | undefined;
  #step = 0;
  #avg: number | undefined;
  #timing: { t0: number; from: number } | null = null;
  #closed = false;

  /** @internal Built by {@link setup}. */
  constructor(options: TrainSetupOptions<H>, parts: RunParts<H>) {
    this.#options = options;
    this.layout = parts.layout; this.rank = parts.rank; this.worldSize = parts.worldSize; this.mesh = parts.mesh;
    this.model = parts.stage; this.gpt = parts.full; this.trainer = parts.trainer; this.loader = parts.loader;
    this.seqLen = parts.seqLen; this.rows = parts.rows; this.#shard = parts.shard; this.device = parts.shard.device; this.#teardown = parts.teardown;
    this.batchSize = options.batchSize; this.steps = options.steps;
    this.flopsPerToken = modelFlopsPerToken(this.gpt, this.seqLen);
    const progress = options.progress;
    const print = progress === false ? () => {} : progress?.log ?? ((line: string) => console.log(line));
    this.#log = this.rank === 0 ? print : () => {};
    this.#every = progress ? progress.every ?? 10 : 10;
    this.#peakFlops = (progress ? progress.peakFlops : undefined) ?? detectPeakFlops(this.device);
    const ck = options.checkpoint;
    const checkpointer = this.#checkpointer = ck?.dir ? new Checkpointer(ck.dir, { keep: ck.keep ?? 3 }) : null;
    // Released first: the checkpoint in flight finishes before the model it was taken from goes.
    if (checkpointer) this.#teardown.add(() => checkpointer.close());
    const scheduler = { state: () => ({ step: this.#step }), loadState: () => {} };
    this.#items = { model: this.trainer, ...(this.loader ? { loader: this.loader } : {}), scheduler, rng: { model: this.gpt.generator }, layout: this.layout };
    const c = this.gpt.shape;
    const heads = c.nKvHead === c.nHead ? `${c.nHead} heads` : `${c.nHead} heads (${c.nKvHead} kv)`;
    this.log(`${this.gpt.family === 'gpt' ? 'GPT' : 'Llama'}: ${c.nLayer} layers, ${heads}, width ${c.nEmbd}, ctx ${this.seqLen}, vocab ${c.vocabSize}; ` +
      `${(this.model.numParameters() / 1e6).toFixed(2)}M parameters${this.layout.tp * this.layout.pp > 1 ? ' on rank 0 (its part of the model)' : ''} on ${this.device}`);
    this.log(`layout ${describeLayout(this.layout)}: ${this.worldSize} process(es), ${this.rows.count} sequences per replica per step` +
      (this.layout.pp > 1 ? `, layers ${this.model.layers[0]}..${this.model.layers[1] - 1} on rank 0` : ''));
  }

  /** Steps done (the next step's 0-based index): 0 at the start, the checkpoint's step after a resume. */
  get stepsDone(): number { return this.#step; }

  /** Whether this rank prints (rank 0, unless progress is off). */
  get isLogger(): boolean { return this.rank === 0; }

  /** Prints a line on rank 0 (through the progress log; nothing when progress is off). */
  log(line: string): void { this.#log(line); }

  /** The learning rate of step `step` (0-based), or undefined when the run leaves it to the optimizer. */
  lrAt(step: number): number | undefined {
    const lr = this.#options.lr;
    if (lr === undefined) return undefined;
    if (typeof lr === 'number') return lr;
    if (typeof lr === 'function') return lr(step);
    return cosineWithWarmup(step, { ...lr, maxSteps: lr.maxSteps ?? this.steps! });
  }

  /** This replica's rows of a global batch (the caller owns the returned tensors when they are new). */
  #rowsOf(batch: Batch, release: Tensor[]): Batch {
    const { inputs, targets } = batch;
    if (!inputs || !targets || typeof inputs.shape !== 'object' || typeof targets.shape !== 'object') throw new ArgumentError('TrainingRun: a batch is { inputs, targets }, two int32 [batchSize, seqLen] tensors');
    if (inputs.ndim !== 2 || inputs.shape[0] !== this.batchSize || targets.ndim !== 2 || targets.shape[0] !== this.batchSize || targets.shape[1] !== inputs.shape[1]) {
      throw new ArgumentError(`TrainingRun: a batch must be the global batch, [${this.batchSize}, T] inputs and targets (every rank passes the same one; the run takes this replica's rows), got ${inputs.describe()} and ${targets.describe()}`);
    }
    if (this.layout.dp === 1) return { inputs, targets };
    const { start, count } = this.rows;
    const mine = { inputs: slice(inputs, 0, start, start + count), targets: slice(targets, 0, start, start + count) };
    release.push(mine.inputs, mine.targets);
    return mine;
  }

  /**
   * One optimizer step. With a batch: the global batch ([batchSize, seqLen] on every rank; the run
   * trains this replica's rows). Without: the next batch of the run's data. Then, as configured:
   * the learning rate of the step, a progress line, a validation loss, a checkpoint.
   */
  async step(batch?: Batch): Promise<StepResult> {
    if (this.#closed) throw new StateError('TrainingRun.step: the run is closed');
    const index = this.#step;
    // Tensors this step made (slices, loaded batches), released after it.
    const release: Tensor[] = [];
    let local: Batch;
    if (batch) local = this.#rowsOf(batch, release);
    else if (this.loader) { local = await this.loader.next(); release.push(local.inputs, local.targets); }
    else if (typeof this.#options.data === 'function') {
      const global = await this.#options.data(index);
      release.push(global.inputs, global.targets);
      local = this.#rowsOf(global, release);
    } else throw new ArgumentError('TrainingRun.step: no batch given and the run has no data (give setup a data option, or pass step({ inputs, targets }))');
    this.#timing ??= { t0: performance.now(), from: index };
    const lr = this.lrAt(index);
    let r;
    try {
      r = await this.trainer.step(local.inputs, local.targets, lr === undefined ? {} : { lr });
    } finally {
      for (const t of release) t.dispose();
    }
    this.#step = index + 1;
    const result: StepResult = { step: this.#step, loss: r.loss, ...(r.gradNorm !== undefined ? { gradNorm: r.gradNorm } : {}), ...(lr !== undefined ? { lr } : {}), ...(r.moe ? { moe: r.moe } : {}) };
    this.#avg = this.#avg === undefined ? r.loss : 0.9 * this.#avg + 0.1 * r.loss;
    const last = this.steps !== undefined && this.#step === this.steps;
    if (index % this.#every === 0 || last) this.log(this.#progressLine(result));
    const data = this.#options.data;
    if (data && typeof data === 'object' && data.val && data.evalEvery && (this.#step % data.evalEvery === 0 || last)) {
      result.valLoss = await this.evaluate();
      this.log(`step ${this.#step}: val loss ${result.valLoss.toFixed(4)}`);
    }
    const every = this.#options.checkpoint?.every ?? 50;
    if (this.#checkpointer && (this.#step % every === 0 || last)) result.saved = await this.save();
    return result;
  }

  #progressLine(r: StepResult): string {
    const elapsed = (performance.now() - this.#timing!.t0) / 1000;
    const done = r.step - this.#timing!.from;
    const tokensPerSecond = (done * this.batchSize * this.seqLen) / elapsed;
    const mfu = this.#peakFlops ? (tokensPerSecond * this.flopsPerToken) / (this.#peakFlops * this.worldSize) : undefined;
    return formatProgress({
      step: r.step, ...(this.steps !== undefined ? { steps: this.steps, etaSeconds: (elapsed / done) * (this.steps - r.step) } : {}),
      loss: r.loss, avgLoss: this.#avg!, ...(r.gradNorm !== undefined ? { gradNorm: r.gradNorm } : {}), ...(r.lr !== undefined ? { lr: r.lr } : {}),
      tokensPerSecond, ...(mfu !== undefined ? { mfu } : {}), peakBytes: memoryStats(this.device).peak, ...(r.moe ? { moe: moeProgress(r.moe) } : {}),
    });
  }

  /**
   * The mean loss over validation batches without gradients, on every rank. With no argument: the
   * data's `val` shards, the same windows every time (`evalBatches` of them). Or a number of batches
   * from there, or global batches to evaluate.
   */
  async evaluate(batches?: number | Batch[]): Promise<number> {
    if (Array.isArray(batches)) {
      if (batches.length === 0) throw new ArgumentError('TrainingRun.evaluate: no batches');
      let total = 0;
      for (const b of batches) {
        const release: Tensor[] = [];
        try {
          const local = this.#rowsOf(b, release);
          total += await this.trainer.evaluate(local.inputs, local.targets);
        } finally { for (const t of release) t.dispose(); }
      }
      return total / batches.length;
    }
    const data = this.#options.data;
    if (!data || typeof data !== 'object' || !data.val) throw new ArgumentError('TrainingRun.evaluate: the run has no validation shards (data.val); pass batches to evaluate');
    const n = batches ?? data.evalBatches ?? 4;
    if (!isInt(n, 1)) throw new ArgumentError(`TrainingRun.evaluate: the number of batches must be an integer >= 1, got ${n}`);
    const val = new TokenLoader({
      batchSize: this.rows.count, seqLen: this.seqLen, dpRank: this.mesh?.dpRank ?? 0, dpSize: this.layout.dp,
      tpGroup: this.mesh?.tpGroup ?? null, device: this.device, files: data.val, seed: data.evalSeed ?? 7,
    });
    try {
      let total = 0;
      for (let i = 0; i < n; i++) {
        const { inputs, targets } = await val.next();
        try { total += await this.trainer.evaluate(inputs, targets); } finally { inputs.dispose(); targets.dispose(); }
      }
      return total / n;
    } finally { val.close(); }
  }

  /**
   * Saves a checkpoint of the current step (model, optimizer, data position, schedule, random
   * generators, layout) under checkpoint.dir, written in the background; the line goes to the log.
   */
  async save(): Promise<SaveResult> {
    if (!this.#checkpointer) throw new ArgumentError('TrainingRun.save: the run has no checkpoint directory (setup({ checkpoint: { dir } }))');
    const saved = await this.#checkpointer.save(this.#step, this.#items);
    this.log(`checkpoint step ${this.#step}: training held ${saved.stallMs.toFixed(1)} ms, writing ${saved.dir} in the background`);
    return saved;
  }

  /**
   * Loads the newest complete checkpoint under `dir` (any layout's) and continues from its step;
   * returns null (and starts from where it is) when there is none.
   */
  async resume(dir: string): Promise<LoadResult | null> {
    const loaded = await new Checkpointer(dir).loadLatest(this.#items);
    if (loaded) {
      this.#step = loaded.step;
      this.#timing = null;
      this.log(`resumed from ${loaded.dir} (step ${loaded.step}${loaded.optimizerLoaded ? '' : ', no optimizer state'})`);
    } else this.log(`no complete checkpoint under ${dir}: starting from step ${this.#step}`);
    return loaded;
  }

  /**
   * Runs `fn` with the whole model on every rank that can hold it: with one pipeline stage, the GPT
   * (its tensor-parallel slices); under ZeRO 3 a copy gathered from the shards (collective over the
   * data-parallel group, disposed after `fn`). Returns fn's result, or null with pipeline stages
   * (no rank holds every layer; fn is not called). Every rank calls it.
   */
  async withFullModel<T>(fn: (model: CausalLM) => T | Promise<T>): Promise<T | null> {
    const whole = this.model.model;
    if (!whole) return null;
    if (this.layout.zero !== 3) return await fn(whole);
    const values = await this.trainer.fullParameters();
    const copy = this.gpt.rebuild(this.#shard);
    try {
      copy.loadStateDict(Object.fromEntries(this.model.namedParameters().map(([n], i) => [n, values[i]!])));
      for (const v of values) v.dispose();
      return await fn(copy);
    } finally { copy.dispose(); }
  }

  /**
   * Samples `maxNewTokens` tokens after `prompt` (token ids). Collective: every rank calls it; a
   * tensor-parallel group samples together. Returns the prompt and the new tokens on the ranks that
   * sampled (rank 0, and every rank when tp > 1), null elsewhere and with pipeline stages.
   */
  async generate(prompt: readonly number[], maxNewTokens: number, opts: GenerateOptions = {}): Promise<number[] | null> {
    if (!Array.isArray(prompt) || prompt.length === 0) throw new ArgumentError('TrainingRun.generate: prompt must be a non-empty array of token ids');
    return this.withFullModel((gpt) => {
      // MoE layers communicate over the data-parallel ranks (router counts, expert parallelism's
      // all-to-all), so there every rank samples along and rank 0 returns the tokens.
      const together = gpt.shape.moeExperts !== undefined && this.layout.dp > 1;
      if (this.rank !== 0 && this.layout.tp === 1 && !together) return null;
      using idx = tensor(Int32Array.from(prompt), [1, prompt.length], { device: this.device });
      if (!gpt.contextLayout) {
        const tokens = gpt.generate(idx, maxNewTokens, { seed: this.#shard.seed, ...opts })[0]!;
        return together && this.rank !== 0 && this.layout.tp === 1 ? null : tokens;
      }
      // Under context parallelism each rank samples from a copy without it (the same parameters).
      const plain = gpt.rebuild({ ...this.#shard, contextLayout: undefined });
      try {
        plain.loadStateDict(Object.fromEntries(gpt.namedParameters()));
        return plain.generate(idx, maxNewTokens, { seed: this.#shard.seed, ...opts })[0]!;
      } finally { plain.dispose(); }
    });
  }

  /**
   * Writes the model as a Hugging Face directory (GPT-2, or LlamaForCausalLM / MixtralForCausalLM / Qwen2MoeForCausalLM for a Llama) from rank 0 (collective under ZeRO 3).
   * Returns false, writing nothing, when the layout splits the model (tp > 1, pp > 1 or ep > 1).
   */
  async exportHF(dir: string): Promise<boolean> {
    if (this.layout.tp > 1 || this.layout.pp > 1 || (this.layout.ep ?? 1) > 1) return false;
    // A GPT-2 directory for the GPT, a LlamaForCausalLM one for a Llama.
    await this.withFullModel((model) => { if (this.rank === 0) exportHF(model as GPT | Llama, dir); });
    return true;
  }

  /** Finishes the checkpoint in flight, releases the loader, trainer and model, and leaves the job. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    try {
      await this.#teardown.run();
    } finally {
      if (dist.isInitialized()) await dist.destroy();
    }
  }
}

/**
 * Runs a training script's main function and sets the exit code: its return value (default 0); 2 for
 * an ArgumentError (bad flags or options), printed as `name: message` on every rank, which waits for
 * the others when they all failed together (so the launcher shows every rank's error) and leaves the
 * job; 1 for anything else (printed with its stack).
 */
export async function main(name: string, fn: () => Promise<number | void>): Promise<void> {
  try {
    process.exitCode = (await fn()) ?? 0;
  } catch (e) {
    if (!(e instanceof ArgumentError)) {
      console.error(e);
      process.exitCode = 1;
      return;
    }
    console.error(`${name}: ${e.message}`);
    if (dist.isInitialized()) {
      if (collectiveErrors.has(e)) {
        // Every rank failed at the same point: each has printed once all reach here.
        await Promise.race([agreeMax(dist.world(), [1]), new Promise((r) => setTimeout(r, 10_000).unref())]);
      }
      if (isParallelInitialized()) destroyParallel();
      await dist.destroy();
    }
    process.exitCode = 2;
  }
}

/** A step's MoE statistics as the progress line shows them. */
function moeProgress(s: MoEStats): MoEProgress {
  const total = s.tokensPerExpert.reduce((a, b) => a + b, 0);
  const mean = total / Math.max(1, s.tokensPerExpert.length);
  return { auxLoss: s.auxLoss, droppedShare: s.routed > 0 ? s.dropped / s.routed : 0, imbalance: mean > 0 ? Math.max(...s.tokensPerExpert) / mean : 0 };
}
