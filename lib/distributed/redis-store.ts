// An optional Store backed by a Redis server, through a minimal RESP2 client on node:net: for jobs
// too large for the launcher's own StoreServer, or where a Redis service already exists.
import type { Socket } from 'node:net';
import { ArgumentError, CommError, StateError } from '../errors.js';
import {
  checkKey, checkKeys, checkTimeout, checkValue, connectWithRetry, resolveConnectOptions, getTimeoutError, sleep, SocketStoreClient, StoreAuthError,
  waitTimeoutError, type Store, type StoreConnectOptions, type StoreValue, type StoreWaitOptions,
} from './store-api.js';
import { toBytes } from './store-wire.js';

/** A decoded RESP reply: simple strings and bulk strings as bytes, nil as null, errors as RedisReplyError. */
type RespValue = Buffer | number | null | RespValue[] | RedisReplyError;

class RedisReplyError {
  constructor(readonly message: string) {}
}

/** Parses one RESP value at `at`; undefined when the buffer does not hold all of it yet. */
function parseResp(buf: Buffer, at: number): { value: RespValue; end: number } | undefined {
  const lineEnd = buf.indexOf('\r\n', at);
  if (lineEnd < 0) return undefined;
  const type = String.fromCharCode(buf[at]!);
  const line = buf.toString('latin1', at + 1, lineEnd);
  const next = lineEnd + 2;
  switch (type) {
    case '+':
      return { value: Buffer.from(line, 'latin1'), end: next };
    case '-':
      return { value: new RedisReplyError(line), end: next };
    case ':':
      return { value: Number(line), end: next };
    case '$': {
      const n = Number(line);
      if (n < 0) return { value: null, end: next };
      if (buf.length < next + n + 2) return undefined;
      return { value: buf.subarray(next, next + n), end: next + n + 2 };
    }
    case '*': {
      const n = Number(line);
      if (n < 0) return { value: null, end: next };
      const items: RespValue[] = [];
      let end = next;
      for (let i = 0; i < n; i++) {
        const item = parseResp(buf, end);
        if (!item) return undefined;
        items.push(item.value);
        end = item.end;
      }
      return { value: items, end };
    }
    default:
      throw new CommError(`redis sent an unknown RESP type byte ${JSON.stringify(type)}`, 'RedisStore');
  }
}

function encodeCommand(args: (string | number | Uint8Array)[]): Buffer {
  const parts: Buffer[] = [Buffer.from(`*${args.length}\r\n`)];
  for (const a of args) {
    const b = Buffer.from(typeof a === 'number' ? String(a) : toBytes(a));
    parts.push(Buffer.from(`$${b.length}\r\n`), b, Buffer.from('\r\n'));
  }
  return Buffer.concat(parts);
}

// Compare-and-set must read and write in one step: a Lua script runs atomically inside Redis.
const COMPARE_SET_LUA = `
local current = redis.call('GET', KEYS[1])
if (current == false and ARGV[1] == '') or current == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return ARGV[2]
end
if current == false then return '' end
return current`;

// Blocking get/wait poll with backoff: it needs no keyspace notifications or extra connections, so
// it works against any Redis, and rendezvous traffic is small.
const POLL_FIRST_MS = 2;
const POLL_MAX_MS = 100;

const decoder = new TextDecoder();

export class RedisStore extends SocketStoreClient<RespValue> implements Store {
  private received: Buffer = Buffer.alloc(0);

  private constructor(socket: Socket, host: string, port: number, timeoutMs: number) {
    super(socket, host, port, timeoutMs, 'redis', 'RedisStore');
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
  }

  /**
   * Connects (retrying until `timeoutMs` while Redis comes up), authenticates with Redis's own AUTH
   * when `options.token` (the password; `options.username` for an ACL user) is given, and checks it
   * answers PING. A refused password is a StoreAuthError at once. (The launcher's job token does not
   * apply to Redis: protect a Redis server with its requirepass / ACLs and a bind address.)
   */
  static async connect(options: StoreConnectOptions): Promise<RedisStore> {
    const { host, port, timeoutMs } = resolveConnectOptions('RedisStore.connect', options);
    const auth = options.token !== undefined ? (options.username ? ['AUTH', options.username, options.token] : ['AUTH', options.token]) : undefined;
    return connectWithRetry('redis store', host, port, timeoutMs, async (socket, remainingMs) => {
      const store = new RedisStore(socket, host, port, timeoutMs);
      let timer: NodeJS.Timeout | undefined;
      const timedOut = new Promise<never>((_, reject) => {
        timer = setTimeout(() => {
          const e = new CommError(`redis at ${store.address} did not answer PING within ${remainingMs} ms`, 'RedisStore.connect');
          store.fail(e);
          reject(e);
        }, remainingMs);
      });
      try {
        // A Redis error reply (not a lost connection) to AUTH or PING means the password is wrong or missing.
        const refused = (e: unknown, what: string): Error => {
          if (store.failure) return e as Error;
          const err = new StoreAuthError(`redis at ${store.address} refused ${what}: ${(e as Error).message}`, 'RedisStore.connect');
          store.fail(err);
          return err;
        };
        if (auth) await Promise.race([store.command('RedisStore.connect', auth), timedOut]).catch((e) => { throw refused(e, 'AUTH (check the password in the redis:// URL)'); });
        const pong = await Promise.race([store.command('RedisStore.connect', ['PING']), timedOut]).catch((e) => {
          throw /NOAUTH/.test((e as Error).message) ? refused(e, 'this client: it needs a password (redis://:password@host:port)') : e;
        });
        if (!(pong instanceof Buffer) || pong.toString() !== 'PONG') throw new CommError(`redis at ${store.address} did not answer PING with PONG`, 'RedisStore.connect');
      } finally {
        clearTimeout(timer);
      }
      return store;
    });
  }

