// ZeRO stages 1 and 2: the bucket engine (../buckets.ts) with the reduce-scatter sync. Gradients are
// reduce-scattered bucket by bucket from autograd's post-accumulate-grad hooks while backward runs,
// so each rank receives the averaged gradient of its chunks (the per-parameter chunk layout of
// chunks.ts makes every bucket an even reduceScatter), and after the update the buckets'
// parameters are allgathered back.
//
// Stage 1 communicates once per step: earlier micro-batches accumulate full gradients without
// communication (noSync), and the last one's backward starts each bucket's reduce-scatter as the
// bucket fills. The full gradients stay (stage 1 shards only the optimizer state).
// Stage 2 shards the gradients as they are produced: every backward pass moves each gradient into
// its bucket as soon as it is final (p.grad becomes null) and reduce-scatters the bucket, so a rank
// never holds more than the buckets being filled or in flight, not the whole model's gradients;
// the shards of successive micro-batches add up.
//
// What a backward pass leaves incomplete is launched when it ends (zeros for gradients that never
// came). Parameters in `deferred` (a pipeline's tied embedding, whose gradient the stages sum after
// backward) are left alone by the hooks and reduce-scattered in step().
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { GradientBuckets, type BucketSync } from '../buckets.js';
import { ChunkedShards, type ShardRun } from './chunks.js';

export interface GradientShardOptions {
  stage: 1 | 2;
  offload: boolean;
  /** Target bytes of full gradients per bucket (a parameter never straddles two). */
  bucketBytes: number;
  /** Reduce-scatter from the hooks during backward (false: everything in step()). */
  overlap: boolean;
  /** Parameters whose gradient is completed after backward by the caller: reduce-scattered in step(). */
  deferred: readonly Tensor[];
  /**
   * The parameters in the order the model creates them (model.parameters()); the first step's
   * buckets take them in reverse, roughly backward's order. Default: the parameter groups' order.
   */
  order?: readonly Tensor[];
}

/** What the reduction did (counts since construction), for tests and benchmarks. */
export interface ReduceStats {
  /** Buckets reduce-scattered from the hooks (or in step() without overlap), and the deferred ones reduce-scattered in step(). */
  buckets: number;
  /** Buckets deferred to step() (parameters whose gradient the caller completes after backward). */
  deferredBuckets: number;
  /** Rounds: launches of every (non-deferred) bucket, one per backward with sync on, or one in step(). */
  rounds: number;
  /** Bucket reduce-scatters launched (the deferred ones included). */
  reduceScatters: number;
  /** Of those, the ones a hook launched while backward was still running (a bucket's last gradient ready). */
  duringBackward: number;
  /**
   * The most bytes of full gradients seen at a hook (the parameters' .grad, buckets being filled or
   * in flight): at stage 2 a few buckets' worth, at stage 1 the whole model's and more.
   */
  peakFullGradBytes: number;
}

/** Reductions in flight beyond which a hook waits for the oldest (bounds the full-gradient bytes held). */
const MAX_IN_FLIGHT = 2;

export class GradientShards extends ChunkedShards {
  readonly stage: 1 | 2;
  readonly overlap: boolean;
  readonly #buckets: GradientBuckets<ShardRun>;
  #peakFullGradBytes = 0;

