// Process groups: a set of ranks with their own communicator and sequence numbers, the collectives
// they run (each returns an awaitable Work), and the handle non-members get; and CollectiveGroup,
// the collectives the parallel layer needs from any group (ProcessGroup or an in-process test group).
import { dtypeCode } from '../dtype.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { checkTensor, emptyOn, type Tensor } from '../tensor.js';
import type { CommBackend, CommPromise } from './backend.js';
import { NotConnectedError, PendingBackend } from './pending.js';
import { verifyCollective, type CollectiveDescription } from './check.js';
import {
  checkCommTensor, checkRank, checkSameDType, checkSize, checkTimeoutMs, outLike, parseReduceOp, REDUCE_OP_CODES, type ReduceOp, splitCounts,
} from './collectives.js';
import { flightEnabled, flightGroup, opIssued, opSettled, opStarted, type FlightOp } from './flight.js';
import type { Store } from './store.js';
import { Work, type WorkOp } from './work.js';

/** Options every collective takes. */
export interface CollectiveOptions {
  /** Per-call timeout; default: the group's. */
  timeoutMs?: number;
}
/** Options of reducing collectives. */
export interface ReduceOptions extends CollectiveOptions {
  /** How values combine (default 'sum'). */
  op?: ReduceOp;
}
/** Options of {@link ProcessGroup.allReduce}. */
export interface AllReduceOptions extends ReduceOptions {
  /** Write the result here instead of in place. */
  out?: Tensor;
}
/** Options of rooted collectives (broadcast, reduce). */
export interface RootOptions extends CollectiveOptions {
  /** Group-local rank of the root; default 0. */
  root?: number;
}
/** Options of point-to-point send and recv. */
export interface P2POptions extends CollectiveOptions {
  /** Matches a send with the recv of the same tag (default 0), in [0, 2^24). */
  tag?: number;
}

/** What a group needs from the runtime that built it. */
export interface GroupContext {
  store: Store;
  /** Run the check-mode agreement before each collective. */
  check: boolean;
  /** In-job recovery: the generation of the communicators the group is built with (default 0); check mode's keys carry it. */
  generation?: number;
  /** Builds subgroups (init.ts), so split() stays collective over this group. */
  makeGroup(name: string, globalRanks: readonly number[]): Promise<ProcessGroup>;
}

/**
 * A started collective as code that runs over any group sees it (Work is one): awaiting it (or
 * `wait()`) resolves when the result is in the output tensors. Code that must finish a collective
 * inside a synchronous call (an autograd backward) needs `waitSync`, which only groups whose
 * communication runs off the JS thread can offer.
 */
export interface CollectiveWork extends PromiseLike<unknown> {
  /** Resolves when the collective's result is in its output tensors. */
  wait(): Promise<unknown>;
  /**
   * Finishes the collective before returning (host communicators) or orders the device stream after it; only groups
   * whose communication runs off the JS thread offer it.
   */
  waitSync?(): void;
}

/**
 * The collectives the parallel layer (lib/parallel) runs over a set of ranks: ProcessGroup has
 * them, and so do the in-process groups that test parallel layouts without processes. Every member
 * calls each collective in the same order. Tensors are contiguous; allGather/reduceScatter treat
 * them as flat arrays whose rank chunks are consecutive (rank i owns elements [i·n, (i+1)·n) of the
 * full buffer).
 */
