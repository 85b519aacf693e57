// The communicator interface a process group drives: the cpu addon's GlooCommunicator implements it
// natively; NcclBackend (nccl-backend.ts) adapts the cuda addon's NcclComm to it.
import { BackendUnavailableError } from '../errors.js';
import { cpu, type NativeStorage } from '../native.js';
import type { Store } from './store-api.js';

/**
 * Native methods of a communicator. Ranks are group-local; counts are elements; dtype is the native
 * dtype code (lib/dtype.ts); op is a REDUCE_OP_CODES value; seq is the group's sequence number
 * (the collective's tag, and named in errors); timeoutMs >= 1. Passing the same storage as send and
 * recv means in place. Every op returns a Promise that settles when the op has finished on this
 * rank, with CommError/TimeoutError naming rank, group, op, seq and bytes on failure. Storages
 * must stay alive until then (the native side holds a reference; lib pins the tensor's storage).
 * The promise of a communication op also carries `waitSync()` (see CommPromise).
 */
/**
 * What a communication op returns: a Promise plus `waitSync()`. On the host (Gloo) waitSync blocks
 * the JS thread until the op has finished on this rank and throws the same typed error the promise
 * rejects with (the promise itself settles once the event loop runs again). On a device
 * (`streamOrdered`, NCCL) it blocks nothing: it orders the device's current stream after the op, and
 * failures surface through the promise and the communicator's later ops.
 */
export type CommPromise = Promise<void> & {
  /** Host: blocks until the op has finished on this rank (throws its error). Device: orders the current stream after the op. */
  waitSync(): void;
  /** Set when the op runs on a device stream (NCCL): waitSync() then blocks nothing. */
  streamOrdered?: true;
};

/**
 * The communicator interface a process group drives: the cpu addon's GlooCommunicator implements it natively;
 * NcclBackend (lib/distributed/nccl-backend.ts) adapts the cuda addon's NcclComm to it. Ranks are group-local; counts are elements; dtype is the native
 * dtype code; op is a REDUCE_OP_CODES value; seq is the group's sequence number; timeoutMs >= 1; the same storage as
 * send and recv means in place. Ops settle when finished on this rank, rejecting with CommError or TimeoutError.
 */
export interface CommBackend {
  /** This rank in the group. */
  readonly rank: number;
  /** Number of ranks in the group. */
  readonly size: number;
  /** Ops in flight. */
  readonly pending: number;
  /** Gloo: whether this group's ranks share a host and allreduce goes through shared memory (known after connect). */
  readonly sharedMemory?: boolean;
  /** Meets the peers and sets up the connections; ops may be issued once it resolves. */
  connect(): Promise<void>;
  /** Reduces `count` elements of send over all ranks with `op` into recv on every rank. */
  allReduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, seq: number, timeoutMs: number): CommPromise;
  /** Copies `count` elements of root's send into recv on every rank. */
  broadcast(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, root: number, seq: number, timeoutMs: number): CommPromise;
  /** recv is written on root; other ranks pass scratch of count elements. */
  reduce(send: NativeStorage, recv: NativeStorage, dtype: number, count: number, op: number, root: number, seq: number, timeoutMs: number): CommPromise;
  /** counts[i]: elements rank i contributes; recv holds sum(counts), in rank order. send === recv: in place (this rank's block of recv is the input). */
  allGather(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], seq: number, timeoutMs: number): CommPromise;
  /** send holds sum(counts); rank r receives counts[r] reduced elements. send === recv: in place (into block r of send, the rest unchanged). */
  reduceScatter(send: NativeStorage, recv: NativeStorage, dtype: number, counts: number[], op: number, seq: number, timeoutMs: number): CommPromise;
  /**
   * Rank r sends sendCounts[j] elements to rank j (blocks in rank order) and receives recvCounts[j] from rank j into
   * recv.
   */
  allToAll(send: NativeStorage, recv: NativeStorage, dtype: number, sendCounts: number[], recvCounts: number[], seq: number, timeoutMs: number): CommPromise;
  /** Resolves once every rank of the group has called it. */
  barrier(seq: number, timeoutMs: number): CommPromise;
  /** tag in [0, 2^24): matches a send with the recv of the same tag between the same pair. */
  send(buf: NativeStorage, dtype: number, count: number, dst: number, tag: number, timeoutMs: number): CommPromise;
  /** Receives `count` elements from rank `src` into buf, matching the send with the same tag. */
  recv(buf: NativeStorage, dtype: number, count: number, src: number, tag: number, timeoutMs: number): CommPromise;
  /** Finishes queued ops, then releases the connections; later ops throw. */
  destroy(): Promise<void>;
  /**
   * Aborts the communicator from the JS thread at any time, also while an op is blocked in it: every
   * op in flight rejects promptly with CommError naming `reason`, later ops fail at once, destroy()
   * still resolves, and peers' ops on the same connections fail too. Idempotent. Gloo: the
   * communicator's thread is woken (Gloo pairs and the shared-memory segment); NCCL: ncclCommAbort.
   * Absent on a backend that cannot abort.
   */
  abort?(reason: string): void;
  /**
   * false: point-to-point messages between a pair match in issue order and only tag 0 is taken (NCCL);
   * a caller that would tag them must post each pair's sends and receives in the same order on both
   * sides instead. Absent or true: send and recv match by tag (Gloo).
   */
  readonly p2pTags?: boolean;
  /** Batching (NCCL group calls): ops between groupStart and groupEnd are issued as one. Absent: ops run one by one. */
  groupStart?(): void;
  /** Issues the ops queued since groupStart() as one. */
  groupEnd?(): void;
}

