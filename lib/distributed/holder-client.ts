// The client side of the image holder protocol (in-job recovery, issue #37; the server is ImageHolder in
// lib/distributed/holder.ts, which re-exports this client): the frames both ends exchange (a 4-byte
// little-endian length, a JSON header, then `bytes` payload bytes when the header says) and
// HolderClient, a worker's connection to its holder. The client reconnects by itself: a call that
// finds the connection lost (the holder restarted, a transient network fault) opens a new one, a few
// times with backoff, and a put or list lost with its connection is sent again on the new one, so a
// transient failure costs at most the copy in flight, not every later one. node:net only.
import { connect as netConnect, type Socket } from 'node:net';
import { constants as bufferConstants } from 'node:buffer';
import { ArgumentError, CommError, TimeoutError } from '../errors.js';

/** Largest JSON header of a frame, either way. */
export const HOLDER_MAX_HEADER_BYTES = 64 << 10;
/** Default request timeout of a HolderClient (ms), counted from the call. */
export const DEFAULT_HOLDER_TIMEOUT_MS = 60_000;
/** Default number of connection attempts a call makes when it finds the connection lost (HolderClientOptions.reconnectAttempts). */
export const DEFAULT_HOLDER_RECONNECT_ATTEMPTS = 3;
/** Default time for each of those attempts to connect (ms; HolderClientOptions.reconnectTimeoutMs). */
export const DEFAULT_HOLDER_RECONNECT_TIMEOUT_MS = 2000;
// Backoff between reconnection attempts of one call (doubling), and the hold-off after a call whose
// attempts all failed: later calls fail at once (without touching the network) until it has passed;
// it doubles with each such call up to HOLD_OFF_MAX_MS and resets once a connection is made.
const BACKOFF_MS = 100;
const HOLD_OFF_MS = 1000;
const HOLD_OFF_MAX_MS = 30_000;

/** A whole frame: length, JSON header. */
export function frame(header: object): Buffer {
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const out = Buffer.allocUnsafe(4 + json.length);
  out.writeUInt32LE(json.length, 0);
  json.copy(out, 4);
  return out;
}

export const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/** Reads frames' length prefixes and JSON headers out of a byte stream; the caller reads payloads. */
export class HeaderReader {
  private readonly len = Buffer.alloc(4);
  private lenHave = 0;
  private buf: Buffer | undefined;
  private have = 0;

  /**
   * Consumes bytes of `chunk` from `at` until a header is complete or the chunk ends. Returns where it
   * stopped and the header when one completed, or the error of a length out of [1, 64 KiB].
   */
  take(chunk: Buffer, at: number): { at: number; header?: Buffer; error?: string } {
    if (!this.buf) {
      const k = Math.min(4 - this.lenHave, chunk.length - at);
      chunk.copy(this.len, this.lenHave, at, at + k);
      this.lenHave += k;
      at += k;
      if (this.lenHave < 4) return { at };
      this.lenHave = 0;
      const n = this.len.readUInt32LE(0);
      if (n === 0 || n > HOLDER_MAX_HEADER_BYTES) return { at, error: `malformed frame: a header of ${n} bytes (1 to ${HOLDER_MAX_HEADER_BYTES} allowed)` };
      this.buf = Buffer.allocUnsafe(n);
      this.have = 0;
    }
    const k = Math.min(this.buf.length - this.have, chunk.length - at);
    chunk.copy(this.buf, this.have, at, at + k);
    this.have += k;
    at += k;
    if (this.have < this.buf.length) return { at };
    const header = this.buf;
    this.buf = undefined;
    return { at, header };
  }
}

/** Options of {@link HolderClient.connect}. */
export interface HolderClientOptions {
  /** The job token (NODETRON_STORE_TOKEN), when the holder checks one. */
  token?: string;
  /** Time for the first connection, and for each request from its call to its reply (default DEFAULT_HOLDER_TIMEOUT_MS). */
  timeoutMs?: number;
  /**
   * Connection attempts a call makes when it finds the connection lost, with backoff between them
   * (default 3; 0: never reconnect, every call after a failure fails at once).
   */
  reconnectAttempts?: number;
  /** Time for each reconnection attempt to connect (default 2000 ms, at most timeoutMs). */
  reconnectTimeoutMs?: number;
}

