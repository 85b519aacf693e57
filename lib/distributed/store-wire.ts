// The rendezvous store's wire format (docs/store-protocol.md): opcodes, status codes, frame encoding
// and a stream splitter, shared by the TS server and client so both read and write it one way.

export const Op = {
  SET: 1,
  GET: 2,
  ADD: 3,
  CAS: 4,
  DELETE: 5,
  WAIT: 6,
  CHECK: 7,
  NUMKEYS: 8,
  PING: 9,
  KEYS: 10,
  AUTH: 11,
} as const;
export type OpCode = (typeof Op)[keyof typeof Op];

export const Status = { OK: 0, TIMEOUT: 1, NOT_FOUND: 2, ERROR: 3 } as const;
export type StatusCode = (typeof Status)[keyof typeof Status];

/**
 * Largest reply frame body a client accepts (the server is trusted; a larger length prefix means a
 * confused peer). Requests have the much smaller limits of {@link StoreLimits}.
 */
export const MAX_FRAME_BYTES = 1 << 30;

const encoder = new TextEncoder();

/** Store values and keys are bytes; strings are taken as UTF-8. */
export function toBytes(value: Uint8Array | string): Uint8Array {
  return typeof value === 'string' ? encoder.encode(value) : value;
}

/** One argument of a frame body, in the encodings of the protocol. */
export type WireArg =
  | { u8: number }
  | { u32: number }
  | { i64: number | bigint }
  | { bytes: Uint8Array | string };

/** Builds a whole frame (u32 length prefix + body) whose body starts with `head` (opcode or status). */
export function encodeFrame(head: number, args: WireArg[] = []): Buffer {
  const parts: Uint8Array[] = [];
  let bodyBytes = 1;
  for (const a of args) {
    if ('bytes' in a) {
      const b = toBytes(a.bytes);
      parts.push(b);
      bodyBytes += 4 + b.length;
    } else {
      bodyBytes += 'u8' in a ? 1 : 'u32' in a ? 4 : 8;
    }
  }
  const frame = Buffer.allocUnsafe(4 + bodyBytes);
  frame.writeUInt32LE(bodyBytes, 0);
  frame.writeUInt8(head, 4);
  let at = 5;
  let part = 0;
  for (const a of args) {
    if ('u8' in a) {
      frame.writeUInt8(a.u8, at);
      at += 1;
    } else if ('u32' in a) {
      frame.writeUInt32LE(a.u32, at);
      at += 4;
    } else if ('i64' in a) {
      frame.writeBigInt64LE(BigInt(a.i64), at);
      at += 8;
    } else {
      const b = parts[part++]!;
      frame.writeUInt32LE(b.length, at);
      frame.set(b, at + 4);
      at += 4 + b.length;
    }
  }
  return frame;
}

/** A body too short for what it claims to hold, or otherwise not a valid frame. */
export class MalformedFrame extends Error {}

/** Reads the arguments of one frame body in order; throws MalformedFrame when the body runs out. */
export class ArgReader {
  private at = 0;
  constructor(private readonly body: Buffer) {}
  private need(n: number): void {
    if (this.at + n > this.body.length) {
      throw new MalformedFrame(`frame body of ${this.body.length} bytes ends at byte ${this.at} but ${n} more are needed`);
    }
  }
  u8(): number {
    this.need(1);
    return this.body.readUInt8(this.at++);
  }
  u32(): number {
    this.need(4);
    const v = this.body.readUInt32LE(this.at);
    this.at += 4;
    return v;
  }
  i64(): bigint {
    this.need(8);
    const v = this.body.readBigInt64LE(this.at);
    this.at += 8;
    return v;
  }
  bytes(): Buffer {
    const n = this.u32();
    this.need(n);
    const v = this.body.subarray(this.at, this.at + n);
    this.at += n;
    return v;
  }
  /** Bytes of the body not read yet. */
  get remaining(): number {
    return this.body.length - this.at;
  }
  /** Throws unless every byte of the body was consumed (trailing bytes mean a confused peer). */
  end(): void {
    if (this.at !== this.body.length) {
      throw new MalformedFrame(`frame body has ${this.body.length - this.at} unexpected trailing bytes`);
    }
  }
}

/**
 * Splits a byte stream into frame bodies. Chunks are only joined once a whole frame has arrived, so a
 * large value costs one copy, not one per chunk. Nothing is allocated from a length prefix: the
 * splitter only holds bytes the peer has sent, and a prefix over the limit is refused before the
 * body's bytes are waited for.
 */
export class FrameSplitter {
  private chunks: Buffer[] = [];
  /** Bytes received and not yet returned as a body (a partial frame, or frames not taken yet). */
  buffered = 0;

  /** @param limit Largest body accepted; a larger length prefix throws MalformedFrame. */
  constructor(private readonly limit = MAX_FRAME_BYTES) {}

  /** Adds bytes and returns every complete frame body; throws MalformedFrame on a bad length prefix. */
  push(chunk: Buffer): Buffer[] {
    this.append(chunk);
    const bodies: Buffer[] = [];
    for (let body = this.next(); body; body = this.next()) bodies.push(body);
    return bodies;
  }

  /** Adds bytes without taking frames out (see next). */
  append(chunk: Buffer): void {
    if (chunk.length === 0) return;
    this.chunks.push(chunk);
    this.buffered += chunk.length;
  }

  /**
   * The next complete frame body, or undefined while it has not fully arrived. `limit` (default: the
   * splitter's) bounds this frame's length prefix: a larger one throws MalformedFrame at once.
   */
  next(limit = this.limit): Buffer | undefined {
    if (this.buffered < 4) return undefined;
    const head = this.peekHeader();
    if (head > limit) throw new MalformedFrame(`frame of ${head} bytes exceeds the ${limit}-byte limit`);
    if (head === 0) throw new MalformedFrame('empty frame (no opcode)');
    if (this.buffered < 4 + head) return undefined;
    const all = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.buffered);
    const rest = all.subarray(4 + head);
    this.chunks = rest.length ? [rest] : [];
    this.buffered = rest.length;
    return all.subarray(4, 4 + head);
  }

  /** The first bytes received and not yet taken (up to n), e.g. to recognize an HTTP request. */
  peek(n: number): Buffer {
    const first = this.chunks[0];
    if (!first) return Buffer.alloc(0);
    return first.length >= n || this.chunks.length === 1 ? first.subarray(0, n) : Buffer.concat(this.chunks, this.buffered).subarray(0, n);
  }

  private peekHeader(): number {
    const first = this.chunks[0]!;
    if (first.length >= 4) return first.readUInt32LE(0);
    const joined = Buffer.concat(this.chunks, this.buffered);
    this.chunks = [joined];
    return joined.readUInt32LE(0);
  }
}
