// File helpers shared by the file formats (safetensors, llm.c model files, token shards, Hugging Face
// directories, checkpoints): whole writes and reads by file descriptor, and atomic, durable writes
// (a temporary file beside the target, fsynced, renamed into place).
import { closeSync, fsyncSync, openSync, readSync, renameSync, rmSync, writeSync } from 'node:fs';
import { StateError } from '../errors.js';

/** Writes all of `bytes` at `position` (in chunks of at most 1 GiB); returns bytes.length. */
export function writeAll(fd: number, bytes: Uint8Array, position: number): number {
  let done = 0;
  while (done < bytes.length) done += writeSync(fd, bytes, done, Math.min(bytes.length - done, 1 << 30), position + done);
  return bytes.length;
}

/** Reads exactly into.length bytes at `position` (in chunks of at most 1 GiB); a StateError worded `${what}: unexpected end of file at byte N` when the file ends first. */
export function readAll(fd: number, into: Uint8Array, position: number, what: string): Uint8Array {
  let done = 0;
  while (done < into.length) {
    const n = readSync(fd, into, done, Math.min(into.length - done, 1 << 30), position + done);
    if (n === 0) throw new StateError(`${what}: unexpected end of file at byte ${position + done}`);
    done += n;
  }
  return into;
}

/** Opens `path` for reading; a failure becomes a StateError worded by `describe(reason)`. */
export function openForReading(path: string, describe: (reason: string) => string): number {
  try { return openSync(path, 'r'); } catch (e) { throw new StateError(describe((e as Error).message)); }
}

/** What `read` returns; `fd` is closed when it throws (a file reader's constructor checking a header). */
export function closeOnThrow<T>(fd: number, read: () => T): T {
  try {
    return read();
  } catch (e) {
    closeSync(fd);
    throw e;
  }
}

/**
 * Writes `path` atomically: `write(tmp)` makes the file under a temporary name beside it (by default
 * `${path}.tmp-${pid}`), which is then renamed into place, so a reader sees all of it or none. A failure
 * removes the temporary file and rethrows. For writers that open the file themselves (safetensors).
 */
export function writeAtomically(path: string, write: (tmp: string) => void, opts: { tmp?: string } = {}): void {
  const tmp = opts.tmp ?? `${path}.tmp-${process.pid}`;
  try {
    write(tmp);
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}

/**
 * Writes `path` atomically and durably: `fill(fd)` writes the temporary file (see writeAtomically),
 * which is fsynced and closed before the rename. The directory is not fsynced: a caller whose renames
 * must survive a crash calls fsyncDir on it afterwards (a checkpoint's commit does, once for all its files).
 */
export function writeFileAtomically(path: string, fill: (fd: number) => void, opts: { tmp?: string } = {}): void {
  writeAtomically(path, (tmp) => {
    const fd = openSync(tmp, 'w');
    try {
      fill(fd);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }, opts);
}

/** Fsyncs a directory, so renames in it survive a crash (quietly skipped where the filesystem refuses). */
export function fsyncDir(path: string): void {
  try {
    const fd = openSync(path, 'r');
    try { fsyncSync(fd); } finally { closeSync(fd); }
  } catch { /* some filesystems refuse fsync on directories */ }
}
