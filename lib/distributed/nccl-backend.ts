// The CommBackend of cuda process groups: drives the cuda addon's NcclComm (native/cuda/nccl.cc).
// Rank 0 creates the NCCL unique id and publishes it through the store; ops run on the
// communicator's stream; a watchdog polls their events for completion, errors and timeouts.
import { existsSync } from 'node:fs';
import { DTYPES, dtypeSize } from '../dtype.js';
import { ArgumentError, BackendUnavailableError, CommError, StateError, TimeoutError } from '../errors.js';
import { cuda, type NativeStorage } from '../native.js';
import type { CommBackend, CommPromise } from './backend.js';
import type { Store } from './store.js';

/** The NcclComm methods this backend calls (see native/cuda/nccl.cc); offsets and counts in elements. */
export interface NcclNativeComm {
  /** This rank in the communicator. */
  readonly rank: number;
  /** Number of ranks in the communicator. */
  readonly size: number;
  /** The cuda device index the communicator runs on. */
  readonly device: number;
  /**
   * Each op returns the id of an event recorded after it on the communication stream, 0 inside a
   * group, or NCCL_PENDING when NCCL is still enqueueing it (see recordCompletion).
   */
  allReduce(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, count: number, dtype: number, op: number): number;
  /** Copies `count` elements from root's send into recv on every rank. */
  broadcast(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, count: number, dtype: number, root: number): number;
  /** Reduces `count` elements over the ranks with `op` into root's recv. */
  reduce(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, count: number, dtype: number, op: number, root: number): number;
  /** Gathers `sendCount` elements from every rank into recv, in rank order. */
  allGather(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, sendCount: number, dtype: number): number;
  /** Reduces send (recvCount elements per rank) and leaves block r of the result in rank r's recv. */
  reduceScatter(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, recvCount: number, dtype: number, op: number): number;
  /** Sends block j (countPerRank elements) of send to rank j and receives rank j's block into block j of recv. */
  allToAll(send: NativeStorage, sendOff: number, recv: NativeStorage, recvOff: number, countPerRank: number, dtype: number): number;
  /** Sends `count` elements to rank `peer`. */
  send(buf: NativeStorage, off: number, count: number, dtype: number, peer: number): number;
  /** Receives `count` elements from rank `peer`. */
  recv(buf: NativeStorage, off: number, count: number, dtype: number, peer: number): number;
  /** Starts an NCCL group: the following ops are issued together at groupEnd(). */
  groupStart(): void;
  /** Ends the NCCL group and issues its ops; returns the completion event (as the ops do). */
  groupEnd(): number;
  /** 'ok', 'inProgress' (init or the last call not finished) or the failure's message. */
  asyncError(): string;
  /** The completion event of the call that returned NCCL_PENDING, once asyncError() has left 'inProgress'. */
  recordCompletion(): number;
  /** Whether the event's operation has finished; throws CommError on an asynchronous NCCL failure. */
  query(eventId: number): boolean;
  /** Aborts the communicator (in-flight ops are cancelled; later calls fail). */
  abort(): void;
  /** Frees the communicator after its work is done. */
  destroy(): void;
}

/** What the backend needs from the cuda addon (injectable, so the mechanics are testable on a host). */
export interface NcclAddon {
  /** A fresh NCCL unique id (rank 0 creates it and shares it through the store). */
  ncclUniqueId(): Uint8Array;
  /** The native communicator class. */
  NcclComm: {
    /** Creates a communicator: rank `rank` of `size` on cuda device `device`, from the shared unique id. */
    new (id: Uint8Array, rank: number, size: number, device: number): NcclNativeComm;
  };
  /** The cuda storage class. */
  Storage: {
    /** Allocates `bytes` of device memory (zero-filled when `zero`) on cuda device `device`. */
    new (bytes: number, zero: boolean, device?: number): NativeStorage;
  };
  /** The id of the device's current stream. */
  currentStream(device: number): number;
  /** Makes a stream wait for an event (no host block). */
  streamWaitEvent(device: number, streamId: number, eventId: number): void;
  /** Frees an event. */
  eventDestroy(eventId: number): void;
}

