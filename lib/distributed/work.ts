// Work: the awaitable handle of a collective in flight (PyTorch's Work), resolving to its output.
import { StorageRef, Tensor } from '../tensor.js';

/** A communication op in flight. `await work` (or `work.wait()`) gives its output tensor. */
export class Work<T = Tensor> implements PromiseLike<T> {
  #done = false;
  #error: unknown = undefined;
  readonly #promise: Promise<T>;

  /**
   * Internal. `pinned` tensors' storages stay allocated until the op settles, even if the caller
   * disposes a tensor meanwhile (the bytes are still being read or written by the communicator).
   */
  constructor(op: Promise<unknown>, result: T, pinned: readonly Tensor[]) {
    const refs: StorageRef[] = pinned.map((t) => t.storageRef);
    for (const r of refs) r.refs++;
    const release = (): void => { for (const r of refs) r.release(); };
    this.#promise = op.then(
      () => { this.#done = true; release(); return result; },
      (e: unknown) => { this.#done = true; this.#error = e; release(); throw e; },
    );
    // A Work whose failure nobody awaits must not crash the process as an unhandled rejection;
    // the error is still thrown by wait()/then().
    this.#promise.catch(() => {});
  }

  /** Resolves with the output once the op has finished on this rank; rejects with CommError/TimeoutError. */
  wait(): Promise<T> { return this.#promise; }
  /** Whether the op has finished (successfully or not). */
  isCompleted(): boolean { return this.#done; }
  /** Whether the op finished with an error. */
  isFailed(): boolean { return this.#done && this.#error !== undefined; }

  then<R1 = T, R2 = never>(onFulfilled?: ((v: T) => R1 | PromiseLike<R1>) | null, onRejected?: ((e: unknown) => R2 | PromiseLike<R2>) | null): Promise<R1 | R2> {
    return this.#promise.then(onFulfilled, onRejected);
  }
}
