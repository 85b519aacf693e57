// The rendezvous store: the `Store` interface every rank uses to meet the others, its TCP client
// (TCPStore), a namespaced view (PrefixStore) and `createStore(url)`. The server is store-server.ts.
import type { Socket } from 'node:net';
import { ArgumentError, CommError, StateError, TimeoutError } from '../errors.js';
import { RedisStore } from './redis-store.js';
import {
  checkKey, checkKeys, checkTimeout, checkToken, checkValue, connectWithRetry, resolveConnectOptions, getTimeoutError, SocketStoreClient, StoreAuthError,
  tokenFromEnv, waitTimeoutError, type Store, type StoreConnectOptions, type StoreValue, type StoreWaitOptions,
} from './store-api.js';
import { ArgReader, encodeFrame, FrameSplitter, Op, Status, type WireArg } from './store-wire.js';

export {
  StoreServer, DEFAULT_STORE_LIMITS, storeLimitsFromEnv, type StoreLimits, type StoreRefusals, type StoreServerOptions,
} from './store-server.js';
export { AddressInUseError, StoreAuthError, tokenFromEnv, DEFAULT_STORE_TIMEOUT_MS, type Store, type StoreConnectOptions, type StoreValue, type StoreWaitOptions } from './store-api.js';

const decoder = new TextDecoder();

interface Reply {
  status: number;
  result: ArgReader;
}

/** The client of a StoreServer: one TCP connection, requests pipelined and answered in order. */
export class TCPStore extends SocketStoreClient<Reply> implements Store {
  private constructor(socket: Socket, host: string, port: number, timeoutMs: number) {
    super(socket, host, port, timeoutMs, 'the rendezvous store', 'TCPStore');
    const splitter = new FrameSplitter();
    socket.on('data', (chunk: Buffer) => {
      let bodies: Buffer[];
      try {
        bodies = splitter.push(chunk);
      } catch (e) {
        this.fail(new CommError(`the rendezvous store at ${this.address} sent a malformed reply: ${(e as Error).message}`, 'TCPStore'));
        return;
      }
      for (const body of bodies) {
        const p = this.pending.shift();
        if (!p) {
          this.fail(new CommError(`the rendezvous store at ${this.address} sent a reply nobody asked for`, 'TCPStore'));
          return;
        }
        p.resolve({ status: body.readUInt8(0), result: new ArgReader(body.subarray(1)) });
      }
    });
  }

  /**
   * Connects to a StoreServer, retrying while it is not up yet (ranks often start before the master
   * listens), and presents the job token (`options.token`, else NODETRON_STORE_TOKEN) when there is one.
   * Throws CommError naming host:port and the timeout when it cannot reach it in time, StoreAuthError
   * at once when the server refuses the token (or needs one and none was given).
   */
  static async connect(options: StoreConnectOptions): Promise<TCPStore> {
    const { host, port, timeoutMs } = resolveConnectOptions('TCPStore.connect', options);
    const token = options.token !== undefined ? checkToken('TCPStore.connect', options.token) : tokenFromEnv();
    return connectWithRetry('rendezvous store', host, port, timeoutMs, async (socket, remainingMs) => {
      const store = new TCPStore(socket, host, port, timeoutMs);
      try {
        if (token !== undefined) await store.roundTrip(Op.AUTH, [{ bytes: token }], remainingMs, 'authenticate');
        else await store.roundTrip(Op.PING, [], remainingMs, 'answer a ping');
      } catch (e) {
        store.fail(e as Error);
        throw e;
      }
      return store;
    });
  }

