// Work: the awaitable handle of a collective in flight (PyTorch's Work), resolving to its output,
// and waitable synchronously (waitSync) by code that cannot await, such as autograd backward.
import { StateError } from '../errors.js';
import type { StorageRef, Tensor } from '../tensor.js';

/**
 * What a Work is built from: the op's promise, blocking-waitable when it carries waitSync; with
 * `streamOrdered` (a device op), waitSync orders the current stream after the op instead of blocking.
 */
export type WorkOp = Promise<unknown> & { waitSync?: () => void; streamOrdered?: true };

type Outcome = { failed: false } | { failed: true; error: unknown };

/** A communication op in flight. `await work`, `work.wait()` or `work.waitSync()` gives its output tensor. */
export class Work<T = Tensor> implements PromiseLike<T> {
  #outcome: Outcome | undefined;
  readonly #promise: Promise<T>;
  readonly #result: T;
  readonly #refs: StorageRef[];
  readonly #finish: (() => void) | undefined;
  readonly #blockingWait: (() => void) | undefined;
  readonly #streamOrdered: boolean;
  readonly #observe: ((failed: boolean, error?: unknown) => void) | undefined;

  /**
   * Internal. `pinned` tensors' storages stay allocated until the op settles, even if the caller
   * disposes a tensor meanwhile (the bytes are still being read or written by the communicator).
   * `finish` runs once after the op succeeds, before the output is handed out (a failure in it
   * becomes the op's failure). `observe` hears the outcome once (the flight recorder, flight.ts).
   */
  constructor(op: WorkOp, result: T, pinned: readonly Tensor[], finish?: () => void, observe?: (failed: boolean, error?: unknown) => void) {
    this.#observe = observe;
    this.#result = result;
    this.#refs = pinned.map((t) => t.storageRef);
    for (const r of this.#refs) r.refs++;
    this.#finish = finish;
    this.#blockingWait = typeof op.waitSync === 'function' ? op.waitSync.bind(op) : undefined;
    this.#streamOrdered = op.streamOrdered === true;
    // The promise path and waitSync settle through #settle; whichever comes first decides.
    this.#promise = op.then(() => this.#settle(false), (e: unknown) => this.#settle(true, e)).then(() => this.#value());
    // A Work whose failure nobody awaits must not crash the process as an unhandled rejection;
    // the error is still thrown by wait()/then()/waitSync().
    this.#promise.catch(() => {});
  }

  #settle(failed: boolean, error?: unknown): void {
    if (this.#outcome) return;
    if (!failed && this.#finish) {
      try {
        this.#finish();
      } catch (e) {
        failed = true;
        error = e;
      }
    }
    this.#outcome = failed ? { failed: true, error } : { failed: false };
    for (const r of this.#refs) r.release();
    this.#observe?.(failed, error);
  }

  #value(): T {
    const o = this.#outcome!;
    if (o.failed) throw o.error;
    return this.#result;
  }

  /**
   * Resolves with the output once the op has finished on this rank; rejects with CommError/TimeoutError.
   * A device op (NCCL) resolves at once instead: the device's current stream is made to wait for
   * the op (PyTorch's work.wait()), so kernels queued after it see its output without a host block.
   */
  wait(): Promise<T> {
    if (!this.#outcome && this.#streamOrdered) {
      try {
        this.waitSync();
      } catch (e) {
        return Promise.reject(e);
      }
    }
    if (!this.#outcome) return this.#promise;
    const o = this.#outcome;
    return o.failed ? Promise.reject(o.error) : Promise.resolve(this.#result);
  }

  /**
   * Blocks the JS thread until the op has finished on this rank (the communicator's thread moves
   * the bytes meanwhile) and returns the output, or throws the CommError/TimeoutError wait() would
   * reject with. Awaiting the Work afterwards gives the same outcome at once. A device op (NCCL)
   * does not block: the current stream waits for it on the device.
   */
  waitSync(): T {
    if (!this.#outcome) {
      if (!this.#blockingWait) throw new StateError('waitSync: this op cannot be waited synchronously; await it instead');
      try {
        this.#blockingWait();
        this.#settle(false);
      } catch (e) {
        this.#settle(true, e);
      }
    }
    return this.#value();
  }

  /** Whether the op has finished (successfully or not); for a device op, also once a stream was ordered after it. */
  isCompleted(): boolean { return this.#outcome !== undefined; }
  /** Whether the op finished with an error. */
  isFailed(): boolean { return this.#outcome?.failed === true; }

  then<R1 = T, R2 = never>(onFulfilled?: ((v: T) => R1 | PromiseLike<R1>) | null, onRejected?: ((e: unknown) => R2 | PromiseLike<R2>) | null): Promise<R1 | R2> {
    return this.wait().then(onFulfilled, onRejected);
  }
}
