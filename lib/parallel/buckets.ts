// The gradient bucket engine of data parallelism and ZeRO stages 1 and 2 (Megatron-core's
// param_and_grad_buffer with its two sync modes, PyTorch DDP's reducer): parameters grouped into
// buckets whose collective starts from autograd's post-accumulate-grad hooks as soon as a bucket's
// last gradient is final, overlapping the rest of backward. Buckets launch in index order on every
// rank, so every rank issues the same collectives in the same order; noSync() holds communication
// back on non-final micro-batches; after the first step the buckets are rebuilt in the order its
// gradients were ready (rank 0's, on every rank). What a bucket's collective is and where its result
// goes is the sync strategy: all-reduce (plain data parallel, GradBuffer in data-parallel/buffer.ts)
// or reduce-scatter (ZeRO 1 and 2, zero/stage1-2.ts).
import { queueBackwardCallback, registerPostAccumulateGradHook, type RemovableHandle } from '../autograd/engine.js';
import { tensor } from '../creation.js';
import type { CollectiveGroup, CollectiveWork } from '../distributed/group.js';
import { ArgumentError, StateError } from '../errors.js';
import type { Tensor } from '../tensor.js';


/** A family's gradient bucket order (plain buckets or ZeRO 1/2's; null for none): what a replacement process must launch in. */
export interface BucketOrder {
  /** Bucketed parameters, as indices into the engine's parameter list, in bucket order. */
  order: number[];
  /** Whether the buckets were rebuilt after the first step (in the order its gradients were ready). */
  rebuilt: boolean;
}
/** Default bucket size: 25 MB as PyTorch DDP; tiny models end up in one bucket. */
export const DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024;

/**
 * Splits `order` into consecutive runs of about `bucketBytes` each (a parameter never straddles two
 * runs; one larger than `bucketBytes` gets a run of its own): what the buckets are cut from.
 */
function splitIntoBuckets(order: readonly Tensor[], bucketBytes: number): Tensor[][] {
  const runs: Tensor[][] = [];
  let run: Tensor[] = [], bytes = 0;
  for (const p of order) {
    if (run.length > 0 && bytes + p.nbytes > bucketBytes) { runs.push(run); run = []; bytes = 0; }
    run.push(p); bytes += p.nbytes;
  }
  if (run.length > 0) runs.push(run);
  return runs;
}

/**
 * The buckets' parameter runs for `order` (the first bucket first): consecutive runs of about
 * `bucketBytes` of the parameters not in `deferred`, then those of the deferred ones (launched last).
 * What the engine cuts its buckets from, and what ZeRO 1/2 lay their shards out by before it exists.
 */
export function bucketRuns(order: readonly Tensor[], deferred: ReadonlySet<Tensor>, bucketBytes: number): { params: Tensor[]; deferred: boolean }[] {
  return [
    ...splitIntoBuckets(order.filter((p) => !deferred.has(p)), bucketBytes).map((params) => ({ params, deferred: false })),
    ...splitIntoBuckets(order.filter((p) => deferred.has(p)), bucketBytes).map((params) => ({ params, deferred: true })),
  ];
}

/** The engine each bucket belongs to (engineOf finds a GradBuffer's engine through its buckets). */
const engines = new WeakMap<object, GradientBuckets<unknown>>();

/**
 * The engine that owns `bucket`, for owners such as GradBuffer that show their buckets but not their
 * engine (in-job recovery abandons its step and reads or sets its bucket order); undefined for none.
 */
export function engineOf(bucket: object): GradientBuckets<unknown> | undefined {
  return engines.get(bucket);
}

/** One bucket: a run of parameters, the flat buffer their gradients are packed into, and its collective in flight. */
export class Bucket<L> {
  /** Parameters whose gradient is in `flat` this round (with one round per step: this step). */
  readonly marked = new Set<Tensor>();
  /** The collective's input being filled, allocated zero-filled at the first gradient packed into it. */
  flat: Tensor | null = null;
  /** The collective last started on the bucket, until its result is taken. */
  work: CollectiveWork | null = null;

  constructor(readonly index: number, readonly params: readonly Tensor[], readonly layout: L, readonly deferred: boolean) {}

  /** Parameters still to be packed before the bucket can launch. */
  get pending(): number { return this.params.length - this.marked.size; }
}

