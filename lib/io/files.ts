// File-descriptor helpers shared by the file formats (safetensors, llm.c checkpoints, token shards).
import { closeSync, openSync, writeSync } from 'node:fs';
import { StateError } from '../errors.js';

/** Writes all of `bytes` at `position` (in chunks of at most 1 GiB); returns bytes.length. */
export function writeAll(fd: number, bytes: Uint8Array, position: number): number {
  let done = 0;
  while (done < bytes.length) done += writeSync(fd, bytes, done, Math.min(bytes.length - done, 1 << 30), position + done);
  return bytes.length;
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
