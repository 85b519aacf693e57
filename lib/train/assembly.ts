// nt.train.setup's assembly: from checked options to this rank's pieces. The mesh, the model the
// factory builds (tensor-parallel slices, pipeline stage), the ParallelTrainer, the data loader wired
// to the data- and tensor-parallel ranks; each registered with one Teardown as soon as it exists, so
// a set-up that fails part-way releases what it built. setup() runs the steps and returns the
// TrainingRun (lib/train/run.ts).
import * as dist from '../distributed/init.js';
import { awaitSpareAssignment } from '../distributed/recovery-env.js';
import { readLaunchEnv } from '../distributed/env.js';
import type { ProcessGroup } from '../distributed/group.js';
import { ArgumentError, StateError } from '../errors.js';
import { resetPeakMemory } from '../memory.js';
import { causalLMProblems, isCausalLM, type CausalLM } from '../nn/causal-lm.js';
import type { Parameter } from '../nn/module.js';
import { batchSlice, describeLayout, resolveTrainingLayout, type TrainingLayout } from '../parallel/layout.js';
import { destroyParallel, initializeParallel, isParallelInitialized, type ParallelState } from '../parallel/mesh.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { schedulePlacement } from '../parallel/pipeline/schedules.js';
import { tensorParallelGPTOptions } from '../parallel/tensor-parallel/gpt.js';
import { contextParallelLayout } from '../parallel/context-parallel/gpt.js';
import { expertParallel } from '../parallel/expert-parallel.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import type { ZeroParamGroup } from '../parallel/zero/optimizer.js';
import { TokenLoader } from '../data/loader.js';
import type { LayoutArgs } from './flags.js';
import { agreeOnSetup, checkOptions, collectiveErrors, type ModelShard, type TrainSetupOptions } from './options.js';
import { TrainingRun, type RunParts } from './run.js';
import { Teardown } from './teardown.js';

/** nanoGPT's grouping: weight decay on matrices except the position table, none on biases, LayerNorms and positions. */
function nanoGPTGroups<H extends { lr: number }>(named: Array<[string, Parameter]>): ZeroParamGroup<H>[] {
  const decay = named.filter(([n, p]) => p.ndim >= 2 && n !== 'wpe.weight').map(([, p]) => p);
  const decaySet = new Set(decay);
  return [{ params: decay } as unknown as ZeroParamGroup<H>, { params: named.map(([, p]) => p).filter((p) => !decaySet.has(p)), weightDecay: 0 } as unknown as ZeroParamGroup<H>];
}

/** This rank's part of the model and its trainer: what {@link buildParallelState} returns. */
export interface ParallelParts<H extends { lr: number }> {
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
  // The model's owner: the model the factory built (any CausalLM), then the pipeline stage that takes it over.
  let owner: { dispose(): void } | null = null;
  teardown.add(() => owner?.dispose());
  try {
    const built: unknown = options.model(shard);
    // Any family's model: the CausalLM contract, not a list of classes.
    if (!isCausalLM(built)) {
      const what = built === null || typeof built !== 'object' ? String(built) : (built.constructor?.name ?? 'an object');
      problems.push(`model: the factory must return an nt.nn.GPT or nt.nn.Llama, or another family's CausalLM, (shard) => new nt.nn.GPT(config, shard), got ${what} (${causalLMProblems(built).join('; ')})`);
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
 * ArgumentError on every rank before any training; main() (lib/train/main.ts) prints it and leaves the job.
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
  // A hot spare (nodetron launch --spares N) waits here for a lost rank's place, then sets up as that rank.
  await awaitSpareAssignment();
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

  // 2-3. This rank's parts (mesh, model shard, stage, trainer, rows, loader), each released by the
  // parts' teardown on a failure; then the run (schedule, checkpoints), which releases them on close.
  const parts = await buildParts(options, flags, l, env.worldSize, world);
  let run: TrainingRun<H> | null = null;
  try {
    run = new TrainingRun<H>(options, parts);
    const ck = options.checkpoint;
    // In-job recovery: a replacement restores the lost rank's state from its peers' memory here.
    const joined = (options.recover ?? flags.recover) === 'memory' ? await run.startRecovery(options.recoverEvery ?? flags.recoverEvery ?? 1) : false;
    if (ck?.resume && !joined) await run.resume(ck.resume === 'auto' ? ck.dir! : ck.resume);
    // The peak from here on is training's (weights, gradients, optimizer state, activations), not set-up's.
    resetPeakMemory(parts.shard.device);
    return run;
  } catch (e) {
    // The set-up's error is the one to report; a release that fails too is not.
    await (run ? run.release() : parts.teardown.run()).catch(() => {});
    throw e;
  }
}

/**
 * Steps 2 and 3: this rank's parts under `layout` over `world` (setup, and in-job recovery's reshape):
 * the mesh, the model shard, its stage and trainer, this replica's rows and its data loader. What is
 * built is registered with the parts' own teardown, which a failure here runs.
 */
export async function buildParts<H extends { lr: number }>(options: TrainSetupOptions<H>, flags: LayoutArgs, layout: TrainingLayout,
  worldSize: number, world: ProcessGroup | null): Promise<RunParts<H>> {
  const teardown = new Teardown();
  try {
    const parts = await buildParallelState(options, flags, layout, worldSize, world, teardown);
    const rows = batchSlice(options.batchSize, parts.mesh?.dpRank ?? 0, layout.dp);
    const loader = await buildLoader(options, parts, layout, rows, world, teardown);
    return { ...parts, flags, layout, rank: world?.rank ?? 0, worldSize, loader, rows, teardown,
      rebuild: (f, l, n, w) => buildParts(options, f, l, n, w) };
  } catch (e) {
    await teardown.run().catch(() => {});
    throw e;
  }
}
