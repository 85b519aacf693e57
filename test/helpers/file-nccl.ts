// A test double of the cuda addon's NCCL surface for ranks in separate processes, on host memory: the
// communicators of one unique id meet in a directory (one sub-directory per id). Each op writes this
// rank's input to a file when it is posted (the data is ready then, as a stream-ordered NCCL op would
// read it); the op completes when every peer's file is there — on the watchdog's query (never
// blocking), or blocking in streamWaitEvent, which is how NcclBackend's waitSync orders later work
// after a collective (inside autograd). Reductions add in rank order in float64 and round once, so
// every rank gets the same bits. Filed under 'cpu' (test/helpers/nccl-only-world.ts), it runs the
// whole of NcclBackend — group calls, uneven all-to-all, p2p — with no Gloo and no GPU.
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { NcclAddon, NcclNativeComm } from '../../lib/internal.js';
import { cpu, type NativeStorage } from '../../lib/native.js';
import { type Buf, CollectiveCalls, ELEMENT_BYTES, reduceElement } from './nccl-double.js';

const sleeper = new Int32Array(new SharedArrayBuffer(4));

interface Header { kind: string; count: number; dtype: number; op: number; root: number }

/** One posted op of a communicator; done once its result is in place. */
type Item =
  | { kind: 'collective'; seq: number; header: Header; recv: Buf; done: boolean }
  | { kind: 'send'; done: boolean }
  | { kind: 'recv'; file: string; buf: Buf; count: number; dtype: number; done: boolean };

function readBytes(b: Buf, dtype: number, count: number): Buffer {
  const out = Buffer.alloc(count * ELEMENT_BYTES[dtype]!);
  if (count > 0) cpu().read(b.s, b.off * ELEMENT_BYTES[dtype]!, out);
  return out;
}
function writeBytes(b: Buf, dtype: number, bytes: Uint8Array): void {
  if (bytes.byteLength > 0) cpu().write(b.s, b.off * ELEMENT_BYTES[dtype]!, bytes);
}
function numbers(bytes: Buffer, dtype: number): Float32Array | Int32Array {
  const copy = Uint8Array.from(bytes);
  if (dtype === 0) return new Float32Array(copy.buffer);
  if (dtype === 3) return new Int32Array(copy.buffer);
  throw new Error(`file nccl: reductions of dtype code ${dtype} are not supported (f32, i32)`);
}
/** `n` elements of the reduction over the inputs, from element `from` of each. */
function reduced(inputs: Buffer[], h: Header, from: number, n: number): Uint8Array {
  const arrays = inputs.map((b) => numbers(b, h.dtype));
  const out = h.dtype === 0 ? new Float32Array(n) : new Int32Array(n);
  for (let i = 0; i < n; i++) out[i] = reduceElement(h.op, arrays.map((a) => a[from + i]!), h.dtype);
  return new Uint8Array(out.buffer);
}

function publish(path: string, data: Uint8Array): void {
  writeFileSync(`${path}.tmp`, data);
  renameSync(`${path}.tmp`, path);
}

/** One rank's communicator over the directory of its unique id. */
class FileComm extends CollectiveCalls implements NcclNativeComm {
  readonly #dir: string;
  #seq = 0;
  readonly #sends = new Map<number, number>();
  readonly #recvs = new Map<number, number>();
  #group: Item[] | undefined;
  #broken: string | undefined;

