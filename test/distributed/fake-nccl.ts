// Test double of the cuda addon's NCCL surface on host memory: ranks of one process share a fabric
// (keyed by the unique id); ops complete lazily when every rank has posted them (on query, or when a
// stream is made to wait on their event), so NcclBackend's mechanics run without a GPU.
// `enqueuePolls = k` plays NCCL's non-blocking mode: ops and group ends return NCCL_PENDING and the
// communicator reports 'inProgress' for k asyncError() polls; any other call meanwhile, or a
// recordCompletion() before the state left in-progress, is refused as real NCCL would misbehave.
// makeNcclRanks builds ranks of one ProcessGroup over NcclBackends on the fake (one fake per device key).
import { randomBytes } from 'node:crypto';
import { afterEach } from 'vitest';
import { CommError } from '../../lib/errors.js';
import { createStore, ProcessGroup, StoreServer, type Store } from '../../lib/distributed/index.js';
import { createNcclBackend, NCCL_PENDING, type NcclAddon, type NcclBackend, type NcclNativeComm } from '../../lib/internal.js';
import { cpu, type NativeStorage } from '../../lib/native.js';
import { type Buf, CollectiveCalls, ELEMENT_BYTES, reduceElement } from '../helpers/nccl-double.js';

interface Post {
  kind: string;
  rank: number;
  count: number;
  dtype: number;
  op?: number;
  root?: number;
  send: Buf;
  recv: Buf;
  done: boolean;
}
interface P2P { rank: number; peer: number; buf: Buf; count: number; dtype: number; done: boolean; isSend: boolean }
type Item = { collective: Post } | { p2p: P2P };

function readAt(b: Buf, dtype: number, count: number): number[] {
  if (dtype !== 0 && dtype !== 3) throw new Error(`fake nccl: dtype ${dtype} not supported (f32, i32)`);
  const a = dtype === 0 ? new Float32Array(count) : new Int32Array(count);
  if (count > 0) cpu().read(b.s, b.off * ELEMENT_BYTES[dtype]!, a);
  return Array.from(a);
}
function writeAt(b: Buf, dtype: number, values: number[]): void {
  const a = dtype === 0 ? Float32Array.from(values) : Int32Array.from(values, (v) => Math.trunc(v));
  if (values.length > 0) cpu().write(b.s, b.off * ELEMENT_BYTES[dtype]!, a);
}

/** Shared by the fake communicators of one unique id. */
class Fabric {
  members = new Map<number, FakeComm>();
  collectives: Post[][] = [];
  p2p: P2P[] = [];
  error: string | undefined;
  constructor(readonly size: number) {}

  // Completes collective k when every rank has posted it; marks the fabric failed on a mismatch.
  tryCollective(k: number): boolean {
    const posts = this.collectives[k] ?? [];
    if (posts.length < this.size) return false;
    if (posts[0]!.done) return true;
    const [first] = posts;
    for (const p of posts) {
      if (p.kind !== first!.kind || p.count !== first!.count || p.dtype !== first!.dtype || p.root !== first!.root || p.op !== first!.op) {
        this.error = `ranks disagree at collective ${k}: ${first!.kind}(${first!.count}) on rank ${first!.rank}, ${p.kind}(${p.count}) on rank ${p.rank}`;
        return false;
      }
    }
    const n = this.size, c = first!.count, dt = first!.dtype, byRank = [...posts].sort((a, b) => a.rank - b.rank);
    const inputs = byRank.map((p) => readAt(p.send, dt, first!.kind === 'reduceScatter' || first!.kind === 'allToAll' ? c * n : c));
    const reduced = (len: number): number[] => Array.from({ length: len }, (_, i) => reduceElement(first!.op!, inputs.map((x) => x[i]!), dt));
    for (const p of byRank) {
      switch (p.kind) {
        case 'allReduce': writeAt(p.recv, dt, reduced(c)); break;
        case 'broadcast': writeAt(p.recv, dt, inputs[p.root!]!); break;
        case 'reduce': if (p.rank === p.root) writeAt(p.recv, dt, reduced(c)); break;
        case 'allGather': writeAt(p.recv, dt, inputs.flat()); break;
        case 'reduceScatter': writeAt(p.recv, dt, reduced(c * n).slice(p.rank * c, (p.rank + 1) * c)); break;
        case 'allToAll': writeAt(p.recv, dt, inputs.flatMap((x) => x.slice(p.rank * c, (p.rank + 1) * c))); break;
      }
    }
    for (const p of posts) p.done = true;
    return true;
  }

