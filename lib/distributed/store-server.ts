// The rendezvous store's server: an in-memory key-value map served over TCP with the protocol of
// docs/store-protocol.md. The launcher on node 0 runs one; every rank's TCPStore (and Gloo's C++ client) talks to it.
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { ArgumentError } from '../errors.js';
import { checkToken, isLoopbackHost, listenError } from './store-api.js';
import { ArgReader, encodeFrame, FrameSplitter, MalformedFrame, Op, Status, type WireArg } from './store-wire.js';

/**
 * What the server accepts, so that no request can cost it more than the job itself needs. Every
 * refusal answers ERROR naming the limit (and the variable that raises it) and, for frames, closes
 * the connection; the job goes on. Defaults: {@link DEFAULT_STORE_LIMITS}; `NODETRON_STORE_*`
 * variables override them ({@link storeLimitsFromEnv}).
 */
export interface StoreLimits {
  /** Largest request frame body (bytes) after authentication (NODETRON_STORE_MAX_FRAME_BYTES). */
  maxFrameBytes: number;
  /** Longest key (bytes) (NODETRON_STORE_MAX_KEY_BYTES). */
  maxKeyBytes: number;
  /** Largest value (bytes) a SET or CAS may store (NODETRON_STORE_MAX_VALUE_BYTES). */
  maxValueBytes: number;
  /** Most keys one WAIT or CHECK may list (NODETRON_STORE_MAX_KEYS). */
  maxKeysPerRequest: number;
  /** Most connections open at once; later ones are closed at once (NODETRON_STORE_MAX_CONNECTIONS). */
  maxConnections: number;
  /** Most connections that have not authenticated yet, a share of maxConnections (NODETRON_STORE_MAX_UNAUTHENTICATED). */
  maxUnauthenticated: number;
  /** A connection that has not authenticated within this many ms is closed (NODETRON_STORE_AUTH_TIMEOUT_MS). */
  authTimeoutMs: number;
  /** A frame whose bytes have not all arrived within this many ms closes its connection (NODETRON_STORE_FRAME_TIMEOUT_MS). */
  frameTimeoutMs: number;
}

/**
 * The limits of a StoreServer when neither options nor environment say otherwise. They fit what a job
 * stores, with a wide margin: values are at most a few KiB (Gloo's addresses, the 128-byte NCCL id,
 * a launcher's failure record with its stderr tail, at most 20 lines of 2 KiB), keys under 200 bytes,
 * and the largest request is a WAIT on one key per rank or node.
 */
export const DEFAULT_STORE_LIMITS: Readonly<StoreLimits> = Object.freeze({
  maxFrameBytes: 8 << 20,
  maxKeyBytes: 4096,
  maxValueBytes: 1 << 20,
  maxKeysPerRequest: 65_536,
  maxConnections: 16_384,
  maxUnauthenticated: 1024,
  authTimeoutMs: 10_000,
  frameTimeoutMs: 30_000,
});

const LIMIT_VARS: Record<keyof StoreLimits, string> = {
  maxFrameBytes: 'NODETRON_STORE_MAX_FRAME_BYTES',
  maxKeyBytes: 'NODETRON_STORE_MAX_KEY_BYTES',
  maxValueBytes: 'NODETRON_STORE_MAX_VALUE_BYTES',
  maxKeysPerRequest: 'NODETRON_STORE_MAX_KEYS',
  maxConnections: 'NODETRON_STORE_MAX_CONNECTIONS',
  maxUnauthenticated: 'NODETRON_STORE_MAX_UNAUTHENTICATED',
  authTimeoutMs: 'NODETRON_STORE_AUTH_TIMEOUT_MS',
  frameTimeoutMs: 'NODETRON_STORE_FRAME_TIMEOUT_MS',
};

/** Largest frame body accepted before authentication: an AUTH frame (opcode, length, a token of at most 256 bytes). */
const PRE_AUTH_FRAME_BYTES = 1 + 4 + 256;
/** The largest any limit may be set to: the wire's own frame limit. */
const LIMIT_CAP = 1 << 30;

