// ZeRO stages 1, 2 and 3 (DeepSpeed), the optimizers users create: each data-parallel rank keeps the
// optimizer state (and, at stage 2, the gradients) of its share of the parameters (chunks.ts);
// at stages 1 and 2 the gradients are written into flat buckets and reduce-scattered bucket by
// bucket as backward produces them, each rank holding a contiguous range of every bucket
// (stage1-2.ts), the step updates the local chunks and allgathers the updated parameters. Stage 3
// shards the parameters too (stage3.ts): they are gathered unit by unit inside forward and backward.
// One class per stage behind one interface: ZeroStage12Optimizer and ZeroStage3Optimizer implement
// ShardedOptimizer (what every stage offers) and add their own (noSync and reduceStats; attach and
// gatherStats), so using a stage's method on the other is a type error, not a run-time refusal.
// `new ZeroOptimizer(params, factory, { stage })` builds the one its stage names.
import { dtypeCode } from '../../dtype.js';
import type { BucketOrder } from '../buckets.js';
import { ArgumentError } from '../../errors.js';
import { clipFactor, globalGradNorm, gradSumSquares, scaleGrads } from '../../optim/clip.js';
import { Lamb } from '../../optim/lamb.js';
import type { Optimizer } from '../../optim/optimizer.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { copyElements } from '../flat.js';
import { DEFAULT_BUCKET_BYTES } from '../buckets.js';
import type { ChunkedShards, LocalChunk } from './chunks.js';
import { GradientShards, type ReduceStats } from './stage1-2.js';
import { defaultUnits, ParameterPartition, type GatherStats } from './stage3.js';
import type { Module } from '../../nn/module.js';

/** ZeRO stage: 1 shards the optimizer state, 2 also the gradients, 3 also the parameters. */
export type ZeroStage = 1 | 2 | 3;

/** Options of {@link ZeroOptimizer}. */
export interface ZeroOptions {
  /** The data-parallel group the state is sharded over. */
  group: CollectiveGroup;
  /** The ZeRO stage. */
  stage: ZeroStage;
  /**
   * Keep the shard (master copy, its gradient, the optimizer state; at stage 3 the parameter
   * shard itself) in host memory and run the update there. For parameters already on the CPU this
   * moves nothing: the flag is accepted and changes no placement.
   */
  offload?: boolean;
  /**
   * Stages 1 and 2: reduce-scatter each bucket of gradients from autograd's post-accumulate-grad
   * hooks while backward runs (default true). Off: every reduce-scatter happens in step().
   */
  overlap?: boolean;
  /** Stages 1 and 2: target bytes of full gradients per reduce-scatter bucket (default 25 MiB, as GradBuffer). */
  bucketBytes?: number;
  /**
   * Stages 1 and 2: parameters whose gradient the caller completes after backward (a pipeline's tied
   * embedding, summed over the stages that hold it): reduce-scattered in step(), not from the hooks.
   * Stage 3 keeps such parameters (outside every unit) gathered until step() anyway.
   */
  deferGrads?: Iterable<Tensor>;
  /**
   * Stages 1 and 2: every parameter in the order the model creates them (model.parameters()), whose
   * reverse the buckets follow (default: the parameter groups' order). Each bucket is laid out flat
   * and each rank holds a contiguous range of it, so the buckets stay as built (never rebuilt in
   * the order gradients were ready in, as plain data parallelism's are).
   */
  bucketOrder?: Iterable<Tensor>;
}

/** How ZeRO stage 3 hooks into a model (ZeroStage3Optimizer.attach). */
export interface ZeroAttachOptions {
  /** Submodules gathered one at a time, in the order their forwards run (default: defaultUnits(model)). */
  units?: readonly Module[];
  /** The model's methods that run a forward pass (default ['forward']; a pipeline stage: ['forwardStage']). */
  entries?: readonly string[];
  /**
   * Parameters of the model that another optimizer holds (under expert parallelism the experts,
   * sharded over the expert-data-parallel group by an optimizer of their own, and the rest for
   * that one): this one neither gathers nor checks them.
   */
  exclude?: Iterable<Tensor>;
}