/** How a bucket's gradients are synchronized: the layout of its buffer, the collective, where the result goes. */
export interface BucketSync<L> {
  /** The layout of a bucket holding `params`, in this order. */
  layout(params: readonly Tensor[]): L;
  /** The input of the bucket's collective, kept out of scopes (the engine frees it); pack() writes every parameter's range before it launches. */
  allocate(b: Bucket<L>): Tensor;
  /** Copies the gradient of the bucket's parameter `i`, if it has one, into `flat` (and may free it). */
  pack(b: Bucket<L>, i: number, flat: Tensor): void;
  /** Starts the collective over the packed `flat`: its work and the tensor the result lands in (`flat` when in place). */
  start(b: Bucket<L>, flat: Tensor): { work: CollectiveWork; out: Tensor };
  /** The collective finished: takes its result (consumes `out`). */
  settle(b: Bucket<L>, out: Tensor): void;
  /** Every collective of the step has settled: the last look at the buckets before they may be rebuilt. */
  collect?(buckets: readonly Bucket<L>[]): void;
  /** The buckets are being replaced by new ones (rebuilt in readiness order): frees what the strategy keeps per bucket. */
  discard?(buckets: readonly Bucket<L>[]): void;
}

export interface GradientBucketsOptions<L> {
  /** Names the owner in messages ('GradBuffer', 'ZeroOptimizer(stage 2)'). */
  name: string;
  group: CollectiveGroup;
  sync: BucketSync<L>;
  /** Target bytes of gradients per bucket (a parameter never straddles two). */
  bucketBytes: number;
  /** Mark each gradient ready from autograd's post-accumulate-grad hook (false: only by hand, or in finish()). */
  overlap: boolean;
  /** Parameters left alone by the hooks (their gradient is completed after backward): own buckets, launched in finish(). */
  deferred?: ReadonlySet<Tensor>;
  /**
   * At most one round per step: marks stay until finish(), so a parameter marked again with sync on
   * (a second backward) is a StateError. Otherwise every backward with sync on is a round of its own.
   */
  oneRoundPerStep: boolean;
  /** The end of a backward pass that marked gradients launches the rest of its round (marks must then come from backward). */
  roundPerPass: boolean;
  /** Collectives in flight beyond which a launch waits (blocking) for the oldest, where the group can block. Default: no limit. */
  maxInFlight?: number;
  /** Called at each mark with sync on, before the gradient is packed. */
  onReady?: () => void;
  /**
   * Rebuild the buckets after the first step in the order its gradients were ready (default true).
   * False keeps the first buckets for good (ZeRO 1/2: which rank holds which elements follows them).
   */
  rebuild?: boolean;
}

/** What the engine launched (counts since construction). */
export interface BucketCounts {
  /** Rounds: launches of every bucket not deferred. */
  rounds: number;
  /** Collectives launched, the deferred buckets' included. */
  launched: number;
  /** Of those, the ones a mark launched (a bucket's last gradient ready), not the end of a round. */
  launchedOnReady: number;
}

interface InFlight<L> {
  bucket: Bucket<L>;
  work: CollectiveWork;
  flat: Tensor;
  out: Tensor;
  /** The step was dropped: the result is freed when it arrives. */
  discard: boolean;
}

/**
 * Gradient buckets over a fixed parameter list, first in reverse order (roughly the order backward
 * produces the gradients, so the first bucket fills first), after the first step in the order the
 * gradients were ready. A mark packs the gradient into its bucket and launches, in index order,
 * every bucket that is complete; finish() launches the rest, waits for every collective and hands
 * each result to the sync strategy.
 */
export class GradientBuckets<L> {
  #buckets: Bucket<L>[] = [];
  readonly #where = new Map<Tensor, readonly [Bucket<L>, number]>();
  readonly #params: readonly Tensor[];
  readonly #options: GradientBucketsOptions<L>;
  readonly #deferred: ReadonlySet<Tensor>;
  readonly #hooks: RemovableHandle[] = [];
  readonly #inFlight: InFlight<L>[] = [];
  // The order gradients were marked in during the first round; at the end of the first step the
  // buckets are rebuilt in it (null: rebuilt, or no hooks to observe the order with).
  #readyOrder: Tensor[] | null;
  #recording = true;
  /** The first bucket not launched in this round. */
  #next = 0;
  /** A backward pass has marked gradients and its end callback is queued. */
  #passOpen = false;
  #syncDisabled = 0;
  /** A round completed this step. */
  #roundDone = false;
  /** A backward under noSync() left gradients that no round has synchronized yet. */
  #unsynced = false;
  readonly #counts: BucketCounts = { rounds: 0, launched: 0, launchedOnReady: 0 };