  // Matches the i-th send from a to b with the i-th recv of b from a.
  tryP2P(x: P2P): boolean {
    if (x.done) return true;
    const [src, dst] = x.isSend ? [x.rank, x.peer] : [x.peer, x.rank];
    const sends = this.p2p.filter((p) => p.isSend && p.rank === src && p.peer === dst);
    const recvs = this.p2p.filter((p) => !p.isSend && p.rank === dst && p.peer === src);
    const i = (x.isSend ? sends : recvs).indexOf(x);
    const s = sends[i], r = recvs[i];
    if (!s || !r) return false;
    if (s.count !== r.count) { this.error = `send of ${s.count} matched with a recv of ${r.count}`; return false; }
    writeAt(r.buf, r.dtype, readAt(s.buf, s.dtype, s.count));
    s.done = r.done = true;
    return true;
  }
}

const fabrics = new Map<string, Fabric>();

/** One rank's fake communicator; `hang` makes its ops never complete. */
export class FakeComm extends CollectiveCalls implements NcclNativeComm {
  readonly fabric: Fabric;
  #next = 0;
  #group: Item[] | undefined;
  aborted = false;
  destroyed = false;

  constructor(private readonly addon: FakeNccl, id: Uint8Array, readonly rank: number, readonly size: number, readonly device: number) {
    super();
    const key = Buffer.from(id).toString('hex');
    let f = fabrics.get(key);
    if (!f) { f = new Fabric(size); fabrics.set(key, f); }
    if (f.members.has(rank)) throw new CommError(`fake nccl: rank ${rank} joined twice`);
    f.members.set(rank, this);
    this.fabric = f;
    addon.comms.push(this);
  }

  /** Items of the call NCCL is still enqueueing, and how many more polls report it in progress. */
  #pending: { items: Item[]; polls: number } | undefined;