/** A request sent and not yet answered. */
interface Pending {
  what: string;
  resolve(reply: Record<string, unknown>, payload: Buffer | undefined): void;
  reject(error: Error): void;
  timer: NodeJS.Timeout;
  /** A get, whose ok reply is followed by the payload. */
  payload: boolean;
}

/** Splits `host:port` (an IPv6 host in brackets). */
function parseAddress(address: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(typeof address === 'string' ? address.trim() : '');
  const port = m ? Number(m[3]) : NaN;
  if (!m || !(port >= 1 && port <= 65535)) throw new ArgumentError(`HolderClient.connect: the holder address must be host:port, got ${JSON.stringify(address)}`);
  return { host: m[1] ?? m[2]!, port };
}

const checkCount = (call: string, name: string, v: unknown): number => {
  if (!isCount(v)) throw new ArgumentError(`${call}: ${name} must be an integer >= 0, got ${String(v)}`);
  return v;
};

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** One TCP connection attempt bounded by `ms`: the socket, or the error code of the failure. */
function dial(host: string, port: number, ms: number): Promise<Socket | string> {
  return new Promise((resolve) => {
    const s = netConnect({ host, port, noDelay: true });
    const timer = setTimeout(() => { s.destroy(); resolve('ETIMEDOUT'); }, Math.max(ms, 1));
    s.once('connect', () => { clearTimeout(timer); s.removeAllListeners('error'); resolve(s); });
    s.once('error', (e: NodeJS.ErrnoException) => { clearTimeout(timer); s.destroy(); resolve(e.code ?? e.message); });
  });
}

/** A failure of the connection itself (lost, reset, a broken reply), after which a call may be sent again on a new one. */
class ConnectionLost extends CommError {}

/**
 * One connection to the holder: requests are pipelined in order and answered in order. After its
 * first failure every request on it fails (the client then opens another).
 */
class Connection {
  private readonly pending: Pending[] = [];
  failure: string | undefined;
  // Reading replies: the length, the header, then a get's payload.
  private readonly frames = new HeaderReader();
  private body: { buf: Buffer; have: number; reply: Record<string, unknown> } | undefined;