  /** `params`: the parameters in the order the model creates them; the first buckets take them in reverse. */
  constructor(params: readonly Tensor[], options: GradientBucketsOptions<L>) {
    if (!(options.bucketBytes > 0)) throw new ArgumentError(`${options.name}: bucketBytes must be > 0, got ${options.bucketBytes}`);
    this.#params = [...params];
    this.#options = options;
    this.#deferred = options.deferred ?? new Set();
    this.#assign([...params].reverse());
    if (options.overlap) {
      for (const p of params) if (p.requiresGrad && !this.#deferred.has(p)) this.#hooks.push(registerPostAccumulateGradHook(p, (q) => this.mark(q)));
    }
    this.#readyOrder = this.#hooks.length > 0 && options.rebuild !== false ? [] : null;
  }

  /** The buckets in launch order, the deferred ones last. */
  get buckets(): readonly Bucket<L>[] { return this.#buckets; }
  /** The parameters, in the order given. */
  get params(): Tensor[] { return [...this.#params]; }
  get syncEnabled(): boolean { return this.#syncDisabled === 0; }
  /** What the engine launched so far. */
  get counts(): Readonly<BucketCounts> { return this.#counts; }
  /** A round of collectives completed in this step (with one round per step, no more marks until finish()). */
  get syncedThisStep(): boolean { return this.#roundDone; }

  // Consecutive runs of `order` of about bucketBytes each, the deferred parameters' last.
  #assign(order: readonly Tensor[]): void {
    const { bucketBytes, sync } = this.#options;
    const runs = bucketRuns(order, this.#deferred, bucketBytes);
    this.#where.clear();
    if (this.#buckets.length > 0) this.#options.sync.discard?.(this.#buckets);
    this.#buckets = runs.map(({ params: ps, deferred }, index) => {
      const b = new Bucket(index, ps, sync.layout(ps), deferred);
      ps.forEach((p, i) => this.#where.set(p, [b, i]));
      engines.set(b, this as GradientBuckets<unknown>);
      return b;
    });
  }

  /**
   * Runs fn with gradient communication off: marks do nothing, gradients accumulate where they are
   * and the next round (a backward with sync on, or finish()) synchronizes them. A synchronous fn
   * (a plain backward) switches it back on before noSync returns, so a schedule that does not await
   * it can run the final micro-batch's backward right after; an async fn when its promise settles.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    this.#syncDisabled++;
    this.#unsynced = true;
    let result: T | Promise<T>;
    try {
      result = fn();
    } catch (e) {
      this.#syncDisabled--;
      throw e;
    }
    if (!(result instanceof Promise)) { this.#syncDisabled--; return result; }
    try { return await result; } finally { this.#syncDisabled--; }
  }

  /**
   * Declares p's gradient final for this round: packs it into its bucket and launches, in index
   * order, every bucket whose gradients are all packed. The hooks call it. Inside noSync() it does
   * nothing.
   */
  mark(p: Tensor): void {
    const where = this.#where.get(p);
    if (!where) throw new ArgumentError(`${this.#options.name}: ${p.describe()} is not one of the bucketed parameters (a gradient outside the buckets would never be synchronized)`);
    if (this.#syncDisabled > 0) return;
    const [b, i] = where;
    if (b.marked.has(p)) {
      throw new StateError(`${this.#options.name}: ${p.describe()} was already marked ready this step ` +
        '(a second backward() with sync on before the step? run every micro-batch but the last inside noSync())');
    }
    if (this.#options.roundPerPass && !this.#passOpen) {
      this.#passOpen = true;
      queueBackwardCallback(() => { this.#passOpen = false; this.#completeRound(); });
    }
    this.#options.onReady?.();
    if (this.#recording) this.#readyOrder?.push(p);
    this.#pack(b, i);
    for (let c = this.#buckets[this.#next]; c && !c.deferred && c.pending === 0; c = this.#buckets[this.#next]) this.#launch(c, true);
  }

  /**
   * Where p's gradient can be written this round: its bucket, its index there and the bucket's
   * input (allocated now when the round has none yet; with noSync() held too, so accumulation lands
   * in it); null when p is not bucketed or was marked already this round.
   */
  home(p: Tensor): { bucket: Bucket<L>; index: number; flat: Tensor } | null {
    const where = this.#where.get(p);
    if (!where || where[0].marked.has(p)) return null;
    const [b, i] = where;
    b.flat ??= this.#options.sync.allocate(b);
    return { bucket: b, index: i, flat: b.flat };
  }

  #pack(b: Bucket<L>, i: number): void {
    b.flat ??= this.#options.sync.allocate(b);
    this.#options.sync.pack(b, i, b.flat);
    b.marked.add(b.params[i]!);
  }

  // Launches every bucket of the round not launched yet, taking whatever gradients are there.
  #completeRound(): void {
    this.#counts.rounds++;
    for (let b = this.#buckets[this.#next]; b && !b.deferred; b = this.#buckets[this.#next]) this.#packRestAndLaunch(b);
    this.#next = 0;
    this.#recording = false;
    this.#roundDone = true;
    this.#unsynced = false;
  }

  #packRestAndLaunch(b: Bucket<L>): void {
    b.params.forEach((p, i) => { if (!b.marked.has(p)) this.#pack(b, i); });
    this.#launch(b, false);
  }

  #launch(b: Bucket<L>, onReady: boolean): void {
    const flat = b.flat!;
    b.flat = null;
    if (!this.#options.oneRoundPerStep) b.marked.clear();
    if (!b.deferred) this.#next++;
    let started: { work: CollectiveWork; out: Tensor };
    try {
      started = this.#options.sync.start(b, flat);
    } catch (e) {
      flat.dispose();
      throw e;
    }
    b.work = started.work;
    this.#inFlight.push({ bucket: b, work: started.work, flat, out: started.out, discard: false });
    this.#counts.launched++;
    if (onReady) this.#counts.launchedOnReady++;
    this.#settleBlocking(this.#options.maxInFlight ?? Infinity);
  }

  // Waits (blocking) for the oldest collectives until at most `limit` remain, where the group can block.
  #settleBlocking(limit: number): void {
    while (this.#inFlight.length > limit && this.#inFlight[0]!.work.waitSync) {
      const r = this.#inFlight.shift()!;
      try {
        r.work.waitSync!();
      } catch (e) {
        // Failed (the step is abandoned): its buffers go now (the Work pins their storage until it settles).
        if (r.bucket.work === r.work) r.bucket.work = null;
        r.flat.dispose();
        if (r.out !== r.flat) r.out.dispose();
        throw e;
      }
      this.#settle(r);
    }
  }

  // A collective that has completed: its input freed, its result to the strategy (or freed, when discarded).
  #settle(r: InFlight<L>): void {
    if (r.bucket.work === r.work) r.bucket.work = null;
    if (r.flat !== r.out) r.flat.dispose();
    if (r.discard) r.out.dispose();
    else this.#options.sync.settle(r.bucket, r.out);
  }

  /**
   * The end of the step's synchronization: launches what no backward synchronized (gradients
   * accumulated under noSync, set by hand, every gradient without overlap; zeros for gradients that
   * never came), then the deferred buckets, waits for every collective in launch order and hands
   * the results to the strategy. After the first step with hooks, rebuilds the buckets in the order
   * its gradients were ready (rank 0's, for every rank; collective).
   */
  async finish(): Promise<void> {
    if (this.#passOpen) {
      throw new StateError(`${this.#options.name}: a backward pass that started synchronizing gradients never finished (it threw, or this runs inside it); ` +
        'call zeroGrad() to drop this step\'s gradients and run the step again');
    }
    if (!this.#roundDone || this.#unsynced) this.#completeRound();
    for (const b of this.#buckets) if (b.deferred) this.#packRestAndLaunch(b);
    while (this.#inFlight.length > 0) {
      const r = this.#inFlight[0]!;
      await r.work;
      this.#inFlight.shift();
      this.#settle(r);
    }
    this.#options.sync.collect?.(this.#buckets);
    this.#resetStep();
    if (this.#readyOrder) {
      const observed = this.#readyOrder;
      this.#readyOrder = null;
      this.#assign(await this.#readyOrderOfRank0(observed));
    }
  }

  /**
   * Collective: rank 0's `observed` order of gradient readiness, completed by the parameters it
   * never saw in reverse order, as the same list of parameters on every rank (broadcast as indices).
   */
  async #readyOrderOfRank0(observed: readonly Tensor[]): Promise<Tensor[]> {
    const params = this.#params;
    const indexOf = new Map(params.map((p, i) => [p, i]));
    const seen = new Set(observed);
    const order = [...observed, ...[...params].reverse().filter((p) => !seen.has(p))];
    using indices = tensor(Int32Array.from(order, (p) => indexOf.get(p)!), [order.length], { dtype: 'i32' });
    await this.#options.group.broadcast(indices, { root: 0 });
    return Array.from(indices.toArraySync(), (i) => params[i]!);
  }

  #resetStep(): void {
    for (const b of this.#buckets) b.marked.clear();
    this.#next = 0;
    this.#passOpen = false;
    this.#roundDone = false;
    this.#unsynced = false;
  }

  /** Drops the step: frees the buffers being filled; collectives already started finish on every rank and their results are freed. */
  drop(): void {
    for (const b of this.#buckets) { b.flat?.dispose(); b.flat = null; }
    for (const r of this.#inFlight) r.discard = true;
    this.#settleBlocking(0);
    this.#resetStep();
  }

  /**
   * Abandons the step after a collective failed (in-job recovery: the communicator is dead, so
   * nothing is awaited): the buffers being filled and the collectives in flight are let go (a Work
   * pins its tensors' storage until it settles, so freeing them now is safe), the strategy drops what
   * it keeps per step (discard), marks and flags are reset, noSync() holds are cleared, and a first
   * step's readiness order, if it was being recorded, starts again. Never throws.
   */
  abandon(): void {
    for (const b of this.#buckets) { b.flat?.dispose(); b.flat = null; b.work = null; }
    for (const r of this.#inFlight) {
      r.flat.dispose();
      if (r.out !== r.flat) r.out.dispose();
    }
    this.#inFlight.length = 0;
    this.#options.sync.discard?.(this.#buckets);
    this.#syncDisabled = 0;
    if (this.#recording && this.#readyOrder) this.#readyOrder = [];
    this.#resetStep();
  }

  /**
   * The bucket order as indices into the parameters (what a replacement process needs to issue the
   * same collectives as ranks that have rebuilt their buckets), and whether the first step's rebuild
   * is still to come.
   */
  orderState(): BucketOrder {
    const index = new Map(this.#params.map((p, i) => [p, i]));
    return { order: this.#buckets.flatMap((b) => b.params.map((p) => index.get(p)!)), rebuilt: this.#readyOrder === null };
  }

  /**
   * Takes another rank's bucket order (orderState()): rebuilds the buckets in it when it was rebuilt
   * there, so this engine launches the same collectives in the same order. Between steps only.
   */
  loadOrderState(s: BucketOrder): void {
    const n = this.#params.length;
    if (!Array.isArray(s?.order) || s.order.length !== n || new Set(s.order).size !== n || s.order.some((i) => !Number.isInteger(i) || i < 0 || i >= n)) {
      throw new StateError(`${this.#options.name}: a bucket order must list each of the ${n} parameters once`);
    }
    if (this.#inFlight.length > 0 || this.#buckets.some((b) => b.flat !== null)) throw new StateError(`${this.#options.name}: the bucket order can change only between steps`);
    if (!s.rebuilt) return;
    this.#readyOrder = null;
    this.#recording = false;
    const current = this.orderState().order;
    if (current.every((i, k) => i === s.order[k])) return;
    // The deferred parameters keep their own buckets at the end (#assign puts them there again).
    this.#assign(s.order.map((i) => this.#params[i]!));
  }

  /** Bytes of collective inputs (being filled or in flight) and of results in flight apart from their inputs. */
  memory(): { inputs: number; outputs: number } {
    let inputs = 0, outputs = 0;
    for (const b of this.#buckets) if (b.flat) inputs += b.flat.nbytes;
    for (const r of this.#inFlight) {
      inputs += r.flat.nbytes;
      if (r.out !== r.flat) outputs += r.out.nbytes;
    }
    return { inputs, outputs };
  }

  /** Removes the hooks and frees the buffers (a step in flight is abandoned). */
  dispose(): void {
    for (const h of this.#hooks) h.remove();
    this.#hooks.length = 0;
    for (const b of this.#buckets) { b.flat?.dispose(); b.flat = null; }
    for (const r of this.#inFlight) {
      r.flat.dispose();
      if (r.out !== r.flat) r.out.dispose();
    }
    this.#inFlight.length = 0;
  }
}