  private onData(chunk: Buffer): void {
    this.received = this.received.length ? Buffer.concat([this.received, chunk]) : chunk;
    let at = 0;
    try {
      for (;;) {
        if (at >= this.received.length) break;
        const parsed = parseResp(this.received, at);
        if (!parsed) break;
        at = parsed.end;
        const p = this.pending.shift();
        if (!p) throw new CommError(`redis at ${this.address} sent a reply nobody asked for`, 'RedisStore');
        p.resolve(parsed.value);
      }
    } catch (e) {
      this.fail(e as Error);
      return;
    }
    this.received = this.received.subarray(at);
  }

  /** Sends one command; a Redis error reply becomes a CommError naming `call`. */
  private async command(call: string, args: (string | number | Uint8Array)[]): Promise<Exclude<RespValue, RedisReplyError>> {
    if (this.failure) throw this.failure;
    const reply = await new Promise<RespValue>((resolve, reject) => {
      this.pending.push({ resolve, reject });
      this.socket.write(encodeCommand(args));
    });
    if (reply instanceof RedisReplyError) throw new CommError(`${call} failed at redis ${this.address}: ${reply.message}`, call);
    return reply;
  }

  /** Polls `ready` with backoff until it returns true or `timeoutMs` passes; returns whether it did. */
  private async poll(timeoutMs: number, ready: () => Promise<boolean>): Promise<boolean> {
    const deadline = Date.now() + timeoutMs;
    let delayMs = POLL_FIRST_MS;
    for (;;) {
      if (await ready()) return true;
      const leftMs = deadline - Date.now();
      if (leftMs <= 0) return false;
      await sleep(Math.min(delayMs, leftMs));
      delayMs = Math.min(delayMs * 2, POLL_MAX_MS);
    }
  }

  async set(key: string, value: StoreValue): Promise<void> {
    checkKey('RedisStore.set', key);
    await this.command('RedisStore.set', ['SET', key, checkValue('RedisStore.set', value)]);
  }

  async tryGet(key: string): Promise<Uint8Array | undefined> {
    checkKey('RedisStore.tryGet', key);
    const v = await this.command('RedisStore.tryGet', ['GET', key]);
    return v instanceof Buffer ? new Uint8Array(v) : undefined;
  }

  async get(key: string, options: StoreWaitOptions = {}): Promise<Uint8Array> {
    checkKey('RedisStore.get', key);
    const timeoutMs = checkTimeout('RedisStore.get', options.timeoutMs ?? this.timeoutMs);
    let value: Uint8Array | undefined;
    const found = await this.poll(timeoutMs, async () => (value = await this.tryGet(key)) !== undefined);
    if (!found) throw getTimeoutError('RedisStore.get', key, timeoutMs);
    return value!;
  }

  async getString(key: string, options?: StoreWaitOptions): Promise<string> {
    return decoder.decode(await this.get(key, options));
  }

  async add(key: string, delta: number): Promise<number> {
    checkKey('RedisStore.add', key);
    if (!Number.isSafeInteger(delta)) throw new ArgumentError(`RedisStore.add: delta must be a safe integer, got ${delta}`);
    return (await this.command('RedisStore.add', ['INCRBY', key, delta])) as number;
  }

  async compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array> {
    checkKey('RedisStore.compareSet', key);
    const args = [checkValue('RedisStore.compareSet', expected), checkValue('RedisStore.compareSet', desired)];
    const v = await this.command('RedisStore.compareSet', ['EVAL', COMPARE_SET_LUA, 1, key, ...args]);
    return new Uint8Array(v as Buffer);
  }

  async delete(key: string): Promise<boolean> {
    checkKey('RedisStore.delete', key);
    return (await this.command('RedisStore.delete', ['DEL', key])) === 1;
  }

  async check(keys: string[]): Promise<boolean> {
    checkKeys('RedisStore.check', keys);
    if (keys.length === 0) return true;
    // EXISTS counts a key once per mention, so duplicates are folded first.
    const unique = [...new Set(keys)];
    return (await this.command('RedisStore.check', ['EXISTS', ...unique])) === unique.length;
  }

  async wait(keys: string[], options: StoreWaitOptions = {}): Promise<void> {
    checkKeys('RedisStore.wait', keys);
    const timeoutMs = checkTimeout('RedisStore.wait', options.timeoutMs ?? this.timeoutMs);
    if (await this.poll(timeoutMs, () => this.check(keys))) return;
    const missing: string[] = [];
    for (const k of keys) if (!(await this.check([k]))) missing.push(k);
    throw waitTimeoutError('RedisStore.wait', missing, timeoutMs);
  }

  /** Keys in the whole Redis database (Redis has no notion of the job; use a PrefixStore to count a job's keys). */
  async numKeys(): Promise<number> {
    return (await this.command('RedisStore.numKeys', ['DBSIZE'])) as number;
  }

  async keys(prefix = ''): Promise<string[]> {
    checkKey('RedisStore.keys', prefix);
    const pattern = prefix.replace(/[*?[\]\\]/g, (c) => `\\${c}`) + '*';
    const keys: string[] = [];
    let cursor = '0';
    do {
      const reply = (await this.command('RedisStore.keys', ['SCAN', cursor, 'MATCH', pattern, 'COUNT', 1000])) as [Buffer, Buffer[]];
      cursor = reply[0].toString();
      for (const k of reply[1]) keys.push(decoder.decode(k));
    } while (cursor !== '0');
    return [...new Set(keys)];
  }

  async close(): Promise<void> {
    if (!this.failure) this.fail(new StateError(`the redis store client for ${this.address} was closed`, 'RedisStore.close'));
  }
}