  constructor(readonly socket: Socket, private readonly address: string, private readonly token: string | undefined, private readonly timeoutMs: number) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (e: NodeJS.ErrnoException) => this.fail(`the connection failed (${e.code ?? e.message})`));
    socket.on('close', () => this.fail('the connection was lost'));
  }

  request(what: string, header: Record<string, unknown>, payload: boolean, bytes?: readonly Uint8Array[]): Promise<{ reply: Record<string, unknown>; payload: Buffer | undefined }> {
    if (this.failure) return Promise.reject(new ConnectionLost(`image holder ${this.address}: ${what} failed: ${this.failure}`, 'HolderClient'));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        const error = new TimeoutError(`image holder ${this.address}: ${what} was not answered within ${this.timeoutMs} ms`, 'HolderClient');
        reject(error);
        this.fail(`the connection was abandoned after ${what} timed out`);
      }, this.timeoutMs);
      this.pending.push({ what, payload, timer, reject, resolve: (reply, body) => resolve({ reply, payload: body }) });
      this.socket.write(frame(this.token === undefined ? header : { ...header, token: this.token }));
      for (const b of bytes ?? []) if (b.byteLength > 0) this.socket.write(b);
    });
  }

  /**
   * Records the first failure (`reason`), fails every pending request with it (naming each op) and ends
   * the connection. Returns the error of the failure.
   */
  fail(reason: string): CommError {
    if (!this.failure) this.failure = reason;
    for (const p of this.pending.splice(0)) {
      clearTimeout(p.timer);
      p.reject(new ConnectionLost(`image holder ${this.address}: ${p.what} failed: ${this.failure}`, 'HolderClient'));
    }
    this.body = undefined;
    this.socket.destroy();
    return new ConnectionLost(`image holder ${this.address}: ${this.failure}`, 'HolderClient');
  }

  private settle(reply: Record<string, unknown>, body: Buffer | undefined): void {
    const p = this.pending.shift();
    if (!p) return void this.fail('it sent a reply no request asked for');
    clearTimeout(p.timer);
    if (reply.ok === true) p.resolve(reply, body);
    else p.reject(new CommError(`image holder ${this.address}: ${p.what} failed: the holder said: ${String(reply.error ?? 'no reason given')}`, 'HolderClient'));
  }

  private onData(chunk: Buffer): void {
    let at = 0;
    while (at < chunk.length && !this.failure) {
      if (this.body) {
        const b = this.body;
        const k = Math.min(b.buf.length - b.have, chunk.length - at);
        chunk.copy(b.buf, b.have, at, at + k);
        b.have += k;
        at += k;
        if (b.have === b.buf.length) {
          this.body = undefined;
          this.settle(b.reply, b.buf);
        }
        continue;
      }
      const got = this.frames.take(chunk, at);
      at = got.at;
      if (got.error) {
        this.fail(`it sent a ${got.error}`);
        return;
      }
      if (!got.header) continue;
      let reply: Record<string, unknown>;
      try {
        reply = JSON.parse(got.header.toString('utf8')) as Record<string, unknown>;
      } catch {
        return void this.fail('it sent a reply that is not JSON');
      }
      const front = this.pending[0];
      if (reply.ok === true && front?.payload) {
        const n = reply.bytes;
        if (!isCount(n) || n > bufferConstants.MAX_LENGTH) {
          this.fail(`it announced a payload of ${String(n)} bytes, which this process cannot receive`);
          return;
        }
        if (n === 0) this.settle(reply, Buffer.alloc(0));
        else this.body = { buf: Buffer.allocUnsafeSlow(n), have: 0, reply };
        continue;
      }
      this.settle(reply, undefined);
    }
  }
}

/**
 * A worker's connection to its image holder. Requests are pipelined in order on one connection and
 * answered in order. A put writes its header, then the caller's bytes as they are (no copy): the caller
 * must not change them until the put resolves. Errors name the holder and the op: CommError when the
 * connection is lost or the holder refuses, TimeoutError when a request is not answered in time (the
 * connection is then abandoned).
 *
 * Reconnection: a call that finds the connection lost opens a new one (up to `reconnectAttempts`
 * attempts, each bounded by `reconnectTimeoutMs`, with backoff from 100 ms between them), and a put or
 * a list whose connection was lost under it is sent once more on a new one (a put is idempotent at the
 * holder: a put of step s replaces the rank's images of steps >= s). A refusal by the holder and a
 * timeout are not retried. When a call's attempts all fail, later calls fail at once with CommError for
 * a hold-off (1 s, doubling up to 30 s while the holder stays unreachable), so an unreachable holder
 * costs a step little. After close() every call fails with CommError.
 */
export class HolderClient {
  #conn: Connection;
  #dialing: Promise<Connection> | undefined;
  #closed = false;
  #holdOffUntil = 0;
  #holdOffMs = HOLD_OFF_MS;
  #lastFailure = '';
  /** Connections opened after the first (reconnections that succeeded). */
  reconnections = 0;

  private constructor(
    conn: Connection,
    private readonly host: string,
    private readonly port: number,
    /** `host:port` of the holder. */ readonly address: string,
    private readonly token: string | undefined,
    /** Time for each request from its call to its reply (ms). */ readonly timeoutMs: number,
    /** Connection attempts of a call that finds the connection lost. */ readonly reconnectAttempts: number,
    /** Time for each reconnection attempt (ms). */ readonly reconnectTimeoutMs: number,
  ) {
    this.#conn = conn;
  }

