// Training layouts: checking a TP × PP × DP (+ ZeRO, offload) request against a model, a world and a
// batch before anything trains, and the data-parallel training step (gradient averaging or ZeRO).
import * as dist from '../distributed/init.js';
import { readLaunchEnv } from '../distributed/env.js';
import { ArgumentError } from '../errors.js';
import { scope } from '../memory.js';
import { clipGradNorm } from '../optim/clip.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Tensor } from '../tensor.js';
import { tensor } from '../creation.js';
import type { LossModel } from '../training.js';
import { GradBuffer } from './data-parallel/buffer.js';
import type { ProcessGroup } from './group.js';
import { initializeParallel, type ParallelState } from './mesh.js';
import { ZeroOptimizer, type ZeroParamGroup, type InnerOptimizerFactory } from './zero/optimizer.js';

export interface TrainingLayout {
  tp: number;
  pp: number;
  dp: number;
  /** ZeRO stage: 0 (replicated optimizer state), 1 (sharded state), 2 (and gradients) or 3 (and parameters). */
  zero: 0 | 1 | 2 | 3;
  /** Keep ZeRO shards and their update in host memory. */
  offload: boolean;
}

/** The model dimensions a layout must divide. */
export interface LayoutModelShape {
  nLayer: number;
  nHead: number;
  nEmbd: number;
}

/** Layout flags as a command line gives them; unset ones take defaults (dp: whatever the world leaves). */
export interface LayoutFlags {
  tp?: number;
  pp?: number;
  dp?: number;
  zero?: number;
  offload?: boolean;
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
  if (zero > 3) problems.push(`--zero must be 0, 1, 2 or 3, got ${zero}`);
  const offload = flags.offload ?? false;
  if (offload && zero === 0) problems.push('--offload moves ZeRO shards to host memory, so it needs --zero 1, 2 or 3');
  if (tp * pp * dp !== worldSize) problems.push(`tp·pp·dp = ${tp}·${pp}·${dp} = ${tp * pp * dp} but the job has ${worldSize} processes (launch with --nproc-per-node ${tp * pp * dp})`);
  if (model.nHead % tp !== 0) problems.push(`--tp ${tp} does not divide the ${model.nHead} attention heads`);
  if (model.nEmbd % tp !== 0) problems.push(`--tp ${tp} does not divide the width ${model.nEmbd}`);
  if (pp > model.nLayer) problems.push(`--pp ${pp} is more pipeline stages than the model's ${model.nLayer} layers`);
  if (globalBatch % dp !== 0) problems.push(`--dp ${dp} does not divide the global batch of ${globalBatch} sequences`);
  if (problems.length > 0) throw new ArgumentError(`training layout: ${problems.join('; ')}`);
  return { tp, pp, dp, zero: zero as 0 | 1 | 2 | 3, offload };
}

/** The rows [start, start + count) of a global batch that data-parallel rank `dpRank` of `dpSize` trains on. */
export function batchSlice(globalBatch: number, dpRank: number, dpSize: number): { start: number; count: number } {
  if (!Number.isInteger(globalBatch) || globalBatch % dpSize !== 0) throw new ArgumentError(`batchSlice: the batch of ${globalBatch} does not split over ${dpSize} data-parallel ranks`);
  if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank >= dpSize) throw new ArgumentError(`batchSlice: dpRank ${dpRank} is outside [0, ${dpSize})`);
  const count = globalBatch / dpSize;
  return { start: dpRank * count, count };
}

export interface ParallelTraining {
  layout: TrainingLayout;
  /** The world rank (0 without a launcher). */
  rank: number;
  /** The mesh, or null for a single process (no communication at all). */
  mesh: ParallelState | null;
}

/**
 * Checks the layout against the launch environment, then (for more than one process) joins the
 * job and builds the mesh. Tensor and pipeline parallelism are checked but not trained here yet.
 */
export async function initParallelTraining(flags: LayoutFlags, model: LayoutModelShape, globalBatch: number): Promise<ParallelTraining> {
  const env = readLaunchEnv();
  const layout = resolveTrainingLayout(flags, model, env.worldSize, globalBatch);
  if (layout.tp > 1 || layout.pp > 1) {
    throw new ArgumentError(`training layout: --tp ${layout.tp} --pp ${layout.pp} is a valid layout, but this trainer implements data parallelism only (tp = pp = 1)`);
  }
  if (env.worldSize === 1) return { layout, rank: 0, mesh: null };
  await dist.init();
  const mesh = await initializeParallel({ tp: layout.tp, pp: layout.pp, dp: layout.dp });
  return { layout, rank: env.rank, mesh };
}

