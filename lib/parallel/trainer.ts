// ParallelTrainer: the training step of one rank of any TP × CP × PP × DP layout (layout.ts checks the
// layout): this rank's tokens under context parallelism, micro-batches through the pipeline schedule,
// gradient averaging over the data- and context-parallel ranks (GradBuffer, or ZeRO 1/2/3), the tied embedding's gradient summed over the first and last stage, clipping by
// the norm of the whole model's gradient, the update.
import { autocast } from '../amp.js';
import { ArgumentError } from '../errors.js';
import { memoryStats, scope } from '../memory.js';
import { scale, slice } from '../ops/index.js';
import { clipFactor, gradSumSquares, scaleGrads } from '../optim/clip.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Module, Parameter } from '../nn/module.js';
import { addMoEStats, moeLayers, setMoEAuxLossScale, type MoEStats } from '../nn/moe.js';
import { emptyOn, type Tensor } from '../tensor.js';
import { tensor } from '../creation.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { agreeAll } from '../distributed/agree.js';
import { traceEnabled, traceSpan } from '../observe/trace.js';
import { busyWaitCpu, cpuNowMs, debugSlowdown, metricsEnabled, recordStepMetrics } from '../observe/metrics.js';
import { GradBuffer } from './data-parallel/buffer.js';
import type { ContextParallelMode, PipelineScheduleName } from './layout.js';
import { contextSlice } from './context-parallel/gpt.js';
import type { ParallelState } from './mesh.js';
import type { PipelineModule } from './pipeline/gpt-stage.js';
import { forwardOnly, runSchedule, SCHEDULE_KINDS, splitsBackward, type PipelineStage } from './pipeline/schedules.js';
import { tensorParallelParameters } from './tensor-parallel/gpt.js';
import { ZeroOptimizer, type GradNormScope, type ZeroParamGroup, type InnerOptimizerFactory } from './zero/optimizer.js';

/**
 * What one rank of a trainer holds of the training state: the description a checkpoint reads
 * (lib/ckpt/parts.ts's trainerState), so the trainer itself knows nothing of checkpoints.
 */
export interface TrainerHoldings<H extends { lr: number }> {
  /** This rank's model (its pipeline stage, its tensor-parallel slices). */
  readonly model: Module;
  /** The optimizer holding the state of whole parameters; null under ZeRO (`zero` holds it). */
  readonly optimizer: Optimizer<H> | null;
  /** The ZeRO optimizer whose masters and inner optimizer hold this rank's flat chunks; null at ZeRO 0. */
  readonly zero: ZeroOptimizer<H> | null;
  /** Parameters whose copy here another rank saves (tensor-parallel replicas of rank > 0, the tied embedding's second copy). */
  readonly savedElsewhere: ReadonlySet<Tensor>;
  /** This rank's place among the identical data-parallel copies; null in one process. */
  readonly replica: ReplicaPlace | null;
  /**
   * Under expert parallelism: the experts this rank holds, which the fields above leave out (their
   * copies are the expert-data-parallel group's, not the data-parallel group's); absent otherwise.
   */
  readonly experts?: ExpertHoldings<H>;
}

/** What one rank holds of the experts under expert parallelism (see {@link TrainerHoldings.experts}). */
export interface ExpertHoldings<H extends {
  /** The learning rate (every optimizer has one). */
  lr: number;
}> {
  /** The expert parameters held here (global expert indices in their names). */
  readonly params: ReadonlySet<Tensor>;
  /** The optimizer holding their whole state (ZeRO 0, where it is the trainer's one optimizer, or ZeRO with no expert-data-parallel copies); null when `zero` holds it. */
  readonly optimizer: Optimizer<H> | null;
  /** The ZeRO optimizer sharding them over the expert-data-parallel group; null when they are not sharded. */
  readonly zero: ZeroOptimizer<H> | null;
  /** This rank's place among the copies of its experts (the expert-data-parallel group); null when it holds the only copy. */
  readonly replica: ReplicaPlace | null;
}

/** A rank's place among identical replicas. */
export interface ReplicaPlace {
  /** This replica's index, from 0. */
  readonly index: number;
  /** The number of replicas. */
  readonly count: number;
}