/** A parameter group as the caller's optimizer would take it: parameters plus option overrides. */
export type ZeroParamGroup<H> = {
  /** The group's parameters. */
  params: Iterable<Tensor>;
} & Partial<H>;

/** Builds the inner optimizer over the shard tensors (one per parameter group, with that group's options). */
export type InnerOptimizerFactory<H extends { lr: number }> = (groups: ZeroParamGroup<H>[]) => Optimizer<H>;

/** How a gradient norm extends beyond the data-parallel group when the model itself is split (TP, PP). */
export interface GradNormScope {
  /** Parameters whose gradient another rank counts (a tensor-parallel replica, the tied embedding's second copy). */
  skip?: Iterable<Tensor>;
  /** Further groups holding the model's other parts: the sum of squares is summed over each in turn. */
  groups?: readonly CollectiveGroup[];
}

/** Bytes held on one rank, by kind (what the ZeRO paper's formula predicts). */
export interface ZeroMemoryBytes {
  /** Parameter bytes. */
  params: number;
  /** Gradient bytes (full gradients and the shard's). */
  grads: number;
  /** Optimizer state bytes. */
  optimizerState: number;
  /** Bytes of the f32 master shard (0 at stage 3, where it is the parameter shard). */
  masterShard: number;
  /** The sum of the above. */
  total: number;
}

/** Options of {@link ShardedOptimizer.step}. */
export interface ZeroStepOptions {
  /** Clip the gradients to this global norm (> 0). */
  maxGradNorm?: number;
  /** How the norm extends beyond the data-parallel group (tensor and pipeline parallel). */
  normScope?: GradNormScope;
}

/**
 * What every ZeRO optimizer offers, whatever its stage: each rank keeps f32 master chunks of every
 * parameter (and the inner optimizer's state for them), gradients are reduce-scattered to their
 * chunk's owner, and the updated chunks are allgathered back. {@link ZeroStage12Optimizer} and
 * {@link ZeroStage3Optimizer} implement it and add what only their stages have.
 */
export interface ShardedOptimizer<H extends { lr: number }> {
  /** The optimizer that updates this rank's master chunks. */
  readonly inner: Optimizer<H>;
  /** The ZeRO stage. */
  readonly stage: ZeroStage;
  /** The data-parallel group the state is sharded over. */
  readonly group: CollectiveGroup;
  /** Whether the shards and their update live in host memory. */
  readonly offload: boolean;
  /** The parameters (all groups, in order). */
  readonly params: Tensor[];
  /** The masters: this rank's chunks of each parameter group, back to back (what the inner optimizer updates). */
  readonly masters: readonly Tensor[];
  /** Where this rank's chunk of each parameter lives in the masters (checkpoints save and load through it). */
  localChunks(): LocalChunk[];
  /**
   * The full value of every parameter, as new tensors in `params` order (the caller owns them).
   * Collective at stage 3, where the parameters themselves hold no values between uses; at stages
   * 1 and 2 a copy of the replicated parameters.
   */
  fullParameters(): Promise<Tensor[]>;
  /** Drops the gradients of the parameters and of this rank's shards. */
  zeroGrad(): void;
  /**
   * One update: finish the reduce-scatters of the averaged gradients (each rank receives its
   * chunks'; most started during backward), optionally clip them to a global norm, step the shard,
   * allgather the updated chunks into every parameter (at stage 3 the updated chunks stay chunks:
   * the next forward gathers them). Every rank of the group calls it. Returns the global gradient
   * norm before clipping when `maxGradNorm` is given.
   */
  step(options?: ZeroStepOptions): Promise<{
    /** The global gradient norm before clipping, when maxGradNorm was given. */
    gradNorm?: number;
  }>;
  /**
   * Finishes the gradient reductions step() would begin with (each rank's shards then hold the
   * averaged gradients), so a caller with two sharded optimizers (expert parallelism: the experts
   * over their own group) can take the norm of both before either updates; step() then skips it.
   */
  reduceGradients(): Promise<void>;
  /** This rank's share of the squared gradient norm: Σ of its shards' squared gradients (after reduceGradients), parameters in `skip` left out. */
  shardGradSumSquares(skip?: ReadonlySet<Tensor>): number;
  /** Multiplies this rank's shard gradients by `factor` (clipping by a norm the caller took). */
  scaleShardGrads(factor: number): void;
  /**
   * Bytes this rank holds now: parameters, gradients (full ones and the shard's), optimizer state,
   * master shard. At stage 3 the f32 master shard is the parameter shard, so it counts as
   * `params` (with the bytes of parameters gathered at this moment; none between steps) and
   * `masterShard` is 0.
   */
  memoryBytes(): ZeroMemoryBytes;
  /** Frees the shards and the state. At stage 3 also removes the hooks; the parameters' values are gone (see fullParameters()). */
  dispose(): void;
}