  /** One request with a time limit, its ERROR reply thrown (StoreAuthError when the server refused the token). */
  private async roundTrip(op: number, args: WireArg[], timeoutMs: number, what: string): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new TimeoutError(`the rendezvous store at ${this.address} did not ${what} within ${timeoutMs} ms`, 'TCPStore.connect')), timeoutMs);
    });
    try {
      const reply = await Promise.race([this.request(op, args), timedOut]);
      if (reply.status === Status.ERROR) {
        const message = decoder.decode(reply.result.bytes());
        if (message.startsWith('authentication')) {
          const hint = op === Op.AUTH ? 'check that every node has the same NODETRON_STORE_TOKEN' : 'set NODETRON_STORE_TOKEN to the job token (nodetron launch sets it for its ranks)';
          throw new StoreAuthError(`the rendezvous store at ${this.address} refused this client (${message}); ${hint}`, 'TCPStore.connect');
        }
      }
      this.expectOk('TCPStore.connect', reply);
    } finally {
      clearTimeout(timer);
    }
  }

  private request(op: number, args: WireArg[] = []): Promise<Reply> {
    if (this.failure) return Promise.reject(this.failure);
    return new Promise<Reply>((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.socket.write(encodeFrame(op, args));
    });
  }

  /** Replies other than OK (and the TIMEOUT/NOT_FOUND a caller handles) become errors. */
  private expectOk(call: string, reply: Reply): ArgReader {
    if (reply.status === Status.OK) return reply.result;
    if (reply.status === Status.ERROR) {
      throw new CommError(`${call} failed at the rendezvous store ${this.address}: ${decoder.decode(reply.result.bytes())}`, call);
    }
    throw new CommError(`${call}: unexpected status ${reply.status} from the rendezvous store ${this.address}`, call);
  }

  /** Round trip to the server; TimeoutError (and a dropped connection) if no reply within `timeoutMs`. */
  async ping(timeoutMs: number = this.timeoutMs): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const timedOut = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const e = new TimeoutError(`the rendezvous store at ${this.address} did not answer a ping within ${timeoutMs} ms`, 'TCPStore.ping');
        this.fail(e);
        reject(e);
      }, timeoutMs);
    });
    try {
      this.expectOk('TCPStore.ping', await Promise.race([this.request(Op.PING), timedOut]));
    } finally {
      clearTimeout(timer);
    }
  }

  async set(key: string, value: StoreValue): Promise<void> {
    checkKey('TCPStore.set', key);
    checkValue('TCPStore.set', value);
    this.expectOk('TCPStore.set', await this.request(Op.SET, [{ bytes: key }, { bytes: value }]));
  }

  async get(key: string, options: StoreWaitOptions = {}): Promise<Uint8Array> {
    checkKey('TCPStore.get', key);
    const timeoutMs = checkTimeout('TCPStore.get', options.timeoutMs ?? this.timeoutMs);
    const reply = await this.request(Op.GET, [{ bytes: key }, { i64: timeoutMs }]);
    if (reply.status === Status.TIMEOUT || reply.status === Status.NOT_FOUND) {
      throw getTimeoutError('TCPStore.get', key, timeoutMs);
    }
    return new Uint8Array(this.expectOk('TCPStore.get', reply).bytes());
  }

  async getString(key: string, options?: StoreWaitOptions): Promise<string> {
    return decoder.decode(await this.get(key, options));
  }

  async tryGet(key: string): Promise<Uint8Array | undefined> {
    checkKey('TCPStore.tryGet', key);
    const reply = await this.request(Op.GET, [{ bytes: key }, { i64: 0 }]);
    if (reply.status === Status.NOT_FOUND) return undefined;
    return new Uint8Array(this.expectOk('TCPStore.tryGet', reply).bytes());
  }

  async add(key: string, delta: number): Promise<number> {
    checkKey('TCPStore.add', key);
    if (!Number.isSafeInteger(delta)) throw new ArgumentError(`TCPStore.add: delta must be a safe integer, got ${delta}`);
    return Number(this.expectOk('TCPStore.add', await this.request(Op.ADD, [{ bytes: key }, { i64: delta }])).i64());
  }

  async compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array> {
    checkKey('TCPStore.compareSet', key);
    checkValue('TCPStore.compareSet', expected);
    checkValue('TCPStore.compareSet', desired);
    const reply = await this.request(Op.CAS, [{ bytes: key }, { bytes: expected }, { bytes: desired }]);
    return new Uint8Array(this.expectOk('TCPStore.compareSet', reply).bytes());
  }

  async delete(key: string): Promise<boolean> {
    checkKey('TCPStore.delete', key);
    return this.expectOk('TCPStore.delete', await this.request(Op.DELETE, [{ bytes: key }])).u8() === 1;
  }

  async wait(keys: string[], options: StoreWaitOptions = {}): Promise<void> {
    checkKeys('TCPStore.wait', keys);
    const timeoutMs = checkTimeout('TCPStore.wait', options.timeoutMs ?? this.timeoutMs);
    const reply = await this.request(Op.WAIT, [{ u32: keys.length }, ...keys.map((k) => ({ bytes: k })), { i64: timeoutMs }]);
    if (reply.status === Status.TIMEOUT) {
      throw waitTimeoutError('TCPStore.wait', await this.missingKeys(keys), timeoutMs);
    }
    this.expectOk('TCPStore.wait', reply);
  }

  private async missingKeys(keys: string[]): Promise<string[]> {
    const missing: string[] = [];
    for (const k of keys) if (!(await this.check([k]))) missing.push(k);
    return missing;
  }

  async check(keys: string[]): Promise<boolean> {
    checkKeys('TCPStore.check', keys);
    const reply = await this.request(Op.CHECK, [{ u32: keys.length }, ...keys.map((k) => ({ bytes: k }))]);
    return this.expectOk('TCPStore.check', reply).u8() === 1;
  }

  async numKeys(): Promise<number> {
    return Number(this.expectOk('TCPStore.numKeys', await this.request(Op.NUMKEYS)).i64());
  }

  async keys(prefix = ''): Promise<string[]> {
    checkKey('TCPStore.keys', prefix);
    const r = this.expectOk('TCPStore.keys', await this.request(Op.KEYS, [{ bytes: prefix }]));
    const n = r.u32();
    const keys: string[] = [];
    for (let i = 0; i < n; i++) keys.push(decoder.decode(r.bytes()));
    return keys;
  }

  async close(): Promise<void> {
    if (!this.failure) this.fail(new StateError(`the store client for ${this.address} was closed`, 'TCPStore.close'));
  }
}

