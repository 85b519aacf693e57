// The rendezvous store's server: an in-memory key-value map served over TCP with the protocol of
// docs/store-protocol.md. The launcher on node 0 runs one; every rank's TCPStore (and Gloo's C++ client) talks to it.
import { createServer, type Server, type Socket } from 'node:net';
import { ArgumentError, CommError } from '../errors.js';
import { ArgReader, encodeFrame, FrameSplitter, MalformedFrame, Op, Status, type WireArg } from './store-wire.js';

/** Options of {@link StoreServer.start}. */
export interface StoreServerOptions {
  /** Interface to listen on; default 127.0.0.1 (use 0.0.0.0 for multi-host jobs). */
  host?: string;
  /** Port; 0 (the default) lets the OS choose a free one, read back from `.port`. */
  port?: number;
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

// Keys are kept as latin1 strings: one char per byte, so any byte sequence round-trips and a byte
// prefix is a string prefix.
const keyOf = (b: Buffer): string => b.toString('latin1');
const keyBytes = (k: string): Buffer => Buffer.from(k, 'latin1');

/**
 * The rendezvous store's server: an in-memory key-value map served over TCP (docs/store-protocol.md). The launcher on
 * node 0 runs one; every rank's TCPStore (and Gloo's C++ client) talks to it. Create with start().
 */
export class StoreServer {
  private readonly data = new Map<string, Buffer>();
  private readonly waiters = new Map<string, Set<Waiter>>();
  private readonly sockets = new Set<Socket>();
  private closed = false;

  /**
   * @param host The interface it listens on.
   * @param port The port it listens on (the one the OS chose when 0 was asked for).
   */
  private constructor(private readonly server: Server, readonly host: string, readonly port: number) {}

  /** Starts listening; resolves once the port is bound. Throws CommError when it cannot bind. */
  static async start(options: StoreServerOptions = {}): Promise<StoreServer> {
    const host = options.host ?? '127.0.0.1';
    const port = options.port ?? 0;
    if (!Number.isInteger(port) || port < 0 || port > 65535) {
      throw new ArgumentError(`StoreServer.start: port must be an integer in [0, 65535], got ${port}`);
    }
    let store: StoreServer | undefined;
    const server = createServer({ noDelay: true }, (socket) => store!.serve(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e: NodeJS.ErrnoException) =>
        reject(new CommError(`the rendezvous store could not listen on ${host}:${port}: ${e.code ?? e.message}`, 'StoreServer.start')),
      );
      server.listen(port, host, () => resolve());
    });
    const address = server.address();
    const bound = typeof address === 'object' && address ? address.port : port;
    store = new StoreServer(server, host, bound);
    return store;
  }

  /** Number of keys held (for tests and diagnostics). */
  get size(): number {
    return this.data.size;
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
    this.sockets.add(socket);
    const splitter = new FrameSplitter();
    const queue: Buffer[] = [];
    let busy = false;
    let broken = false;
    const cancels = new Set<() => void>();

    const pump = async (): Promise<void> => {
      if (busy) return;
      busy = true;
      while (queue.length && !socket.destroyed) {
        const reply = this.handle(queue.shift()!, cancels);
        socket.write(reply instanceof Promise ? await reply : reply);
      }
      busy = false;
    };

    socket.on('data', (chunk: Buffer) => {
      if (broken) return;
      let bodies: Buffer[];
      try {
        bodies = splitter.push(chunk);
      } catch (e) {
        // The stream has lost its framing; nothing after this point can be trusted.
        broken = true;
        queue.length = 0;
        socket.end(encodeFrame(Status.ERROR, [{ bytes: (e as Error).message }]));
        return;
      }
      queue.push(...bodies);
      void pump();
    });
    // A peer that vanishes is normal (a rank was killed); its blocked requests are dropped.
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      this.sockets.delete(socket);
      for (const cancel of [...cancels]) cancel();
      queue.length = 0;
    });
  }

  /** Answers one request body with a whole response frame (a promise for blocking requests). */
  private handle(body: Buffer, cancels: Set<() => void>): Buffer | Promise<Buffer> {
    try {
      const r = new ArgReader(body);
      const op = r.u8();
      switch (op) {
        case Op.SET: {
          const key = keyOf(r.bytes());
          const value = Buffer.from(r.bytes());
          r.end();
          this.put(key, value);
          return ok();
        }
        case Op.GET: {
          const key = keyOf(r.bytes());
          const timeoutMs = r.i64();
          r.end();
          const value = this.data.get(key);
          if (value) return ok([{ bytes: value }]);
          if (timeoutMs <= 0n) return frame(Status.NOT_FOUND);
          return this.waitFor([key], timeoutMs, cancels).then((found) =>
            found ? ok([{ bytes: this.data.get(key)! }]) : frame(Status.TIMEOUT),
          );
        }
        case Op.ADD: {
          const key = keyOf(r.bytes());
          const delta = r.i64();
          r.end();
          const current = this.data.get(key);
          const text = current ? current.toString('latin1') : '0';
          if (!INTEGER_TEXT.test(text)) return error(`ADD: the value of key ${JSON.stringify(key)} is not a decimal integer`);
          const next = BigInt(text) + delta;
          if (next < I64_MIN || next > I64_MAX) return error(`ADD: key ${JSON.stringify(key)} would overflow a signed 64-bit integer`);
          this.put(key, Buffer.from(next.toString(), 'latin1'));
          return ok([{ i64: next }]);
        }
        case Op.CAS: {
          const key = keyOf(r.bytes());
          const expected = r.bytes();
          const desired = Buffer.from(r.bytes());
          r.end();
          const current = this.data.get(key);
          const matches = current ? current.equals(expected) : expected.length === 0;
          if (matches) this.put(key, desired);
          return ok([{ bytes: this.data.get(key) ?? Buffer.alloc(0) }]);
        }
        case Op.DELETE: {
          const key = keyOf(r.bytes());
          r.end();
          return ok([{ u8: this.data.delete(key) ? 1 : 0 }]);
        }
        case Op.WAIT: {
          const keys = readKeys(r);
          const timeoutMs = r.i64();
          r.end();
          return this.waitFor(keys, timeoutMs, cancels).then((found) => frame(found ? Status.OK : Status.TIMEOUT));
        }
        case Op.CHECK: {
          const keys = readKeys(r);
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
          const prefix = keyOf(r.bytes());
          r.end();
          const keys = [...this.data.keys()].filter((k) => k.startsWith(prefix));
          return ok([{ u32: keys.length }, ...keys.map((k) => ({ bytes: keyBytes(k) }))]);
        }
        default:
          return error(`unknown opcode ${op}`);
      }
    } catch (e) {
      if (e instanceof MalformedFrame) return error(`malformed request: ${e.message}`);
      throw e;
    }
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

function readKeys(r: ArgReader): string[] {
  const n = r.u32();
  const keys: string[] = [];
  for (let i = 0; i < n; i++) keys.push(keyOf(r.bytes()));
  return keys;
}

const frame = (status: number, args: WireArg[] = []): Buffer => encodeFrame(status, args);
const ok = (args: WireArg[] = []): Buffer => encodeFrame(Status.OK, args);
const error = (message: string): Buffer => encodeFrame(Status.ERROR, [{ bytes: message }]);
