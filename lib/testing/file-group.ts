// Process groups over a shared directory: each rank writes its contribution to a file and blocks
// until its peers' files exist. Slow, but synchronous, so collectives can complete inside an
// autograd backward (waitSync) — what tensor-parallel tests on CPU need while no native backend
// offers a blocking wait. Meant for tests and small runs on one host, not for throughput.
import { mkdirSync, readFileSync, renameSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { ArgumentError, CommError, TimeoutError } from '../errors.js';
import type { Tensor } from '../tensor.js';
import type { CollectiveGroup, CollectiveWork, WorldGroup } from '../distributed/group.js';
import type { ReduceOp } from '../distributed/collectives.js';
import { hostArrayFor, readData, reduceInRankOrder, writeData } from './host-data.js';
import type { TypedArray } from '../dtype.js';

const sleeper = new Int32Array(new SharedArrayBuffer(4));

/** An already finished collective: the file exchange completed before the call returned. */
class CompletedWork implements CollectiveWork {
  wait(): Promise<void> { return Promise.resolve(); }
  waitSync(): void {}
  then<A = void, B = never>(ok?: ((v: unknown) => A | PromiseLike<A>) | null, bad?: ((e: unknown) => B | PromiseLike<B>) | null): PromiseLike<A | B> {
    return Promise.resolve().then(ok, bad);
  }
}

interface Header { op: string; count: number; args: string }

class FileGroup implements CollectiveGroup {
  #seq = 0;
  readonly #p2pSeq = new Map<string, number>();
  constructor(readonly dir: string, readonly name: string, readonly rank: number, readonly ranks: readonly number[], readonly timeoutMs: number) {}
  get size(): number { return this.ranks.length; }

  #path(tag: string, rank: number): string { return join(this.dir, `${this.name}.${tag}.${rank}`); }

  #publish(path: string, header: Header, data: TypedArray): void {
    const head = Buffer.from(JSON.stringify(header) + '\n');
    const body = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
    writeFileSync(path + '.tmp', Buffer.concat([head, body]));
    renameSync(path + '.tmp', path);
  }

  #await(path: string, what: string): { header: Header; body: Buffer } {
    const deadline = Date.now() + this.timeoutMs;
    let pauseMs = 0.05;
    while (!existsSync(path)) {
      if (Date.now() > deadline) throw new TimeoutError(`${what} on rank ${this.rank} of group '${this.name}' timed out after ${this.timeoutMs} ms (missing ${path})`);
      Atomics.wait(sleeper, 0, 0, pauseMs);
      pauseMs = Math.min(pauseMs * 2, 5);
    }
    const raw = readFileSync(path);
    const nl = raw.indexOf(10);
    return { header: JSON.parse(raw.subarray(0, nl).toString()) as Header, body: raw.subarray(nl + 1) };
  }

  #exchange(op: string, count: number, data: TypedArray, args = ''): TypedArray[] {
    const tag = String(this.#seq++);
    this.#publish(this.#path(tag, this.rank), { op, count, args }, data);
    const parts: TypedArray[] = [];
    const headers: Header[] = [];
    for (let r = 0; r < this.size; r++) {
      const { header, body } = this.#await(this.#path(tag, r), `${op} #${tag}`);
      headers.push(header);
      const arr = new (data.constructor as new (n: number) => TypedArray)(body.byteLength / data.BYTES_PER_ELEMENT);
      new Uint8Array(arr.buffer).set(body);
      parts.push(arr);
    }
    const bad = headers.findIndex((h) => h.op !== op || h.count !== count || h.args !== args);
    if (bad >= 0) {
      throw new CommError(`${this.name}: collective #${tag} does not match across ranks: ` + headers.map((h, r) => `rank ${r} called ${h.op}(${h.count} elements${h.args ? ', ' + h.args : ''})`).join('; '));
    }
    return parts;
  }

  allReduce(t: Tensor, opts: { op?: ReduceOp } = {}): CollectiveWork {
    const op = opts.op ?? 'sum';
    writeData(t, reduceInRankOrder(this.#exchange('allReduce', t.size, readData(t), op), op));
    return new CompletedWork();
  }
  allGather(out: Tensor, input: Tensor): CollectiveWork {
    if (out.size !== input.size * this.size) throw new ArgumentError(`allGather: output has ${out.size} elements, expected ${this.size}·${input.size}`);
    const parts = this.#exchange('allGather', input.size, readData(input));
    const full = hostArrayFor(out);
    parts.forEach((p, r) => full.set(p, r * input.size));
    writeData(out, full);
    return new CompletedWork();
  }
  reduceScatter(out: Tensor, input: Tensor, opts: { op?: ReduceOp } = {}): CollectiveWork {
    if (input.size !== out.size * this.size) throw new ArgumentError(`reduceScatter: input has ${input.size} elements, expected ${this.size}·${out.size}`);
    const op = opts.op ?? 'sum';
    const red = reduceInRankOrder(this.#exchange('reduceScatter', out.size, readData(input), op), op);
    writeData(out, red.subarray(this.rank * out.size, (this.rank + 1) * out.size));
    return new CompletedWork();
  }
  broadcast(t: Tensor, opts: { root?: number } = {}): CollectiveWork {
    const root = opts.root ?? 0;
    if (!Number.isInteger(root) || root < 0 || root >= this.size) throw new ArgumentError(`broadcast: root ${root} is outside [0, ${this.size})`);
    writeData(t, this.#exchange('broadcast', t.size, readData(t), String(root))[root]!);
    return new CompletedWork();
  }
  // A send publishes and returns (the file is the buffer); a recv blocks until the matching file exists.
  send(t: Tensor, dst: number, opts: { tag?: number } = {}): CollectiveWork {
    this.#checkPeer('send', dst);
    this.#publish(this.#p2pPath(this.rank, dst, opts.tag ?? 0), { op: 'p2p', count: t.size, args: '' }, readData(t));
    return new CompletedWork();
  }
  recv(t: Tensor, src: number, opts: { tag?: number } = {}): CollectiveWork {
    this.#checkPeer('recv', src);
    const { header, body } = this.#await(this.#p2pPath(src, this.rank, opts.tag ?? 0), `recv from ${src}`);
    if (header.count !== t.size) throw new CommError(`${this.name}: recv of ${t.size} elements matched a send of ${header.count}`);
    const arr = hostArrayFor(t);
    new Uint8Array(arr.buffer).set(body);
    writeData(t, arr);
    return new CompletedWork();
  }
  #p2pPath(src: number, dst: number, tag: number): string {
    const key = tag === 0 ? `${src}-${dst}` : `${src}-${dst}t${tag}`;
    const n = this.#p2pSeq.get(key) ?? 0;
    this.#p2pSeq.set(key, n + 1);
    return join(this.dir, `${this.name}.p2p.${key}.${n}`);
  }
  #checkPeer(call: string, peer: number): void {
    if (!Number.isInteger(peer) || peer < 0 || peer >= this.size || peer === this.rank) throw new ArgumentError(`${call}: peer ${peer} must be another rank in [0, ${this.size})`);
  }
}

class FileWorld extends FileGroup implements WorldGroup {
  #created = 0;
  newGroup(ranks: readonly number[]): CollectiveGroup {
    const name = `g${this.#created++}`;
    return new FileGroup(this.dir, name, ranks.indexOf(this.rank), [...ranks], this.timeoutMs);
  }
}

/**
 * This process's world over `dir` (shared by all ranks, empty at the start of the job). Every
 * collective returns a completed CollectiveWork with waitSync(), so autograd backward can use it.
 */
export function fileWorld(dir: string, rank: number, size: number, timeoutMs = 60_000): WorldGroup {
  if (!Number.isInteger(size) || size < 1 || !Number.isInteger(rank) || rank < 0 || rank >= size) throw new ArgumentError(`fileWorld: rank ${rank} of size ${size} is not valid`);
  mkdirSync(dir, { recursive: true });
  return new FileWorld(dir, 'world', rank, Array.from({ length: size }, (_, i) => i), timeoutMs);
}