/** The caller's parameters as parameter groups (a plain list is one group). */
function userGroupsOf<H>(params: Iterable<Tensor> | ZeroParamGroup<H>[]): ZeroParamGroup<H>[] {
  const list = Array.from(params as Iterable<unknown>);
  const grouped = list.length > 0 && list.every((g) => g !== null && typeof g === 'object' && 'params' in (g as object));
  return grouped ? (list as ZeroParamGroup<H>[]) : [{ params: list as Tensor[] } as unknown as ZeroParamGroup<H>];
}

/** The parameter lists of the groups (what the shard layouts take). */
const paramListsOf = <H>(groups: ZeroParamGroup<H>[]): Tensor[][] => groups.map((g) => Array.from(g.params));

/**
 * What both stages' optimizers share: the inner optimizer over the shard layout's masters, the step
 * (finish the gradients, clip, update, hand the update back) and the byte count. A subclass gives
 * the layout (`S`) and what its stage does around the update.
 */
abstract class ShardedOptimizerBase<H extends { lr: number }, S extends ChunkedShards> implements ShardedOptimizer<H> {
  readonly inner: Optimizer<H>;
  abstract readonly stage: ZeroStage;
  readonly group: CollectiveGroup;
  readonly offload: boolean;
  /** The shard layout and the stage's collectives. @internal */
  protected readonly shards: S;

  /** Builds the inner optimizer over the masters of `shards` (which it disposes when the optimizer is refused). */
  constructor(userGroups: ZeroParamGroup<H>[], shards: S, createOptimizer: InnerOptimizerFactory<H>, options: { group: CollectiveGroup; offload?: boolean }) {
    this.group = options.group;
    this.offload = options.offload ?? false;
    this.shards = shards;
    const masters = shards.masters;
    try {
      this.inner = createOptimizer(userGroups.map(({ params: _ps, ...over }, i) => ({ ...over, params: [masters[i]!] }) as unknown as ZeroParamGroup<H>));
    } catch (e) {
      shards.dispose();
      throw e;
    }
    if (this.inner instanceof Lamb) {
      this.dispose();
      throw new ArgumentError('ZeroOptimizer: LAMB scales each parameter by its own norm ratio, which a shard that cuts parameters apart cannot compute; use an elementwise optimizer (AdamW, SGD)');
    }
    const inner = this.inner.paramGroups.flatMap((g) => g.params);
    if (inner.length !== masters.length || inner.some((p, i) => p !== masters[i])) {
      this.dispose();
      throw new ArgumentError('ZeroOptimizer: the factory must build the optimizer over exactly the shard groups it is given');
    }
  }

  get params(): Tensor[] { return this.shards.params; }

  get masters(): readonly Tensor[] { return this.shards.masters; }

  localChunks(): LocalChunk[] { return this.shards.localChunks(); }

