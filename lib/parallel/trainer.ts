// ParallelTrainer: the training step of one rank of any TP × CP × PP × DP × EP layout (layout.ts checks the
// layout): this rank's tokens under context parallelism, micro-batches through the pipeline schedule,
// gradient averaging per parameter family (families.ts: the dense parameters over the data- and
// context-parallel ranks, the experts over their expert-data-parallel copies; GradBuffer or ZeRO
// 1/2/3), the tied embedding's gradient summed over the first and last stage, clipping by the norm of
// the whole model's gradient (one function over every family), the update. Every total the trainer
// reduces (loss, counted tokens, norm) goes on the group's agreement device, so NCCL-only groups work.
// The option checks are trainer-checks.ts's.
import { autocast } from '../amp.js';
import { ArgumentError, StateError } from '../errors.js';
import { memoryStats, scope } from '../memory.js';
import { scale, slice } from '../ops/index.js';
import { clipFactor } from '../optim/clip.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Module, Parameter } from '../nn/module.js';
import { addMoEStats, moeLayers, type MoEStats, type MoEStepContext } from '../nn/moe.js';
import { emptyOn, type Tensor } from '../tensor.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { agreeAll } from '../distributed/agree.js';
import { reduceTotals } from '../distributed/totals.js';
import { traceEnabled, traceSpan } from '../observe/trace.js';
import { busyWaitCpu, cpuNowMs, debugSlowdown, metricsEnabled, recordStepMetrics } from '../observe/metrics.js';
import type { ContextParallelMode, PipelineScheduleName } from './layout.js';
import { contextSlice } from './context-parallel/gpt.js';
import {
  abandonFamilies, buildFamilies, disposeFamilies, familyBucketOrders, loadFamilyBucketOrders, type BucketOrder, familiesGradNorm, finishBucketSync, finishShardedSync, holdingSync, optimizersOf, scaleFamilyGrads, updateFamilies, zeroFamilyGrads, zeroOf,
  type ParamFamily,
} from './families.js';
import type { ParallelState } from './mesh.js';
import type { PipelineModule } from './pipeline/gpt-stage.js';
import { forwardOnly, runSchedule, type PipelineStage } from './pipeline/schedules.js';
import { tensorParallelParameters } from './tensor-parallel/gpt.js';
import { checkTrainerSetup } from './trainer-checks.js';
import type { ZeroOptimizer, ZeroParamGroup, InnerOptimizerFactory } from './zero/optimizer.js';

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

/**
 * What a trainer holds beyond the checkpoint's training state that another process of the same
 * layout needs to go on in step with its peers (in-job recovery's images carry it): the steps taken,
 * and each family's gradient bucket order (after the first step the buckets are rebuilt in the order
 * its gradients were ready; a replacement process must launch the same collectives in the same order).
 */
