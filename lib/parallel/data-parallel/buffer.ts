// Data-parallel gradient synchronization: the bucket engine (../buckets.ts) with the all-reduce
// sync. Each bucket's averaging allReduce starts from autograd's grad-ready hooks as soon as the
// bucket's last gradient is final, overlapping the rest of backward (Megatron's
// param_and_grad_buffer, PyTorch DDP's reducer). No communication on non-final micro-batches (noSync).
//
// No copies of gradients: each bucket owns one flat buffer for the buffer's life, and each
// parameter's .grad is a view of its range (Megatron's main_grad, DDP's gradient_as_bucket_view).
// After zeroGrad() the views are in place and zero, so autograd accumulates every micro-batch
// straight into the bucket, the allReduce averages it in place, and the optimizer reads the result
// through the same views. A gradient that is not its view when marked (set by hand, or created
// by backward after the views were disposed, e.g. by optimizer.zeroGrad()) is copied in once and
// replaced by the view.
import { StateError } from '../../errors.js';
import { dtypeCode } from '../../dtype.js';
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
 * One bucket: a run of parameters packed back to back (`layout`), the flat buffer being filled
 * this step (its persistent gradient buffer, from the step's first ready gradient until its
 * allReduce starts), and the allReduce in flight (if any).
 */
export type GradBucket = Bucket<FlatLayout>;

/** Each bucket's persistent flat gradient buffer, and each parameter's gradient view of it. */
class GradViews {
  readonly #buffers = new Map<GradBucket, Tensor>();
  readonly #views = new Map<Tensor, { view: Tensor; buffer: Tensor }>();

  /** The bucket's buffer (allocated zero-filled, kept out of scopes, on first use or after it was freed). */
  buffer(b: GradBucket): Tensor {
    let buf = this.#buffers.get(b);
    if (!buf || buf.disposed) {
      const p = b.params[0]!;
      buf = keep(emptyOn([b.layout.count], b.layout.dtype, p.deviceInfo, true));
      this.#buffers.set(b, buf);
    }
    return buf;
  }

  /** The bucket's buffer, if it has one (allocates nothing). */
  peek(b: GradBucket): Tensor | undefined {
    const buf = this.#buffers.get(b);
    return buf && !buf.disposed ? buf : undefined;
  }

  /** Whether p.grad is the live view of p's range in `buffer`. */
  isView(p: Tensor, buffer: Tensor): boolean {
    const v = this.#views.get(p);
    return v !== undefined && v.buffer === buffer && p.grad === v.view && !v.view.disposed;
  }

  /** Makes p.grad the view of its range in `buffer` (disposing whatever gradient it held). */
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

  /** Frees the buckets' buffers (views handed out keep their bytes until they are disposed). */
  discard(buckets: readonly GradBucket[]): void {
    for (const b of buckets) {
      this.#buffers.get(b)?.dispose();
      this.#buffers.delete(b);
    }
  }

  /** Bytes of the buffers. */
  get bytes(): number {
    let n = 0;
    for (const b of this.#buffers.values()) if (!b.disposed) n += b.nbytes;
    return n;
  }

  dispose(): void {
    this.discard([...this.#buffers.keys()]);
    this.#views.clear();
  }
}

/** The all-reduce sync: each bucket's persistent buffer, the gradients views into it, reduced in place. */
function allReduceSync(group: CollectiveGroup, average: boolean, views: GradViews): BucketSync<FlatLayout> {
  return {
    layout: (params) => new FlatLayout(params, 1, 'GradBuffer'),
    allocate: (b) => views.buffer(b),
    pack: (b, i, flat) => {
      const e = b.layout.entries[i]!, p = e.param;
      if (views.isView(p, flat)) return;  // accumulated in place: nothing to copy
      const old = p.grad;
      p.grad = null;
      const view = views.attach(e, flat);
      // A parameter without a gradient contributes zeros.
      if (old) copyElements(view, 0, old, 0, e.count);
      else view.backend.fill(view.storage, dtypeCode(view.dtype), e.count, 0);
      old?.dispose();
    },
    start: (_b, flat) => ({ work: group.allReduce(flat, { op: average ? 'avg' : 'sum' }), out: flat }),
    // In place: every gradient is a view of the reduced buffer already.
    settle: () => {},
    discard: (buckets) => views.discard(buckets),
  };
}

/**
 * Gradient buckets over a fixed parameter list. Parameters are bucketed in reverse order, roughly
 * the order backward produces their gradients, so the first bucket fills (and starts communicating)
 * first; with overlap, after the first step, in the order the gradients were actually ready. With
 * `overlap` (the default) the buffer hooks every parameter, so `loss.backward()` marks each
 * gradient ready as it becomes final; then `await finishGradSync()` before the optimizer step,
 * and `zeroGrad()` after it. Each bucket keeps one flat buffer and each parameter's `.grad` is a
 * view of its range, so gradients take their size in memory once and are never copied: backward
 * accumulates into the bucket, the allReduce averages it in place. Between a gradient's mark and
 * finishGradSync its bucket may be in flight: read or write `.grad` only after finishGradSync.
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
   * bucket's view (after zeroGrad()); otherwise it is copied in once and p.grad becomes the view.
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

  /**
   * Zeroes every bucket's buffer and makes each parameter's .grad the view of its range (disposing
   * any other gradient it held), so the next backward accumulates straight into the buckets. Call
   * it after the optimizer step, in place of the optimizer's zeroGrad(). A StateError while a step's
   * gradients are being synchronized (marked, before finishGradSync()).
   */
  zeroGrad(): void {
    if (this.#buckets.buckets.some((b) => b.marked.size > 0 || b.work !== null)) {
      throw new StateError('GradBuffer.zeroGrad: this step\'s gradients are being synchronized; await finishGradSync() first');
    }
    for (const b of this.#buckets.buckets) {
      const buf = this.#views.buffer(b);
      buf.backend.fill(buf.storage, dtypeCode(buf.dtype), buf.size, 0);
      for (const e of b.layout.entries) this.#views.attach(e, buf);
    }
  }

  /** Whether p.grad is the view of p's range in its bucket's buffer (what backward accumulates into without copies). */
  gradIsView(p: Tensor): boolean {
    const b = this.#buckets.buckets.find((c) => c.params.includes(p));
    const buf = b && this.#views.peek(b);
    return buf !== undefined && this.#views.isView(p, buf);
  }

  /** Bytes of the buckets' gradient buffers (the parameters' gradients are views of them). */
  get bufferBytes(): number { return this.#views.bytes; }

  /**
   * Removes the hooks and frees the buckets (a step in flight is abandoned). Gradients handed out
   * as views keep their bytes until they are disposed.
   */
  dispose(): void {
    this.#buckets.dispose();
    this.#views.dispose();
  }
}