  abstract fullParameters(): Promise<Tensor[]>;

  zeroGrad(): void {
    this.#reduced = false;
    this.shards.zeroGrad();
  }

  /**
   * Abandons a step that failed midway (a collective failed; in-job recovery): the stage's
   * collectives in flight are let go unawaited, gathered parameters released, every gradient
   * dropped. The shards' values are whatever the failed step left: restore them (an image) before
   * the next step. Never throws.
   */
  abandonStep(): void {
    this.#reduced = false;
    this.shards.abandon();
  }

  /**
   * The gradient buckets' order at stages 1 and 2 (null at 3, which has none): in-job recovery hands
   * it to a replacement process, so every rank launches the same reduce-scatters in the same order.
   */
  bucketOrder(): BucketOrder | null { return this.shards.orderState(); }

  /** Takes the bucket order another rank's bucketOrder() gave (between steps; nothing at stage 3). */
  loadBucketOrder(s: BucketOrder): void { this.shards.loadOrderState(s); }

  /** Whether reduceGradients() ran since the last update. */
  #reduced = false;

  async reduceGradients(): Promise<void> {
    if (this.#reduced) return;
    await this.finishGradients();
    this.#reduced = true;
  }

  shardGradSumSquares(skip: ReadonlySet<Tensor> = new Set()): number {
    if (skip.size === 0) return gradSumSquares([...this.masters]);
    let local = 0;
    this.shards.forEachLocalChunk((p, master, offset, c) => {
      if (skip.has(p)) return;
      const shardGrad = master.grad;
      if (!shardGrad) return;
      using run = emptyOn([c], 'f32', shardGrad.deviceInfo);
      copyElements(run, 0, shardGrad, offset, c);
      local += (run.backend.sum_squares([run.storage], [c], [dtypeCode('f32')]) as Float64Array)[0]!;
    });
    return local;
  }

  scaleShardGrads(factor: number): void {
    if (factor !== 1) scaleGrads([...this.masters], factor);
  }

  /** Before the update: every reduce-scatter finished, the shards' gradients in the masters'. @internal */
  protected abstract finishGradients(): Promise<void>;

  /** After the update: what the parameters need of it (stages 1 and 2: the allgather). @internal */
  protected abstract finishUpdate(): Promise<void>;

  /** Bytes of parameters, gradients and master shard (the optimizer state is counted here). @internal */
  protected abstract heldBytes(): { params: number; grads: number; masterShard: number };

  async step(options: ZeroStepOptions = {}): Promise<{
    /** The global gradient norm before clipping, when maxGradNorm was given. */
    gradNorm?: number;
  }> {
    const { maxGradNorm } = options;
    if (maxGradNorm !== undefined && !(typeof maxGradNorm === 'number' && maxGradNorm > 0)) {
      throw new ArgumentError(`ZeroOptimizer.step: maxGradNorm must be a number > 0, got ${String(maxGradNorm)}`);
    }
    await this.reduceGradients();
    const gradNorm = maxGradNorm === undefined ? undefined : await this.#clipShardGrads(maxGradNorm, options.normScope ?? {});
    this.#reduced = false;
    this.inner.step();
    await this.finishUpdate();
    for (const p of this.params) p.markModified();  // autocast's weight-cast cache must re-cast them
    return gradNorm === undefined ? {} : { gradNorm };
  }

  // The shards partition the averaged gradient (padding holds zeros), so the global sum of squares
  // is the group sum of the shards' sums (then summed over the scope's model-parallel groups).
  async #clipShardGrads(maxGradNorm: number, scope: GradNormScope): Promise<number> {
    const part = { sumSquares: this.shardGradSumSquares(new Set(scope.skip ?? [])), groups: [this.group] };
    const norm = await globalGradNorm([part], (scope.groups ?? []).filter((g) => g.size > 1));
    this.scaleShardGrads(clipFactor(norm, maxGradNorm));
    return norm;
  }

