// ZeRO stages 1 and 2: gradients reduce-scattered bucket by bucket from autograd's post-accumulate-
// grad hooks while backward runs, so each rank receives the averaged gradient of its chunks (the
// per-parameter chunk layout of chunks.ts makes every bucket an even reduceScatter), and after the
// update the buckets' parameters are allgathered back.
//
// Stage 1 communicates once per step: earlier micro-batches accumulate full gradients without
// communication (noSync), and the last one's backward starts each bucket's reduce-scatter as the
// bucket fills. The full gradients stay (stage 1 shards only the optimizer state).
// Stage 2 shards the gradients as they are produced: every backward pass moves each gradient into
// its bucket as soon as it is final (p.grad becomes null) and reduce-scatters the bucket, so a rank
// never holds more than the buckets being filled or in flight, not the whole model's gradients;
// the shards of successive micro-batches add up.
//
// Buckets launch in index order on every rank (what the pass has not completed when it ends is
// launched then, zeros for gradients that never came), so every rank issues the same collectives in
// the same order. Parameters in `deferred` (a pipeline's tied embedding, whose gradient the stages
// sum after backward) are left alone by the hooks and reduce-scattered in step().
import { queueBackwardCallback, registerPostAccumulateGradHook, type RemovableHandle } from '../../autograd/engine.js';
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import { readyOrderOfRank0, withExit } from '../data-parallel/buffer.js';
import { splitIntoBuckets } from '../flat.js';
import type { ProcessGroup, Work } from '../group.js';
import { ChunkedShards, type ShardRun, type ShardSlot } from './chunks.js';

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

/** A run of parameters whose gradients are reduce-scattered together. */
interface Bucket extends ShardRun {
  index: number;
  deferred: boolean;
  /** Parameters whose gradient is in `input` this round. */
  marked: Set<Tensor>;
  /** The reduceScatter's input being filled ([rank][bucket shard]), allocated at the round's first gradient. */
  input: Tensor | null;
}

interface Reduction {
  bucket: Bucket;
  work: Work;
  input: Tensor;
  out: Tensor;
  /** zeroGrad() came before step(): the result is dropped when it arrives. */
  discard: boolean;
}

/** What the reduction did (counts since construction), for tests and benchmarks. */
export interface ReduceStats {
  /** Buckets reduce-scattered from the hooks (or in step() without overlap), and the deferred ones reduce-scattered in step(). */
  buckets: number;
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
  #buckets: Bucket[] = [];
  readonly #bucketBytes: number;
  readonly #deferred: Set<Tensor>;
  /** The first synchronized pass's order of ready gradients, for rebuilding the buckets after the first step (null: rebuilt, or no hooks). */
  #readyOrder: Tensor[] | null;
  #recording = true;
  readonly #slotOf = new Map<Tensor, [Bucket, ShardSlot]>();
  readonly #hooks: RemovableHandle[] = [];
  readonly #inFlight: Reduction[] = [];
  /** The first bucket not launched in this round (buckets launch in index order). */
  #next = 0;
  /** A backward pass's hooks have started a round whose end callback is queued. */
  #passOpen = false;
  #syncDisabled = 0;
  /** A round of reduce-scatters ran this step (stage 1: at most one). */
  #reducedThisStep = false;
  /** A backward under noSync() left gradients in p.grad that no round has reduced yet. */
  #unreduced = false;
  readonly stats: ReduceStats;

