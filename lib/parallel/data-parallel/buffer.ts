// Data-parallel gradient synchronization: the bucket engine (../buckets.ts) with the all-reduce
// sync. Each bucket's averaging allReduce starts from autograd's grad-ready hooks as soon as the
// bucket's last gradient is final, overlapping the rest of backward (Megatron's
// param_and_grad_buffer, PyTorch DDP's reducer). No communication on non-final micro-batches (noSync).
import { StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { DEFAULT_BUCKET_BYTES, GradientBuckets, type Bucket, type BucketSync } from '../buckets.js';
import { copyElements, FlatLayout } from '../flat.js';

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
 * One bucket: a run of parameters packed back to back (`layout`), its flat gradient (allocated at
 * the step's first ready gradient, freed once the averages are written back), and the allReduce in
 * flight (if any).
 */
export type GradBucket = Bucket<FlatLayout>;

/** The all-reduce sync: a bucket's gradients packed back to back, reduced in place, written back into each .grad. */
function allReduceSync(group: CollectiveGroup, average: boolean): BucketSync<FlatLayout> {
  return {
    layout: (params) => new FlatLayout(params, 1, 'GradBuffer'),
    // Zero-filled, so a parameter without a gradient contributes zeros.
    allocate: (b) => keep(emptyOn([b.layout.count], b.layout.dtype, b.params[0]!.deviceInfo, true)),
    pack: (b, i, flat) => {
      const e = b.layout.entries[i]!, p = e.param;
      if (!p.grad) return;
      copyElements(flat, e.offset, p.grad, 0, e.count);
      p.grad.dispose();
      p.grad = null;
    },
    start: (_b, flat) => ({ work: group.allReduce(flat, { op: average ? 'avg' : 'sum' }), out: flat }),
    settle: (b, flat) => {
      for (const e of b.layout.entries) {
        const p = e.param;
        if (!p.grad) p.grad = keep(emptyOn(p.shape, p.dtype, p.deviceInfo));
        copyElements(p.grad, 0, flat, e.offset, e.count);
      }
      flat.dispose();
    },
  };
}

/**
 * Gradient buckets over a fixed parameter list. Parameters are bucketed in reverse order, roughly
 * the order backward produces their gradients, so the first bucket fills (and starts communicating)
 * first; with overlap, after the first step, in the order the gradients were actually ready. With
 * `overlap` (the default) the buffer hooks every parameter, so `loss.backward()` marks each
 * gradient ready as it becomes final; then `await finishGradSync()` before the optimizer step.
 * Between a gradient's mark and finishGradSync the gradient lives in its bucket and `p.grad` is
 * null, so gradients take their size in memory once, not twice.
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

  constructor(params: readonly Tensor[], options: GradBufferOptions) {
    this.group = options.group;
    this.average = options.average ?? true;
    this.overlap = options.overlap ?? true;
    // One dtype, one device, no parameter twice.
    const checked = new FlatLayout(params, 1, 'GradBuffer').entries.map((e) => e.param);
    // Parameters without requiresGrad never get a gradient; finishGradSync packs them (zeros).
    this.#buckets = new GradientBuckets(checked, {
      name: 'GradBuffer', group: this.group, sync: allReduceSync(this.group, this.average),
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
   * Declares p's gradient final for this step: moves it into its bucket (p.grad becomes null) and
   * starts the bucket's allReduce when it was the bucket's last (and every earlier bucket started).
   * The overlap hooks call it; call it yourself only with `overlap: false`. Inside noSync() it does
   * nothing: gradients keep accumulating in p.grad.
   */
  markGradReady(p: Tensor): void { this.#buckets.mark(p); }

  /**
   * Marks every gradient not marked yet (all of them without overlap; parameters backward never
   * reached with it, which contribute zeros), waits for every bucket, writes the averaged gradients
   * back into each parameter's .grad and frees the buckets.
   */
  async finishGradSync(): Promise<void> {
    if (!this.syncEnabled) throw new StateError('GradBuffer.finishGradSync inside noSync(): the last micro-batch must run with sync on');
    await this.#buckets.finish();
  }

  /** Removes the hooks and frees the buckets (a step in flight is abandoned). */
  dispose(): void { this.#buckets.dispose(); }
}