/**
 * The server limits: `overrides`, then the NODETRON_STORE_* variables of `env`, then the defaults.
 * Throws ArgumentError naming a variable that is not a positive integer.
 */
export function storeLimitsFromEnv(env: NodeJS.ProcessEnv = process.env, overrides: Partial<StoreLimits> = {}): StoreLimits {
  const limits = { ...DEFAULT_STORE_LIMITS };
  for (const key of Object.keys(LIMIT_VARS) as (keyof StoreLimits)[]) {
    const name = LIMIT_VARS[key];
    const text = env[name]?.trim();
    if (text) {
      if (!/^\d+$/.test(text) || Number(text) < 1 || Number(text) > LIMIT_CAP) {
        throw new ArgumentError(`environment variable ${name}=${JSON.stringify(text)} must be an integer in [1, ${LIMIT_CAP}]`);
      }
      limits[key] = Number(text);
    }
    const o = overrides[key];
    if (o !== undefined) {
      if (!Number.isSafeInteger(o) || o < 1 || o > LIMIT_CAP) throw new ArgumentError(`StoreServer.start: limits.${key} must be an integer in [1, ${LIMIT_CAP}], got ${o}`);
      limits[key] = o;
    }
  }
  limits.maxUnauthenticated = Math.min(limits.maxUnauthenticated, limits.maxConnections);
  return limits;
}

/** Options of {@link StoreServer.start}. */
export interface StoreServerOptions {
  /** Interface to listen on; default 127.0.0.1 (use 0.0.0.0 for multi-host jobs). */
  host?: string;
  /** Port; 0 (the default) lets the OS choose a free one, read back from `.port`. */
  port?: number;
  /**
   * The job token every client must present (AUTH, the first frame of each connection) before any
   * other request; connections without it are closed. Undefined: no authentication (loopback only:
   * the server refuses a non-loopback `host` without a token unless `allowUnauthenticated`).
   */
  token?: string;
  /** Listen on a non-loopback interface without a token (anyone who can reach the port can use and stop the job). */
  allowUnauthenticated?: boolean;
  /** Limits of what a request may cost; unset fields come from the environment or the defaults (storeLimitsFromEnv). */
  limits?: Partial<StoreLimits>;
}

/** Why connections were refused, counted since the server started (for tests and diagnostics). */
export interface StoreRefusals {
  /** Closed because the token was missing or wrong, or the first frame was not AUTH. */
  unauthenticated: number;
  /** Closed because a frame broke the framing or a limit (length prefix, HTTP, empty frame). */
  malformed: number;
  /** Closed because a frame or the authentication did not complete in time. */
  stalled: number;
  /** Closed at once because the connection limits were reached. */
  overLimit: number;
  /** Requests answered ERROR for breaking a key, value or key-count limit (the connection stays open). */
  rejectedRequests: number;
}

/** A request blocked until some keys exist (GET with a timeout, WAIT). */
interface Waiter {
  keys: string[];
  finish(allPresent: boolean): void;
}

// setTimeout cannot wait longer than 2^31-1 ms; longer timeouts are clamped to that (~24.8 days).
const MAX_TIMER_MS = 2 ** 31 - 1;
const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;
const INTEGER_TEXT = /^[+-]?\d+$/;
// Requests start with a u32 length; an HTTP (or other text) client's first bytes read as hundreds of MiB.
const TEXT_PROTOCOL = /^(GET |POST|PUT |HEAD|DELE|OPTI|PATC|CONN|TRAC|PRI |SSH-|\x16\x03)/;

// Keys are kept as latin1 strings: one char per byte, so any byte sequence round-trips and a byte
// prefix is a string prefix.
const keyOf = (b: Buffer): string => b.toString('latin1');
const keyBytes = (k: string): Buffer => Buffer.from(k, 'latin1');

/** A request that breaks a limit: answered ERROR, the connection stays usable. */
class LimitExceeded extends Error {}

// Requests queued behind a blocking one: reading pauses at QUEUE_PAUSE and resumes below QUEUE_RESUME.
const QUEUE_PAUSE = 256;
const QUEUE_RESUME = 64;
// How long a connection being closed waits for its last ERROR frame to be flushed before it is destroyed.
const CLOSE_GRACE_MS = 5000;