export interface CollectiveGroup {
  /** This process's index inside the group. */
  readonly rank: number;
  /** Number of members. */
  readonly size: number;
  /** Global (world) ranks of the members, in group-rank order. */
  readonly ranks: readonly number[];
  /** The group's name (in error messages). */
  readonly name: string;
  /** The devices it communicates on ('cpu', 'cuda:0'); absent for host groups, which communicate on cpu. */
  readonly devices?: readonly string[];
  /** In place: every member's `t` becomes the reduction of all members' `t`. */
  allReduce(t: Tensor, opts?: { op?: ReduceOp }): CollectiveWork;
  /** `out` (size·n elements) receives every member's `input` (n elements), in rank order. */
  allGather(out: Tensor, input: Tensor): CollectiveWork;
  /** `out` (n elements) receives chunk `rank` of the reduction of every member's `input` (size·n elements). */
  reduceScatter(out: Tensor, input: Tensor, opts?: { op?: ReduceOp }): CollectiveWork;
  /** In place: every member's `t` becomes group rank `root`'s `t`. */
  broadcast(t: Tensor, opts: { root?: number }): CollectiveWork;
  /** Point to point, by group rank. A send completes when the receiver has the data; it matches the recv of the same tag (default 0). */
  send(t: Tensor, dst: number, opts?: { tag?: number }): CollectiveWork;
  /** Receives into `t` from group rank `src` (the send of the same tag); completes when the data is in `t`. */
  recv(t: Tensor, src: number, opts?: { tag?: number }): CollectiveWork;
  /**
   * Sends block i of `t` to member i and receives block j of `out` from member j (equal blocks unless
   * counts, in elements, are given). Optional: Ulysses context parallelism and expert parallelism need
   * it; ProcessGroup has it.
   */
  allToAll?(out: Tensor, t: Tensor, opts?: { sendCounts?: number[]; recvCounts?: number[] }): CollectiveWork;
  /**
   * Whether send/recv of tensors on `device` match by tag. false (NCCL): a pair's messages match in
   * issue order, only tag 0 is taken. Absent: tagged.
   */
  p2pTagged?(device: string): boolean;
  /** Issues the ops `fn` starts synchronously as one batch (NCCL: one group call). Absent: ops run one by one. */
  batch?<T>(fn: () => T): T;
}

/** A world that can create subgroups; every world rank calls newGroup with the same ranks in the same order. */
export interface WorldGroup extends CollectiveGroup {
  /** Creates a subgroup of the given world ranks (collective over the world). */
  newGroup(ranks: readonly number[]): CollectiveGroup | Promise<CollectiveGroup>;
}

/** The methods every group handle has; a non-member's throw StateError. */
export interface Group {
  /** The group's name (in error messages). */
  readonly name: string;
  /** This process's rank in the group (-1 for a non-member). */
  readonly rank: number;
  /** Number of members (0 for a non-member). */
  readonly size: number;
  /** Global ranks of the members, in group-rank order. */
  readonly ranks: readonly number[];
  /** Whether this process belongs to the group. */
  readonly isMember: boolean;
  /** Reduces `t` across the group, in place (or into options.out). */
  allReduce(t: Tensor, options?: AllReduceOptions): Work;
  /** Copies root's `t` into `t` on every rank (or into options.out, leaving `t` unchanged). */
  broadcast(t: Tensor, options?: RootOptions & { out?: Tensor }): Work;
  /** Reduces `t` onto root (in place there, or into options.out); other ranks' tensors are left unchanged. */
  reduce(t: Tensor, options?: RootOptions & ReduceOptions & { out?: Tensor }): Work;
  /** Gathers every rank's `t` into `out`: one tensor of size × t.size elements (rank order), or one tensor per rank. */
  allGather(out: Tensor | Tensor[], t: Tensor, options?: CollectiveOptions): Work<Tensor | Tensor[]>;
  /**
   * Reduces `t` (block r of counts[r] elements for rank r; equal blocks by default) and leaves block `rank` of the
   * result in `out`.
   */
  reduceScatter(out: Tensor, t: Tensor, options?: ReduceOptions & { counts?: number[] }): Work;
  /**
   * Sends block i of `t` to rank i and receives block j of `out` from rank j (equal blocks unless counts are given).
   */
  allToAll(out: Tensor, t: Tensor, options?: CollectiveOptions & { sendCounts?: number[]; recvCounts?: number[] }): Work;
  /** Sends `t` to group rank `dst` (not a collective). */
  send(t: Tensor, dst: number, options?: P2POptions): Work;
  /** Receives into `t` from group rank `src`. */
  recv(t: Tensor, src: number, options?: P2POptions): Work;
  /** Resolves once every member has reached it. */
  barrier(options?: CollectiveOptions): Work<void>;
  /**
   * Splits the group collectively: ranks with the same color form a new group, ordered by (key, rank); color null
   * gives a non-member handle.
   */
  split(color: number | null, key?: number): Promise<Group>;
  /** Finishes queued ops and releases the communicators; later ops throw StateError. */
  destroy(): Promise<void>;
}

/** A group this process belongs to. Group ranks are local: 0..size-1, in the order of `ranks`. */
export class ProcessGroup implements Group, CollectiveGroup {
  /** Always true: this process is a member. */
  readonly isMember = true;
  #seq = 0;
  // The generation of the communicators (in-job recovery); check mode's store keys carry it, since
  // sequence numbers restart at 0 in each generation.
  #generation: number;
  #splits = 0;
  #destroyed = false;
  // Check mode publishes descriptions through the store; this chain keeps native calls in call order.
  #submitted: Promise<unknown> = Promise.resolve();