  memoryBytes(): ZeroMemoryBytes {
    let optimizerState = 0;
    for (const m of this.masters) {
      const st = this.inner.state.get(m);
      if (st) for (const t of Object.values(st.tensors)) optimizerState += t.nbytes;
    }
    const { params, grads, masterShard } = this.heldBytes();
    return { params, grads, optimizerState, masterShard, total: params + grads + optimizerState + masterShard };
  }

  dispose(): void {
    this.inner?.dispose();
    this.shards.dispose();
  }
}

/** Options of {@link ZeroStage12Optimizer}: {@link ZeroOptions} at stage 1 or 2. */
export interface ZeroStage12Options extends ZeroOptions {
  /** The ZeRO stage: 1 shards the optimizer state, 2 also the gradients. */
  stage: 1 | 2;
}

/**
 * ZeRO stages 1 and 2 over a data-parallel group: the optimizer state (stage 1) and the gradients
 * (stage 2) sharded, the gradients reduce-scattered bucket by bucket from autograd's hooks while
 * backward runs, the updated chunks allgathered back into the replicated parameters after each
 * step. Throws ArgumentError for a stage other than 1 or 2, a LAMB inner optimizer, or a factory
 * that does not build over the given shard groups.
 */
export class ZeroStage12Optimizer<H extends { lr: number }> extends ShardedOptimizerBase<H, GradientShards> {
  /** The ZeRO stage: 1 or 2. */
  readonly stage: 1 | 2;

  constructor(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroStage12Options) {
    const stage = options.stage;
    if (stage !== 1 && stage !== 2) throw new ArgumentError(`ZeroStage12Optimizer: stage must be 1 or 2, got ${String(stage)}`);
    const userGroups = userGroupsOf(params);
    super(userGroups, new GradientShards(paramListsOf(userGroups), options.group, {
      stage, offload: options.offload ?? false, overlap: options.overlap ?? true,
      bucketBytes: options.bucketBytes ?? DEFAULT_BUCKET_BYTES, deferred: [...(options.deferGrads ?? [])],
      ...(options.bucketOrder ? { order: [...options.bucketOrder] } : {}),
    }), createOptimizer, options);
    this.stage = stage;
  }

  /** How many bucket reduce-scatters ran, and how many of them started during backward. */
  get reduceStats(): Readonly<ReduceStats> {
    return this.shards.stats;
  }

  /**
   * Runs fn (a micro-batch's forward and backward) without gradient communication: the gradients
   * accumulate in full and are reduce-scattered by the next backward with sync on, or by step().
   * At stage 1 every micro-batch but the last should run inside it (stage 1 communicates once per
   * step); at stage 2 it trades memory for less communication.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    return this.shards.noSync(fn);
  }

  /** A copy of the replicated parameters. */
  async fullParameters(): Promise<Tensor[]> {
    return this.params.map((p) => p.clone());
  }

  /** @internal */
  protected async finishGradients(): Promise<void> {
    await this.shards.finishGradients();
  }

  /** @internal */
  protected async finishUpdate(): Promise<void> {
    await this.shards.finishStep();
  }

  /** @internal */
  protected heldBytes(): { params: number; grads: number; masterShard: number } {
    const mem = this.shards.memory();
    return {
      params: this.params.reduce((s, p) => s + p.nbytes, 0),
      grads: mem.fullGrads + mem.shardGrads,
      masterShard: this.masters.reduce((s, m) => s + m.nbytes, 0),
    };
  }
}

/** Options of {@link ZeroStage3Optimizer}: the stage-1/2 bucket options do not apply. */
export interface ZeroStage3Options {
  /** The data-parallel group the parameters, gradients and state are sharded over. */
  group: CollectiveGroup;
  /** The stage (3; may be left out). */
  stage?: 3;
  /** Keep the shards (the parameter chunks, their gradients, the optimizer state) in host memory and run the update there. */
  offload?: boolean;
}