const digest = (token: string | Buffer): Buffer => createHash('sha256').update(token).digest();

/**
 * The rendezvous store's server: an in-memory key-value map served over TCP (docs/store-protocol.md). The launcher on
 * node 0 runs one; every rank's TCPStore (and Gloo's C++ client) talks to it. Create with start().
 */
export class StoreServer {
  private readonly data = new Map<string, Buffer>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly sockets = new Set<Socket>();
  private unauthenticated = 0;
  private closed = false;
  /** Connections refused so far, by reason. */
  readonly refusals: StoreRefusals = { unauthenticated: 0, malformed: 0, stalled: 0, overLimit: 0, rejectedRequests: 0 };

  /**
   * @param host The interface it listens on.
   * @param port The port it listens on (the one the OS chose when 0 was asked for).
   * @param limits What a request may cost (see StoreLimits).
   * @param tokenDigest SHA-256 of the job token, or undefined when clients need none.
   */
  private constructor(
    private readonly server: Server,
    readonly host: string,
    readonly port: number,
    readonly limits: Readonly<StoreLimits>,
    private readonly tokenDigest: Buffer | undefined,
  ) {}

  /** Whether clients must present the job token. */
  get authenticates(): boolean {
    return this.tokenDigest !== undefined;
  }

  /**
   * Starts listening; resolves once the port is bound. Throws AddressInUseError when the port is taken,
   * CommError when it cannot bind otherwise, ArgumentError for a bad option (a non-loopback host
   * without a token, a token shorter than 16 characters).
   */
  static async start(options: StoreServerOptions = {}): Promise<StoreServer> {
    const host = options.host ?? '127.0.0.1';
    const port = options.port ?? 0;
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
      throw new ArgumentError(`StoreServer.start: port must be an integer in [0, 65535], got ${port}`);
    }
    if (options.token !== undefined) checkToken('StoreServer.start', options.token);
    if (options.token === undefined && !options.allowUnauthenticated && !isLoopbackHost(host)) {
      throw new ArgumentError(
        `StoreServer.start: listening on ${host} needs a job token (anyone who reaches ${host}:${port} could read, overwrite or stop the job); ` +
          'pass token (nodetron launch and init() take it from NODETRON_STORE_TOKEN), or allowUnauthenticated: true',
      );
    }
    const limits = storeLimitsFromEnv(process.env, options.limits);
    let store: StoreServer | undefined;
    const server = createServer({ noDelay: true }, (socket) => store!.serve(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e: NodeJS.ErrnoException) => reject(listenError(e, host, port)));
      server.listen(port, host, () => resolve());
    });
    // A failed accept (EMFILE, ...) must not become an unhandled 'error' that ends the process.
    server.on('error', () => {});
    const address = server.address();
    const bound = typeof address === 'object' && address ? address.port : port;
    store = new StoreServer(server, host, bound, Object.freeze(limits), options.token === undefined ? undefined : digest(options.token));
    return store;
  }

  /** Number of keys held (for tests and diagnostics). */
  get size(): number {
    return this.data.size;
  }

  /** Number of open connections (for tests and diagnostics). */
  get connections(): number {
    return this.sockets.size;
  }

  /** Stops listening, drops every connection and releases blocked requests. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const set of this.waiters.values()) for (const w of [...set]) w.finish(false);
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  // ---- one connection: frames are answered in order; a blocking request holds back later ones ----
  private serve(socket: Socket): void {
    socket.on('error', () => socket.destroy());
    const needsAuth = this.tokenDigest !== undefined;
    if (this.closed || this.sockets.size >= this.limits.maxConnections || (needsAuth && this.unauthenticated >= this.limits.maxUnauthenticated)) {
      this.refusals.overLimit++;
      socket.destroy();
      return;
    }
    this.sockets.add(socket);
    let authed = !needsAuth;
    let fresh = true;  // no frame completed yet: the first bytes may belong to another protocol
    if (!authed) this.unauthenticated++;
    const splitter = new FrameSplitter(this.limits.maxFrameBytes);
    const queue: Buffer[] = [];
    let busy = false;
    let broken = false;
    const cancels = new Set<() => void>();
    // One timer bounds how long the connection may sit unauthenticated, or on an unfinished frame.
    let timer: NodeJS.Timeout | undefined;
    let timerFor: 'auth' | 'frame' | undefined;
    const arm = (what: 'auth' | 'frame', ms: number): void => {
      clearTimeout(timer);
      timerFor = what;
      timer = setTimeout(() => {
        if (socket.destroyed) return;
        this.refusals.stalled++;
        broken = true;
        const why = what === 'auth' ? `no authentication within ${ms} ms` : `a frame did not complete within ${ms} ms`;
        closeWith(`${why}; closing the connection`);
      }, ms);
      timer.unref();
    };
    const disarm = (): void => {
      clearTimeout(timer);
      timer = undefined;
      timerFor = undefined;
    };
    if (!authed) arm('auth', this.limits.authTimeoutMs);
    // Bounds how long a connection being closed may linger (a peer that does not read its ERROR frame).
    let killTimer: NodeJS.Timeout | undefined;
    const killAfter = (ms: number): void => {
      if (killTimer) return;
      killTimer = setTimeout(() => socket.destroy(), ms);
      killTimer.unref();
    };
    const closeWith = (message: string): void => {
      socket.end(error(message));
      socket.destroySoon();
      killAfter(CLOSE_GRACE_MS);
    };

    // Set once the stream has lost its framing (or was never ours): nothing after that point can be
    // trusted, so later bytes are dropped unread; requests that completed before it are still answered, then this
    // message, then the connection is closed.
    let closing: string | undefined;
    const refuse = (message: string, counter: 'malformed' | 'unauthenticated'): void => {
      this.refusals[counter]++;
      broken = true;
      closing = message;
      disarm();
      // Reading goes on (and drops the bytes): a peer's unread bytes would turn the close into a
      // reset that can discard the ERROR frame before the peer reads it.
      if (socket.isPaused()) socket.resume();
      // Answers still owed (a WAIT queued before the bad frame) get the frame deadline, no more.
      killAfter(this.limits.frameTimeoutMs);
      void pump();
    };

    const pump = async (): Promise<void> => {
      if (busy) return;
      busy = true;
      while (queue.length && !socket.destroyed) {
        const reply = this.handle(queue.shift()!, cancels);
        socket.write(reply instanceof Promise ? await reply : reply);
        if (!broken && queue.length < QUEUE_RESUME && socket.isPaused()) {
          socket.resume();
          if (splitter.buffered > 0) arm('frame', this.limits.frameTimeoutMs);
        }
      }
      busy = false;
      if (closing !== undefined && !socket.destroyed) closeWith(closing);
    };

    socket.on('data', (chunk: Buffer) => {
      if (broken) return;
      splitter.append(chunk);
      if (fresh && TEXT_PROTOCOL.test(splitter.peek(4).toString('latin1'))) {
        refuse('this is the nodetron rendezvous store (a binary protocol, docs/store-protocol.md), not an HTTP or TLS server', 'malformed');
        return;
      }
      let completed = false;
      try {
        for (;;) {
          const body = splitter.next(authed ? this.limits.maxFrameBytes : PRE_AUTH_FRAME_BYTES);
          if (!body) break;
          completed = true;
          fresh = false;
          if (authed) {
            queue.push(body);
            continue;
          }
          const verdict = this.authenticate(body);
          if (verdict !== undefined) {
            refuse(verdict, 'unauthenticated');
            return;
          }
          authed = true;
          this.unauthenticated--;
          disarm();
          socket.write(ok());
        }
      } catch (e) {
        if (!(e instanceof MalformedFrame)) throw e;
        refuse(authed ? e.message : `before authentication: ${e.message} (the first frame must be AUTH with the job token)`, authed ? 'malformed' : 'unauthenticated');
        return;
      }
      // A partial frame must complete in time; the clock restarts whenever a frame completes.
      if (authed) {
        if (splitter.buffered === 0) disarm();
        else if (completed || timerFor !== 'frame') arm('frame', this.limits.frameTimeoutMs);
      }
      // A client that pipelines faster than blocked requests are answered is read no further for now.
      // (A partial frame is not timed while the server itself holds the connection back.)
      if (queue.length >= QUEUE_PAUSE) {
        socket.pause();
        if (timerFor === 'frame') disarm();
      }
      void pump();
    });
    socket.on('close', () => {
      disarm();
      clearTimeout(killTimer);
      if (!authed) this.unauthenticated--;
      authed = true;
      this.sockets.delete(socket);
      for (const cancel of [...cancels]) cancel();
      queue.length = 0;
    });
  }

  /** Checks an AUTH frame; returns why it is refused, or undefined when the token matches. */
  private authenticate(body: Buffer): string | undefined {
    const refused = 'authentication required: the first frame must be AUTH with the job token (NODETRON_STORE_TOKEN)';
    if (body.readUInt8(0) !== Op.AUTH) return refused;
    let token: Buffer;
    try {
      const r = new ArgReader(body.subarray(1));
      token = r.bytes();
      r.end();
    } catch {
      return refused;
    }
    // Equal-length digests compared in constant time: neither the token's bytes nor its length leak.
    return timingSafeEqual(digest(token), this.tokenDigest!) ? undefined : 'authentication failed: wrong job token';
  }

  /** Answers one request body with a whole response frame (a promise for blocking requests). */
  private handle(body: Buffer, cancels: Set<() => void>): Buffer | Promise<Buffer> {
    try {
      const r = new ArgReader(body);
      const op = r.u8();
      const key = (): string => this.key(r);
      switch (op) {
        case Op.SET: {
          const k = key();
          const value = Buffer.from(this.value(r, 'SET'));
          r.end();
          this.put(k, value);
          return ok();
        }
        case Op.GET: {
          const k = key();
          const timeoutMs = r.i64();
          r.end();
          const value = this.data.get(k);
          if (value) return ok([{ bytes: value }]);
          if (timeoutMs <= 0n) return frame(Status.NOT_FOUND);
          return this.waitFor([k], timeoutMs, cancels).then((found) =>
            found ? ok([{ bytes: this.data.get(k)! }]) : frame(Status.TIMEOUT),
          );
        }
        case Op.ADD: {
          const k = key();
          const delta = r.i64();
          r.end();
          const current = this.data.get(k);
          const text = current ? current.toString('latin1') : '0';
          if (!INTEGER_TEXT.test(text)) return error(`ADD: the value of key ${JSON.stringify(k)} is not a decimal integer`);
          const next = BigInt(text) + delta;
          if (next < I64_MIN || next > I64_MAX) return error(`ADD: key ${JSON.stringify(k)} would overflow a signed 64-bit integer`);
          this.put(k, Buffer.from(next.toString(), 'latin1'));
          return ok([{ i64: next }]);
        }
        case Op.CAS: {
          const k = key();
          const expected = r.bytes();
          const desired = Buffer.from(this.value(r, 'CAS'));
          r.end();
          const current = this.data.get(k);
          const matches = current ? current.equals(expected) : expected.length === 0;
          if (matches) this.put(k, desired);
          return ok([{ bytes: this.data.get(k) ?? Buffer.alloc(0) }]);
        }
        case Op.DELETE: {
          const k = key();
          r.end();
          return ok([{ u8: this.data.delete(k) ? 1 : 0 }]);
        }
        case Op.WAIT: {
          const keys = this.keyList(r, 'WAIT', 8);
          const timeoutMs = r.i64();
          r.end();
          return this.waitFor(keys, timeoutMs, cancels).then((found) => frame(found ? Status.OK : Status.TIMEOUT));
        }
        case Op.CHECK: {
          const keys = this.keyList(r, 'CHECK', 0);
          r.end();
          return ok([{ u8: keys.every((k) => this.data.has(k)) ? 1 : 0 }]);
        }
        case Op.NUMKEYS:
          r.end();
          return ok([{ i64: this.data.size }]);
        case Op.PING:
          r.end();
          return ok();
        case Op.KEYS: {
          const prefix = key();
          r.end();
          const keys = [...this.data.keys()].filter((k) => k.startsWith(prefix));
          return ok([{ u32: keys.length }, ...keys.map((k) => ({ bytes: keyBytes(k) }))]);
        }
        case Op.AUTH:
          // Authentication happens before a connection's first request; a repeated AUTH, or one sent to
          // a server without a token, is accepted as a no-op.
          r.bytes();
          r.end();
          return ok();
        default:
          return error(`unknown opcode ${op}`);
      }
    } catch (e) {
      if (e instanceof MalformedFrame) return error(`malformed request: ${e.message}`);
      if (e instanceof LimitExceeded) {
        this.refusals.rejectedRequests++;
        return error(e.message);
      }
      throw e;
    }
  }

  private key(r: ArgReader): string {
    const b = r.bytes();
    if (b.length > this.limits.maxKeyBytes) {
      throw new LimitExceeded(`a key of ${b.length} bytes exceeds the ${this.limits.maxKeyBytes}-byte limit (NODETRON_STORE_MAX_KEY_BYTES)`);
    }
    return keyOf(b);
  }

  private value(r: ArgReader, op: string): Buffer {
    const b = r.bytes();
    if (b.length > this.limits.maxValueBytes) {
      throw new LimitExceeded(`${op}: a value of ${b.length} bytes exceeds the ${this.limits.maxValueBytes}-byte limit (NODETRON_STORE_MAX_VALUE_BYTES)`);
    }
    return b;
  }

  /** A u32 count and that many keys; the count is checked against the limit and the body before any key is read. */
  private keyList(r: ArgReader, op: string, trailing: number): string[] {
    const n = r.u32();
    if (n > this.limits.maxKeysPerRequest) {
      throw new LimitExceeded(`${op}: ${n} keys exceed the limit of ${this.limits.maxKeysPerRequest} per request (NODETRON_STORE_MAX_KEYS)`);
    }
    // Each key takes at least its 4-byte length: a count the body cannot hold is refused before the loop.
    if (n * 4 + trailing > r.remaining) throw new MalformedFrame(`${op} lists ${n} keys but its body holds at most ${Math.floor((r.remaining - trailing) / 4)}`);
    const keys: string[] = [];
    for (let i = 0; i < n; i++) keys.push(this.key(r));
    return keys;
  }

  private put(key: string, value: Buffer): void {
    this.data.set(key, value);
    const blocked = this.waiters.get(key);
    if (!blocked) return;
    for (const w of [...blocked]) if (w.keys.every((k) => this.data.has(k))) w.finish(true);
  }

  /** Resolves true once every key exists, false on timeout, server close or connection loss. */
  private waitFor(keys: string[], timeoutMs: bigint, cancels: Set<() => void>): Promise<boolean> {
    if (keys.every((k) => this.data.has(k))) return Promise.resolve(true);
    if (timeoutMs <= 0n || this.closed) return Promise.resolve(false);
    return new Promise<boolean>((resolve) => {
      const waitMs = timeoutMs > BigInt(MAX_TIMER_MS) ? MAX_TIMER_MS : Number(timeoutMs);
      const waiter: Waiter = {
        keys,
        finish: (allPresent) => {
          clearTimeout(timer);
          cancels.delete(cancel);
          for (const k of keys) {
            const set = this.waiters.get(k);
            set?.delete(waiter);
            if (set && set.size === 0) this.waiters.delete(k);
          }
          resolve(allPresent);
        },
      };
      const cancel = (): void => waiter.finish(false);
      const timer = setTimeout(cancel, waitMs);
      cancels.add(cancel);
      for (const k of keys) {
        let set = this.waiters.get(k);
        if (!set) this.waiters.set(k, (set = new Set()));
        set.add(waiter);
      }
    });
  }
}

const frame = (status: number, args: WireArg[] = []): Buffer => encodeFrame(status, args);
const ok = (args: WireArg[] = []): Buffer => encodeFrame(Status.OK, args);
const error = (message: string): Buffer => encodeFrame(Status.ERROR, [{ bytes: message }]);