/** Where an NCCL communicator meets its peers. */
export interface NcclEndpoint {
  /** The job's store; the unique id goes under `prefix`. */
  store: Store;
  /** Store key prefix of this group (unique per group and launch attempt). */
  prefix: string;
  /** The group's name, for errors. */
  group: string;
  /** This rank in the group. */
  rank: number;
  /** Number of ranks in the group. */
  size: number;
  /** The cuda device index this rank's communicator runs on. */
  device: number;
  /** Bounds the id exchange and the communicator's initialization. */
  timeoutMs: number;
  /** Default: the cuda addon. */
  addon?: NcclAddon;
  /** Watchdog poll interval while ops are in flight; default 1 ms. */
  pollMs?: number;
}

/**
 * The cuda addon when it can run NCCL here, else BackendUnavailableError naming what is missing
 * (the cuda build, a library, the driver, a GPU, or a GPU for this device index).
 */
export function loadNcclAddon(device = 0): NcclAddon {
  let addon;
  try {
    addon = cuda();
  } catch (e) {
    throw new BackendUnavailableError(`the nccl backend needs the cuda backend: ${(e as Error).message}`, 'nccl');
  }
  if (typeof addon.NcclComm !== 'function' || typeof addon.ncclUniqueId !== 'function') {
    throw new BackendUnavailableError('the cuda addon was built without NCCL: `pip install nvidia-nccl-cu13` (or set NCCL_HOME) and rebuild', 'nccl');
  }
  const status = addon.driverStatus() as string;
  if (status !== 'ok') throw new BackendUnavailableError(`the nccl backend needs a usable GPU: ${status}`, 'nccl');
  const count = addon.deviceCount() as number;
  if (device >= count) {
    throw new BackendUnavailableError(`the nccl backend was asked for cuda:${device} but this machine has ${count} GPU(s); ` +
      'NCCL runs one rank per GPU (LOCAL_RANK picks it)', 'nccl');
  }
  return addon as unknown as NcclAddon;
}

/** Whether this machine has an NVIDIA device node (checked before loading the ~150 MiB cuda addon). */
export function nvidiaDeviceNodePresent(): boolean {
  return existsSync('/dev/nvidiactl') || existsSync('/dev/dxg');
}

/**
 * How many GPUs NCCL can use here (0 when the cuda build, NCCL, the driver or a GPU is missing).
 * Without an NVIDIA device node it answers 0 without loading the cuda addon (~150 MiB per process).
 */
export function ncclUsableDevices(): number {
  if (!nvidiaDeviceNodePresent()) return 0;
  try {
    loadNcclAddon(0);
    return cuda().deviceCount() as number;
  } catch {
    return 0;
  }
}

/**
 * What a NcclComm call returns when NCCL answered ncclInProgress: the operation may not be on the
 * stream yet, so no event was recorded; NCCL allows no other call on the communicator until its
 * state leaves in-progress.
 */
export const NCCL_PENDING = -1;

/** Store key (under the group's prefix) of the NCCL unique id rank 0 publishes. */
export const NCCL_UNIQUE_ID_KEY = 'ncclUniqueId';

/**
 * A connected NCCL communicator: rank 0 creates the unique id and publishes it, the others wait for
 * it, then every rank initializes its communicator (non-blocking) and waits until NCCL reports it ready.
 */
export async function createNcclBackend(e: NcclEndpoint): Promise<NcclBackend> {
  const addon = e.addon ?? loadNcclAddon(e.device);
  const key = `${e.prefix}/${NCCL_UNIQUE_ID_KEY}`;
  let id: Uint8Array;
  if (e.rank === 0) {
    id = addon.ncclUniqueId();
    await e.store.set(key, id);
  } else {
    id = await e.store.get(key, { timeoutMs: e.timeoutMs });
  }
  const native = new addon.NcclComm(id, e.rank, e.size, e.device);
  const comm = new NcclBackend(native, addon, e.group, e.rank, e.size, e.device, e.pollMs ?? 1);
  await comm.connect(e.timeoutMs);
  return comm;
}

interface OpInfo {
  op: string;
  seq: number;
  bytes: number;
  resolve(): void;
  reject(e: Error): void;
  /** Settles (never rejects) with the op. */
  settled: Promise<void>;
}