/**
 * ZeRO stage 3 over a data-parallel group: the parameters sharded too. From construction on each
 * rank holds only its chunks; {@link attach} installs the hooks that gather each unit's parameters
 * for its forward and backward and reduce-scatter its gradients. Throws ArgumentError for a LAMB
 * inner optimizer or a factory that does not build over the given shard groups (the parameters
 * stay whole then).
 */
export class ZeroStage3Optimizer<H extends { lr: number }> extends ShardedOptimizerBase<H, ParameterPartition> {
  /** The ZeRO stage: 3. */
  readonly stage = 3 as const;

  constructor(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroStage3Options) {
    if (options.stage !== undefined && options.stage !== 3) throw new ArgumentError(`ZeroStage3Optimizer: stage must be 3, got ${String(options.stage)}`);
    const userGroups = userGroupsOf(params);
    super(userGroups, new ParameterPartition(paramListsOf(userGroups), options.group, options.offload ?? false), createOptimizer, options);
    // Only now, with nothing left to refuse: from here on the parameters' bytes are this rank's chunks only.
    this.shards.evictParameters();
  }

  /**
   * Installs the hooks that gather each unit's parameters for its forward and backward and
   * reduce-scatter its gradients. `units` are submodules of `model` in the order their forwards
   * run (default: the modules in the model's array fields, a GPT's blocks); the model's other
   * parameters (the root unit) are gathered for the whole step, from the moment one of `entries`
   * (the model's methods that run a forward pass; default `forward`) is called. Every model
   * parameter must be in this optimizer.
   */
  attach(model: Module, options: ZeroAttachOptions = {}): this {
    this.shards.attach(model, options.units ?? defaultUnits(model), options.entries ?? ['forward'], new Set(options.exclude ?? []));
    return this;
  }

  /**
   * Runs fn (a zero-bubble pipeline's input-gradient pass) with the units' gradient reduce-scatters
   * held back until {@link reduceHeld} (the weight gradients come later, in the W pass).
   */
  holdReductions<T>(fn: () => T | Promise<T>): Promise<T> {
    return this.shards.holdReductions(fn);
  }

  /** Reduce-scatters the gradients the units hold (after a W pass: the micro-batch's gradients are final). */
  reduceHeld(): void {
    this.shards.reduceHeld();
  }

  /** What gathering did so far (prefetched and on-demand gathers, peak gathered bytes). */
  get gatherStats(): Readonly<GatherStats> {
    return this.shards.stats;
  }

  /** Collective: every parameter gathered from the shards. */
  fullParameters(): Promise<Tensor[]> {
    return this.shards.fullParameters();
  }

  /** @internal */
  protected async finishGradients(): Promise<void> {
    this.shards.finishGradients();
  }

  // The updated chunks stay chunks: the next forward gathers them.
  /** @internal */
  protected async finishUpdate(): Promise<void> {}

  /** @internal */
  protected heldBytes(): { params: number; grads: number; masterShard: number } {
    const mem = this.shards.memory();
    return {
      params: this.masters.reduce((s, m) => s + m.nbytes, 0) + mem.gatheredParams,
      grads: mem.fullGrads + mem.shardGrads,
      masterShard: 0,
    };
  }
}

/** A ZeRO optimizer of any stage; its `stage` tells which (`zero.stage === 3` narrows to {@link ZeroStage3Optimizer}). */
export type ZeroOptimizer<H extends { lr: number }> = ZeroStage12Optimizer<H> | ZeroStage3Optimizer<H>;

/** The construction of {@link ZeroOptimizer}: the stage in the options picks the class. */
export interface ZeroOptimizerConstructor {
  new <H extends { lr: number }>(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroOptions & { stage: 3 }): ZeroStage3Optimizer<H>;
  new <H extends { lr: number }>(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroOptions & { stage: 1 | 2 }): ZeroStage12Optimizer<H>;
  new <H extends { lr: number }>(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroOptions): ZeroOptimizer<H>;
}

