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
} as const;
export type OpCode = (typeof Op)[keyof typeof Op];

export const Status = { OK: 0, TIMEOUT: 1, NOT_FOUND: 2, ERROR: 3 } as const;
export type StatusCode = (typeof Status)[keyof typeof Status];

/** Largest frame body either side accepts; a larger length prefix is a protocol error. */
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
  /** Throws unless every byte of the body was consumed (trailing bytes mean a confused peer). */
  end(): void {
    if (this.at !== this.body.length) {
      throw new MalformedFrame(`frame body has ${this.body.length - this.at} unexpected trailing bytes`);
    }
  }
}

/**
 * Splits a byte stream into frame bodies. Chunks are only joined once a whole frame has arrived, so a
 * large value costs one copy, not one per chunk.
 */
export class FrameSplitter {
  private chunks: Buffer[] = [];
  private buffered = 0;

  /** Adds bytes and returns every complete frame body; throws MalformedFrame on a bad length prefix. */
  push(chunk: Buffer): Buffer[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    const bodies: Buffer[] = [];
    for (;;) {
      if (this.buffered < 4) break;
      const head = this.peekHeader();
      if (head > MAX_FRAME_BYTES) throw new MalformedFrame(`frame of ${head} bytes exceeds the ${MAX_FRAME_BYTES}-byte limit`);
      if (head === 0) throw new MalformedFrame('empty frame (no opcode)');
      if (this.buffered < 4 + head) break;
      const all = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks, this.buffered);
      bodies.push(all.subarray(4, 4 + head));
      const rest = all.subarray(4 + head);
      this.chunks = rest.length ? [rest] : [];
      this.buffered = rest.length;
    }
    return bodies;
  }

  private peekHeader(): number {
    const first = this.chunks[0]!;
    if (first.length >= 4) return first.readUInt32LE(0);
    const joined = Buffer.concat(this.chunks, this.buffered);
    this.chunks = [joined];
    return joined.readUInt32LE(0);
  }
}