  /**
   * Internal (init.ts builds groups). `comms` maps a device name ('cpu', 'cuda:0') to the
   * communicator that moves tensors on it; a collective goes to its input's device's communicator.
   * @param name The group's name (in error messages).
   * @param rank This process's rank in the group.
   * @param ranks Global ranks of the members, in group-rank order.
   * @param timeoutMs Default timeout of the group's ops (ms).
   */
  constructor(
    readonly name: string,
    readonly rank: number,
    readonly ranks: readonly number[],
    comms: ReadonlyMap<string, CommBackend>,
    readonly timeoutMs: number,
    private readonly ctx: GroupContext,
  ) {
    if (comms.size === 0) throw new ArgumentError(`group '${name}' needs at least one communicator`);
    this.comms = new Map(comms);
    this.#generation = ctx.generation ?? 0;
    if (flightEnabled) flightGroup(this);
  }

  private comms: Map<string, CommBackend>;

  /**
   * Whether the group's communicators are connected: false for a group a joining process (a
   * replacement in in-job recovery) built before it met the running ranks; its ops throw StateError
   * until it regroups (`regroup` in lib/distributed/init.ts) and is given communicators, and agreements on it answer locally (agree.ts).
   */
  get connected(): boolean { return ![...this.comms.values()].some((c) => c instanceof PendingBackend); }