/** Options of {@link ParallelTrainer.create}. */
export interface ParallelTrainerOptions<H extends { lr: number }> {
  /** The mesh; null trains in one process (plain optimizer, no communication). */
  mesh: ParallelState | null;
  /**
   * ZeRO stage over the data-parallel group (default 0: every replica holds the whole optimizer
   * state). At 3 the trainer attaches ZeroOptimizer to the model: its blocks are the units gathered
   * for their forward and backward, the rest (embeddings, final norm) is gathered for the step.
   */
  zero?: 0 | 1 | 2 | 3;
  /** Keep the ZeRO shards and their update in host memory (needs zero >= 1; default false). */
  offload?: boolean;
  /** Micro-batches per step; each rank's batch rows split evenly among them (default 1). */
  microBatches?: number;
  /**
   * The pipeline schedule (default 1f1b; all give the same numbers): gpipe, 1f1b (fewer activations
   * held), interleaved (needs a model with chunks > 1, micro-batches a multiple of pp), zb-h1
   * (weight gradients deferred into the bubble) or zb-v (2 chunks per stage placed in a V, B and W
   * split as in zb-h1). Every ZeRO stage works with the zero-bubble ones: ZeRO 2 and 3 reduce a
   * micro-batch's gradients after its W.
   */
  schedule?: PipelineScheduleName;
  /**
   * Under context parallelism (the mesh's cp > 1): how the model splits the sequence (default ring,
   * as its contextParallelLayout was built). step() and evaluate() take whole sequences and keep
   * this rank's tokens.
   */
  cpMode?: ContextParallelMode;
  /** Clip the global gradient norm (of the whole model's averaged gradient) to this value. */
  maxGradNorm?: number;
  /** Target bytes per gradient bucket (data-parallel allreduce, ZeRO 1/2 reduce-scatter; default 25 MiB). */
  bucketBytes?: number;
  /** Builds the optimizer over the parameter groups it is given (the local parameters, or ZeRO's shards of them). */
  createOptimizer: InnerOptimizerFactory<H>;
  /**
   * The compute precision of the forward (default 'f32'). 'bf16': each micro-batch's forward runs
   * under nt.autocast({ dtype: 'bf16' }) (GEMMs and attention in bf16 with f32 accumulation; norms,
   * softmax, the loss and the residual stream in f32); parameters, gradients and the optimizer stay
   * f32. f16 needs loss scaling: use nt.autocast with nt.GradScaler in your own loop.
   */
  precision?: TrainingPrecision;
}

/** The compute precisions the trainer runs in. */
export type TrainingPrecision = 'f32' | 'bf16';

/** What a training step returns. */
export interface TrainerStepResult {
  /** The loss of the whole global batch, on every rank. */
  loss: number;
  /** The global gradient norm before clipping (when maxGradNorm is set), on every rank. */
  gradNorm?: number;
  /** The MoE layers' routing statistics of this step on this rank (its pipeline stage; counts summed over the data-parallel ranks); absent without MoE layers. */
  moe?: MoEStats;
}

/**
 * One rank's training step for any TP × PP × DP layout: micro-batches through the pipeline schedule
 * (a single stage runs them one after the other), data-parallel gradient averaging (GradBuffer, or
 * ZeRO 1/2/3), the tied embedding's gradient summed over the first and last stage, clipping by the
 * norm of the whole model's gradient, the update. Create with `await ParallelTrainer.create(...)`.
 */
export class ParallelTrainer<H extends { lr: number }> {
  readonly #model: PipelineModule;
  readonly #mesh: ParallelState | null;
  readonly #maxGradNorm: number | undefined;
  readonly #microBatches: number;
  readonly #schedule: PipelineScheduleName;
  readonly #precision: TrainingPrecision;
  readonly #cpMode: ContextParallelMode;
  readonly #optimizer: Optimizer<H> | null;
  readonly #zero: ZeroOptimizer<H> | null;
  readonly #grads: GradBuffer | null;
  /** Expert parameters under expert parallelism: averaged over the expert-data-parallel group (null: none, or ep = dp). */
  #expertGrads: GradBuffer | null = null;
  /** Expert parameters under expert parallelism (different on each expert-parallel rank). */
  readonly #expertParams: Set<Parameter>;
  /** Under ZeRO with expert parallelism: the experts' ZeRO optimizer over the expert-data-parallel group (null: none). */
  #expertZero: ZeroOptimizer<H> | null = null;
  /** Under ZeRO with expert parallelism and no expert-data-parallel copies (ep = dp): the experts' own, unsharded optimizer. */
  #expertOptimizer: Optimizer<H> | null = null;
  /** Parameters whose gradient another rank counts in the norm. */
  readonly #countedElsewhere: Set<Parameter>;
  /** Steps taken (the per-step metrics' index). */
  #steps = 0;
  /** This step's time in forward, backward and the optimizer so far (ms; waits in collectives left out). */
  #computeMs = 0;
  /** The process's CPU time over the same phases (ms). */
  #cpuMs = 0;
  /** NODETRON_DEBUG_SLOW_RANK's extra compute fraction for this rank (0: none). */
  readonly #slowdown: number;
  /** This process's global rank (the metrics' and the debug slowdown's). */
  readonly #rank: number;
  /** Whether compute time is measured: only for the metrics or the debug slowdown (a clock read per phase otherwise wasted). */
  readonly #measure: boolean;