  #live(): void {
    if (this.aborted || this.destroyed) throw new CommError('fake nccl: communicator aborted or destroyed');
    if (this.#pending) {
      this.addon.violations.push(`rank ${this.rank}: a call while NCCL was still enqueueing the previous one`);
      throw new CommError('fake nccl: called while the previous call is in progress (poll asyncError first)');
    }
  }
  // A finished call's return: an event now, or NCCL_PENDING in the non-blocking mode.
  #finish(items: Item[]): number {
    if (this.addon.enqueuePolls > 0 || this.addon.stuckEnqueue) {
      this.#pending = { items, polls: this.addon.enqueuePolls };
      return NCCL_PENDING;
    }
    return this.addon.newEvent(this, items);
  }

  protected override postCollective(kind: string, send: Buf, recv: Buf, count: number, dtype: number, op?: number, root?: number): number {
    this.#live();
    this.addon.calls.push(kind);
    const k = this.#next++;
    const post: Post = { kind, rank: this.rank, count, dtype, op, root, send, recv, done: false };
    (this.fabric.collectives[k] ??= []).push(post);
    return this.#item({ collective: post });
  }
  #postP2P(isSend: boolean, buf: Buf, count: number, dtype: number, peer: number): number {
    this.#live();
    this.addon.calls.push(isSend ? 'send' : 'recv');
    const x: P2P = { rank: this.rank, peer, buf, count, dtype, done: false, isSend };
    this.fabric.p2p.push(x);
    return this.#item({ p2p: x });
  }
  #item(it: Item): number {
    if (this.#group) { this.#group.push(it); return 0; }
    return this.#finish([it]);
  }

  send(b: NativeStorage, off: number, n: number, dt: number, peer: number): number { return this.#postP2P(true, { s: b, off }, n, dt, peer); }
  recv(b: NativeStorage, off: number, n: number, dt: number, peer: number): number { return this.#postP2P(false, { s: b, off }, n, dt, peer); }
  groupStart(): void { this.#live(); this.addon.calls.push('groupStart'); this.#group = []; }
  groupEnd(): number {
    this.#live();
    this.addon.calls.push('groupEnd');
    const items = this.#group ?? [];
    this.#group = undefined;
    return this.#finish(items);
  }
  asyncError(): string {
    if (this.fabric.error) return this.fabric.error;
    if (this.#pending) {
      this.addon.polls++;
      if (this.addon.stuckEnqueue || this.#pending.polls-- > 0) return 'inProgress';
    }
    return this.fabric.members.size < this.size ? 'inProgress' : 'ok';
  }
  recordCompletion(): number {
    const p = this.#pending;
    if (!p) throw new CommError('fake nccl: recordCompletion without a pending call');
    if (this.addon.stuckEnqueue || p.polls >= 0) {
      this.addon.violations.push(`rank ${this.rank}: recordCompletion while NCCL was still enqueueing (the event could fire early)`);
      throw new CommError('fake nccl: recordCompletion while in progress');
    }
    this.#pending = undefined;
    this.addon.calls.push('recordCompletion');
    return this.addon.newEvent(this, p.items);
  }
  query(eventId: number): boolean {
    if (this.addon.hang) return false;
    const done = this.addon.complete(eventId);
    if (this.fabric.error) throw new CommError(`fake nccl: ${this.fabric.error}`, 'query');
    return done;
  }
  abort(): void { this.aborted = true; this.addon.calls.push('abort'); }
  destroy(): void { this.#live(); this.destroyed = true; this.addon.calls.push('destroy'); }
}

/** The addon double: records unique ids handed out, events created/destroyed and stream waits. */
export class FakeNccl implements NcclAddon {
  comms: FakeComm[] = [];
  ids: Uint8Array[] = [];
  calls: string[] = [];
  events = new Map<number, { comm: FakeComm; items: Item[] }>();
  destroyedEvents: number[] = [];
  streamWaits: { device: number; stream: number; event: number }[] = [];
  hang = false;
  /** Non-blocking mode: calls return NCCL_PENDING and stay 'inProgress' for this many polls. */
  enqueuePolls = 0;
  /** Calls return NCCL_PENDING and never leave 'inProgress'. */
  stuckEnqueue = false;
  /** asyncError() polls answered while a call was pending. */
  polls = 0;
  /** Protocol breaches the backend committed (calls during in-progress, early completion events). */
  violations: string[] = [];
  #nextEvent = 1;
  readonly NcclComm: NcclAddon['NcclComm'];
  readonly Storage = cpu().Storage;

  constructor() {
    const self = this;
    this.NcclComm = class extends FakeComm {
      constructor(id: Uint8Array, rank: number, size: number, device: number) { super(self, id, rank, size, device); }
    };
  }
  ncclUniqueId(): Uint8Array {
    const id = new Uint8Array(randomBytes(128));
    this.ids.push(id);
    return id;
  }
  newEvent(comm: FakeComm, items: Item[]): number {
    const id = this.#nextEvent++;
    this.events.set(id, { comm, items });
    return id;
  }
  complete(eventId: number): boolean {
    const e = this.events.get(eventId);
    if (!e) throw new CommError(`fake nccl: event ${eventId} does not exist (destroyed?)`);
    return e.items.every((it) => ('p2p' in it ? e.comm.fabric.tryP2P(it.p2p) : e.comm.fabric.tryCollective(e.comm.fabric.collectives.findIndex((ps) => ps.includes(it.collective)))));
  }
  currentStream(): number { return 7; }
  // A stream that waits on an event sees its results: the fake completes the op here (all ranks posted).
  streamWaitEvent(device: number, stream: number, event: number): void {
    this.streamWaits.push({ device, stream, event });
    if (!this.hang) this.complete(event);
  }
  eventDestroy(eventId: number): void {
    if (!this.events.delete(eventId)) throw new CommError(`fake nccl: event ${eventId} destroyed twice`);
    this.destroyedEvents.push(eventId);
  }
}

/** Options of {@link makeNcclRanks}. */
export interface NcclRanksOptions {
  /** The groups' collective timeout (default 5000 ms). */
  timeoutMs?: number;
  /** The store prefix of the first communicator's unique id (default 'nccl/world'). */
  prefix?: string;
  /** The device the communicator is filed under (default 'cpu': the fake moves host memory). */
  deviceKey?: string;
  /** Several communicators per group, one fake NCCL each, filed under these devices (overrides deviceKey). */
  deviceKeys?: string[];
}

/** n ranks of one process group whose communicators are NcclBackends over fake NCCL (no GPU needed). */
export interface NcclRanks {
  groups: ProcessGroup[];
  /** The first communicator of each rank. */
  backends: NcclBackend[];
  stores: Store[];
  /** The fake of the first communicator. */
  fake: FakeNccl;
  /** One fake per device key, in deviceKeys order. */
  fakes: FakeNccl[];
  server: StoreServer;
}

/** Builds n ranks (a store server, a store per rank, NCCL communicators through the fake) as one world group each. */
export async function makeNcclRanks(n: number, opts: NcclRanksOptions = {}): Promise<NcclRanks> {
  const server = await StoreServer.start({ host: '127.0.0.1', port: 0 });
  const stores = await Promise.all(Array.from({ length: n }, () => createStore(`tcp://127.0.0.1:${server.port}`)));
  const keys = opts.deviceKeys ?? [opts.deviceKey ?? 'cpu'];
  const fakes = keys.map(() => new FakeNccl());
  const prefix = opts.prefix ?? 'nccl/world';
  const perKey: NcclBackend[][] = [];
  for (const [k, fake] of fakes.entries()) {
    // Higher ranks first: they must wait for rank 0's id.
    perKey.push(await Promise.all(Array.from({ length: n }, (_, i) => n - 1 - i).map((rank) => createNcclBackend({
      store: stores[rank]!, prefix: k === 0 ? prefix : `${prefix}-${k}`, group: 'world', rank, size: n, device: 0, timeoutMs: opts.timeoutMs ?? 5000, addon: fake,
    }))).then((bs) => bs.reverse()));
  }
  const groups = Array.from({ length: n }, (_, rank) => new ProcessGroup('world', rank, Array.from({ length: n }, (_, i) => i),
    new Map(keys.map((key, k) => [key, perKey[k]![rank]!])),
    opts.timeoutMs ?? 5000, { store: stores[rank]!, check: false, makeGroup: () => Promise.reject(new Error('not in this test')) }));
  return { groups, backends: perKey[0]!, stores, fake: fakes[0]!, fakes, server };
}

/** Destroys the groups and closes the stores and the server of {@link makeNcclRanks}. */
export async function closeNcclRanks(r: NcclRanks): Promise<void> {
  for (const g of r.groups) await g.destroy().catch(() => {});
  for (const s of r.stores) await s.close();
  await r.server.close();
}

/** makeNcclRanks for a test file: registers an afterEach that closes every set of ranks made during the test. */
export function ncclRanksClosedAfterEach(): (n: number, opts?: NcclRanksOptions) => Promise<NcclRanks> {
  const open: NcclRanks[] = [];
  afterEach(async () => {
    for (const r of open.splice(0)) await closeNcclRanks(r);
  });
  return async (n, opts = {}) => {
    const r = await makeNcclRanks(n, opts);
    open.push(r);
    return r;
  };
}
