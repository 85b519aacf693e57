// The background half of an asynchronous save: two worker threads, one writing a rank's file (header,
// then the host staging buffer it shares with the main thread) in order, in 1 MiB writes, then
// fsyncing it; the other computing the file's CRC-32 from the same shared bytes meanwhile. Training
// goes on in the main thread. Writes in file order: out-of-order concurrent chunks of one file (what
// an earlier version did) made saves up to 4× slower than `dd` on an ext4 VM disk, in-order writes
// keep pace with it; and the checksum on its own thread takes its ~70 ms per 360 MB off the write's
// path. The workers' code is plain JavaScript evaluated in the thread, so it runs the same from the
// TypeScript sources and from dist.
import { Worker } from 'node:worker_threads';
import { StateError } from '../errors.js';

const WORKER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const fs = require('node:fs');
const zlib = require('node:zlib');
const BLOCK = 1 << 20;
function writeAll(fd, bytes, position) {
  for (let at = 0; at < bytes.length;) {
    const n = fs.writeSync(fd, bytes, at, Math.min(BLOCK, bytes.length - at), position + at);
    at += n;
  }
}
parentPort.on('message', (job) => {
  const header = new Uint8Array(job.header), body = new Uint8Array(job.staging, 0, job.length);
  if (job.kind === 'crc') {
    parentPort.postMessage({ id: job.id, ok: true, crc32: zlib.crc32(body, zlib.crc32(header)) >>> 0 });
    return;
  }
  let fd = null;
  try {
    fd = fs.openSync(job.path, 'w');
    writeAll(fd, header, 0);
    writeAll(fd, body, header.length);
    fs.fsyncSync(fd);
    fs.closeSync(fd);
    fd = null;
    parentPort.postMessage({ id: job.id, ok: true, size: header.length + body.length });
  } catch (e) {
    if (fd !== null) try { fs.closeSync(fd); } catch {}
    parentPort.postMessage({ id: job.id, ok: false, error: String((e && e.message) || e) });
  }
});
`;

export interface WrittenFile { size: number; crc32: number }

interface Reply { id: number; ok: boolean; size?: number; crc32?: number; error?: string }

/** One worker thread running jobs in the order posted; idle, it does not keep the process alive. */
class JobThread {
  #worker: Worker | null = null;
  readonly #pending = new Map<number, { resolve: (r: Reply) => void; reject: (e: Error) => void }>();

  #start(): Worker {
    if (this.#worker) return this.#worker;
    const w = new Worker(WORKER_SOURCE, { eval: true });
    w.on('message', (m: Reply) => {
      const p = this.#pending.get(m.id);
      if (!p) return;
      this.#pending.delete(m.id);
      if (this.#pending.size === 0) w.unref();
      if (m.ok) p.resolve(m);
      else p.reject(new Error(m.error));
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
      p.reject(e);
    }
  }

  run(job: Record<string, unknown> & { id: number }, transfer: ArrayBuffer[] = []): Promise<Reply> {
    const w = this.#start();
    w.ref();
    return new Promise((resolve, reject) => {
      this.#pending.set(job.id, { resolve, reject });
      w.postMessage(job, transfer);
    });
  }

  async close(): Promise<void> {
    const w = this.#worker;
    this.#worker = null;
    if (w) await w.terminate();
  }
}

/** Writes files in the order asked (one writer thread), each checksummed on a second thread meanwhile. */
export class FileWriter {
  readonly #writer = new JobThread();
  readonly #checker = new JobThread();
  #next = 0;

  /**
   * Writes header + the first `length` bytes of `staging` to `path` (fsynced) and returns its size and
   * CRC-32. The staging buffer is shared with the threads, not copied: the caller must not change it
   * until the promise settles.
   */
  async write(path: string, header: Uint8Array, staging: SharedArrayBuffer, length: number): Promise<WrittenFile> {
    const id = this.#next++;
    // Two copies, each moved to its thread (a Buffer's slice() is a view, not a copy: never transfer that).
    const forWriter = new Uint8Array(header).buffer, forChecker = new Uint8Array(header).buffer;
    const written = this.#writer.run({ id, kind: 'write', path, header: forWriter, staging, length }, [forWriter]);
    const checked = this.#checker.run({ id, kind: 'crc', header: forChecker, staging, length }, [forChecker]);
    try {
      const [w, c] = await Promise.all([written, checked]);
      return { size: w.size!, crc32: c.crc32! };
    } catch (e) {
      // Both settle before the staging buffer may be reused.
      await Promise.allSettled([written, checked]);
      throw new StateError(`checkpoint: writing ${path} failed: ${(e as Error).message}`);
    }
  }

  async close(): Promise<void> {
    await Promise.all([this.#writer.close(), this.#checker.close()]);
  }
}