  private constructor(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], options: ParallelTrainerOptions<H>) {
    const mesh = options.mesh;
    this.#model = model;
    this.#mesh = mesh;
    this.#maxGradNorm = options.maxGradNorm;
    this.#microBatches = options.microBatches ?? 1;
    this.#schedule = options.schedule ?? '1f1b';
    this.#precision = options.precision ?? 'f32';
    this.#cpMode = options.cpMode ?? 'ring';
    const zero = options.zero ?? 0;
    this.#rank = mesh?.world.rank ?? Number(process.env.RANK ?? 0);
    this.#slowdown = debugSlowdown(this.#rank);
    this.#measure = metricsEnabled || this.#slowdown > 0;
    this.#countedElsewhere = new Set(model.tiedCountedElsewhere);
    this.#expertParams = new Set(mesh && mesh.epSize > 1 ? moeLayers(model).flatMap((l) => l.experts.flatMap((e) => e.parameters())) : []);
    // Replicated parameters (LayerNorms, positions, row-parallel biases) have equal gradients on every tensor-parallel rank.
    if (mesh && mesh.tpSize > 1 && mesh.tpRank > 0) for (const p of tensorParallelParameters(model).replicated) this.#countedElsewhere.add(p);
    const bucketing = options.bucketBytes ? { bucketBytes: options.bucketBytes } : {};
    if (zero !== 0) {
      // The tied embedding's gradient is complete only after the stages sum it, so ZeRO 1/2 leave it
      // out of the reduce-scatters that start during backward.
      const deferGrads = mesh?.embeddingGroup ? model.tiedParameters : [];
      // Under expert parallelism the experts are copies over the expert-data-parallel group only, so
      // they get a ZeRO optimizer of their own over that group (or, with no copies, a plain one);
      // everything else is sharded over the data-parallel group as without experts.
      const experts = this.#expertParams;
      const split = experts.size > 0 ? splitParamGroups(paramGroups, experts) : { dense: paramGroups, experts: [] };
      const sharded = new ZeroOptimizer(split.dense, options.createOptimizer, {
        group: mesh!.dpCpGroup, stage: zero, offload: options.offload ?? false, deferGrads, bucketOrder: model.parameters().filter((p) => !experts.has(p)), ...bucketing,
      });
      if (experts.size > 0) {
        const edp = mesh!.edpGroup;
        try {
          if (edp && edp.size > 1) {
            this.#expertZero = new ZeroOptimizer(split.experts, options.createOptimizer, {
              group: edp, stage: zero, offload: options.offload ?? false, bucketOrder: model.parameters().filter((p) => experts.has(p)), ...bucketing,
            });
          } else this.#expertOptimizer = options.createOptimizer(split.experts);
        } catch (e) {
          sharded.dispose();
          throw e;
        }
      }
      if (sharded.stage === 3) sharded.attach(model, { entries: ['forwardStage'], exclude: experts });
      // ZeRO 3's units for the experts: each expert, gathered for its forward and backward.
      if (this.#expertZero?.stage === 3) {
        this.#expertZero.attach(model, { units: moeLayers(model).flatMap((l) => l.experts), entries: ['forwardStage'], exclude: model.parameters().filter((p) => !experts.has(p)) });
      }
      this.#zero = sharded;
      this.#optimizer = null;
      this.#grads = null;
    } else {
      this.#zero = null;
      this.#optimizer = options.createOptimizer(paramGroups);
      const experts = this.#expertParams;
      const dense = model.parameters().filter((p) => !experts.has(p));
      // Context-parallel ranks hold the same parameters as data-parallel ones: dense gradients average over both.
      this.#grads = mesh && mesh.dpCpGroup.size > 1 && dense.length > 0 ? new GradBuffer(dense, { group: mesh.dpCpGroup, ...bucketing }) : null;
      const edp = mesh?.edpGroup ?? null;
      this.#expertGrads = experts.size > 0 && edp && edp.size > 1 ? new GradBuffer([...experts], { group: edp, ...bucketing }) : null;
    }
  }

  /**
   * Checks the options and that the parameter groups hold every parameter of the model exactly once,
   * then builds the trainer. Collective over the mesh's world: when any rank's check fails, every
   * rank throws an ArgumentError (this rank's problem, or a pointer to the other rank's).
   */
  static async create<H extends { lr: number }>(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], options: ParallelTrainerOptions<H>): Promise<ParallelTrainer<H>> {
    const groups = paramGroups.map((g) => ({ ...g, params: [...g.params] }));
    let problem: string | null = null;
    try { checkTrainerSetup(model, groups, options); } catch (e) {
      if (!(e instanceof ArgumentError)) throw e;
      problem = e.message;
    }
    await agreeAll(options.mesh?.world ?? null, problem === null ? null : new ArgumentError(problem), {
      failedElsewhere: (ranks) => new ArgumentError(`ParallelTrainer: model or optimizer rejected on ${ranks} (see the error there); every rank stops`),
    });
    return new ParallelTrainer(model, groups, options);
  }

  /** The ZeRO optimizer (null at ZeRO 0): its reduceStats or gatherStats tell what communication did. Under expert parallelism it holds everything but the experts. */
  get zero(): ZeroOptimizer<H> | null { return this.#zero; }

  /** Under ZeRO with expert parallelism: the experts' ZeRO optimizer over the expert-data-parallel group (null otherwise). */
  get expertZero(): ZeroOptimizer<H> | null { return this.#expertZero; }

  /** The optimizer that holds the state (ZeRO's inner one over the shard when sharded; under ZeRO with expert parallelism, the non-expert parameters'). */
  get optimizer(): Optimizer<H> { return this.#zero ? this.#zero.inner : this.#optimizer!; }

  /** Every optimizer that updates a part of this rank's parameters (one, but for ZeRO with expert parallelism). */
  #optimizers(): Optimizer<H>[] {
    return [this.optimizer, ...(this.#expertZero ? [this.#expertZero.inner] : []), ...(this.#expertOptimizer ? [this.#expertOptimizer] : [])];
  }

  /**
   * Forward and backward of this rank's rows of the global batch (inputs on the first stage, targets
   * on the last; other stages may pass the same tensors), in micro-batches through the pipeline;
   * gradient synchronization, clipping, update.
   */
  async step(inputs: Tensor, targets: Tensor, opts: { lr?: number } = {}): Promise<TrainerStepResult> {
    const t0 = performance.now();
    this.#computeMs = 0;
    this.#cpuMs = 0;
    // The MoE auxiliary losses' gradient carries the loss's scale: each micro-batch's loss weighs 1/m.
    const auxScale = setMoEAuxLossScale(1 / this.#microBatches);
    const result = await scope(async () => {
      let losses: number[];
      try {
        const stage = await this.#contextStage(inputs, targets, true);
        losses = await traceSpan('forward+backward', () => runSchedule(this.#schedule, stage, this.#microBatches));
      } finally {
        setMoEAuxLossScale(auxScale);
      }
      // The debug slowdown: this rank computes (1 + F) times as long (a test hook for straggler detection).
      if (this.#slowdown > 0) traceSpan('debug slowdown', () => this.#timed(() => busyWaitCpu(this.#cpuMs * this.#slowdown)));
      if (opts.lr !== undefined) for (const o of this.#optimizers()) o.setLr(opts.lr);
      let gradNorm: number | undefined;
      if (this.#zero && (this.#expertZero || this.#expertOptimizer)) {
        await this.#sumTiedGrads();
        gradNorm = await traceSpan('optimizer (ZeRO, experts)', () => this.#zeroStepWithExperts());
      } else if (this.#zero) {
        // ZeRO reduce-scatters the tied embedding's gradient (deferred) inside its step, so the stages' sum comes first.
        await this.#sumTiedGrads();
        const normScope: GradNormScope = { skip: this.#countedElsewhere, groups: this.#modelParallelGroups() };
        ({ gradNorm } = await traceSpan('optimizer (ZeRO)', () => this.#zero!.step(this.#maxGradNorm === undefined ? {} : { maxGradNorm: this.#maxGradNorm, normScope })));
        this.#zero.zeroGrad();
      } else {
        // finishGradSync writes the averaged buckets back into .grad, after which the stages sum.
        if (this.#grads) await traceSpan('grad sync', () => this.#grads!.finishGradSync());
        if (this.#expertGrads) await traceSpan('grad sync (experts)', () => this.#expertGrads!.finishGradSync());
        await this.#sumTiedGrads();
        if (this.#maxGradNorm !== undefined) gradNorm = await this.#clipGradNorm(this.#maxGradNorm);
        this.#timed(() => traceSpan('optimizer', () => this.#optimizer!.step()));
        this.#optimizer!.zeroGrad();
      }
      const loss = await this.#globalLoss(losses);
      return gradNorm === undefined ? { loss } : { loss, gradNorm };
    });
    this.#steps++;
    const moe = this.#takeMoEStats();
    if (metricsEnabled) this.#recordMetrics(inputs, performance.now() - t0, result.loss, moe);
    return moe ? { ...result, moe } : result;
  }

  /**
   * ZeRO with expert parallelism: both sharded optimizers finish their reductions, the norm adds the
   * non-expert shards (over the data-parallel group) and the experts' (over their expert-data-parallel
   * copies, then the expert-parallel group, whose ranks hold other experts), both clip by it and update.
   */
  async #zeroStepWithExperts(): Promise<number | undefined> {
    const dense = this.#zero!, ez = this.#expertZero, eo = this.#expertOptimizer, mesh = this.#mesh!;
    await dense.reduceGradients();
    if (ez) await ez.reduceGradients();
    let gradNorm: number | undefined;
    if (this.#maxGradNorm !== undefined) {
      const skip = this.#countedElsewhere;
      using d = tensor(new Float32Array([dense.shardGradSumSquares(skip)]), [1]);
      await dense.group.allReduce(d, { op: 'sum' });
      const expertParams = [...this.#expertParams].filter((p) => !skip.has(p));
      using e = tensor(new Float32Array([ez ? ez.shardGradSumSquares(skip) : gradSumSquares(expertParams)]), [1]);
      if (ez) await ez.group.allReduce(e, { op: 'sum' });
      await mesh.epGroup!.allReduce(e, { op: 'sum' });
      using total = tensor(new Float32Array([d.toArraySync()[0]! + e.toArraySync()[0]!]), [1]);
      for (const g of this.#modelParallelGroups()) await g.allReduce(total, { op: 'sum' });
      gradNorm = Math.sqrt(total.toArraySync()[0]!);
      const factor = clipFactor(gradNorm, this.#maxGradNorm);
      if (factor < 1) {
        dense.scaleShardGrads(factor);
        if (ez) ez.scaleShardGrads(factor);
        else scaleGrads([...this.#expertParams], factor);
      }
    }
    await this.#timed(async () => {
      await dense.step();
      if (ez) await ez.step();
      else eo!.step();
    });
    dense.zeroGrad();
    ez?.zeroGrad();
    eo?.zeroGrad();
    return gradNorm;
  }

  /** The MoE layers' statistics since the last step (summed over layers); undefined without MoE layers. */
  #takeMoEStats(): MoEStats | undefined {
    const layers = moeLayers(this.#model);
    return layers.length === 0 ? undefined : layers.map((l) => l.takeStats()).reduce(addMoEStats);
  }

  /** Appends this step's line to the rank's metrics file (NODETRON_METRICS / NODETRON_TRACE). */
  #recordMetrics(inputs: Tensor, stepMs: number, loss: number, moe?: MoEStats): void {
    const mesh = this.#mesh;
    const tokens = inputs.size * (mesh?.dpSize ?? 1);
    const mem = memoryStats(inputs.device);
    recordStepMetrics({
      step: this.#steps, rank: this.#rank, time: Date.now(), stepMs, computeMs: this.#computeMs, cpuMs: this.#cpuMs, loss,
      tokens, tokensPerSec: tokens / (stepMs / 1000), allocatedBytes: mem.allocated, peakBytes: mem.peak, rssBytes: process.memoryUsage.rss(), device: inputs.device,
      ...(moe ? { moe: { tokensPerExpert: moe.tokensPerExpert, droppedShare: moe.routed > 0 ? moe.dropped / moe.routed : 0, auxLoss: moe.auxLoss, loadBalanceLoss: moe.loadBalanceLoss / Math.max(1, moe.forwards), zLoss: moe.zLoss / Math.max(1, moe.forwards) } } : {}),
    });
  }

  /** Runs fn (sync, or async until it settles) and adds its wall and CPU time to this step's compute time. */
  #timed<T>(fn: () => T): T {
    if (!this.#measure) return fn();
    const t = performance.now(), c = cpuNowMs();
    const done = () => { this.#computeMs += performance.now() - t; this.#cpuMs += cpuNowMs() - c; };
    const out = fn();
    if (out instanceof Promise) return out.finally(done) as T;
    done();
    return out;
  }

  /** The loss of this rank's rows without gradients, through the pipeline, as a global-batch mean on every rank. */
  async evaluate(inputs: Tensor, targets: Tensor): Promise<number> {
    const wasTraining = this.#model.training;
    this.#model.eval();
    try {
      return await scope(async () => this.#globalLoss(await forwardOnly(await this.#contextStage(inputs, targets, false), this.#microBatches)));
    } finally {
      this.#model.train(wasTraining);
    }
  }

  /**
   * The pipeline stage of this rank's rows; under context parallelism, of its tokens of them, with
   * each micro-batch's loss weighted by its share of the group's counted targets (those not -100),
   * so the mean over the group (the gradients' and the loss's) is the whole sequences' token mean.
   */
  async #contextStage(inputs: Tensor, targets: Tensor, training: boolean): Promise<PipelineStage> {
    const mesh = this.#mesh;
    if (!mesh || mesh.cpSize === 1) return this.#pipelineStage(inputs, targets, training);
    const cp = mesh.cpSize, m = this.#microBatches;
    if (inputs.ndim !== 2 || targets.ndim !== 2) throw new ArgumentError(`ParallelTrainer: inputs and targets must be [B, T], got ${inputs.describe()} and ${targets.describe()}`);
    const local = contextSlice(inputs, cp, mesh.cpRank, this.#cpMode), localTargets = contextSlice(targets, cp, mesh.cpRank, this.#cpMode);
    if (local.shape[0]! % m !== 0) throw new ArgumentError(`ParallelTrainer: inputs must be [B, T] with B divisible by the ${m} micro-batches, got ${inputs.describe()}`);
    // Counted targets per micro-batch, here and over the group.
    const rowsPer = local.shape[0]! / m, ids = localTargets.toArraySync(), width = localTargets.shape[1]!;
    using counts = tensor(Float32Array.from({ length: m }, (_, i) => {
      let n = 0;
      for (let j = i * rowsPer * width; j < (i + 1) * rowsPer * width; j++) if (ids[j] !== IGNORE_INDEX) n++;
      return n;
    }), [m]);
    const mine = counts.toArraySync();
    await mesh.cpGroup.allReduce(counts, { op: 'sum' });
    const total = counts.toArraySync();
    const weights = Array.from(mine, (n, i) => (total[i]! > 0 ? (n * cp) / total[i]! : 0));
    return this.#pipelineStage(local, localTargets, training, weights);
  }

  #pipelineStage(inputs: Tensor, targets: Tensor, training: boolean, lossWeights?: number[]): PipelineStage {
    const model = this.#model, m = this.#microBatches;
    const [rows, seqLen] = inputs.shape as [number, number];
    if (inputs.ndim !== 2 || rows % m !== 0) throw new ArgumentError(`ParallelTrainer: inputs must be [B, T] with B divisible by the ${m} micro-batches, got ${inputs.describe()}`);
    const rowsPer = rows / m;
    const microBatch = (t: Tensor, i: number) => (m === 1 ? t : slice(t, 0, i * rowsPer, (i + 1) * rowsPer));
    const pp = this.#mesh && this.#mesh.ppSize > 1 ? this.#mesh.ppGroup : undefined;
    // Gradient communication held back on non-final micro-batches: data parallel (GradBuffer) and
    // ZeRO-1 communicate once per step; ZeRO-2 reduce-scatters every micro-batch (its gradients are
    // sharded as they are produced); ZeRO-3 as each unit's backward ends.
    const grads = !training ? null : this.#grads ?? (this.#zero?.stage === 1 ? this.#zero : null);
    const chunks = model.chunks ?? 1;
    const lastChunk = (c: number) => model.isLastStage && c === chunks - 1;
    return {
      ...(pp ? { group: pp } : {}),
      chunks,
      ...(model.placement ? { placement: model.placement } : {}),
      device: inputs.deviceInfo,
      inputShape: () => model.activationShape(rowsPer, seqLen),
      forwardStep: (i, input, chunk) => {
        const forward = () => model.forwardStage(input ?? microBatch(inputs, i), lastChunk(chunk) ? microBatch(targets, i) : null, chunk);
        const out = this.#timed(() => computeSpan('forward', this.#precision === 'bf16' ? () => autocast({ dtype: 'bf16' }, forward) : forward, { microBatch: i, chunk }));
        // Each micro-batch's mean loss weighs 1/m, so the accumulated gradient is that of the batch mean
        // (under context parallelism, times this rank's share of the micro-batch's counted tokens).
        const w = (m > 1 ? 1 / m : 1) * (lossWeights ? lossWeights[i]! : 1);
        return lastChunk(chunk) && w !== 1 ? scale(out, w) : out;
      },
      runBackward: (i, final, go, info) => this.#timed(() => computeSpan(info.phase === 'weight' ? 'weight grad' : 'backward', () => {
        const experts = !training ? null : this.#expertGrads ?? (this.#expertZero?.stage === 1 ? this.#expertZero : null);
        const held = experts && !final ? () => experts.noSync(go) : go;
        const zero = training ? this.#zero : null;
        // ZeRO 2 and 3 under a zero-bubble schedule: a micro-batch's gradients are final only after its
        // W, and the next micro-batch's B may come first. B runs with the reductions held back (ZeRO 2:
        // its hooks off, the gradients it makes accumulate in full; ZeRO 3: the units release their
        // parameters but keep their gradients); W reduces (ZeRO 2: its hooks fill the buckets and the
        // pass's end launches the rest, B's gradients included; ZeRO 3: every unit reduce-scatters).
        if (zero && zero.stage >= 2 && info.phase !== 'backward') {
          if (info.phase === 'input') return zero.stage === 3 ? zero.holdReductions(held) : zero.noSync(held);
          const out = held() as void | Promise<void>;
          if (zero.stage !== 3) return out;
          if (out) return out.then(() => zero.reduceHeld());
          zero.reduceHeld();
          return;
        }
        return grads && !final ? grads.noSync(held) : held();
      }, { microBatch: i, chunk: info.chunk })),
    };
  }

  /** The first and last stage each hold the tied embedding; both apply the sum of their gradients. */
  async #sumTiedGrads(): Promise<void> {
    const group = this.#mesh?.embeddingGroup;
    if (!group) return;
    for (const p of this.#model.tiedParameters) {
      if (!p.grad) p.grad = emptyOn(p.shape, p.dtype, p.deviceInfo, true);
      await group.allReduce(p.grad, { op: 'sum' });
    }
  }

  /** The groups over which the model is split: tensor-parallel, then pipeline (those with more than one rank). */
  #modelParallelGroups(): CollectiveGroup[] {
    const mesh = this.#mesh;
    return mesh ? [mesh.tpGroup, mesh.ppGroup].filter((g) => g.size > 1) : [];
  }

  // The norm of the whole model's gradient: each rank's parameters that no other rank counts, summed
  // over the model-parallel groups (data-parallel replicas hold the same averaged gradient).
  async #clipGradNorm(maxGradNorm: number): Promise<number> {
    const params = this.#model.parameters();
    const experts = this.#expertParams;
    let sumSquares = gradSumSquares(params.filter((p) => !this.#countedElsewhere.has(p) && !experts.has(p)));
    if (experts.size > 0) {
      // Each expert-parallel rank holds other experts: their squares add over the expert-parallel group.
      using e = tensor(new Float32Array([gradSumSquares([...experts].filter((p) => !this.#countedElsewhere.has(p)))]), [1]);
      await this.#mesh!.epGroup!.allReduce(e, { op: 'sum' });
      sumSquares += e.toArraySync()[0]!;
    }
    const groups = this.#modelParallelGroups();
    if (groups.length > 0) {
      using total = tensor(new Float32Array([sumSquares]), [1]);
      for (const g of groups) await g.allReduce(total, { op: 'sum' });
      sumSquares = total.toArraySync()[0]!;
    }
    const norm = Math.sqrt(sumSquares);
    const factor = clipFactor(norm, maxGradNorm);
    if (factor < 1) scaleGrads(params, factor);
    return norm;
  }

  /** The last stage's micro-batch losses (each already weighted 1/m) → the global batch mean, on every rank. */
  async #globalLoss(losses: number[]): Promise<number> {
    const local = losses.reduce((a, b) => a + b, 0);
    const mesh = this.#mesh;
    if (!mesh || (mesh.ppSize === 1 && mesh.dpCpGroup.size === 1)) return local;
    using t = tensor(new Float32Array([local]), [1]);
    // Only the last stage holds a loss (the others add zeros); then the mean over the data-parallel
    // and context-parallel ranks (context-parallel losses come weighted by their token shares).
    if (mesh.ppSize > 1) await mesh.ppGroup.allReduce(t, { op: 'sum' });
    if (mesh.dpCpGroup.size > 1) await mesh.dpCpGroup.allReduce(t, { op: 'avg' });
    return t.toArraySync()[0]!;
  }

  /**
   * Every parameter of this rank's model (stage) as a new tensor, in model.parameters() order (the
   * caller owns them). Collective over the data-parallel group under ZeRO 3, where the parameters
   * hold no values between steps.
   */
  async fullParameters(): Promise<Tensor[]> {
    const params = this.#model.parameters();
    if (!this.#zero) return params.map((p) => p.clone());
    const byParam = new Map<Tensor, Tensor>();
    for (const z of [this.#zero, this.#expertZero]) {
      if (!z) continue;
      const values = await z.fullParameters();
      z.params.forEach((p, i) => byParam.set(p, values[i]!));
    }
    return params.map((p) => byParam.get(p) ?? p.clone());
  }

  /**
   * What this rank holds of the job's training state (lib/ckpt turns it into parts of the global tensors
   * to save and load): its model, the optimizer or ZeRO shards that hold the state, the parameters
   * another rank saves, and its place among the identical data-parallel replicas.
   */
  checkpointHoldings(): TrainerHoldings<H> {
    const mesh = this.#mesh;
    const edp = mesh?.edpGroup ?? null;
    return {
      model: this.#model,
      optimizer: this.#zero ? null : this.#optimizer,
      zero: this.#zero,
      savedElsewhere: this.#countedElsewhere,
      // Context-parallel ranks hold the same state as data-parallel replicas.
      replica: mesh ? { index: mesh.dpCpGroup.rank, count: mesh.dpCpGroup.size } : null,
      ...(this.#expertParams.size > 0 ? {
        experts: {
          params: this.#expertParams,
          optimizer: this.#zero ? this.#expertOptimizer : this.#optimizer,
          zero: this.#expertZero,
          replica: edp && edp.size > 1 ? { index: edp.rank, count: edp.size } : null,
        },
      } : {}),
    };
  }

  /** The job's world (null in one process): checkpoints coordinate their ranks over it. */
  get world(): CollectiveGroup | null { return this.#mesh?.world ?? null; }

  /** Frees the trainer's optimizer, ZeRO shards and gradient buffers (the model stays with its owner). */
  dispose(): void {
    this.#zero?.dispose();
    this.#expertZero?.dispose();
    this.#expertOptimizer?.dispose();
    this.#optimizer?.dispose();
    this.#grads?.dispose();
    this.#expertGrads?.dispose();
  }
}

/**
 * A span on the compute track (a micro-batch's forward, backward or weight gradient) whose args also
 * carry, when tracing, the process's CPU time over it in µs (`cpuUs`): time a loaded machine cannot
 * stretch by taking the core away, which `nodetron bench pipeline` replays through the schedule's
 * table for a bubble the load does not spoil. The process's (getrusage, exact to the µs), not the
 * main thread's: Node before 23.9 has no thread clock, and a running thread's schedstat only moves at
 * scheduler ticks (milliseconds), coarser than a small model's weight-gradient pass. Waits for
 * messages happen outside these spans, so what else the process runs meanwhile is the
 * communicator's thread moving bytes, and BLAS threads working on the span's own GEMMs.
 */
function computeSpan<T>(name: string, fn: () => T, args: Record<string, unknown>): T {
  if (!traceEnabled) return fn();
  const c0 = process.cpuUsage();
  return traceSpan(name, () => {
    const done = () => { const d = process.cpuUsage(c0); args.cpuUs = d.user + d.system; };
    const out = fn();
    if (out instanceof Promise) return out.finally(done) as T;
    done();
    return out;
  }, 'compute', args);
}

/** The parameter groups cut in two: without the experts, and the experts only (groups left empty dropped). */
function splitParamGroups<H>(groups: ZeroParamGroup<H>[], experts: ReadonlySet<Tensor>): { dense: ZeroParamGroup<H>[]; experts: ZeroParamGroup<H>[] } {
  const part = (keep: (p: Tensor) => boolean) => groups.map((g) => ({ ...g, params: [...g.params].filter(keep) })).filter((g) => g.params.length > 0);
  return { dense: part((p) => !experts.has(p)), experts: part((p) => experts.has(p)) };
}

/** Targets with this value are not counted (crossEntropy's default ignoreIndex). */
const IGNORE_INDEX = -100;

/** The trainer's local checks; throws an ArgumentError naming every problem. */
function checkTrainerSetup<H extends { lr: number }>(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], options: ParallelTrainerOptions<H>): void {
  const problems: string[] = [];
  const { mesh } = options;
  const zero = options.zero ?? 0, m = options.microBatches ?? 1, schedule = options.schedule ?? '1f1b';
  if (zero !== 0 && zero !== 1 && zero !== 2 && zero !== 3) problems.push(`zero must be 0, 1, 2 or 3, got ${String(zero)}`);
  if (zero !== 0 && (!mesh || mesh.dpCpGroup.size === 1)) problems.push(`ZeRO ${zero} shards over a data-parallel group of more than one rank`);
  const cpMode = options.cpMode ?? 'ring';
  if (cpMode !== 'ring' && cpMode !== 'ulysses') problems.push(`cpMode must be 'ring' or 'ulysses', got ${String(cpMode)}`);
  if (!Number.isInteger(m) || m < 1) problems.push(`microBatches must be an integer >= 1, got ${m}`);
  const chunks = model.chunks ?? 1, placement = model.placement ?? 'loop';
  if (!(SCHEDULE_KINDS as readonly string[]).includes(schedule)) problems.push(`schedule must be one of ${SCHEDULE_KINDS.map((k) => `'${k}'`).join(', ')}, got ${String(schedule)}`);
  else if (schedule === 'zb-v') {
    if (chunks !== 2 || placement !== 'v') problems.push('the zb-v schedule needs a model of 2 chunks per stage placed in a V (GPTStage(model, stage, stages, 2, \'v\'))');
    if ((mesh?.ppSize ?? 1) < 2) problems.push('the zb-v schedule needs 2 or more pipeline stages');
  } else if (placement !== 'loop') problems.push(`a model whose chunks are placed '${placement}' needs the zb-v schedule, not '${schedule}'`);
  else if (schedule === 'interleaved') {
    const stages = mesh?.ppSize ?? 1;
    if (chunks < 2) problems.push('the interleaved schedule needs a model of 2 or more chunks per stage (GPTStage(model, stage, stages, chunks))');
    if (stages < 2) problems.push('the interleaved schedule needs 2 or more pipeline stages');
    else if (Number.isInteger(m) && m % stages !== 0) problems.push(`the interleaved schedule needs the micro-batches to be a multiple of the pipeline stages (as Megatron-LM requires): ${m} micro-batches over ${stages} stages`);
  } else if (chunks > 1) problems.push(`a model of ${chunks} chunks per stage needs the interleaved schedule, not '${schedule}'`);
  const precision = options.precision ?? 'f32';
  if (precision !== 'f32' && precision !== 'bf16') {
    problems.push(`precision must be 'f32' or 'bf16', got ${String(precision)}${precision === 'f16' ? ' (f16 needs loss scaling: run nt.autocast({ dtype: \'f16\' }) with nt.GradScaler in your own loop)' : ''}`);
  }
  const stages = mesh?.ppSize ?? 1, stage = mesh?.ppRank ?? 0;
  // Under the V placement the first stage also computes the loss.
  if (model.isFirstStage !== (stage === 0) || model.isLastStage !== (placement === 'v' ? stage === 0 : stage === stages - 1)) {
    problems.push(`the model is ${model.isFirstStage ? 'a first' : 'not a first'} and ${model.isLastStage ? 'a last' : 'not a last'} stage, but this rank is pipeline stage ${stage} of ${stages}`);
  }
  if (mesh && mesh.tpSize > 1 && tensorParallelParameters(model).sharded.length === 0) {
    problems.push(`tp = ${mesh.tpSize}, but the model has no tensor-parallel layers (every rank would hold and train the whole model)`);
  }
  const named = new Map(model.namedParameters().map(([n, p]) => [p, n] as const));
  const listed = new Set<Tensor>();
  for (const g of paramGroups) {
    for (const p of g.params) {
      if (listed.has(p)) problems.push(`${named.get(p as Parameter) ?? p.describe()} is in the parameter groups twice`);
      else if (!named.has(p as Parameter)) problems.push(`the parameter groups hold ${p.describe()}, which is not one of the model's parameters`);
      listed.add(p);
    }
  }
  if (mesh && mesh.epSize > 1 && splitsBackward(schedule) && (zero === 2 || zero === 3)) {
    problems.push(`the ${schedule} schedule with expert parallelism (ep = ${mesh.epSize}) and ZeRO ${zero} is not supported yet (the experts' ZeRO would reduce before each W): use ZeRO 0 or 1`);
  }
  if (mesh && mesh.epSize > 1) {
    const layers = moeLayers(model);
    if (layers.length === 0) problems.push(`ep = ${mesh.epSize}, but the model has no MoE layers to split`);
    else if (layers.some((l) => l.experts.length * mesh.epSize !== l.config.experts)) {
      problems.push(`ep = ${mesh.epSize}, but the MoE layers hold ${layers[0]!.experts.length} of their ${layers[0]!.config.experts} experts here: ` +
        'build the model with moeParallel: nt.parallel.expertParallel({ experts, epGroup: mesh.epGroup, countGroup: mesh.dpGroup })');
    }
  }
  const missing = [...named].filter(([p]) => !listed.has(p)).map(([, n]) => n);
  if (missing.length > 0) problems.push(`the model's parameter(s) ${missing.join(', ')} are in no parameter group, so the optimizer would never update them`);
  if (problems.length > 0) throw new ArgumentError(`ParallelTrainer: ${problems.join('; ')}`);
}
