// In-process process groups: N simulated ranks as concurrent async tasks in one Node process, so
// data, pipeline and ZeRO logic can be checked against a single-process run without a launcher.
// A collective completes when every member has called it; reductions run in rank order in the
// tensor's dtype, so every member gets bit-identical results, as with a real ring/tree backend.
import { type TypedArray } from '../dtype.js';
import { ArgumentError, CommError, TimeoutError } from '../errors.js';
import type { Tensor } from '../tensor.js';
import type { CollectiveGroup, CollectiveWork, WorldGroup } from '../distributed/group.js';
import type { ReduceOp } from '../distributed/collectives.js';
import { hostArrayFor, readData, reduceInRankOrder, writeData } from './host-data.js';

/** How long a collective waits for the other members before failing (a deadlock in a test becomes an error). */
export const LOCAL_TIMEOUT_MS = 20_000;

class LocalWork implements CollectiveWork {
  readonly #promise: Promise<void>;
  constructor(promise: Promise<void>) { this.#promise = promise; }
  wait(): Promise<void> { return this.#promise; }
  then<A = void, B = never>(ok?: ((v: void) => A | PromiseLike<A>) | null, bad?: ((e: unknown) => B | PromiseLike<B>) | null): PromiseLike<A | B> {
    return this.#promise.then(ok, bad);
  }
}

interface Arrival {
  op: string;
  count: number;
  data: TypedArray;
  out: Tensor;
  finish: (err?: Error) => void;
  args: string;
}

/** State shared by the members of one local group: pending collectives by sequence number, and p2p queues. */
class LocalGroupCore {
  readonly #pending = new Map<number, Map<number, Arrival>>();
  readonly #sends = new Map<string, { data: TypedArray; finish: (e?: Error) => void }[]>();
  readonly #recvs = new Map<string, { out: Tensor; finish: (e?: Error) => void }[]>();
  constructor(readonly ranks: readonly number[], readonly name: string) {}

  arrive(seq: number, member: number, a: Arrival): void {
    let slot = this.#pending.get(seq);
    if (!slot) { slot = new Map(); this.#pending.set(seq, slot); }
    slot.set(member, a);
    if (slot.size < this.ranks.length) return;
    this.#pending.delete(seq);
    const all = Array.from({ length: this.ranks.length }, (_, r) => slot!.get(r)!);
    const first = all[0]!;
    const mismatch = all.find((x) => x.op !== first.op || x.count !== first.count || x.args !== first.args);
    if (mismatch) {
      const err = new CommError(`${this.name}: collective #${seq} does not match across ranks: ` +
        all.map((x, r) => `rank ${r} called ${x.op}(${x.count} elements${x.args ? ', ' + x.args : ''})`).join('; '));
      for (const x of all) x.finish(err);
      return;
    }
    try {
      this.#complete(first.op, first.args, all);
      for (const x of all) x.finish();
    } catch (e) {
      for (const x of all) x.finish(e as Error);
    }
  }

  #complete(op: string, args: string, all: Arrival[]): void {
    const n = all.length;
    const parts = all.map((x) => x.data);
    if (op === 'allReduce') {
      const red = reduceInRankOrder(parts, args as ReduceOp);
      for (const x of all) writeData(x.out, red);
    } else if (op === 'allGather') {
      const full = hostArrayFor(all[0]!.out, parts[0]!.length * n);
      parts.forEach((p, r) => full.set(p, r * p.length));
      for (const x of all) writeData(x.out, full);
    } else if (op === 'reduceScatter') {
      const red = reduceInRankOrder(parts, args as ReduceOp);
      const chunk = red.length / n;
      all.forEach((x, r) => writeData(x.out, red.subarray(r * chunk, (r + 1) * chunk)));
    } else if (op === 'broadcast') {
      const src = Number(args);
      for (const x of all) writeData(x.out, parts[src]!);
    }
  }

  // Sends and receives match in order per (source, destination, tag), as Gloo's do.
  send(src: number, dst: number, data: TypedArray, finish: (e?: Error) => void, tag = 0): void {
    const key = `${src}>${dst}#${tag}`;
    const waiting = this.#recvs.get(key);
    const r = waiting?.shift();
    if (r) { this.#deliver(data, r.out, r.finish, finish); return; }
    const q = this.#sends.get(key) ?? [];
    q.push({ data, finish });
    this.#sends.set(key, q);
  }

  recv(src: number, dst: number, out: Tensor, finish: (e?: Error) => void, tag = 0): void {
    const key = `${src}>${dst}#${tag}`;
    const s = this.#sends.get(key)?.shift();
    if (s) { this.#deliver(s.data, out, finish, s.finish); return; }
    const q = this.#recvs.get(key) ?? [];
    q.push({ out, finish });
    this.#recvs.set(key, q);
  }

  #deliver(data: TypedArray, out: Tensor, finishRecv: (e?: Error) => void, finishSend: (e?: Error) => void): void {
    if (data.length !== out.size) {
      const err = new CommError(`${this.name}: send of ${data.length} elements matched a recv of ${out.size}`);
      finishRecv(err); finishSend(err);
      return;
    }
    writeData(out, data);
    finishRecv(); finishSend();
  }
}

class LocalGroup implements CollectiveGroup {
  #seq = 0;
  readonly size: number;
  constructor(readonly core: LocalGroupCore, readonly rank: number, readonly timeoutMs: number) { this.size = core.ranks.length; }
  get ranks(): readonly number[] { return this.core.ranks; }
  get name(): string { return this.core.name; }

  #start(op: string, count: number, data: TypedArray, out: Tensor, args = ''): CollectiveWork {
    const seq = this.#seq++;
    return new LocalWork(this.#timed(`${op} #${seq} (${count} elements)`, (finish) => this.core.arrive(seq, this.rank, { op, count, data, out, finish, args })));
  }

  #timed(what: string, start: (finish: (e?: Error) => void) => void): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new TimeoutError(`${what} on rank ${this.rank} of group '${this.name}' timed out after ${this.timeoutMs} ms waiting for the other ranks`)), this.timeoutMs);
      start((e) => { clearTimeout(timer); if (e) reject(e); else resolve(); });
    });
  }

