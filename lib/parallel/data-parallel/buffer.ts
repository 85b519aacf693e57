// Data-parallel gradient synchronization: the bucket engine (../buckets.ts) with the all-reduce
// sync. Each bucket's averaging allReduce starts from autograd's grad-ready hooks as soon as the
// bucket's last gradient is final, overlapping the rest of backward (Megatron's
// param_and_grad_buffer, PyTorch DDP's reducer). No communication on non-final micro-batches (noSync).
//
// Gradients are views of the buckets (Megatron's main_grad, DDP's gradient_as_bucket_view): the
// buffer registers a gradient allocator on every parameter, so a parameter's first gradient of a
// step is written straight into its range of the bucket's flat buffer and becomes `.grad` there;
// later micro-batches accumulate into it in place, the allReduce averages the bucket in place and
// the optimizer reads the result through the same views. Nothing is copied into a bucket or back.
// A bucket's buffer is allocated at its first gradient of a step; the buffer lets go of it when the
// step's sync is done, and its bytes live on in the views until they are disposed (zeroGrad), as
// plain gradients would. A gradient that is not its view when marked (set by hand, or left from an
// earlier step that was not zeroed) is copied in once and replaced by the view.
import { dtypeCode } from '../../dtype.js';
import { StateError } from '../../errors.js';
import { registerGradAllocator, type RemovableHandle } from '../../autograd/engine.js';
import { keep } from '../../memory.js';
import { emptyOn, viewOf, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { DEFAULT_BUCKET_BYTES, GradientBuckets, type Bucket, type BucketSync } from '../buckets.js';
import { copyElements, FlatLayout, type FlatEntry } from '../flat.js';

/** Options of {@link GradBuffer}. */
export interface GradBufferOptions {
  /** The data-parallel group the gradients are averaged over. */
  group: CollectiveGroup;
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
 * One bucket: a run of parameters packed back to back (`layout`), its flat buffer while the step's
 * gradients are being marked (until its allReduce starts), and the allReduce in flight (if any).
 */
export type GradBucket = Bucket<FlatLayout>;

/** This step's flat buffer of each bucket, and each parameter's gradient view of it. */
class GradViews {
  readonly #buffers = new Map<GradBucket, Tensor>();
  readonly #views = new Map<Tensor, { view: Tensor; buffer: Tensor }>();

  /**
   * The bucket's buffer this step: allocated uninitialized (kept out of scopes) at its first use.
   * Every range is written before the allReduce: by backward through a view, or when marked.
   */
  buffer(b: GradBucket): Tensor {
    let buf = this.#buffers.get(b);
    if (!buf || buf.disposed) {
      buf = keep(emptyOn([b.layout.count], b.layout.dtype, b.params[0]!.deviceInfo));
      this.#buffers.set(b, buf);
    }
    return buf;
  }

  /** Whether p.grad is the live view of p's range in `buffer` (any buffer when omitted). */
  isView(p: Tensor, buffer?: Tensor): boolean {
    const v = this.#views.get(p);
    return v !== undefined && (buffer === undefined || v.buffer === buffer) && p.grad === v.view && !v.view.disposed;
  }

  /** The view of e's range in `buffer`, made p.grad (disposing whatever gradient p held). */
  attach(e: FlatEntry, buffer: Tensor): Tensor {
    const p = e.param;
    let v = this.#views.get(p);
    if (!v || v.buffer !== buffer || v.view.disposed) {
      v = { view: keep(viewOf(buffer, e.offset, p.shape)), buffer };
      this.#views.set(p, v);
    }
    if (p.grad !== v.view) { p.grad?.dispose(); p.grad = v.view; }
    return v.view;
  }

  /** Lets go of the buffers (views handed out keep their bytes until they are disposed). */
  release(): void {
    for (const buf of this.#buffers.values()) buf.dispose();
    this.#buffers.clear();
  }

  dispose(): void {
    this.release();
    this.#views.clear();
  }
}

/** The all-reduce sync over the buckets' buffers, which the gradients are views of: reduced in place. */
function allReduceSync(group: CollectiveGroup, average: boolean, views: GradViews): BucketSync<FlatLayout> {
  return {
    layout: (params) => new FlatLayout(params, 1, 'GradBuffer'),
    allocate: (b) => views.buffer(b),
    pack: (b, i, flat) => {
      const e = b.layout.entries[i]!, p = e.param;
      if (views.isView(p, flat)) return;  // backward wrote it in place: nothing to copy
      const old = p.grad;
      p.grad = null;
      const view = views.attach(e, flat);
      // A parameter without a gradient contributes zeros.
      if (old) copyElements(view, 0, old, 0, e.count);
      else view.backend.fill(view.storage, dtypeCode(view.dtype), e.count, 0);
      old?.dispose();
    },
    start: (_b, flat) => ({ work: group.allReduce(flat, { op: average ? 'avg' : 'sum' }), out: flat }),
    // In place: every gradient is a view of its reduced bucket already.
    settle: () => {},
    // The step is synchronized: the views hold the buffers' bytes from here on.
    collect: () => views.release(),
    discard: () => views.release(),
  };
}

/**
 * Gradient buckets over a fixed parameter list. Parameters are bucketed in reverse order, roughly
 * the order backward produces their gradients, so the first bucket fills (and starts communicating)
 * first; with overlap, after the first step, in the order the gradients were actually ready. With
 * `overlap` (the default) the buffer hooks every parameter, so `loss.backward()` marks each
 * gradient ready as it becomes final; then `await finishGradSync()` before the optimizer step.
 * Each parameter's `.grad` is a view of its range of its bucket's flat buffer, so gradients take
 * their size in memory once and are never copied into buckets or back: backward writes and
 * accumulates them in the bucket, the allReduce averages it in place. Between a gradient's mark
 * and finishGradSync its bucket may be in flight: read or write `.grad` only after finishGradSync.
 *
 * Every backward() that reaches the parameters marks them: for gradient accumulation, run every
 * micro-batch but the last inside noSync() (a second mark in one step is a StateError, as PyTorch
 * DDP's "marked ready twice").
 */
export class GradBuffer {
  /** The data-parallel group. */
  readonly group: CollectiveGroup;
  /** Whether the summed gradients are divided by the group size. */
  readonly average: boolean;
  /** Whether buckets communicate during backward (from the post-accumulate-grad hooks). */
  readonly overlap: boolean;
  readonly #buckets: GradientBuckets<FlatLayout>;
  readonly #views = new GradViews();
  readonly #allocators: RemovableHandle[] = [];
  #located: { buckets: readonly GradBucket[]; at: Map<Tensor, readonly [GradBucket, FlatEntry]> } | null = null;

  constructor(params: readonly Tensor[], options: GradBufferOptions) {
    this.group = options.group;
    this.average = options.average ?? true;
    this.overlap = options.overlap ?? true;
    // One dtype, one device, no parameter twice.
    const checked = new FlatLayout(params, 1, 'GradBuffer').entries.map((e) => e.param);
    // Parameters without requiresGrad never get a gradient; finishGradSync packs them (zeros).
    this.#buckets = new GradientBuckets(checked, {
      name: 'GradBuffer', group: this.group, sync: allReduceSync(this.group, this.average, this.#views),
      bucketBytes: options.bucketBytes ?? DEFAULT_BUCKET_BYTES, overlap: this.overlap, oneRoundPerStep: true, roundPerPass: false,
    });
    for (const p of checked) if (p.requiresGrad) this.#allocators.push(registerGradAllocator(p, (q) => this.#gradView(q)));
  }

  // The view backward writes p's first gradient of the step into: p's range of its bucket's buffer.
  // None while p's bucket is being synchronized (a second backward is an error the hooks report).
  #gradView(p: Tensor): Tensor | null {
    const buckets = this.#buckets.buckets;
    if (this.#located?.buckets !== buckets) {
      const at = new Map<Tensor, readonly [GradBucket, FlatEntry]>();
      for (const b of buckets) for (const e of b.layout.entries) at.set(e.param, [b, e]);
      this.#located = { buckets, at };
    }
    const [b, e] = this.#located.at.get(p)!;
    if (b.marked.has(p) || b.work !== null) return null;
    return this.#views.attach(e, this.#views.buffer(b));
  }

  /** The buckets, in the order their gradients are expected to be ready. */
  get buckets(): readonly GradBucket[] { return this.#buckets.buckets; }

  /** The parameters, in the order they were given. */
  get params(): Tensor[] { return this.#buckets.params; }

  /** Number of allReduce calls launched so far (what tests and logs read to see overlap). */
  get launched(): number { return this.#buckets.counts.launched; }

  /**
   * Runs fn with gradient communication off: for all micro-batches but the last. A synchronous fn
   * (a plain backward) switches it back on before noSync returns, so a schedule that does not await
   * it can run the final micro-batch's backward right after; an async fn when its promise settles.
   */
  noSync<T>(fn: () => T | Promise<T>): Promise<T> { return this.#buckets.noSync(fn); }

  /** False inside noSync(): gradients are not communicated. */
  get syncEnabled(): boolean { return this.#buckets.syncEnabled; }

  /**
   * Declares p's gradient final for this step: it is in its bucket already when p.grad is the
   * bucket's view (backward wrote it there); otherwise it is copied in once and p.grad becomes the view.
   * Starts the bucket's allReduce when it was the bucket's last (and every earlier bucket started).
   * The overlap hooks call it; call it yourself only with `overlap: false`. Inside noSync() it does
   * nothing: gradients keep accumulating in p.grad.
   */
  markGradReady(p: Tensor): void { this.#buckets.mark(p); }

  /**
   * Marks every gradient not marked yet (all of them without overlap; parameters backward never
   * reached with it, which contribute zeros) and waits for every bucket: then each parameter's
   * .grad is the view of its averaged range.
   */
  async finishGradSync(): Promise<void> {
    if (!this.syncEnabled) throw new StateError('GradBuffer.finishGradSync inside noSync(): the last micro-batch must run with sync on');
    await this.#buckets.finish();
  }

  /** Whether p.grad is the view of p's range in its bucket's buffer (what backward accumulates into without copies). */
  gradIsView(p: Tensor): boolean { return this.#views.isView(p); }

  /**
   * Removes the hooks and frees the buckets (a step in flight is abandoned). Gradients handed out
   * as views keep their bytes until they are disposed.
   */
  dispose(): void {
    for (const h of this.#allocators) h.remove();
    this.#allocators.length = 0;
    this.#buckets.dispose();
    this.#views.dispose();
  }
}