// One event in flight: a single op's, or the shared event of a batch (group call).
interface InFlight {
  eventId: number;
  ops: OpInfo[];
  deadline: number;
  retired: boolean;
}

/**
 * NCCL behind the CommBackend interface. An op's promise settles when its event completes (polled
 * on the host by a watchdog that never blocks the event loop); its `waitSync()` does not block the
 * host: it makes the device's current stream wait on that event, so later compute is ordered after
 * the collective (docs/architecture.md, Backends). A failure or timeout aborts the communicator; later ops then throw.
 */
export class NcclBackend implements CommBackend {
  /** Marks the promises of this backend as stream-ordered (see Work.wait). */
  static readonly streamOrdered = true;
  /** NCCL has no tags: point-to-point messages between a pair match in issue order (see send). */
  readonly p2pTags = false;
  #inFlight: InFlight[] = [];
  #batch: { ops: OpInfo[]; deadline: number; waits: Array<(e: InFlight) => void> } | undefined;
  #broken: string | undefined;
  #destroyed = false;
  #aborted = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #barrierBuf: NativeStorage | undefined;

  /**
   * Wraps a native communicator. Use createNcclBackend() to create one.
   * @param group The group's name, for errors.
   * @param rank This rank in the group.
   * @param size Number of ranks in the group.
   * @param device The cuda device index of the communicator.
   */
  constructor(private readonly native: NcclNativeComm, private readonly addon: NcclAddon, readonly group: string,
    readonly rank: number, readonly size: number, readonly device: number, private readonly pollMs: number) {}

  get pending(): number { return this.#inFlight.reduce((a, f) => a + f.ops.length, 0) + (this.#batch?.ops.length ?? 0); }

  /** Waits (without blocking the event loop) until NCCL's non-blocking init has finished. */
  async connect(timeoutMs = 300_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const state = this.native.asyncError();
      if (state === 'ok') return;
      if (state !== 'inProgress') {
        this.#abort(state);
        throw new CommError(`${this.#where('connect')} failed: ${state}`, 'NcclComm.connect');
      }
      if (Date.now() > deadline) {
        this.#abort('initialization timed out');
        throw new TimeoutError(`${this.#where('connect')} did not finish within ${timeoutMs} ms; the communicator was aborted ` +
          '(did every rank of the group start, and can they reach each other?)', 'NcclComm.connect');
      }
      await new Promise((r) => setTimeout(r, this.pollMs));
    }
  }

