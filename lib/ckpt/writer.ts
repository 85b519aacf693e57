// The background half of an asynchronous save: a worker thread that writes a rank's file (header,
// then the host staging buffer it shares with the main thread, in concurrent chunks), computes its CRC-32 meanwhile, fsyncs
// and reports. Training goes on in the main thread meanwhile. The worker's code is plain
// JavaScript evaluated in the thread, so it runs the same from the TypeScript sources and from dist.
import { Worker } from 'node:worker_threads';
import { StateError } from '../errors.js';

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fs = require('node:fs');
const zlib = require('node:zlib');
const CHUNK = 16 << 20;
function writeAt(fd, bytes, position) {
  return new Promise((resolve, reject) => fs.write(fd, bytes, 0, bytes.length, position, (e, n) => {
    if (e) reject(e);
    else if (n < bytes.length) writeAt(fd, bytes.subarray(n), position + n).then(resolve, reject);
    else resolve();
  }));
}
parentPort.on('message', async (job) => {
  let fd = null;
  try {
    fd = fs.openSync(job.path, 'w');
    const header = new Uint8Array(job.header), body = new Uint8Array(job.staging, 0, job.length);
    // Chunks written concurrently by libuv's threads (filling the page cache is the slow part),
    // while this thread computes the CRC-32 of the same bytes.
    const writes = [writeAt(fd, header, 0)];
    for (let at = 0; at < body.length; at += CHUNK) writes.push(writeAt(fd, body.subarray(at, Math.min(at + CHUNK, body.length)), header.length + at));
    const crc = zlib.crc32(body, zlib.crc32(header));
    await Promise.all(writes);
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = null;
    parentPort.postMessage({ id: job.id, ok: true, size: header.length + body.length, crc32: crc >>> 0 });
  } catch (e) {
    if (fd !== null) try { fs.closeSync(fd); } catch {}
    parentPort.postMessage({ id: job.id, ok: false, error: String((e && e.message) || e) });
  }
});
`;

export interface WrittenFile { size: number; crc32: number }

/** One worker thread writing files in the order asked; idle, it does not keep the process alive. */
export class FileWriter {
  #worker: Worker | null = null;
  #next = 0;
  readonly #pending = new Map<number, { resolve: (w: WrittenFile) => void; reject: (e: Error) => void; path: string }>();

  #start(): Worker {
    if (this.#worker) return this.#worker;
    const w = new Worker(WORKER_SOURCE, { eval: true });
    w.on('message', (m: { id: number; ok: boolean; size?: number; crc32?: number; error?: string }) => {
      const p = this.#pending.get(m.id);
      if (!p) return;
      this.#pending.delete(m.id);
      if (this.#pending.size === 0) w.unref();
      if (m.ok) p.resolve({ size: m.size!, crc32: m.crc32! });
      else p.reject(new StateError(`checkpoint: writing ${p.path} failed: ${m.error}`));
    });
    w.on('error', (e) => this.#failAll(e));
    w.on('exit', (code) => {
      this.#worker = null;
      if (this.#pending.size > 0) this.#failAll(new Error(`the writer thread exited with code ${code}`));
    });
    this.#worker = w;
    return w;
  }

  #failAll(e: Error): void {
    for (const [id, p] of this.#pending) {
      this.#pending.delete(id);
      p.reject(new StateError(`checkpoint: writing ${p.path} failed: ${e.message}`));
    }
  }

  /**
   * Writes header + the first `length` bytes of `staging` to `path`. The staging buffer is shared
   * with the thread, not copied: the caller must not change it until the promise settles.
   */
  write(path: string, header: Uint8Array, staging: SharedArrayBuffer, length: number): Promise<WrittenFile> {
    const w = this.#start();
    w.ref();
    const id = this.#next++;
    const head = header.slice().buffer;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, path });
      w.postMessage({ id, path, header: head, staging, length }, [head]);
    });
  }

  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = null;
    if (w) await w.terminate();
  }
}