  constructor(groups: readonly Tensor[][], group: CollectiveGroup, options: GradientShardOptions) {
    super(groups, group, options.offload, `ZeroOptimizer(stage ${options.stage})`);
    this.stage = options.stage;
    this.overlap = options.overlap;
    const deferred = new Set(options.deferred);
    for (const p of deferred) if (!this.parts.has(p)) throw new ArgumentError(`${this.call}: a deferred parameter ${p.describe()} is not one of the optimizer's parameters`);
    const order = options.order ?? this.params;
    const given = new Set(order);
    if (order.length !== this.parts.size || given.size !== order.length || order.some((p) => !this.parts.has(p))) {
      throw new ArgumentError(`${this.call}: the bucket order must list every parameter of the optimizer exactly once`);
    }
    this.#buckets = new GradientBuckets(order, {
      name: this.call, group, sync: this.#reduceScatterSync(), bucketBytes: options.bucketBytes, overlap: options.overlap, deferred,
      oneRoundPerStep: this.stage === 1, roundPerPass: true, maxInFlight: MAX_IN_FLIGHT,
      onReady: () => { this.#peakFullGradBytes = Math.max(this.#peakFullGradBytes, this.memory().fullGrads); },
    });
  }

  /** The reduce-scatter sync: each bucket packed rank-major ([rank][bucket shard]), this rank's reduced shard added to the bucket's gradShard. */
  #reduceScatterSync(): BucketSync<ShardRun> {
    const input = (run: ShardRun) => keep(emptyOn([this.group.size * run.shardCount], 'f32', this.paramDevice, true));
    return {
      layout: (params) => ({ ...this.slotsOf(params.map((p) => [p, p.describe()] as const)), gradShard: null }),
      allocate: (b) => input(b.layout),
      // Stage 2 keeps only the shard: the full gradient goes as soon as it is in the bucket.
      pack: (b, i, flat) => { this.packGrad(b.layout, b.layout.slots[i]!, flat, this.stage === 2); },
      start: (b, flat) => {
        const out = keep(emptyOn([b.layout.shardCount], 'f32', this.paramDevice));
        try {
          return { work: this.group.reduceScatter(out, flat, { op: 'avg' }), out };
        } catch (e) {
          out.dispose();
          throw e;
        }
      },
      settle: (b, out) => this.foldReduced(b.layout, out),
      collect: (buckets) => this.writeMasterGrads(buckets.map((b) => b.layout)),
    };
  }

  get stats(): ReduceStats {
    const all = this.#buckets.buckets, deferredBuckets = all.filter((b) => b.deferred).length, c = this.#buckets.counts;
    return {
      buckets: all.length - deferredBuckets, deferredBuckets, rounds: c.rounds, reduceScatters: c.launched,
      duringBackward: c.launchedOnReady, peakFullGradBytes: this.#peakFullGradBytes,
    };
  }

  /**
   * Runs fn with gradient communication off: gradients accumulate in p.grad and are reduce-scattered
   * by the next synchronized backward or by step(). At stage 1, every micro-batch but the last.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    if (this.stage === 1 && this.#buckets.syncedThisStep) {
      throw new StateError(`${this.call}.noSync: this step's gradients were already reduce-scattered by a backward with sync on; ` +
        'stage 1 communicates once per step, so the micro-batch that syncs must be the last (call step() first)');
    }
    return this.#buckets.noSync(fn);
  }

  /**
   * Before the update: launches what no backward reduced (gradients accumulated under noSync, set
   * by hand, or every gradient without overlap), then the deferred parameters, waits for every
   * reduction and writes the shards into the masters' gradients. After the first step with hooks,
   * the buckets are rebuilt in the order that step's gradients were ready (rank 0's, for every rank).
   */
  async finishGradients(): Promise<void> {
    await this.#buckets.finish();
  }

  /** After the update: every bucket's updated chunks allgathered into the parameters (the next bucket's gather runs while one is unpacked). */
  async finishStep(): Promise<void> {
    const runs = this.#buckets.buckets.map((b) => b.layout);
    const start = (run: ShardRun) => {
      const local = keep(this.localShard(run));
      const full = keep(emptyOn([this.group.size * run.shardCount], 'f32', this.paramDevice));
      return { run, local, full, work: this.group.allGather(full, local) };
    };
    let next: ReturnType<typeof start> | null = runs.length > 0 ? start(runs[0]!) : null;
    for (let i = 0; next; i++) {
      const cur = next;
      try {
        next = i + 1 < runs.length ? start(runs[i + 1]!) : null;
        await cur.work;
        this.unpackGathered(cur.run, cur.full);
      } finally {
        cur.local.dispose();
        cur.full.dispose();
      }
    }
  }

  zeroGrad(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    // Reductions already started finish on every rank; their results are dropped.
    this.#buckets.drop();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
  }

  /** Abandons a failed step: its reductions are let go unawaited (the buckets' abandon), the gradients dropped. */
  abandon(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    this.#buckets.abandon();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
  }

  /** The bucket order (GradientBuckets.orderState), for a process that must launch the same reductions. */
  override orderState(): { order: number[]; rebuilt: boolean } { return this.#buckets.orderState(); }

  /** Takes the bucket order another rank's orderState() gave. */
  override loadOrderState(s: { order: number[]; rebuilt: boolean }): void { this.#buckets.loadOrderState(s); }

  /** Bytes of full gradients (the parameters', in buckets being filled or in flight) and of shard gradients. */
  memory(): { fullGrads: number; shardGrads: number } {
    const inBuckets = this.#buckets.memory();
    let fullGrads = inBuckets.inputs, shardGrads = inBuckets.outputs;
    for (const p of this.parts.keys()) if (p.grad && !p.grad.disposed) fullGrads += p.grad.nbytes;
    for (const b of this.#buckets.buckets) if (b.layout.gradShard) shardGrads += b.layout.gradShard.nbytes;
    for (const m of this.masters) if (m.grad) shardGrads += m.grad.nbytes;
    return { fullGrads, shardGrads };
  }

  /** Removes the hooks and frees the shards and buffers. */
  dispose(): void {
    this.#buckets.dispose();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    this.disposeMasters();
  }
}