  constructor(groups: readonly Tensor[][], group: ProcessGroup, options: GradientShardOptions) {
    super(groups, group, options.offload, `ZeroOptimizer(stage ${options.stage})`);
    this.stage = options.stage;
    this.overlap = options.overlap;
    if (!(options.bucketBytes > 0)) throw new ArgumentError(`${this.call}: bucketBytes must be > 0, got ${options.bucketBytes}`);
    this.#bucketBytes = options.bucketBytes;
    this.#deferred = new Set(options.deferred);
    for (const p of this.#deferred) if (!this.parts.has(p)) throw new ArgumentError(`${this.call}: a deferred parameter ${p.describe()} is not one of the optimizer's parameters`);
    const order = options.order ?? this.params;
    const given = new Set(order);
    if (order.length !== this.parts.size || given.size !== order.length || order.some((p) => !this.parts.has(p))) {
      throw new ArgumentError(`${this.call}: the bucket order must list every parameter of the optimizer exactly once`);
    }
    this.stats = { buckets: 0, deferredBuckets: 0, rounds: 0, reduceScatters: 0, duringBackward: 0, peakFullGradBytes: 0 };
    // Reverse creation order is roughly the order backward finishes the gradients.
    this.#assignBuckets([...order].reverse());
    this.#readyOrder = options.overlap ? [] : null;
    if (this.overlap) {
      for (const b of this.#buckets) {
        if (b.deferred) continue;
        for (const s of b.slots) if (s.part.param.requiresGrad) this.#hooks.push(registerPostAccumulateGradHook(s.part.param, (p) => this.#gradReady(p)));
      }
    }
  }

  // Buckets of about bucketBytes over `order`, the deferred parameters' last.
  #assignBuckets(order: readonly Tensor[]): void {
    const runs = [
      ...splitIntoBuckets(order.filter((p) => !this.#deferred.has(p)), this.#bucketBytes).map((ps) => [ps, false] as const),
      ...splitIntoBuckets(order.filter((p) => this.#deferred.has(p)), this.#bucketBytes).map((ps) => [ps, true] as const),
    ];
    this.#slotOf.clear();
    this.#buckets = runs.map(([ps, isDeferred], index) => {
      const b: Bucket = { ...this.slotsOf(ps.map((p) => [p, p.describe()] as const)), gradShard: null, index, deferred: isDeferred, marked: new Set(), input: null };
      for (const s of b.slots) this.#slotOf.set(s.part.param, [b, s]);
      return b;
    });
    this.stats.deferredBuckets = this.#buckets.filter((b) => b.deferred).length;
    this.stats.buckets = this.#buckets.length - this.stats.deferredBuckets;
  }

  /**
   * Runs fn with gradient communication off: gradients accumulate in p.grad and are reduce-scattered
   * by the next synchronized backward or by step(). At stage 1, every micro-batch but the last.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    if (this.stage === 1 && this.#reducedThisStep) {
      throw new StateError(`${this.call}.noSync: this step's gradients were already reduce-scattered by a backward with sync on; ` +
        'stage 1 communicates once per step, so the micro-batch that syncs must be the last (call step() first)');
    }
    this.#syncDisabled++;
    this.#unreduced = true;
    return withExit(fn, () => { this.#syncDisabled--; });
  }

  // The hook: p's gradient of this backward pass is final.
  #gradReady(p: Tensor): void {
    if (this.#syncDisabled > 0) return;
    if (this.stage === 1 && this.#reducedThisStep) {
      throw new StateError(`${this.call}: ${p.describe()} got a gradient from a second backward() after this step's gradients were reduce-scattered; ` +
        'stage 1 communicates once per step: run every micro-batch but the last inside noSync()');
    }
    if (!this.#passOpen) {
      this.#passOpen = true;
      queueBackwardCallback(() => this.#endPass());
    }
    this.stats.peakFullGradBytes = Math.max(this.stats.peakFullGradBytes, this.memory().fullGrads);
    if (this.#recording) this.#readyOrder?.push(p);
    const [b, slot] = this.#slotOf.get(p)!;
    this.#pack(b, slot);
    if (b.marked.size === b.slots.length) this.#launchCompleted();
  }

  #pack(b: Bucket, slot: ShardSlot): void {
    b.input ??= keep(emptyOn([this.group.size * b.shardCount], 'f32', this.paramDevice, true));
    // Stage 2 keeps only the shard: the full gradient goes as soon as it is in the bucket.
    this.packGrad(b, slot, b.input, this.stage === 2);
    b.marked.add(slot.part.param);
  }

  #launchCompleted(): void {
    for (let b = this.#buckets[this.#next]; b && !b.deferred && b.marked.size === b.slots.length; b = this.#buckets[this.#next]) this.#launch(b, true);
  }

  // Launches every bucket of the round not launched yet.
  #launchRest(): void {
    this.stats.rounds++;
    for (let b = this.#buckets[this.#next]; b && !b.deferred; b = this.#buckets[this.#next]) this.#packRestAndLaunch(b);
  }

  // Launches b from outside the hooks, taking whatever gradients its unmarked parameters hold.
  #packRestAndLaunch(b: Bucket): void {
    for (const s of b.slots) if (!b.marked.has(s.part.param)) this.#pack(b, s);
    this.#launch(b, false);
  }

  #launch(b: Bucket, duringBackward: boolean): void {
    const input = b.input ?? keep(emptyOn([this.group.size * b.shardCount], 'f32', this.paramDevice, true));
    b.input = null;
    b.marked.clear();
    if (!b.deferred) this.#next++;
    const out = keep(emptyOn([b.shardCount], 'f32', this.paramDevice));
    let work: Work;
    try {
      work = this.group.reduceScatter(out, input, { op: 'avg' });
    } catch (e) {
      input.dispose();
      out.dispose();
      throw e;
    }
    this.#inFlight.push({ bucket: b, work, input, out, discard: false });
    this.stats.reduceScatters++;
    if (duringBackward) this.stats.duringBackward++;
    // A group that can block keeps at most MAX_IN_FLIGHT buckets of full gradients in flight.
    this.#settleBlocking(MAX_IN_FLIGHT);
  }

  // Waits (blocking) for the oldest reductions until at most `limit` remain, where the group can block.
  #settleBlocking(limit: number): void {
    while (this.#inFlight.length > limit && this.#inFlight[0]!.work.waitSync) {
      const r = this.#inFlight.shift()!;
      r.work.waitSync!();
      this.#settle(r);
    }
  }

  // A reduction whose work has completed: frees its input, adds its output to the bucket's shard.
  #settle(r: Reduction): void {
    r.input.dispose();
    if (r.discard) r.out.dispose();
    else this.foldReduced(r.bucket, r.out);
  }

  // The end of a backward pass with sync on: what it left incomplete is launched now.
  #endPass(): void {
    this.#passOpen = false;
    this.#recording = false;
    this.#launchRest();
    this.#next = 0;
    this.#reducedThisStep = true;
    this.#unreduced = false;
  }

  /**
   * Before the update: launches what no backward reduced (gradients accumulated under noSync, set
   * by hand, or every gradient without overlap), then the deferred parameters, waits for every
   * reduction and writes the shards into the masters' gradients.
   */
  async finishGradients(): Promise<void> {
    if (this.#passOpen) {
      throw new StateError(`${this.call}.step: a backward pass that started reduce-scattering gradients never finished (it threw, or step() runs inside it); ` +
        'call zeroGrad() to drop this step\'s gradients and run the step again');
    }
    if (!this.#reducedThisStep || this.#unreduced) this.#launchRest();
    this.#next = 0;
    for (const b of this.#buckets) if (b.deferred) this.#packRestAndLaunch(b);
    while (this.#inFlight.length > 0) {
      const r = this.#inFlight[0]!;
      await r.work;
      this.#inFlight.shift();
      this.#settle(r);
    }
    this.writeMasterGrads(this.#buckets);
    this.#reducedThisStep = false;
    this.#unreduced = false;
  }

  /**
   * After the update: every bucket's updated chunks allgathered into the parameters (the next
   * bucket's gather runs while one is unpacked). After the first step with hooks, the buckets are
   * rebuilt in the order that step's gradients were ready (rank 0's, for every rank), as GradBuffer does.
   */
  async finishStep(): Promise<void> {
    await this.#allGatherParameters();
    if (this.#readyOrder && this.#readyOrder.length > 0) {
      const observed = this.#readyOrder;
      this.#readyOrder = null;
      this.#assignBuckets(await readyOrderOfRank0(this.group, this.params, observed));
    }
  }

  async #allGatherParameters(): Promise<void> {
    const start = (b: Bucket) => {
      const local = keep(this.localShard(b));
      const full = keep(emptyOn([this.group.size * b.shardCount], 'f32', this.paramDevice));
      return { b, local, full, work: this.group.allGather(full, local) };
    };
    let next: ReturnType<typeof start> | null = this.#buckets.length > 0 ? start(this.#buckets[0]!) : null;
    for (let i = 0; next; i++) {
      const cur = next;
      try {
        next = i + 1 < this.#buckets.length ? start(this.#buckets[i + 1]!) : null;
        await cur.work;
        this.unpackGathered(cur.b, cur.full);
      } finally {
        cur.local.dispose();
        cur.full.dispose();
      }
    }
  }

  zeroGrad(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    for (const b of this.#buckets) {
      b.input?.dispose();
      b.input = null;
      b.marked.clear();
      b.gradShard?.dispose();
      b.gradShard = null;
    }
    // Reductions already started finish on every rank; their results are dropped.
    for (const r of this.#inFlight) r.discard = true;
    this.#settleBlocking(0);
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
    this.#next = 0;
    this.#passOpen = false;
    this.#reducedThisStep = false;
    this.#unreduced = false;
  }

  /** Bytes of full gradients (the parameters', in buckets being filled or in flight) and of shard gradients. */
  memory(): { fullGrads: number; shardGrads: number } {
    let fullGrads = 0, shardGrads = 0;
    for (const p of this.parts.keys()) if (p.grad && !p.grad.disposed) fullGrads += p.grad.nbytes;
    for (const b of this.#buckets) {
      if (b.input) fullGrads += b.input.nbytes;
      if (b.gradShard) shardGrads += b.gradShard.nbytes;
    }
    for (const r of this.#inFlight) { fullGrads += r.input.nbytes; shardGrads += r.out.nbytes; }
    for (const m of this.masters) if (m.grad) shardGrads += m.grad.nbytes;
    return { fullGrads, shardGrads };
  }

  /** Removes the hooks and frees the shards and buffers. */
  dispose(): void {
    for (const h of this.#hooks) h.remove();
    this.#hooks.length = 0;
    for (const b of this.#buckets) { b.input?.dispose(); b.input = null; b.gradShard?.dispose(); b.gradShard = null; }
    for (const r of this.#inFlight) { r.input.dispose(); r.out.dispose(); }
    this.#inFlight.length = 0;
    this.disposeMasters();
  }
}