/** Where a Gloo communicator meets its peers: the store's address and the key namespace of the group. */
export interface GlooEndpoint {
  /** Host of the rendezvous TCP store. */
  storeHost: string;
  /** Port of the rendezvous TCP store. */
  storePort: number;
  /**
   * Meet through this store instead of the TCP store at storeHost:storePort (the Redis store of a
   * job launched with --rdzv): Gloo's rendezvous calls are forwarded to it from the communicator's thread.
   */
  store?: Store;
  /** Store key prefix of this group (unique per group and launch attempt; relative to `store` when given). */
  prefix: string;
  /** This rank in the group. */
  rank: number;
  /** Number of ranks in the group. */
  size: number;
  /** Timeout of the rendezvous and of every op (ms). */
  timeoutMs: number;
  /** Address this rank's TCP device binds to (resolvable by its peers). */
  deviceHost: string;
  /** Network interface to bind to instead of deviceHost (GLOO_SOCKET_IFNAME), or ''. */
  deviceIface: string;
  /** Ranks agree on op, dtype and sizes before each collective (see InitOptions.verifySizes). */
  verifySizes: boolean;
  /** Use a shared-memory segment when all ranks share this host (see InitOptions.sharedMemory). */
  sharedMemory: boolean;
}

type StoreOp = (op: 'set' | 'get' | 'wait', key: string, value: Uint8Array | null, done: (error: string | null, value?: Uint8Array) => void) => void;
type GlooCtor = new (storeHost: string, storePort: number, prefix: string, rank: number, size: number, timeoutMs: number,
  deviceHost: string, deviceIface: string, verifySizes: boolean, sharedMemory: boolean, storeOp: StoreOp | null) => CommBackend;

// The native side's view of a JS store (native/cpu/comm/js_store.h): one callback per rendezvous call.
function storeOpFor(store: Store, timeoutMs: number): StoreOp {
  return (op, key, value, done) => {
    const call: Promise<Uint8Array | undefined> = op === 'set' ? store.set(key, value ?? new Uint8Array(0)).then(() => undefined)
      : op === 'get' ? store.get(key, { timeoutMs })
        : store.wait([key], { timeoutMs }).then(() => undefined);
    call.then((v) => done(null, v), (e: unknown) => done(e instanceof Error ? e.message : String(e)));
  };
}

/** A connected Gloo communicator. */
export async function createGlooBackend(e: GlooEndpoint): Promise<CommBackend> {
  const Ctor = cpu().GlooCommunicator as GlooCtor | undefined;
  if (!Ctor) throw new BackendUnavailableError('the cpu addon was built without Gloo (install libgloo-dev and rebuild)', 'createGlooBackend');
  const comm = new Ctor(e.storeHost, e.storePort, e.prefix, e.rank, e.size, e.timeoutMs, e.deviceHost, e.deviceIface, e.verifySizes, e.sharedMemory,
    e.store ? storeOpFor(e.store, e.timeoutMs) : null);
  await comm.connect();
  return comm;
}
