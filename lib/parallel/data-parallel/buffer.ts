// Data-parallel gradient synchronization: gradients packed into contiguous buckets whose averaging
// allReduce starts from autograd's grad-ready hooks as soon as the bucket's last gradient is final,
// overlapping the rest of backward (Megatron's param_and_grad_buffer, PyTorch DDP's reducer). No
// communication on non-final micro-batches (noSync).
import { registerPostAccumulateGradHook, type RemovableHandle } from '../../autograd/engine.js';
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { tensor } from '../../creation.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { ProcessGroup, Work } from '../group.js';
import { copyElements, FlatLayout, splitIntoBuckets } from '../flat.js';

/** Default bucket size: 25 MB as PyTorch DDP; tiny models end up in one bucket. */
export const DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024;

export interface GradBufferOptions {
  group: ProcessGroup;
  /** Target bytes per bucket (a parameter never straddles two buckets). */
  bucketBytes?: number;
  /** Divide the summed gradients by the group size (default true): the data-parallel mean. */
  average?: boolean;
  /**
   * Mark each gradient ready from autograd's post-accumulate-grad hook, so buckets communicate
   * during backward (default true). Off: nothing happens until finishGradSync(), which then marks
   * every gradient and launches every bucket at once.
   */
  overlap?: boolean;
}

/**
 * Runs fn, then exit(): right when a synchronous fn returns or throws (before the returned promise
 * settles, so a caller that does not await sees it), when its promise settles for an async fn.
 * What noSync() scopes are made of.
 */
export async function withExit<T>(fn: () => T | Promise<T>, exit: () => void): Promise<T> {
  let result: T | Promise<T>;
  try {
    result = fn();
  } catch (e) {
    exit();
    throw e;
  }
  if (!(result instanceof Promise)) { exit(); return result; }
  try { return await result; } finally { exit(); }
}

/**
 * Collective over `group`: rank 0's `observed` order of gradient readiness, completed by the
 * parameters it never saw in reverse `params` order, as the same list of `params` on every rank
 * (broadcast as indices). What gradient buckets are rebuilt in after a first step.
 */
export async function readyOrderOfRank0(group: ProcessGroup, params: readonly Tensor[], observed: readonly Tensor[]): Promise<Tensor[]> {
  const indexOf = new Map(params.map((p, i) => [p, i]));
  const seen = new Set(observed);
  const order = [...observed, ...[...params].reverse().filter((p) => !seen.has(p))];
  using indices = tensor(Int32Array.from(order, (p) => indexOf.get(p)!), [order.length], { dtype: 'i32' });
  await group.broadcast(indices, { root: 0 });
  return Array.from(indices.toArraySync(), (i) => params[i]!);
}

/**
 * One bucket: a run of parameters, its flat gradient (allocated at the step's first ready
 * gradient, freed once the averages are written back), and the allReduce in flight (if any).
 */
export interface GradBucket {
  readonly index: number;
  readonly layout: FlatLayout;
  flat: Tensor | null;
  pending: number;
  work: Work | null;
}

/**
 * Gradient buckets over a fixed parameter list. Parameters are bucketed in reverse order, roughly
 * the order backward produces their gradients, so the first bucket fills (and starts communicating)
 * first; with overlap, after the first step, in the order the gradients were actually ready. With `overlap` (the default) the buffer hooks every parameter, so `loss.backward()` marks
 * each gradient ready as it becomes final; then `await finishGradSync()` before the optimizer step.
 * Between a gradient's mark and finishGradSync the gradient lives in its bucket and `p.grad` is
 * null, so gradients take their size in memory once, not twice.
 *
 * Every backward() that reaches the parameters marks them: for gradient accumulation, run every
 * micro-batch but the last inside noSync() (a second mark in one step is a StateError, as PyTorch
 * DDP's "marked ready twice").
 */
export class GradBuffer {
  #buckets: GradBucket[] = [];
  readonly #bucketOf = new Map<Tensor, GradBucket>();
  readonly #ready = new Set<Tensor>();
  readonly #hooks: RemovableHandle[] = [];
  readonly #params: readonly Tensor[];
  readonly #bucketBytes: number;
  // The order the overlap hooks marked gradients in during the first synchronized step; once that
  // step is over, the buckets are rebuilt in it (null: rebuilt, or never to be).
  #readyOrder: Tensor[] | null;
  readonly group: ProcessGroup;
  readonly average: boolean;
  readonly overlap: boolean;
  #syncDisabled = 0;
  // Buckets launch in index order, so every rank issues the same collectives in the same order even
  // when their backward passes ready the gradients in different orders: the first not launched yet.
  #nextLaunch = 0;
  /** Number of allReduce calls launched so far (what tests and logs read to see overlap). */
  launched = 0;