/**
 * A namespaced view of a store: every key is `<prefix>/<key>` underneath. Closing the view closes the
 * store only when the view owns it (`ownsStore`), so several views can share one connection.
 */
export class PrefixStore implements Store {
  /**
   * @param store The underlying store.
   * @param prefix Prepended to every key as `<prefix>/`.
   * @param ownsStore Whether close() also closes `store` (default false).
   */
  constructor(
    readonly store: Store,
    readonly prefix: string,
    readonly ownsStore = false,
  ) {
    checkKey('PrefixStore', prefix);
  }

  private k(key: string): string {
    return `${this.prefix}/${key}`;
  }

  set(key: string, value: StoreValue): Promise<void> {
    return this.store.set(this.k(key), value);
  }
  get(key: string, options?: StoreWaitOptions): Promise<Uint8Array> {
    return this.store.get(this.k(key), options);
  }
  getString(key: string, options?: StoreWaitOptions): Promise<string> {
    return this.store.getString(this.k(key), options);
  }
  tryGet(key: string): Promise<Uint8Array | undefined> {
    return this.store.tryGet(this.k(key));
  }
  add(key: string, delta: number): Promise<number> {
    return this.store.add(this.k(key), delta);
  }
  compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array> {
    return this.store.compareSet(this.k(key), expected, desired);
  }
  delete(key: string): Promise<boolean> {
    return this.store.delete(this.k(key));
  }
  wait(keys: string[], options?: StoreWaitOptions): Promise<void> {
    return this.store.wait(keys.map((k) => this.k(k)), options);
  }
  check(keys: string[]): Promise<boolean> {
    return this.store.check(keys.map((k) => this.k(k)));
  }
  async numKeys(): Promise<number> {
    return (await this.keys()).length;
  }
  async keys(prefix = ''): Promise<string[]> {
    const strip = this.prefix.length + 1;
    return (await this.store.keys(this.k(prefix))).map((k) => k.slice(strip));
  }
  async close(): Promise<void> {
    if (this.ownsStore) await this.store.close();
  }
}

/**
 * Connects to the store a URL names: `tcp://host:port` (a StoreServer; `options.token` or
 * NODETRON_STORE_TOKEN is the job token) or `redis://[[user]:password@]host:port` (a Redis server,
 * for jobs too large for one process to serve; the password and user go to Redis's AUTH).
 */
export async function createStore(url: string, options: { timeoutMs?: number; token?: string } = {}): Promise<Store> {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new ArgumentError(`createStore: ${JSON.stringify(url)} is not a URL (expected tcp://host:port or redis://host:port)`);
  }
  const host = parsed.hostname.replace(/^\[(.*)\]$/, '$1');
  // redis://[user]:password@host:port: Redis's own authentication (requirepass or an ACL user).
  const username = decodeURIComponent(parsed.username) || undefined;
  const password = decodeURIComponent(parsed.password) || undefined;
  const port = Number(parsed.port);
  if (!host || !parsed.port || !Number.isInteger(port)) {
    throw new ArgumentError(`createStore: ${JSON.stringify(url)} must name a host and a port`);
  }
  switch (parsed.protocol) {
    case 'tcp:':
      return TCPStore.connect({ host, port, timeoutMs: options.timeoutMs, ...(options.token !== undefined ? { token: options.token } : {}) });
    case 'redis:':
      return RedisStore.connect({ host, port, timeoutMs: options.timeoutMs, ...(password !== undefined ? { token: password } : {}), ...(username ? { username } : {}) });
    default:
      throw new ArgumentError(`createStore: unsupported scheme ${JSON.stringify(parsed.protocol)} in ${JSON.stringify(url)} (tcp: or redis:)`);
  }
}
