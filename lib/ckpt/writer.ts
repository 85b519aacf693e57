// The background half of an asynchronous save: a worker thread that writes a rank's file (header,
// then the host staging buffer it shares with the main thread), computes its CRC-32 on the way, fsyncs
// and reports. Training goes on in the main thread meanwhile. The worker's code is plain
// JavaScript evaluated in the thread, so it runs the same from the TypeScript sources and from dist.
import { Worker } from 'node:worker_threads';
import { StateError } from '../errors.js';

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fs = require('node:fs');
const zlib = require('node:zlib');
parentPort.on('message', (job) => {
  let fd = null;
  try {
    fd = fs.openSync(job.path, 'w');
    let position = 0, crc = 0;
    for (const bytes of [new Uint8Array(job.header), new Uint8Array(job.staging, 0, job.length)]) {
      let done = 0;
      while (done < bytes.length) done += fs.writeSync(fd, bytes, done, Math.min(bytes.length - done, 1 << 30), position + done);
      position += bytes.length;
      crc = zlib.crc32(bytes, crc);
    }
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = null;
    parentPort.postMessage({ id: job.id, ok: true, size: position, crc32: crc >>> 0 });
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
