// The stand-in communicator of a group built by a process that joins a running job (in-job recovery,
// docs/recovery.md): the group knows its members and devices, and connects when the process regroups.
// Its ops throw NotConnectedError, the typed error of that condition (in-job recovery treats it as a
// lost peer's doing, as it does every CommError).
import { CommError } from '../errors.js';
import type { CommBackend, CommPromise } from './backend.js';

/**
 * An op on a group that is not connected yet: a joining process (in-job recovery's replacement) ran a
 * collective before it met the running ranks (regroup). A CommError (code ERR_COMM, call
 * 'notConnected'), so whatever treats a failed collective as recoverable treats this one alike.
 */
export class NotConnectedError extends CommError {
  /** @param what The op (and group) that was called, e.g. "allReduce: group 'world'". */
  constructor(what: string) {
    super(`${what} is not connected yet (this process is joining a running job; it connects when the run takes it in)`, 'notConnected');
  }
}

/**
 * The stand-in communicator of a group a joining process built before meeting the running ranks
 * (in-job recovery): it knows only its device's point-to-point matching; every op throws NotConnectedError.
 */
export class PendingBackend implements CommBackend {
  readonly pending = 0;
  /** @param rank This rank in the group. @param size Ranks in the group. @param p2pTags false for an NCCL communicator (untagged point-to-point). */
  constructor(readonly rank: number, readonly size: number, readonly p2pTags: boolean = true) {}
  private fail(): never { throw new NotConnectedError('the group'); }
  connect(): Promise<void> { return Promise.resolve(); }
  allReduce(): CommPromise { return this.fail(); }
  broadcast(): CommPromise { return this.fail(); }
  reduce(): CommPromise { return this.fail(); }
  allGather(): CommPromise { return this.fail(); }
  reduceScatter(): CommPromise { return this.fail(); }
  allToAll(): CommPromise { return this.fail(); }
  barrier(): CommPromise { return this.fail(); }
  send(): CommPromise { return this.fail(); }
  recv(): CommPromise { return this.fail(); }
  destroy(): Promise<void> { return Promise.resolve(); }
}
