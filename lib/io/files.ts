// File-descriptor helpers shared by the file formats (safetensors, llm.c checkpoints).
import { writeSync } from 'node:fs';

/** Writes all of `bytes` at `position` (in chunks of at most 1 GiB); returns bytes.length. */
export function writeAll(fd: number, bytes: Uint8Array, position: number): number {
  let done = 0;
  while (done < bytes.length) done += writeSync(fd, bytes, done, Math.min(bytes.length - done, 1 << 30), position + done);
  return bytes.length;
}