  /** Whether destroy() has run. */
  get destroyed(): boolean { return this.#destroyed; }

  /** @internal In-job recovery: aborts the communicators (their ops in flight fail), keeping them until rebind. */
  abortCommunicators(reason: string): void {
    for (const c of this.comms.values()) {
      try { c.abort?.(reason); } catch { /* already broken */ }
    }
  }

  /**
   * @internal In-job recovery (lib/distributed/init.ts regroup): the group's communicators are
   * replaced by those of a new generation (the same members, the same devices). The old ones, which
   * regroup aborted first (abortCommunicators), are released in the background; sequence numbers
   * restart at 0, and check mode's keys are those of `generation`.
   */
  rebind(comms: ReadonlyMap<string, CommBackend>, generation: number): void {
    if (comms.size === 0) throw new ArgumentError(`group '${this.name}' needs at least one communicator`);
    const old = [...this.comms.values()];
    this.comms = new Map(comms);
    this.#seq = 0;
    this.#generation = generation;
    this.#submitted = Promise.resolve();
    for (const c of old) void c.destroy().catch(() => {});
  }

  /** Number of members. */
  get size(): number { return this.ranks.length; }
  /** Whether this group's cpu collectives go through shared memory (all ranks on this host; see InitOptions.sharedMemory). */
  get sharedMemory(): boolean { return [...this.comms.values()].some((c) => c.sharedMemory === true); }
  /** Devices whose tensors this group communicates ('cpu' through Gloo, 'cuda:N' through NCCL). */
  get devices(): string[] { return [...this.comms.keys()]; }
  /** Whether send/recv of tensors on `device` match by tag (Gloo) or, false, in issue order per pair (NCCL). */
  p2pTagged(device: string): boolean { return this.comms.get(device)?.p2pTags !== false; }

  // The communicator for t's device; ArgumentError naming the devices this group has.
  private commFor(t: unknown, call: string): CommBackend {
    const x = checkTensor(t, call, 'tensor');
    const comm = this.comms.get(x.device);
    if (comm instanceof PendingBackend) {
      throw new NotConnectedError(`${call}: group '${this.name}'`);
    }
    if (!comm) {
      throw new ArgumentError(`${call}: tensor is on ${x.device} but group '${this.name}' communicates on ${this.devices.join(', ')}` +
        (x.device.startsWith('cuda') ? ' (cuda tensors go through NCCL when every local rank has its own GPU, else through Gloo in host memory; neither is set up here)' : ''));
    }
    return comm;
  }

  /**
   * Issues the ops `fn` starts as one batch: on NCCL one group call (ncclGroupStart/End), which
   * pairs of send/recv that depend on each other need; on Gloo the ops simply run in order. `fn`
   * must start the ops synchronously (no await inside). In check mode collectives are verified
   * through the store first and so leave the batch; point-to-point ops stay in it.
   */
  batch<T>(fn: () => T): T {
    this.live('batch');
    const started: CommBackend[] = [];
    try {
      for (const c of this.comms.values()) {
        if (c.groupStart && c.groupEnd) { c.groupStart(); started.push(c); }
      }
      return fn();
    } finally {
      for (const c of started) c.groupEnd!();
    }
  }
  /** The next collective's sequence number. */
  get seq(): number { return this.#seq; }

  private live(call: string): void {
    if (this.#destroyed) throw new StateError(`${call}: group '${this.name}' was destroyed`);
  }

  // Starts a collective: in check mode after all ranks agree on `desc`, else at once. `finish`
  // runs once after the native op succeeds (see Work).
  private start<T>(desc: Omit<CollectiveDescription, 'seq'>, timeoutMs: number, result: T, pinned: Tensor[],
    run: (seq: number) => CommPromise, finish?: () => void): Work<T> {
    const seq = this.#seq++;
    // The flight recorder (flight.ts): one branch when it is off.
    const rec: FlightOp | undefined = flightEnabled
      ? opIssued(this, desc.op, seq, pinned[0]?.nbytes ?? 0, desc.dtype, desc.root !== undefined ? { root: desc.root } : undefined) : undefined;
    const observe = rec ? (failed: boolean, error?: unknown) => opSettled(rec, failed, error) : undefined;
    if (!this.ctx.check) {
      try {
        const native = run(seq);
        opStarted(rec);
        return new Work(native, result, pinned, finish, observe);
      } catch (e) {
        this.#seq--;  // the op never started; the next one must reuse the tag the peers expect
        if (rec) opSettled(rec, true, e);
        throw e;
      }
    }
    const d = { ...desc, seq };
    const chained = this.#submitted.then(() => verifyCollective(this.ctx.store, this.name, this.rank, this.size, d, timeoutMs, this.#generation)).then(() => {
      opStarted(rec);
      return run(seq);
    });
    this.#submitted = chained.catch(() => {});
    // The store exchange needs the event loop, which a blocked JS thread cannot run.
    const op: WorkOp = Object.assign(chained, {
      waitSync: (): never => {
        throw new StateError(`${desc.op}: waitSync is unavailable in check mode (NODETRON_COMM_CHECK), which verifies collectives through the store asynchronously; await the Work instead`);
      },
    });
    return new Work(op, result, pinned, finish, observe);
  }

  /** Reduces `t` across the group, in place (or into options.out). */
  allReduce(t: Tensor, options: AllReduceOptions = {}): Work {
    const call = 'allReduce';
    this.live(call);
    const comm = this.commFor(t, call);
    const out = outLike(call, t, options.out);
    const op = parseReduceOp(options.op, call);
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    return this.start({ op: `allReduce(${op})`, dtype: t.dtype, count: t.size }, timeoutMs, out, [t, out], (seq) =>
      comm.allReduce(t.storage, out.storage, dtypeCode(t.dtype), t.size, REDUCE_OP_CODES[op], seq, timeoutMs));
  }

  /** Copies root's `t` into `t` on every rank (or into options.out, leaving `t` unchanged). */
  broadcast(t: Tensor, options: RootOptions & { out?: Tensor } = {}): Work {
    const call = 'broadcast';
    this.live(call);
    const comm = this.commFor(t, call);
    const out = outLike(call, t, options.out);
    const root = checkRank(options.root ?? 0, this.size, call, 'root');
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    return this.start({ op: 'broadcast', dtype: t.dtype, count: t.size, root }, timeoutMs, out, [t, out], (seq) =>
      comm.broadcast(t.storage, out.storage, dtypeCode(t.dtype), t.size, root, seq, timeoutMs));
  }

  /** Reduces `t` onto root (in place there, or into options.out); other ranks' tensors are left unchanged. */
  reduce(t: Tensor, options: RootOptions & ReduceOptions & { out?: Tensor } = {}): Work {
    const call = 'reduce';
    this.live(call);
    const comm = this.commFor(t, call);
    const root = checkRank(options.root ?? 0, this.size, call, 'root');
    const op = parseReduceOp(options.op, call);
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    let out: Tensor;
    let scratch: Tensor | undefined;
    if (this.rank === root) {
      out = outLike(call, t, options.out);
    } else {
      // Gloo uses the output as scratch on non-roots; keep the caller's tensor intact.
      scratch = emptyOn(t.shape, t.dtype, t.deviceInfo);
      out = scratch;
    }
    const work = this.start({ op: `reduce(${op})`, dtype: t.dtype, count: t.size, root }, timeoutMs, this.rank === root ? out : t, [t, out],
      (seq) => comm.reduce(t.storage, out.storage, dtypeCode(t.dtype), t.size, REDUCE_OP_CODES[op], root, seq, timeoutMs));
    if (scratch) void work.then(() => scratch!.dispose(), () => scratch!.dispose());
    return work;
  }

  /**
   * Gathers every rank's `t`. `out` is one tensor of size*t.size elements (rank order), or a list of
   * one tensor per rank, whose sizes may differ (uneven gather). In place: pass `out` as `t` too;
   * block `rank` of out (out.size/size elements) is then this rank's input (nccl-tests' in-place).
   */
  allGather(out: Tensor | Tensor[], t: Tensor, options: CollectiveOptions = {}): Work<Tensor | Tensor[]> {
    const call = 'allGather';
    this.live(call);
    const comm = this.commFor(t, call);
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    if (!Array.isArray(out) && sharesStorage(out, t)) {
      if (t.size % this.size !== 0) throw new ShapeError(`${call}: in place, out (${t.size} elements) must split evenly over ${this.size} ranks`);
      const per = t.size / this.size;
      const counts = new Array<number>(this.size).fill(per);
      return this.start({ op: 'allGather', dtype: t.dtype, count: per }, timeoutMs, out as Tensor | Tensor[], [t], (seq) =>
        comm.allGather(t.storage, t.storage, dtypeCode(t.dtype), counts, seq, timeoutMs));
    }
    if (!Array.isArray(out)) {
      checkCommTensor(out, call, 'out', t.device);
      checkSameDType(call, t, out, 'tensor', 'out');
      checkSize(call, out, t.size * this.size, 'out');
      const counts = new Array<number>(this.size).fill(t.size);
      return this.start({ op: 'allGather', dtype: t.dtype, count: t.size }, timeoutMs, out as Tensor | Tensor[], [t, out], (seq) =>
        comm.allGather(t.storage, out.storage, dtypeCode(t.dtype), counts, seq, timeoutMs));
    }
    if (out.length !== this.size) throw new ArgumentError(`${call}: out must list one tensor per rank (${this.size}), got ${out.length}`);
    out.forEach((o, i) => { checkCommTensor(o, call, `out[${i}]`, t.device); checkSameDType(call, t, o, 'tensor', `out[${i}]`); });
    checkSize(call, out[this.rank]!, t.size, `out[${this.rank}] (this rank's slot)`);
    const counts = out.map((o) => o.size);
    const total = counts.reduce((a, b) => a + b, 0);
    const flat = emptyOn([total], t.dtype, t.deviceInfo);
    // Read now: flat itself is disposed below, its storage lives on pinned by the Work.
    const flatStorage = flat.storage;
    const copyOut = (): void => {
      let offsetBytes = 0;
      for (const o of out) {
        o.backend.copy(o.storage, 0, flatStorage, offsetBytes, o.nbytes);
        offsetBytes += o.nbytes;
      }
    };
    let work: Work<Tensor | Tensor[]>;
    try {
      work = this.start({ op: `allGatherV[${counts.join(',')}]`, dtype: t.dtype, count: total }, timeoutMs, out as Tensor | Tensor[],
        [t, flat, ...out], (seq) => comm.allGather(t.storage, flatStorage, dtypeCode(t.dtype), counts, seq, timeoutMs), copyOut);
    } finally {
      // The Work pins flat's storage until the op settles.
      flat.dispose();
    }
    return work;
  }

  /**
   * Reduces `t` (sum(counts) elements, block r of counts[r] for rank r; equal blocks by default) and
   * writes this rank's block into `out`. In place: pass `t` as `out` too; the result then lands in
   * block `rank` of t and the other blocks are left unchanged (nccl-tests' in-place).
   */
  reduceScatter(out: Tensor, t: Tensor, options: ReduceOptions & { counts?: number[] } = {}): Work {
    const call = 'reduceScatter';
    this.live(call);
    const comm = this.commFor(t, call);
    checkCommTensor(out, call, 'out', t.device);
    checkSameDType(call, t, out, 'tensor', 'out');
    const counts = splitCounts(t.size, this.size, options.counts, call);
    if (!sharesStorage(out, t)) checkSize(call, out, counts[this.rank]!, 'out');
    else checkSize(call, out, t.size, 'out (in place, the input itself)');
    const op = parseReduceOp(options.op, call);
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    return this.start({ op: `reduceScatter(${op})[${options.counts ? counts.join(',') : 'even'}]`, dtype: t.dtype, count: t.size }, timeoutMs,
      out, [t, out], (seq) => comm.reduceScatter(t.storage, out.storage, dtypeCode(t.dtype), counts, REDUCE_OP_CODES[op], seq, timeoutMs));
  }

  /**
   * Sends block i of `t` to rank i and receives block j of `out` from rank j (equal blocks unless
   * counts are given). In place (`out` passed as `t`): the input is first copied to a staging
   * buffer, since every block is read and written by the exchange.
   */
  allToAll(out: Tensor, t: Tensor, options: CollectiveOptions & { sendCounts?: number[]; recvCounts?: number[] } = {}): Work {
    const call = 'allToAll';
    this.live(call);
    const comm = this.commFor(t, call);
    checkCommTensor(out, call, 'out', t.device);
    checkSameDType(call, t, out, 'tensor', 'out');
    if (sharesStorage(out, t)) {
      if (out.size !== t.size) throw new ShapeError(`${call}: in place, out and the input must be the same tensor`);
      const staged = emptyOn(t.shape, t.dtype, t.deviceInfo);
      staged.backend.copy(staged.storage, 0, t.storage, 0, t.nbytes);
      let work: Work;
      try {
        work = this.allToAll(out, staged, options);
      } catch (e) {
        staged.dispose();
        throw e;
      }
      // In check mode the native call starts later and reads staged.storage then.
      void work.then(() => staged.dispose(), () => staged.dispose());
      return work;
    }
    const sendCounts = splitCounts(t.size, this.size, options.sendCounts, call);
    const recvCounts = splitCounts(out.size, this.size, options.recvCounts, call);
    if (options.sendCounts === undefined && options.recvCounts === undefined && out.size !== t.size) {
      throw new ShapeError(`${call}: out holds ${out.size} elements but the input ${t.size}`);
    }
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    // Uneven block sizes legitimately differ between ranks, so only the kind of op is compared then.
    const uneven = options.sendCounts !== undefined || options.recvCounts !== undefined;
    return this.start({ op: uneven ? 'allToAllV' : 'allToAll', dtype: t.dtype, count: uneven ? -1 : t.size }, timeoutMs, out, [t, out], (seq) =>
      comm.allToAll(t.storage, out.storage, dtypeCode(t.dtype), sendCounts, recvCounts, seq, timeoutMs));
  }

  /** Sends `t` to group rank `dst`; not a collective (no sequence number, not checked). */
  send(t: Tensor, dst: number, options: P2POptions = {}): Work {
    return this.pointToPoint('send', t, dst, options);
  }

  /** Receives into `t` from group rank `src`. */
  recv(t: Tensor, src: number, options: P2POptions = {}): Work {
    return this.pointToPoint('recv', t, src, options);
  }

  /** send / recv: checks the peer, tag and timeout, then posts the op on t's communicator. */
  private pointToPoint(call: 'send' | 'recv', t: Tensor, peer: number, options: P2POptions): Work {
    this.live(call);
    const comm = this.commFor(t, call);
    checkRank(peer, this.size, call, call === 'send' ? 'dst' : 'src');
    if (peer === this.rank) throw new ArgumentError(`${call}: rank ${peer} cannot ${call === 'send' ? 'send to' : 'receive from'} itself`);
    const tag = checkTag(options.tag, call);
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    if (!flightEnabled) return new Work(comm[call](t.storage, dtypeCode(t.dtype), t.size, peer, tag, timeoutMs), t, [t]);
    const rec = opIssued(this, call, -1, t.nbytes, t.dtype, { peer: this.ranks[peer]!, tag, send: call === 'send' });
    let native: WorkOp;
    try {
      native = comm[call](t.storage, dtypeCode(t.dtype), t.size, peer, tag, timeoutMs);
    } catch (e) {
      opSettled(rec, true, e);
      throw e;
    }
    opStarted(rec);
    return new Work(native, t, [t], undefined, (failed, error) => opSettled(rec, failed, error));
  }

  /** Waits until every member has reached it (on the group's first communicator: Gloo when the group has one). */
  barrier(options: CollectiveOptions = {}): Work<void> {
    const call = 'barrier';
    this.live(call);
    const comm = this.comms.values().next().value as CommBackend;
    const timeoutMs = checkTimeoutMs(options.timeoutMs, this.timeoutMs, call);
    return this.start({ op: 'barrier', dtype: '-', count: 0 }, timeoutMs, undefined, [], (seq) => comm.barrier(seq, timeoutMs));
  }

  /**
   * Splits this group (collectively: every member calls it): ranks with the same color form a new
   * group, ordered by (key, rank); color null → a non-member handle.
   */
  async split(color: number | null, key: number = this.rank): Promise<Group> {
    const call = 'split';
    this.live(call);
    if (color !== null && (!Number.isInteger(color) || color < 0)) throw new ArgumentError(`${call}: color must be a non-negative integer or null, got ${String(color)}`);
    if (!Number.isInteger(key)) throw new ArgumentError(`${call}: key must be an integer, got ${String(key)}`);
    const n = this.#splits++;
    const base = `split/${this.name}/${n}`;
    await this.ctx.store.set(`${base}/${this.rank}`, JSON.stringify({ color, key }));
    const entries: { rank: number; color: number | null; key: number }[] = [];
    for (let r = 0; r < this.size; r++) {
      const v = JSON.parse(await this.ctx.store.getString(`${base}/${r}`, { timeoutMs: this.timeoutMs })) as { color: number | null; key: number };
      entries.push({ rank: r, ...v });
    }
    if (color === null) return new NonMemberGroup(`${this.name}.split${n}`);
    const members = entries.filter((e) => e.color === color).sort((a, b) => a.key - b.key || a.rank - b.rank);
    return this.ctx.makeGroup(`${this.name}.split${n}c${color}`, members.map((e) => this.ranks[e.rank]!));
  }

  /** Finishes queued ops and releases the communicator; later ops throw StateError. */
  async destroy(): Promise<void> {
    if (this.#destroyed) return;
    this.#destroyed = true;
    for (const comm of this.comms.values()) await comm.destroy();
  }
}

/** Whether two tensors are one buffer (the in-place forms). */
function sharesStorage(a: Tensor, b: Tensor): boolean {
  return a === b || a.storageRef === b.storageRef;
}

function checkTag(tag: unknown, call: string): number {
  if (tag === undefined) return 0;
  if (typeof tag !== 'number' || !Number.isInteger(tag) || tag < 0 || tag >= 2 ** 24) {
    throw new ArgumentError(`${call}: tag must be an integer in [0, 2^24), got ${String(tag)}`);
  }
  return tag;
}

/** The handle a process gets for a group it is not in: every op throws StateError. */
export class NonMemberGroup implements Group {
  /** Always false. */
  readonly isMember = false;
  readonly rank = -1;
  /** Always 0. */
  readonly size = 0;
  readonly ranks: readonly number[] = [];
  /** @param name The group's name (in error messages). */
  constructor(readonly name: string) {}
  private fail(call: string): never {
    throw new StateError(`${call}: this process is not a member of group '${this.name}'`);
  }
  /** Throws StateError: this process is not a member. */
  allReduce(): Work { return this.fail('allReduce'); }
  /** Throws StateError: this process is not a member. */
  broadcast(): Work { return this.fail('broadcast'); }
  /** Throws StateError: this process is not a member. */
  reduce(): Work { return this.fail('reduce'); }
  /** Throws StateError: this process is not a member. */
  allGather(): Work<Tensor | Tensor[]> { return this.fail('allGather'); }
  /** Throws StateError: this process is not a member. */
  reduceScatter(): Work { return this.fail('reduceScatter'); }
  /** Throws StateError: this process is not a member. */
  allToAll(): Work { return this.fail('allToAll'); }
  /** Throws StateError: this process is not a member. */
  send(): Work { return this.fail('send'); }
  /** Throws StateError: this process is not a member. */
  recv(): Work { return this.fail('recv'); }
  /** Throws StateError: this process is not a member. */
  barrier(): Work<void> { return this.fail('barrier'); }
  /** Rejects with StateError: this process is not a member. */
  split(): Promise<Group> { return Promise.reject(new StateError(`split: this process is not a member of group '${this.name}'`)); }
  /** Does nothing (there is nothing to release). */
  async destroy(): Promise<void> {}
}