  #where(op: string, seq = -1, bytes?: number): string {
    return `${op}${seq >= 0 ? ` #${seq}` : ''}${bytes === undefined ? '' : ` (${bytes} bytes)`} on rank ${this.rank} of nccl group '${this.group}' (size ${this.size}, cuda:${this.device})`;
  }

  #usable(call: string): void {
    if (this.#destroyed) throw new StateError(`${call}: the nccl communicator of group '${this.group}' was destroyed`);
    if (this.#broken !== undefined) {
      throw new CommError(`${call}: the nccl communicator of group '${this.group}' is unusable after an earlier failure: ${this.#broken}`, `NcclComm.${call}`);
    }
  }

  #abort(why: string): void {
    if (this.#broken === undefined) this.#broken = why;
    try { this.native.abort(); } catch { /* already aborted or destroyed */ }
  }

  // Issues one native op (or several, for the uneven forms) and tracks its completion.
  #issue(op: string, seq: number, bytes: number, timeoutMs: number, call: () => number): CommPromise {
    this.#usable(op);
    let resolve!: () => void, reject!: (e: Error) => void;
    const promise = new Promise<void>((res, rej) => { resolve = res; reject = rej; });
    const info: OpInfo = { op, seq, bytes, resolve, reject, settled: promise.then(() => {}, () => {}) };
    const eventId = this.#enqueued(call(), op, seq, bytes, timeoutMs);
    let flight: InFlight | undefined;
    let batchWaiters: Array<(e: InFlight) => void> | undefined;
    if (this.#batch) {
      this.#batch.ops.push(info);
      this.#batch.deadline = Math.max(this.#batch.deadline, Date.now() + timeoutMs);
      batchWaiters = this.#batch.waits;
      batchWaiters.push((f) => { flight = f; });
    } else {
      flight = { eventId, ops: [info], deadline: Date.now() + timeoutMs, retired: false };
      this.#track(flight);
    }
    const waitSync = (): void => {
      if (!flight) throw new StateError(`${op}: this op is part of an open batch; wait for it after the batch ends`);
      if (flight.retired) return;
      this.addon.streamWaitEvent(this.device, this.addon.currentStream(this.device), flight.eventId);
    };
    return Object.assign(promise, { waitSync, streamOrdered: true as const });
  }

  /**
   * The completion event of a call that returned `id`. When NCCL is still enqueueing it
   * (NCCL_PENDING), polls the communicator until its state leaves in-progress — blocking the host,
   * since NCCL forbids other calls meanwhile (PyTorch's ProcessGroupNCCL does the same) — and only
   * then records the event, so it cannot complete before the operation.
   */
  #enqueued(id: number, op: string, seq: number, bytes: number | undefined, timeoutMs: number): number {
    if (id !== NCCL_PENDING) return id;
    const deadline = Date.now() + timeoutMs;
    for (let polls = 0; ; polls++) {
      let state: string;
      try {
        state = this.native.asyncError();
      } catch (e) {
        this.#abort((e as Error).message);
        throw e;
      }
      if (state === 'ok') break;
      if (state !== 'inProgress') {
        this.#abort(state);
        throw new CommError(`${this.#where(op, seq, bytes)} failed while NCCL enqueued it: ${state}; the communicator was aborted`, `NcclComm.${op}`);
      }
      if (Date.now() > deadline) {
        this.#abort('enqueue timed out');
        throw new TimeoutError(`${this.#where(op, seq, bytes)} was still being enqueued by NCCL (ncclInProgress) after ${timeoutMs} ms; ` +
          'the communicator was aborted (did every rank of the group issue it?)', `NcclComm.${op}`);
      }
      if (polls >= 100) sleepMicros(50);
    }
    return this.native.recordCompletion();
  }

  #track(f: InFlight): void {
    this.#inFlight.push(f);
    this.#schedule();
  }

  #schedule(): void {
    if (this.#timer !== undefined || this.#inFlight.length === 0) return;
    this.#timer = setTimeout(() => { this.#timer = undefined; this.#poll(); }, this.pollMs);
  }

  // The watchdog: retires completed events, fails everything on an asynchronous error or a timeout.
  #poll(): void {
    const now = Date.now();
    for (const f of this.#inFlight) {
      let done: boolean;
      try {
        done = this.native.query(f.eventId);
      } catch (e) {
        this.#failAll(`${(e as Error).message}`, CommError);
        return;
      }
      if (done) {
        this.#retire(f);
        for (const o of f.ops) o.resolve();
      } else if (now > f.deadline) {
        const o = f.ops[0]!;
        this.#failAll(`${this.#where(o.op, o.seq, o.bytes)} did not finish within its timeout; the communicator was aborted`, TimeoutError);
        return;
      }
    }
    this.#inFlight = this.#inFlight.filter((f) => !f.retired);
    this.#schedule();
  }

  #retire(f: InFlight): void {
    f.retired = true;
    try { this.addon.eventDestroy(f.eventId); } catch { /* the event went with an aborted context */ }
  }

  #failAll(why: string, Kind: typeof CommError | typeof TimeoutError): void {
    this.#abort(why);
    const flights = this.#inFlight;
    this.#inFlight = [];
    for (const f of flights) {
      this.#retire(f);
      for (const o of f.ops) o.reject(new Kind(`${this.#where(o.op, o.seq, o.bytes)} failed: ${why}`, `NcclComm.${o.op}`));
    }
  }

  /** Opens a batch: ops until groupEnd() are fused into one NCCL group call (ncclGroupStart/End). */
  groupStart(): void {
    this.#usable('groupStart');
    if (this.#batch) throw new StateError(`groupStart: a batch is already open on nccl group '${this.group}'`);
    this.native.groupStart();
    this.#batch = { ops: [], deadline: 0, waits: [] };
  }

  /** Closes the batch; its ops complete together. */
  groupEnd(): void {
    const batch = this.#batch;
    if (!batch) throw new StateError(`groupEnd: no batch is open on nccl group '${this.group}'`);
    this.#batch = undefined;
    let eventId: number;
    try {
      const first = batch.ops[0];
      eventId = this.#enqueued(this.native.groupEnd(), first ? `batch of ${batch.ops.length} ops starting with ${first.op}` : 'empty batch',
        first?.seq ?? -1, first ? sum(batch.ops.map((o) => o.bytes)) : undefined, first ? Math.max(1, batch.deadline - Date.now()) : 300_000);
    } catch (e) {
      this.#abort((e as Error).message);
      for (const o of batch.ops) o.reject(e as Error);
      throw e;
    }
    if (batch.ops.length === 0) {
      this.#retire({ eventId, ops: [], deadline: 0, retired: false });
      return;
    }
    const f: InFlight = { eventId, ops: batch.ops, deadline: batch.deadline, retired: false };
    for (const w of batch.waits) w(f);
    this.#track(f);
  }

  allReduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, seq: number, timeoutMs: number): CommPromise {
    return this.#issue('allReduce', seq, bytesOf(dtype, count), timeoutMs,
      () => this.native.allReduce(send, 0, recv, 0, count, dtype, op));
  }

  broadcast(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, root: number, seq: number, timeoutMs: number): CommPromise {
    return this.#issue('broadcast', seq, bytesOf(dtype, count), timeoutMs,
      () => this.native.broadcast(send, 0, recv, 0, count, dtype, root));
  }

  reduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, root: number, seq: number, timeoutMs: number): CommPromise {
    return this.#issue('reduce', seq, bytesOf(dtype, count), timeoutMs,
      () => this.native.reduce(send, 0, recv, 0, count, dtype, op, root));
  }

  /** Equal counts: one ncclAllGather; uneven: one broadcast per rank into its slot, fused in a group. */
  allGather(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], seq: number, timeoutMs: number): CommPromise {
    // In place (send === recv): NCCL sees the input at this rank's block of the output.
    const inPlace = send === recv;
    const mine = sum(counts.slice(0, this.rank));
    return this.#issue('allGather', seq, bytesOf(dtype, sum(counts)), timeoutMs, () => {
      if (counts.every((c) => c === counts[0])) return this.native.allGather(send, inPlace ? mine : 0, recv, 0, counts[0] ?? 0, dtype);
      return this.#grouped(() => {
        let offset = 0;
        counts.forEach((c, r) => {
          // Non-roots' send buffer is ignored by NCCL; their own slot keeps the range check valid.
          const root = r === this.rank;
          if (c > 0) this.native.broadcast(root ? send : recv, root && !inPlace ? 0 : offset, recv, offset, c, dtype, r);
          offset += c;
        });
      });
    });
  }

  /** Equal counts: one ncclReduceScatter; uneven: one reduce per rank onto its owner, fused in a group. */
  reduceScatter(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], op: number, seq: number, timeoutMs: number): CommPromise {
    // In place (send === recv): the result lands in this rank's block of the input.
    const recvOffset = send === recv ? sum(counts.slice(0, this.rank)) : 0;
    return this.#issue('reduceScatter', seq, bytesOf(dtype, sum(counts)), timeoutMs, () => {
      if (counts.every((c) => c === counts[0])) return this.native.reduceScatter(send, 0, recv, recvOffset, counts[0] ?? 0, dtype, op);
      return this.#grouped(() => {
        let offset = 0;
        counts.forEach((c, r) => {
          // recv is used on the root only; others pass their own block, which NCCL ignores.
          if (c > 0) this.native.reduce(send, offset, r === this.rank ? recv : send, r === this.rank ? recvOffset : offset, c, dtype, op, r);
          offset += c;
        });
      });
    });
  }

  /** Equal blocks: the native allToAll; uneven: a send and a recv per peer, fused in a group. */
  allToAll(send: NativeStorage, recv: NativeStorage, dtype: number, sendCounts: number[], recvCounts: number[], seq: number, timeoutMs: number): CommPromise {
    return this.#issue('allToAll', seq, bytesOf(dtype, sum(sendCounts)), timeoutMs, () => {
      const equal = sendCounts.every((c) => c === sendCounts[0]) && recvCounts.every((c) => c === sendCounts[0]);
      if (equal) return this.native.allToAll(send, 0, recv, 0, sendCounts[0] ?? 0, dtype);
      return this.#grouped(() => {
        let sendOffset = 0, recvOffset = 0;
        for (let peer = 0; peer < this.size; peer++) {
          if (sendCounts[peer]! > 0) this.native.send(send, sendOffset, sendCounts[peer]!, dtype, peer);
          if (recvCounts[peer]! > 0) this.native.recv(recv, recvOffset, recvCounts[peer]!, dtype, peer);
          sendOffset += sendCounts[peer]!;
          recvOffset += recvCounts[peer]!;
        }
      });
    });
  }

  /** NCCL has no barrier: a one-element allreduce on the communication stream, as PyTorch does. */
  barrier(seq: number, timeoutMs: number): CommPromise {
    this.#barrierBuf ??= new this.addon.Storage(4, true, this.device);
    const buf = this.#barrierBuf;
    return this.#issue('barrier', seq, 0, timeoutMs, () => this.native.allReduce(buf, 0, buf, 0, 1, 0, 0));
  }

  /**
   * NCCL matches sends and receives between a pair in issue order and has no tags; a nonzero tag
   * is refused rather than silently ignored. Paired send/recv that depend on each other (a ring)
   * must be issued inside one batch (ProcessGroup.batch), or they deadlock on the stream.
   */
  send(buf: NativeStorage, dtype: number, count: number, dst: number, tag: number, timeoutMs: number): CommPromise {
    this.#noTag(tag, 'send');
    return this.#issue(`send to rank ${dst}`, -1, bytesOf(dtype, count), timeoutMs, () => this.native.send(buf, 0, count, dtype, dst));
  }

  recv(buf: NativeStorage, dtype: number, count: number, src: number, tag: number, timeoutMs: number): CommPromise {
    this.#noTag(tag, 'recv');
    return this.#issue(`recv from rank ${src}`, -1, bytesOf(dtype, count), timeoutMs, () => this.native.recv(buf, 0, count, dtype, src));
  }

  #noTag(tag: number, call: string): void {
    if (tag !== 0) throw new ArgumentError(`${call}: NCCL matches point-to-point messages in issue order and has no tags; got tag ${tag} (pass 0)`, `NcclComm.${call}`);
  }

  // Several native calls as one op: inside an open batch they join it, else they get their own group.
  #grouped(calls: () => void): number {
    if (this.#batch) { calls(); return 0; }
    this.native.groupStart();
    try {
      calls();
    } catch (e) {
      // NCCL must leave the group even when a call inside failed; the first failure is the one reported.
      try {
        const id = this.native.groupEnd();
        if (id > 0) this.addon.eventDestroy(id);
      } catch { /* see above */ }
      throw e;
    }
    return this.native.groupEnd();
  }

  /**
   * Aborts the communicator (ncclCommAbort) from the JS thread: the ops in flight reject at once with
   * CommError naming `reason`, later ops throw, destroy() resolves without waiting on peers. A
   * no-op after destroy() or an earlier abort.
   */
  abort(reason: string): void {
    if (this.#destroyed || this.#aborted) return;
    this.#aborted = true;
    this.#failAll(`the communicator was aborted: ${reason}`, CommError);
  }

  /** Waits for the ops in flight, then frees the communicator (ncclCommFinalize + destroy). */
  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    if (this.#batch) this.groupEnd();
    await Promise.all(this.#inFlight.flatMap((f) => f.ops.map((o) => o.settled)));
    this.#destroyed = true;
    this.#barrierBuf?.dispose();
    if (this.#broken === undefined) this.native.destroy();
  }
}

function bytesOf(dtypeCode: number, count: number): number {
  const d = DTYPES[dtypeCode];
  return d === undefined ? 0 : count * dtypeSize(d);
}

const sleeper = new Int32Array(new SharedArrayBuffer(4));
/** Blocks the thread for about `us` microseconds (a poll interval that does not spin a core). */
function sleepMicros(us: number): void {
  Atomics.wait(sleeper, 0, 0, us / 1000);
}

function sum(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0);
}