  /**
   * Connects to the holder at `address` (host:port), retrying a refused connection until `timeoutMs`
   * has passed (the agent may still be starting it), then checks the token with one list request.
   */
  static async connect(address: string, options: HolderClientOptions = {}): Promise<HolderClient> {
    const { host, port } = parseAddress(address);
    const timeoutMs = options.timeoutMs ?? DEFAULT_HOLDER_TIMEOUT_MS;
    if (typeof timeoutMs !== 'number' || !(timeoutMs > 0) || !Number.isFinite(timeoutMs)) {
      throw new ArgumentError(`HolderClient.connect: timeoutMs must be a finite number > 0, got ${timeoutMs}`);
    }
    const attempts = options.reconnectAttempts ?? DEFAULT_HOLDER_RECONNECT_ATTEMPTS;
    if (!Number.isSafeInteger(attempts) || attempts < 0) throw new ArgumentError(`HolderClient.connect: reconnectAttempts must be an integer >= 0, got ${attempts}`);
    const perAttempt = options.reconnectTimeoutMs ?? Math.min(DEFAULT_HOLDER_RECONNECT_TIMEOUT_MS, timeoutMs);
    if (typeof perAttempt !== 'number' || !(perAttempt > 0) || !Number.isFinite(perAttempt)) {
      throw new ArgumentError(`HolderClient.connect: reconnectTimeoutMs must be a finite number > 0, got ${perAttempt}`);
    }
    const named = `${host.includes(':') ? `[${host}]` : host}:${port}`;
    const deadline = Date.now() + timeoutMs;
    let backoff = 20;
    let last = 'no attempt made';
    for (;;) {
      const socket = await dial(host, port, deadline - Date.now());
      if (typeof socket !== 'string') {
        const conn = new Connection(socket, named, options.token, timeoutMs);
        const client = new HolderClient(conn, host, port, named, options.token, timeoutMs, attempts, Math.min(perAttempt, timeoutMs));
        try {
          await client.list(0);
        } catch (e) {
          conn.socket.destroy();
          client.#closed = true;
          throw e;
        }
        return client;
      }
      last = socket;
      if (Date.now() + backoff >= deadline) break;
      await sleep(backoff);
      backoff = Math.min(backoff * 2, 500);
    }
    throw new CommError(`could not reach the image holder at ${address} within ${timeoutMs} ms (last error: ${last})`, 'HolderClient.connect');
  }