/**
 * `new ZeroOptimizer(params, createOptimizer, { group, stage })`: a {@link ZeroStage12Optimizer} at
 * stages 1 and 2, a {@link ZeroStage3Optimizer} at stage 3 (`x instanceof ZeroOptimizer` holds for
 * both). Throws ArgumentError for another stage, and what the stage's class throws.
 */
export const ZeroOptimizer: ZeroOptimizerConstructor = class ZeroOptimizer {
  constructor(params: Iterable<Tensor> | ZeroParamGroup<{ lr: number }>[], createOptimizer: InnerOptimizerFactory<{ lr: number }>, options: ZeroOptions) {
    const stage = options?.stage;
    if (stage === 3) return new ZeroStage3Optimizer(params, createOptimizer, { ...options, stage }) as never;
    if (stage === 1 || stage === 2) return new ZeroStage12Optimizer(params, createOptimizer, { ...options, stage }) as never;
    throw new ArgumentError(`ZeroOptimizer: stage must be 1, 2 or 3, got ${String(stage)}`);
  }

  static [Symbol.hasInstance](x: unknown): boolean {
    return x instanceof ZeroStage12Optimizer || x instanceof ZeroStage3Optimizer;
  }
} as unknown as ZeroOptimizerConstructor;

/**
 * Per-rank bytes for Ψ f32 parameters over N ranks with an optimizer holding `stateBytesPerParam`
 * per parameter (Adam: 8), as this implementation holds them between steps. The ZeRO paper's
 * mixed-precision count is 2Ψ + 2Ψ + KΨ (K = 12: f32 master, momentum, variance); for f32 training
 * it becomes 4Ψ params + 4Ψ grads + 8Ψ state, and sharding divides: stage 1 the state, stage 2 the
 * gradients too, stage 3 the parameters too. Differences from the paper, because shards cannot be
 * views of the parameters: at stages 1 and 2 each rank also keeps a 4Ψ/N f32 master copy of its
 * shard, and at stage 1 the shard's reduced gradient (4Ψ/N) beside the full gradients. At stage 3
 * the master shard is the parameter shard (counted once, as params). Given Ψ, a shard is ceil(Ψ/N)
 * elements (the paper's Ψ/N); given every parameter's size, what this implementation holds on its
 * fullest rank: at stages 1 and 2 each bucket is laid out flat and rank r holds [r·S, (r+1)·S) of
 * it, so with one bucket rank 0 holds ceil(Ψ/N) (later ranks what is left, the padding held by
 * nobody; B buckets, each split so, give rank 0 up to B − 1 elements more than this counts); at
 * stage 3, exactly, each parameter padded to N equal chunks, Σ ceil(size/N) elements. Not counted: what a step
 * needs transiently — the gradient buckets being filled or reduced during backward (stages 1, 2), at
 * stage 3 the gathered parameters of the model's root unit, of the unit running and of the one
 * being prefetched (ZeroOptimizer.gatherStats.peakGatheredBytes measures it).
 */
export function zeroMemoryFormula(numParams: number | readonly number[], ranks: number, stage: 0 | ZeroStage, stateBytesPerParam = 8): ZeroMemoryBytes {
  const sizes = typeof numParams === 'number' ? null : numParams;
  const psi = sizes ? sizes.reduce((a, b) => a + b, 0) : numParams as number;
  const shard = stage === 0 ? psi : sizes && stage === 3 ? sizes.reduce((a, b) => a + Math.ceil(b / ranks), 0) : Math.ceil(psi / ranks);
  const params = 4 * (stage === 3 ? shard : psi);
  const grads = stage === 0 ? 4 * psi : stage === 1 ? 4 * psi + 4 * shard : 4 * shard;
  const optimizerState = stateBytesPerParam * shard;
  const masterShard = stage === 1 || stage === 2 ? 4 * shard : 0;
  return { params, grads, optimizerState, masterShard, total: params + grads + optimizerState + masterShard };
}