  constructor(private readonly addon: FileNccl, id: Uint8Array, readonly rank: number, readonly size: number, readonly device: number) {
    super();
    this.#dir = join(addon.dir, Buffer.from(id).toString('hex').slice(0, 32));
    mkdirSync(this.#dir, { recursive: true });
    publish(join(this.#dir, `join.${rank}`), new Uint8Array(0));
  }

  #file(seq: number, rank: number): string { return join(this.#dir, `c${seq}.${rank}`); }

  protected override postCollective(kind: string, send: Buf, recv: Buf, count: number, dtype: number, op = -1, root = -1): number {
    this.#live();
    const seq = this.#seq++;
    const header: Header = { kind, count, dtype, op, root };
    const sendCount = kind === 'reduceScatter' || kind === 'allToAll' ? count * this.size : count;
    const head = Buffer.from(`${JSON.stringify(header)}\n`);
    publish(this.#file(seq, this.rank), Buffer.concat([head, readBytes(send, dtype, sendCount)]));
    return this.#item({ kind: 'collective', seq, header, recv, done: false });
  }

  #item(it: Item): number {
    if (this.#group) { this.#group.push(it); return 0; }
    return this.addon.newEvent(this, [it]);
  }

  #live(): void {
    if (this.#broken) throw new Error(`file nccl: communicator unusable: ${this.#broken}`);
  }

  /** Completes the item when every input is there (blocking: waits for them); returns whether it is done. */
  complete(it: Item, block: boolean): boolean {
    if (it.done) return true;
    if (it.kind === 'send') return (it.done = true);
    const files = it.kind === 'recv' ? [it.file] : Array.from({ length: this.size }, (_, r) => this.#file(it.seq, r));
    if (!this.#ready(files, block)) return false;
    if (it.kind === 'recv') {
      writeBytes(it.buf, it.dtype, readFileSync(it.file));
      return (it.done = true);
    }
    const h = it.header;
    const inputs = files.map((f) => {
      const raw = readFileSync(f), nl = raw.indexOf(10);
      const other = JSON.parse(raw.subarray(0, nl).toString()) as Header;
      if (other.kind !== h.kind || other.count !== h.count || other.dtype !== h.dtype || other.op !== h.op || other.root !== h.root) {
        this.#broken = `ranks disagree at collective ${it.seq}: ${h.kind}(${h.count}) here, ${other.kind}(${other.count}) in ${f}`;
        throw new Error(`file nccl: ${this.#broken}`);
      }
      return raw.subarray(nl + 1);
    });
    const size = ELEMENT_BYTES[h.dtype]!, c = h.count;
    switch (h.kind) {
      case 'allReduce': writeBytes(it.recv, h.dtype, reduced(inputs, h, 0, c)); break;
      case 'broadcast': writeBytes(it.recv, h.dtype, inputs[h.root]!); break;
      case 'reduce': if (this.rank === h.root) writeBytes(it.recv, h.dtype, reduced(inputs, h, 0, c)); break;
      case 'allGather': writeBytes(it.recv, h.dtype, Buffer.concat(inputs)); break;
      case 'reduceScatter': writeBytes(it.recv, h.dtype, reduced(inputs, h, this.rank * c, c)); break;
      case 'allToAll': writeBytes(it.recv, h.dtype, Buffer.concat(inputs.map((x) => x.subarray(this.rank * c * size, (this.rank + 1) * c * size)))); break;
      default: throw new Error(`file nccl: unknown collective ${h.kind}`);
    }
    return (it.done = true);
  }

  #ready(files: string[], block: boolean): boolean {
    const deadline = Date.now() + this.addon.timeoutMs;
    let pauseMs = 0.05;
    for (;;) {
      if (files.every((f) => existsSync(f))) return true;
      if (!block) return false;
      if (Date.now() > deadline) {
        this.#broken = `waited ${this.addon.timeoutMs} ms for ${files.filter((f) => !existsSync(f)).join(', ')}`;
        throw new Error(`file nccl: ${this.#broken}`);
      }
      Atomics.wait(sleeper, 0, 0, pauseMs);
      pauseMs = Math.min(pauseMs * 2, 5);
    }
  }

  send(b: NativeStorage, off: number, n: number, dt: number, peer: number): number {
    this.#live();
    const i = this.#sends.get(peer) ?? 0;
    this.#sends.set(peer, i + 1);
    publish(join(this.#dir, `p${this.rank}-${peer}.${i}`), readBytes({ s: b, off }, dt, n));
    return this.#item({ kind: 'send', done: false });
  }
  recv(b: NativeStorage, off: number, n: number, dt: number, peer: number): number {
    this.#live();
    const i = this.#recvs.get(peer) ?? 0;
    this.#recvs.set(peer, i + 1);
    return this.#item({ kind: 'recv', file: join(this.#dir, `p${peer}-${this.rank}.${i}`), buf: { s: b, off }, count: n, dtype: dt, done: false });
  }
  groupStart(): void { this.#live(); this.#group = []; }
  groupEnd(): number {
    this.#live();
    const items = this.#group ?? [];
    this.#group = undefined;
    return this.addon.newEvent(this, items);
  }
  asyncError(): string {
    if (this.#broken) return this.#broken;
    return Array.from({ length: this.size }, (_, r) => existsSync(join(this.#dir, `join.${r}`))).every(Boolean) ? 'ok' : 'inProgress';
  }
  recordCompletion(): number { throw new Error('file nccl: no call is ever pending'); }
  query(eventId: number): boolean { return this.addon.complete(eventId, false); }
  abort(): void { this.#broken ??= 'aborted'; }
  destroy(): void {}
}

/** The addon double: communicators meeting in `dir`, completion events, stream waits that block until done. */
export class FileNccl implements NcclAddon {
  readonly #events = new Map<number, { comm: FileComm; items: Item[] }>();
  #next = 1;
  readonly NcclComm: NcclAddon['NcclComm'];
  readonly Storage = cpu().Storage;

  /**
   * @param dir Where the communicators of every unique id meet (shared by the job's processes).
   * @param timeoutMs How long a blocking wait waits for the peers' inputs.
   */
  constructor(readonly dir: string, readonly timeoutMs = 120_000) {
    const self = this;
    this.NcclComm = class extends FileComm {
      constructor(id: Uint8Array, rank: number, size: number, device: number) { super(self, id, rank, size, device); }
    };
  }
  ncclUniqueId(): Uint8Array { return new Uint8Array(randomBytes(128)); }
  newEvent(comm: FileComm, items: Item[]): number {
    const id = this.#next++;
    this.#events.set(id, { comm, items });
    return id;
  }
  complete(eventId: number, block: boolean): boolean {
    const e = this.#events.get(eventId);
    if (!e) throw new Error(`file nccl: event ${eventId} does not exist (destroyed?)`);
    let all = true;
    for (const it of e.items) all = e.comm.complete(it, block) && all;
    return all;
  }
  currentStream(): number { return 7; }
  // On host memory the "stream" is the caller: ordering later work after the op means finishing it now.
  streamWaitEvent(_device: number, _stream: number, event: number): void { this.complete(event, true); }
  eventDestroy(eventId: number): void { this.#events.delete(eventId); }
}