  /** Whether the current connection has failed or was closed (the next call then reconnects, unless close() was called). */
  get broken(): boolean { return this.#closed || this.#conn.failure !== undefined; }

  /**
   * Sends `bytes` as rank's image of `step` (taken in `generation`); resolves once the holder has stored
   * it. The header and the bytes are handed to the socket before put returns (again, on a reconnection);
   * do not change them until it resolves.
   */
  async put(rank: number, step: number, generation: number, bytes: Uint8Array | readonly Uint8Array[]): Promise<void> {
    const call = 'HolderClient.put';
    checkCount(call, 'rank', rank);
    checkCount(call, 'step', step);
    checkCount(call, 'generation', generation);
    // An image may come in pieces (encodeImage's head and data): sent one after the other, never joined.
    const pieces = Array.isArray(bytes) ? bytes as readonly Uint8Array[] : [bytes as Uint8Array];
    if (pieces.length === 0 || pieces.some((b) => !(b instanceof Uint8Array))) throw new ArgumentError(`${call}: bytes must be a Uint8Array or a non-empty array of them`);
    const n = pieces.reduce((sum, b) => sum + b.byteLength, 0);
    const header = { op: 'put', rank, step, generation, bytes: n };
    await this.#request(`put(rank ${rank}, step ${step}, ${n} bytes)`, header, false, pieces);
  }

  /** The steps the holder has for `rank`, ascending. */
  async list(rank: number): Promise<number[]> {
    checkCount('HolderClient.list', 'rank', rank);
    const { reply } = await this.#request(`list(rank ${rank})`, { op: 'list', rank }, false);
    const steps = reply.steps;
    if (!Array.isArray(steps) || !steps.every(isCount)) throw this.#conn.fail(`it answered list(rank ${rank}) with a malformed reply`);
    return steps as number[];
  }

  /** Rank's image of `step` (with `limit`: its first `limit` bytes, e.g. the header decodeImageHead reads); CommError when the holder has none. */
  async get(rank: number, step: number, limit?: number): Promise<Uint8Array> {
    checkCount('HolderClient.get', 'rank', rank);
    checkCount('HolderClient.get', 'step', step);
    if (limit !== undefined) checkCount('HolderClient.get', 'limit', limit);
    const { payload } = await this.#request(`get(rank ${rank}, step ${step}${limit !== undefined ? `, first ${limit} bytes` : ''})`, { op: 'get', rank, step, ...(limit !== undefined ? { limit } : {}) }, true);
    return payload!;
  }

  /** Closes the connection; requests still pending fail with CommError, and so does every later call. */
  async close(): Promise<void> {
    this.#closed = true;
    const socket = this.#conn.socket;
    if (socket.destroyed) return;
    const closed = new Promise<void>((resolve) => socket.once('close', () => resolve()));
    this.#conn.fail('the client closed the connection');
    await closed;
  }

  // A request on the current connection, reconnecting first when it is lost; sent once more when the
  // connection is lost under it (not a get, whose payload may be large: the caller retries it).
  async #request(what: string, header: Record<string, unknown>, payload: boolean, bytes?: readonly Uint8Array[]): Promise<{ reply: Record<string, unknown>; payload: Buffer | undefined }> {
    for (let sent = 0; ; sent++) {
      const conn = await this.#connection(what);
      try {
        return await conn.request(what, header, payload, bytes);
      } catch (e) {
        if (!(e instanceof ConnectionLost) || payload || sent >= 1 || this.#closed || this.reconnectAttempts === 0) throw e;
      }
    }
  }

  // The connection, reopened when it has failed (one dial at a time, shared by the calls waiting for it).
  async #connection(what: string): Promise<Connection> {
    const fail = (why: string) => new CommError(`image holder ${this.address}: ${what} failed: ${why}`, 'HolderClient');
    if (this.#closed) throw fail(this.#conn.failure ?? 'the client closed the connection');
    if (!this.#conn.failure) return this.#conn;
    if (this.reconnectAttempts === 0) throw fail(this.#conn.failure);
    if (Date.now() < this.#holdOffUntil) throw fail(`${this.#conn.failure}; reconnecting failed (${this.#lastFailure}), next try in ${this.#holdOffUntil - Date.now()} ms`);
    this.#dialing ??= this.#redial().finally(() => { this.#dialing = undefined; });
    try {
      return await this.#dialing;
    } catch (e) {
      throw fail(`${this.#conn.failure}; ${(e as Error).message}`);
    }
  }

  async #redial(): Promise<Connection> {
    let backoff = BACKOFF_MS;
    for (let attempt = 1; ; attempt++) {
      const socket = await dial(this.host, this.port, this.reconnectTimeoutMs);
      if (this.#closed) {
        if (typeof socket !== 'string') socket.destroy();
        throw new CommError('the client closed the connection', 'HolderClient');
      }
      if (typeof socket !== 'string') {
        this.#conn = new Connection(socket, this.address, this.token, this.timeoutMs);
        this.reconnections++;
        this.#holdOffMs = HOLD_OFF_MS;
        return this.#conn;
      }
      this.#lastFailure = socket;
      if (attempt >= this.reconnectAttempts) {
        this.#holdOffUntil = Date.now() + this.#holdOffMs;
        this.#holdOffMs = Math.min(this.#holdOffMs * 2, HOLD_OFF_MAX_MS);
        throw new CommError(`could not reconnect in ${attempt} attempt(s) (last error: ${socket})`, 'HolderClient');
      }
      await sleep(backoff);
      backoff *= 2;
    }
  }
}
