// Token shards in llm.c's format (also modded-nanogpt's): a header of 256 little-endian int32
// (magic 20240520, version 1, token count), then the tokens as uint16. Written to a temporary name,
// fsynced and renamed (writeFileAtomically); read with positional reads of the windows asked for, never whole.
import { closeSync, fstatSync } from 'node:fs';
import { ArgumentError, StateError } from '../errors.js';
import { closeOnThrow, openForReading, readAll, writeAll, writeFileAtomically } from '../io/files.js';

/** Magic number in the first int32 of a token shard (llm.c's). */
export const TOKEN_SHARD_MAGIC = 20240520;
/** Format version in the second int32 of a token shard. */
export const TOKEN_SHARD_VERSION = 1;
const HEADER_BYTES = 256 * 4;

/** Writes `tokens` as a shard at `path` (atomically: a reader never sees half a file). */
export function writeTokenShard(path: string, tokens: Uint16Array): void {
  if (!(tokens instanceof Uint16Array)) throw new ArgumentError('writeTokenShard: tokens must be a Uint16Array');
  if (tokens.length >= 2 ** 31) throw new ArgumentError(`writeTokenShard: ${tokens.length} tokens do not fit the header's int32 count`);
  const header = new Int32Array(256);
  header[0] = TOKEN_SHARD_MAGIC;
  header[1] = TOKEN_SHARD_VERSION;
  header[2] = tokens.length;
  writeFileAtomically(path, (fd) => {
    const at = writeAll(fd, new Uint8Array(header.buffer), 0);
    writeAll(fd, new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength), at);
  });
}

/** An open shard: its token count and positional reads of token ranges. */
export class TokenShard {
  /** Tokens in the shard. */
  readonly tokens: number;
  #fd: number | null;
  /** @param path The shard's file path. */
  private constructor(readonly path: string, fd: number) {
    this.#fd = fd;
    this.tokens = closeOnThrow(fd, () => {
      const size = fstatSync(fd).size;
      if (size < HEADER_BYTES) throw new StateError(`${path}: ${size} bytes is shorter than the 1024-byte header of a token shard`);
      const header = new Int32Array(256);
      readAll(fd, new Uint8Array(header.buffer), 0, path);
      if (header[0] !== TOKEN_SHARD_MAGIC) throw new StateError(`${path}: not a token shard (magic ${header[0]}, expected ${TOKEN_SHARD_MAGIC})`);
      if (header[1] !== TOKEN_SHARD_VERSION) throw new StateError(`${path}: token shard version ${header[1]}, this reader knows ${TOKEN_SHARD_VERSION}`);
      const n = header[2]!;
      if (n < 0 || size !== HEADER_BYTES + 2 * n) {
        throw new StateError(`${path}: the header says ${n} tokens (${HEADER_BYTES + 2 * n} bytes) but the file has ${size} bytes (${size < HEADER_BYTES + 2 * n ? 'truncated' : 'trailing bytes'})`);
      }
      return n;
    });
  }

  /** Opens a shard and validates its header and size. Throws StateError for a file that is not a valid shard. */
  static open(path: string): TokenShard {
    return new TokenShard(path, openForReading(path, (reason) => `token shard ${path}: ${reason}`));
  }

  /** Tokens [start, start + count) into `into` (allocated when omitted). */
  read(start: number, count: number, into?: Uint16Array): Uint16Array {
    if (!(Number.isSafeInteger(start) && Number.isSafeInteger(count) && start >= 0 && count >= 0 && start + count <= this.tokens)) {
      throw new ArgumentError(`${this.path}: tokens [${start}, ${start + count}) are outside the shard's ${this.tokens}`);
    }
    if (this.#fd === null) throw new StateError(`${this.path}: the shard is closed`);
    const out = into ?? new Uint16Array(count);
    readAll(this.#fd, new Uint8Array(out.buffer, out.byteOffset, count * 2), HEADER_BYTES + 2 * start, this.path);
    return out;
  }

  /** Closes the file. Idempotent; read() throws StateError afterwards. */
  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
  }
  /** close(), for `using` declarations. */
  [Symbol.dispose](): void { this.close(); }
}