export interface DataParallelTrainerOptions<H extends { lr: number }> {
  /** The data-parallel group; null trains alone (plain optimizer, no communication). */
  group: ProcessGroup | null;
  zero: 0 | 1 | 2 | 3;
  offload?: boolean;
  /** Clip the global gradient norm (of the averaged gradient) to this value. */
  maxGradNorm?: number;
  createOptimizer: InnerOptimizerFactory<H>;
}

/**
 * One model replica's training step under data parallelism: every rank runs its slice of the global
 * batch; gradients are averaged (GradBuffer, ZeRO 0) or reduce-scattered into optimizer shards
 * (ZeroOptimizer, ZeRO 1/2/3), so every replica applies the update of the whole batch. At ZeRO 3
 * the model's blocks are the units gathered for their forward and backward (ZeroOptimizer.attach).
 */
export class DataParallelTrainer<H extends { lr: number }> {
  readonly #model: LossModel;
  readonly #group: ProcessGroup | null;
  readonly #maxGradNorm: number | undefined;
  readonly #optimizer: Optimizer<H> | null;
  readonly #zero: ZeroOptimizer<H> | null;
  readonly #grads: GradBuffer | null;

  constructor(model: LossModel, paramGroups: ZeroParamGroup<H>[], options: DataParallelTrainerOptions<H>) {
    this.#model = model;
    this.#group = options.group;
    this.#maxGradNorm = options.maxGradNorm;
    if (options.zero !== 0 && options.group === null) throw new ArgumentError('DataParallelTrainer: ZeRO shards over a data-parallel group; pass one (or zero: 0)');
    if (options.zero !== 0) {
      this.#zero = new ZeroOptimizer(paramGroups, options.createOptimizer, { group: options.group!, stage: options.zero, offload: options.offload ?? false });
      if (options.zero === 3) this.#zero.attach(model);
      this.#optimizer = null;
      this.#grads = null;
    } else {
      this.#zero = null;
      this.#optimizer = options.createOptimizer(paramGroups);
      this.#grads = options.group && options.group.size > 1 ? new GradBuffer(model.parameters(), { group: options.group }) : null;
    }
  }

  /** The optimizer that holds the state (ZeRO's inner one over the shard when sharded). */
  get optimizer(): Optimizer<H> { return this.#zero ? this.#zero.inner : this.#optimizer!; }

  /**
   * Forward and backward on this rank's slice, gradient synchronization, clipping, update. Returns
   * the loss of the whole global batch (the mean of the equal slices' losses) and the norm before clipping.
   */
  async step(inputs: Tensor, targets: Tensor, opts: { lr?: number } = {}): Promise<{ loss: number; gradNorm?: number }> {
    return scope(async () => {
      const { loss } = this.#model.forward(inputs, targets);
      if (!loss) throw new ArgumentError('DataParallelTrainer.step: the model returned no loss (were targets passed?)');
      loss.backward();
      const localLoss = loss.item();
      if (opts.lr !== undefined) this.optimizer.setLr(opts.lr);
      let gradNorm: number | undefined;
      if (this.#zero) {
        ({ gradNorm } = await this.#zero.step(this.#maxGradNorm === undefined ? {} : { maxGradNorm: this.#maxGradNorm }));
        this.#zero.zeroGrad();
      } else {
        if (this.#grads) {
          for (const p of this.#grads.params) this.#grads.markGradReady(p);
          await this.#grads.finishGradSync();
        }
        const params = this.#model.parameters();
        if (this.#maxGradNorm !== undefined) gradNorm = clipGradNorm(params, this.#maxGradNorm);
        this.#optimizer!.step();
        this.#optimizer!.zeroGrad();
      }
      const globalLoss = await this.#meanOverGroup(localLoss);
      return gradNorm === undefined ? { loss: globalLoss } : { loss: globalLoss, gradNorm };
    });
  }

  /**
   * Every model parameter's value as a new tensor, in model.parameters() order (the caller owns
   * them). Collective under ZeRO 3, where the parameters hold no values between steps.
   */
  async fullParameters(): Promise<Tensor[]> {
    const model = this.#model.parameters();
    if (!this.#zero) return model.map((p) => p.clone());
    const values = await this.#zero.fullParameters();
    const byParam = new Map(this.#zero.params.map((p, i) => [p, values[i]!]));
    return model.map((p) => byParam.get(p)!);
  }

  async #meanOverGroup(value: number): Promise<number> {
    if (!this.#group || this.#group.size === 1) return value;
    using t = tensor(new Float32Array([value]), [1]);
    await this.#group.allReduce(t, { op: 'avg' });
    return t.toArraySync()[0]!;
  }

  dispose(): void {
    this.#zero?.dispose();
    this.#optimizer?.dispose();
    this.#grads?.dispose();
  }
}