export interface TrainerRecoveryState {
  /** Steps taken (the per-step metrics' index). */
  steps: number;
  /** Each family's bucket order, in family order (null: no buckets). */
  buckets: (BucketOrder | null)[];
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
  /** The parameter families (families.ts): dense, and the experts under expert parallelism. */
  readonly #families: ParamFamily<H>[];
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
    this.#rank = mesh?.world.rank ?? Number(process.env.RANK ?? 0);
    this.#slowdown = debugSlowdown(this.#rank);
    this.#measure = metricsEnabled || this.#slowdown > 0;
    this.#countedElsewhere = new Set(model.tiedCountedElsewhere);
    // Replicated parameters (LayerNorms, positions, row-parallel biases) have equal gradients on every tensor-parallel rank.
    if (mesh && mesh.tpSize > 1 && mesh.tpRank > 0) for (const p of tensorParallelParameters(model).replicated) this.#countedElsewhere.add(p);
    this.#families = buildFamilies(model, paramGroups, mesh, {
      zero: options.zero ?? 0, offload: options.offload ?? false, bucketBytes: options.bucketBytes, createOptimizer: options.createOptimizer,
    });
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
  get zero(): ZeroOptimizer<H> | null { return zeroOf(this.#families[0]); }

  /** Under ZeRO with expert parallelism: the experts' ZeRO optimizer over the expert-data-parallel group (null otherwise). */
  get expertZero(): ZeroOptimizer<H> | null { return zeroOf(this.#experts()); }

  /** The optimizer that holds the state (ZeRO's inner one over the shard when sharded; under ZeRO with expert parallelism, the non-expert parameters'). */
  get optimizer(): Optimizer<H> { return this.#families[0]!.optimizer; }

  /** The experts' family under expert parallelism, else undefined. */
  #experts(): ParamFamily<H> | undefined { return this.#families.find((f) => f.name === 'experts'); }

  /**
   * Forward and backward of this rank's rows of the global batch (inputs on the first stage, targets
   * on the last; other stages may pass the same tensors), in micro-batches through the pipeline;
   * gradient synchronization, clipping, update.
   */
  async step(inputs: Tensor, targets: Tensor, opts: { lr?: number } = {}): Promise<TrainerStepResult> {
    const t0 = performance.now();
    this.#computeMs = 0;
    this.#cpuMs = 0;
    const families = this.#families;
    const result = await scope(async () => {
      // The MoE auxiliary losses' gradient carries the loss's scale: each micro-batch's loss weighs 1/m.
      // The step context goes to this trainer's own MoE layers, for this step only.
      const context: MoEStepContext = { auxLossScale: 1 / this.#microBatches };
      const layers = moeLayers(this.#model);
      let losses: number[];
      for (const l of layers) l.stepContext = context;
      try {
        const stage = await this.#contextStage(inputs, targets, true);
        losses = await traceSpan('forward+backward', () => runSchedule(this.#schedule, stage, this.#microBatches));
      } finally {
        for (const l of layers) l.stepContext = null;
      }
      // The debug slowdown: this rank computes (1 + F) times as long (a test hook for straggler detection).
      if (this.#slowdown > 0) traceSpan('debug slowdown', () => this.#timed(() => busyWaitCpu(this.#cpuMs * this.#slowdown)));
      if (opts.lr !== undefined) for (const o of optimizersOf(families)) o.setLr(opts.lr);
      // Bucketed all-reduces write the averages back into .grad, after which the stages sum the tied
      // embedding; ZeRO reduce-scatters that gradient (deferred) itself, so the stages' sum comes first.
      await finishBucketSync(families);
      await this.#sumTiedGrads();
      await finishShardedSync(families);
      let gradNorm: number | undefined;
      if (this.#maxGradNorm !== undefined) {
        gradNorm = await familiesGradNorm(families, this.#countedElsewhere, this.#modelParallelGroups());
        scaleFamilyGrads(families, clipFactor(gradNorm, this.#maxGradNorm));
      }
      await traceSpan('optimizer', () => updateFamilies(families, (fn) => this.#timed(fn)));
      zeroFamilyGrads(families);
      const loss = await this.#globalLoss(losses);
      return gradNorm === undefined ? { loss } : { loss, gradNorm };
    });
    this.#steps++;
    const moe = this.#takeMoEStats();
    if (metricsEnabled) this.#recordMetrics(inputs, performance.now() - t0, result.loss, moe);
    return moe ? { ...result, moe } : result;
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
    const mine = Array.from({ length: m }, (_, i) => {
      let n = 0;
      for (let j = i * rowsPer * width; j < (i + 1) * rowsPer * width; j++) if (ids[j] !== IGNORE_INDEX) n++;
      return n;
    });
    const total = await reduceTotals(mine, [{ group: mesh.cpGroup }]);
    const weights = mine.map((n, i) => (total[i]! > 0 ? (n * cp) / total[i]! : 0));
    return this.#pipelineStage(local, localTargets, training, weights);
  }

  #pipelineStage(inputs: Tensor, targets: Tensor, training: boolean, lossWeights?: number[]): PipelineStage {
    const model = this.#model, m = this.#microBatches;
    const [rows, seqLen] = inputs.shape as [number, number];
    if (inputs.ndim !== 2 || rows % m !== 0) throw new ArgumentError(`ParallelTrainer: inputs must be [B, T] with B divisible by the ${m} micro-batches, got ${inputs.describe()}`);
    const rowsPer = rows / m;
    const microBatch = (t: Tensor, i: number) => (m === 1 ? t : slice(t, 0, i * rowsPer, (i + 1) * rowsPer));
    const pp = this.#mesh && this.#mesh.ppSize > 1 ? this.#mesh.ppGroup : undefined;
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
      // Gradient communication held back where the gradients are not final (families.ts's holdingSync).
      runBackward: (i, final, go, info) => this.#timed(() => computeSpan(info.phase === 'weight' ? 'weight grad' : 'backward',
        () => (training ? holdingSync(this.#families, final, info.phase, go) : go()), { microBatch: i, chunk: info.chunk })),
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

  /**
   * The last stage's micro-batch losses (each already weighted 1/m) → the global batch mean, on every
   * rank: only the last stage holds a loss (the others add zeros), then the mean over the data- and
   * context-parallel ranks (context-parallel losses come weighted by their token shares).
   */
  async #globalLoss(losses: number[]): Promise<number> {
    const local = losses.reduce((a, b) => a + b, 0);
    const mesh = this.#mesh;
    if (!mesh) return local;
    const [loss] = await reduceTotals([local], [{ group: mesh.ppGroup, op: 'sum' }, { group: mesh.dpCpGroup, op: 'avg' }]);
    return loss!;
  }

  /**
   * Every parameter of this rank's model (stage) as a new tensor, in model.parameters() order (the
   * caller owns them). Collective over the data-parallel group under ZeRO 3, where the parameters
   * hold no values between steps.
   */
  async fullParameters(): Promise<Tensor[]> {
    const params = this.#model.parameters();
    const byParam = new Map<Tensor, Tensor>();
    for (const f of this.#families) {
      const z = zeroOf(f);
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
    const [dense] = this.#families, experts = this.#experts();
    const place = (g: CollectiveGroup | null): ReplicaPlace | null => (g ? { index: g.rank, count: g.size } : null);
    const mesh = this.#mesh;
    return {
      model: this.#model,
      optimizer: zeroOf(dense) ? null : dense!.optimizer,
      zero: zeroOf(dense),
      savedElsewhere: this.#countedElsewhere,
      // Context-parallel ranks hold the same state as data-parallel replicas.
      replica: mesh ? { index: mesh.dpCpGroup.rank, count: mesh.dpCpGroup.size } : null,
      ...(experts ? {
        experts: { params: new Set(experts.params), optimizer: zeroOf(experts) ? null : experts.optimizer, zero: zeroOf(experts), replica: place(experts.replicas) },
      } : {}),
    };
  }

  /**
   * After step() threw midway (a collective failed: CommError, TimeoutError), puts the trainer back
   * in a state where the next step() works once the parameters and optimizer are restored (an image,
   * lib/ckpt/image.ts): every family's collectives in flight are let go unawaited (the communicator
   * is dead), bucket marks and noSync holds reset (the hooks stay armed), ZeRO 3's gathered
   * parameters released (re-gathered by the next forward), every gradient and the step's temporary
   * buffers freed, the MoE layers' step context and statistics dropped. The pipeline runner lives
   * for one step (its buffers went with the failed step). The values of the parameters and the
   * optimizer state are whatever the failed step left: restore them before stepping. Safe to call
   * when no step failed (it drops the gradients).
   */
  abandonStep(): void {
    abandonFamilies(this.#families);
    for (const l of moeLayers(this.#model)) { l.stepContext = null; l.takeStats(); }
    this.#computeMs = 0;
    this.#cpuMs = 0;
  }

  /** What this trainer holds beyond its training state (see {@link TrainerRecoveryState}); between steps. */
  recoveryState(): TrainerRecoveryState {
    return { steps: this.#steps, buckets: familyBucketOrders(this.#families) };
  }

  /** Takes another process's (or an earlier) recoveryState() of the same layout; between steps. */
  loadRecoveryState(s: TrainerRecoveryState): void {
    if (!s || !Number.isInteger(s.steps) || s.steps < 0 || !Array.isArray(s.buckets) || s.buckets.length !== this.#families.length) {
      throw new StateError(`ParallelTrainer.loadRecoveryState: expected { steps, buckets } with one bucket order per family (${this.#families.length}), got ${JSON.stringify(s)?.slice(0, 200)}`);
    }
    loadFamilyBucketOrders(this.#families, s.buckets);
    this.#steps = s.steps;
  }

  /** The job's world (null in one process): checkpoints coordinate their ranks over it. */
  get world(): CollectiveGroup | null { return this.#mesh?.world ?? null; }

  /** Frees the trainer's optimizer, ZeRO shards and gradient buffers (the model stays with its owner). */
  dispose(): void {
    disposeFamilies(this.#families);
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

/** Targets with this value are not counted (crossEntropy's default ignoreIndex). */
const IGNORE_INDEX = -100;
