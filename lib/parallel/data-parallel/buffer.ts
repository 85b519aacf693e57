// Data-parallel gradient synchronization: gradients packed into contiguous buckets whose averaging
// allReduce starts as soon as the bucket's last gradient is ready, overlapping the rest of backward
// (Megatron's param_and_grad_buffer). No communication on non-final micro-batches (noSync).
import { dtypeCode } from '../../dtype.js';
import { ArgumentError, StateError } from '../../errors.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { ProcessGroup, Work } from '../group.js';
import { copyElements, FlatLayout } from '../flat.js';

/** Default bucket size: 25 MB as PyTorch DDP; tiny models end up in one bucket. */
export const DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024;

export interface GradBufferOptions {
  group: ProcessGroup;
  /** Target bytes per bucket (a parameter never straddles two buckets). */
  bucketBytes?: number;
  /** Divide the summed gradients by the group size (default true): the data-parallel mean. */
  average?: boolean;
}

/** One bucket: a run of parameters, its own flat tensor, and the allReduce in flight (if any). */
export interface GradBucket {
  readonly index: number;
  readonly layout: FlatLayout;
  readonly flat: Tensor;
  pending: number;
  work: Work | null;
}

/**
 * Gradient buckets over a fixed parameter list. Parameters are bucketed in reverse order, the
 * order backward produces their gradients, so the first bucket fills (and starts communicating)
 * first. Call `markGradReady(p)` as each gradient is final (autograd's per-leaf hook, or all at
 * once after backward), then `await finishGradSync()` before the optimizer step.
 */
export class GradBuffer {
  readonly buckets: GradBucket[];
  readonly #bucketOf = new Map<Tensor, GradBucket>();
  readonly #ready = new Set<Tensor>();
  readonly group: ProcessGroup;
  readonly average: boolean;
  #syncDisabled = 0;
  /** Number of allReduce calls launched so far (what tests and logs read to see overlap). */
  launched = 0;

  constructor(params: readonly Tensor[], options: GradBufferOptions) {
    const bucketBytes = options.bucketBytes ?? DEFAULT_BUCKET_BYTES;
    if (!(bucketBytes > 0)) throw new ArgumentError(`GradBuffer: bucketBytes must be > 0, got ${bucketBytes}`);
    this.group = options.group;
    this.average = options.average ?? true;
    const all = new FlatLayout(params, 1, 'GradBuffer');
    const reversed = [...all.entries].reverse().map((e) => e.param);
    const runs: Tensor[][] = [];
    let run: Tensor[] = [], bytes = 0;
    for (const p of reversed) {
      if (run.length > 0 && bytes + p.nbytes > bucketBytes) { runs.push(run); run = []; bytes = 0; }
      run.push(p); bytes += p.nbytes;
    }
    runs.push(run);
    this.buckets = runs.map((ps, index) => {
      const layout = new FlatLayout(ps, 1, 'GradBuffer');
      const b: GradBucket = { index, layout, flat: emptyOn([layout.count], layout.dtype, ps[0]!.deviceInfo, true), pending: ps.length, work: null };
      for (const p of ps) this.#bucketOf.set(p, b);
      return b;
    });
  }

  get params(): Tensor[] { return this.buckets.flatMap((b) => b.layout.entries.map((e) => e.param)); }

  /** Runs fn (sync or async) with gradient communication off: for all micro-batches but the last. */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    this.#syncDisabled++;
    try { return await fn(); } finally { this.#syncDisabled--; }
  }

  get syncEnabled(): boolean { return this.#syncDisabled === 0; }

  /**
   * Declares p's gradient final for this step; the bucket's allReduce starts when it was the
   * bucket's last. Inside noSync() it only records nothing: gradients keep accumulating in p.grad.
   */
  markGradReady(p: Tensor): void {
    const b = this.#bucketOf.get(p);
    if (!b) throw new ArgumentError(`GradBuffer.markGradReady: ${p.describe()} is not one of the buffer's parameters (a parameter outside the data-parallel buffer would never be averaged)`);
    if (!this.syncEnabled) return;
    if (this.#ready.has(p)) throw new StateError(`GradBuffer.markGradReady: ${p.describe()} was already marked ready this step`);
    this.#ready.add(p);
    // The first arrival clears the bucket, so a parameter without a gradient contributes zeros.
    if (b.pending === b.layout.entries.length) b.flat.backend.fill(b.flat.storage, dtypeCode(b.flat.dtype), b.flat.size, 0);
    const e = b.layout.entry(p)!;
    if (p.grad) copyElements(b.flat, e.offset, p.grad, 0, e.count);
    if (--b.pending === 0) this.#launch(b);
  }

  #launch(b: GradBucket): void {
    this.launched++;
    b.work = this.group.allReduce(b.flat, { op: this.average ? 'avg' : 'sum' });
  }

  /**
   * Waits for every bucket (launching those with gradients never marked, e.g. unused parameters,
   * which contribute zeros), then writes the averaged gradients back into each parameter's .grad.
   */
  async finishGradSync(): Promise<void> {
    if (!this.syncEnabled) throw new StateError('GradBuffer.finishGradSync inside noSync(): the last micro-batch must run with sync on');
    for (const b of this.buckets) {
      if (b.work === null) for (const e of b.layout.entries) if (!this.#ready.has(e.param)) this.markGradReady(e.param);
    }
    for (const b of this.buckets) {
      await b.work!;
      for (const e of b.layout.entries) {
        const p = e.param;
        if (!p.grad) p.grad = emptyOn(p.shape, p.dtype, p.deviceInfo);
        copyElements(p.grad, 0, b.flat, e.offset, e.count);
      }
      b.work = null;
      b.pending = b.layout.entries.length;
    }
    this.#ready.clear();
  }

  dispose(): void { for (const b of this.buckets) b.flat.dispose(); }
}