  allReduce(t: Tensor, opts: { op?: ReduceOp } = {}): CollectiveWork {
    return this.#start('allReduce', t.size, readData(t), t, opts.op ?? 'sum');
  }
  allGather(out: Tensor, input: Tensor): CollectiveWork {
    if (out.size !== input.size * this.size) throw new ArgumentError(`allGather: output has ${out.size} elements, expected ${this.size}·${input.size}`);
    return this.#start('allGather', input.size, readData(input), out);
  }
  reduceScatter(out: Tensor, input: Tensor, opts: { op?: ReduceOp } = {}): CollectiveWork {
    if (input.size !== out.size * this.size) throw new ArgumentError(`reduceScatter: input has ${input.size} elements, expected ${this.size}·${out.size}`);
    return this.#start('reduceScatter', out.size, readData(input), out, opts.op ?? 'sum');
  }
  broadcast(t: Tensor, opts: { root?: number } = {}): CollectiveWork {
    const root = opts.root ?? 0;
    if (!Number.isInteger(root) || root < 0 || root >= this.size) throw new ArgumentError(`broadcast: root ${root} is outside [0, ${this.size})`);
    return this.#start('broadcast', t.size, readData(t), t, String(root));
  }
  send(t: Tensor, dst: number, opts: { tag?: number } = {}): CollectiveWork {
    this.#checkPeer('send', dst);
    const data = readData(t), tag = opts.tag ?? 0;
    return new LocalWork(this.#timed(`send to ${dst} (tag ${tag})`, (finish) => this.core.send(this.rank, dst, data, finish, tag)));
  }
  recv(t: Tensor, src: number, opts: { tag?: number } = {}): CollectiveWork {
    this.#checkPeer('recv', src);
    const tag = opts.tag ?? 0;
    return new LocalWork(this.#timed(`recv from ${src} (tag ${tag})`, (finish) => this.core.recv(src, this.rank, t, finish, tag)));
  }
  #checkPeer(call: string, peer: number): void {
    if (!Number.isInteger(peer) || peer < 0 || peer >= this.size || peer === this.rank) throw new ArgumentError(`${call}: peer ${peer} must be another rank in [0, ${this.size})`);
  }
}

class LocalWorld extends LocalGroup implements WorldGroup {
  #created = 0;
  constructor(core: LocalGroupCore, rank: number, timeoutMs: number, readonly registry: LocalGroupCore[]) { super(core, rank, timeoutMs); }
  newGroup(ranks: readonly number[]): CollectiveGroup {
    const index = this.#created++;
    let core = this.registry[index];
    if (!core) { core = new LocalGroupCore([...ranks], `group${index}[${ranks.join(',')}]`); this.registry[index] = core; }
    if (core.ranks.join(',') !== ranks.join(',')) throw new CommError(`newGroup #${index}: ranks [${ranks.join(',')}] differ from [${core.ranks.join(',')}] given by another rank`);
    const me = ranks.indexOf(this.core.ranks[this.rank]!);
    return new LocalGroup(core, me, this.timeoutMs);
  }
}

/** One world handle per simulated rank (rank i gets element i). */
export async function localWorld(size: number, timeoutMs = LOCAL_TIMEOUT_MS): Promise<WorldGroup[]> {
  if (!Number.isInteger(size) || size < 1) throw new ArgumentError(`localWorld: size must be an integer >= 1, got ${size}`);
  const core = new LocalGroupCore(Array.from({ length: size }, (_, i) => i), 'world');
  const registry: LocalGroupCore[] = [];
  return Array.from({ length: size }, (_, r) => new LocalWorld(core, r, timeoutMs, registry));
}

/** Runs fn once per simulated rank, concurrently, and returns each rank's result (rejects with the first failure). */
export async function runLocalRanks<T>(size: number, fn: (world: WorldGroup) => Promise<T>, timeoutMs?: number): Promise<T[]> {
  const worlds = await localWorld(size, timeoutMs);
  return Promise.all(worlds.map((w) => fn(w)));
}
