// Finishing collectives inside a synchronous call: autograd's forward and backward return tensors,
// not promises, so the parallel layers (tensor-parallel mappings, expert parallelism's all-to-all,
// ring and Ulysses attention, ZeRO-3's gathers) finish each collective with Work.waitSync() before
// they return. One behaviour for all of them on failure: the caller's buffers are released once every
// collective of the call has settled (never while one may still read or write them), and the error
// is thrown to the caller, on every rank — nothing is swallowed and no rejection is left unhandled.
import { StateError } from '../errors.js';
import type { Tensor } from '../tensor.js';
import type { CollectiveGroup, CollectiveWork } from './group.js';

/** What finishSync needs besides the works. */
export interface FinishSyncOptions {
  /** The operation, for the error message (e.g. 'gatherFromRegion', 'ringAttention'). */
  call: string;
  /** The group the works run on, named in the error when it cannot finish synchronously. */
  group: CollectiveGroup;
  /**
   * Tensors the collectives read or write that the caller would free: disposed on failure once every
   * work has settled. After a success they stay the caller's to free.
   */
  buffers?: readonly Tensor[];
}

/** One started collective, or several finished in order. */
type Works = CollectiveWork | readonly CollectiveWork[];

/** A promise that resolves when every work has settled, whatever its outcome (each rejection is handled). */
function settled(works: readonly CollectiveWork[]): Promise<unknown> {
  return Promise.allSettled(works.map((w) => new Promise((resolve) => { w.then(resolve, resolve); })));
}

/**
 * Finishes `works` in order before returning; given a function, starts them first (a start that
 * throws releases the buffers too). A group whose Work cannot block (no waitSync) is refused with a
 * StateError before any wait, the same on every rank; a failing wait rethrows its error. Either way
 * `buffers` are disposed: at once when nothing is left running, else when the works still in flight
 * have settled.
 */
export function finishSync(works: Works | (() => Works), o: FinishSyncOptions): void {
  const release = (): void => { for (const b of o.buffers ?? []) b.dispose(); };
  let started: Works;
  try {
    started = typeof works === 'function' ? works() : works;
  } catch (e) {
    release();
    throw e;
  }
  const list: readonly CollectiveWork[] = Array.isArray(started) ? started : [started as CollectiveWork];
  const releaseAfter = (pending: readonly CollectiveWork[]): void => {
    if (pending.length === 0) release();
    else void settled(pending).then(release);
  };
  if (list.some((w) => typeof w.waitSync !== 'function')) {
    releaseAfter(list);
    throw new StateError(`${o.call}: group '${o.group.name}' cannot complete a collective synchronously (its Work has no waitSync), ` +
      'which autograd needs inside forward and backward; use a process group from nt.distributed (Gloo or NCCL) or, on CPU, the file-backed group of nodetron/testing');
  }
  for (let i = 0; i < list.length; i++) {
    try {
      list[i]!.waitSync!();
    } catch (e) {
      releaseAfter(list.slice(i + 1));
      throw e;
    }
  }
}