  constructor(params: readonly Tensor[], options: GradBufferOptions) {
    const bucketBytes = options.bucketBytes ?? DEFAULT_BUCKET_BYTES;
    if (!(bucketBytes > 0)) throw new ArgumentError(`GradBuffer: bucketBytes must be > 0, got ${bucketBytes}`);
    this.group = options.group;
    this.average = options.average ?? true;
    this.overlap = options.overlap ?? true;
    this.#bucketBytes = bucketBytes;
    this.#params = new FlatLayout(params, 1, 'GradBuffer').entries.map((e) => e.param);
    this.#assignBuckets([...this.#params].reverse());
    // Parameters without requiresGrad never get a gradient; finishGradSync marks them (zeros).
    if (this.overlap) for (const p of this.#params) if (p.requiresGrad) this.#hooks.push(registerPostAccumulateGradHook(p, (q) => this.markGradReady(q)));
    this.#readyOrder = this.#hooks.length > 0 ? [] : null;
  }

  /** The buckets, in the order their gradients are expected to be ready. */
  get buckets(): readonly GradBucket[] { return this.#buckets; }

  // Consecutive runs of `order` of about bucketBytes each (a parameter never straddles two).
  #assignBuckets(order: readonly Tensor[]): void {
    this.#bucketOf.clear();
    this.#buckets = splitIntoBuckets(order, this.#bucketBytes).map((ps, index) => {
      const layout = new FlatLayout(ps, 1, 'GradBuffer');
      const b: GradBucket = { index, layout, flat: null, pending: ps.length, work: null };
      for (const p of ps) this.#bucketOf.set(p, b);
      return b;
    });
  }

  /**
   * Reverse parameter order is only a guess at backward's order (modules may create parameters in
   * another order than they use them; a shared parameter is final only at its earliest use). As PyTorch DDP does,
   * the buckets are rebuilt once in the order the first step's gradients were ready, rank 0's order
   * for every rank so bucket sizes agree everywhere.
   */
  async #rebuildInReadyOrder(observed: Tensor[]): Promise<void> {
    this.#assignBuckets(await readyOrderOfRank0(this.group, this.#params, observed));
  }

  /** The parameters, in the order they were given. */
  get params(): Tensor[] { return [...this.#params]; }

  /**
   * Runs fn with gradient communication off: for all micro-batches but the last. A synchronous fn
   * (a plain backward) switches it back on before noSync returns, so a schedule that does not await
   * it can run the final micro-batch's backward right after; an async fn when its promise settles.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    this.#syncDisabled++;
    return withExit(fn, () => { this.#syncDisabled--; });
  }

  get syncEnabled(): boolean { return this.#syncDisabled === 0; }

  /**
   * Declares p's gradient final for this step: moves it into its bucket (p.grad becomes null) and
   * starts the bucket's allReduce when it was the bucket's last (and every earlier bucket started). The overlap hooks call it; call it
   * yourself only with `overlap: false`. Inside noSync() it does nothing: gradients keep
   * accumulating in p.grad.
   */
  markGradReady(p: Tensor): void {
    const b = this.#bucketOf.get(p);
    if (!b) throw new ArgumentError(`GradBuffer.markGradReady: ${p.describe()} is not one of the buffer's parameters (a parameter outside the data-parallel buffer would never be averaged)`);
    if (!this.syncEnabled) return;
    if (this.#ready.has(p)) {
      throw new StateError(`GradBuffer.markGradReady: ${p.describe()} was already marked ready this step (a second backward() before finishGradSync()? run all micro-batches but the last inside noSync())`);
    }
    this.#ready.add(p);
    this.#readyOrder?.push(p);
    // Zero-filled, so a parameter without a gradient contributes zeros. The buffer owns it, not the
    // scope backward() happens to run in.
    b.flat ??= keep(emptyOn([b.layout.count], b.layout.dtype, p.deviceInfo, true));
    const e = b.layout.entry(p)!;
    if (p.grad) {
      copyElements(b.flat, e.offset, p.grad, 0, e.count);
      p.grad.dispose();
      p.grad = null;
    }
    if (--b.pending === 0) this.#launchReadyBuckets();
  }

  #launchReadyBuckets(): void {
    for (let b = this.#buckets[this.#nextLaunch]; b && b.pending === 0; b = this.#buckets[++this.#nextLaunch]) {
      this.launched++;
      b.work = this.group.allReduce(b.flat!, { op: this.average ? 'avg' : 'sum' });
    }
  }

  /**
   * Marks every gradient not marked yet (all of them without overlap; parameters backward never
   * reached with it, which contribute zeros), waits for every bucket, writes the averaged gradients
   * back into each parameter's .grad and frees the buckets.
   */
  async finishGradSync(): Promise<void> {
    if (!this.syncEnabled) throw new StateError('GradBuffer.finishGradSync inside noSync(): the last micro-batch must run with sync on');
    for (const b of this.buckets) {
      if (b.work === null) for (const e of b.layout.entries) if (!this.#ready.has(e.param)) this.markGradReady(e.param);
    }
    for (const b of this.buckets) {
      await b.work!;
      const flat = b.flat!;
      for (const e of b.layout.entries) {
        const p = e.param;
        if (!p.grad) p.grad = keep(emptyOn(p.shape, p.dtype, p.deviceInfo));
        copyElements(p.grad, 0, flat, e.offset, e.count);
      }
      flat.dispose();
      b.flat = null;
      b.work = null;
      b.pending = b.layout.entries.length;
    }
    this.#ready.clear();
    this.#nextLaunch = 0;
    if (this.#readyOrder) {
      const observed = this.#readyOrder;
      this.#readyOrder = null;
      await this.#rebuildInReadyOrder(observed);
    }
  }

  /** Removes the hooks and frees the buckets (a step in flight is abandoned). */
  dispose(): void {
    for (const h of this.#hooks) h.remove();
    this.#hooks.length = 0;
    for (const b of this.buckets) { b.flat?.dispose(); b.flat = null; }
  }
}
