// The Store interface every backend implements (TCP, Redis, prefix views), and what the backends
// share: argument checks, the default timeout and connecting with retries while the server comes up.
import { connect as netConnect, type Socket } from 'node:net';
import { ArgumentError, CommError, TimeoutError } from '../errors.js';

/** How long blocking calls (connect, get, wait) wait when no timeout is given: 5 minutes, as torch's store. */
export const DEFAULT_STORE_TIMEOUT_MS = 300_000;

/** A stored value: bytes, or a string stored as UTF-8. */
export type StoreValue = Uint8Array | string;

/** Options of blocking store reads (get, getString, wait). */
export interface StoreWaitOptions {
  /** How long to wait for missing keys; default: the store's timeout. */
  timeoutMs?: number;
}

/** A key-value store shared by every rank of a job. Keys are strings; values are bytes (strings are stored as UTF-8). */
export interface Store {
  /** Sets `key` to `value`, replacing any previous value (and waking ranks waiting for it). */
  set(key: string, value: StoreValue): Promise<void>;
  /** The value of `key`, waiting until it exists; TimeoutError naming the key after `timeoutMs`. */
  get(key: string, options?: StoreWaitOptions): Promise<Uint8Array>;
  /** `get` decoded as UTF-8. */
  getString(key: string, options?: StoreWaitOptions): Promise<string>;
  /** The value of `key` now, or undefined when it does not exist (never waits). */
  tryGet(key: string): Promise<Uint8Array | undefined>;
  /** Adds `delta` to the integer stored at `key` (missing = 0) atomically; returns the new value. */
  add(key: string, delta: number): Promise<number>;
  /** Sets `desired` iff the current value equals `expected` (or the key is missing and `expected` is empty); returns the value after the call. */
  compareSet(key: string, expected: StoreValue, desired: StoreValue): Promise<Uint8Array>;
  /** Deletes `key`; true when it existed. */
  delete(key: string): Promise<boolean>;
  /** Waits until every key exists; TimeoutError naming the missing keys after `timeoutMs`. */
  wait(keys: string[], options?: StoreWaitOptions): Promise<void>;
  /** Whether every key exists now. */
  check(keys: string[]): Promise<boolean>;
  /** Number of keys in the store (a PrefixStore counts its own). */
  numKeys(): Promise<number>;
  /** Keys starting with `prefix` (all keys when omitted). */
  keys(prefix?: string): Promise<string[]>;
  /** Releases the connection; pending calls fail with CommError. */
  close(): Promise<void>;
}

/** Where a store client connects. */
export interface StoreConnectOptions {
  /** Host of the store server (the master); default 127.0.0.1. */
  host?: string;
  /** Port of the store server. */
  port: number;
  /** How long to keep retrying the connection while the server comes up, and the default for get/wait. */
  timeoutMs?: number;
  /**
   * TCPStore: the job token presented in the connection's first frame (default: NODETRON_STORE_TOKEN,
   * when set). RedisStore: the password sent with AUTH (Redis's own authentication, `requirepass` or an ACL user).
   */
  token?: string;
  /** RedisStore: the ACL user name sent with AUTH (with `token` as its password). */
  username?: string;
}

/**
 * The rendezvous store could not listen because its address is taken (another job, or a previous run
 * still holding the port). The message is one line naming the address and what to do.
 */
export class AddressInUseError extends CommError {
  /**
   * @param host The interface the store tried to listen on.
   * @param port The port that is in use.
   */
  constructor(readonly host: string, readonly port: number) {
    super(
      `the rendezvous store cannot listen on ${host}:${port}: the port is already in use (another job or an earlier run holds it); ` +
        'choose another --master-port / MASTER_PORT, or stop the process that holds it',
      'StoreServer.start',
    );
  }
}

/** The store refused this client's job token (missing or wrong): retrying cannot help. */
export class StoreAuthError extends CommError {}

/** Whether a listen address reaches only this machine. */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host);
}

/** The error of a failed listen: AddressInUseError for a taken port, else a CommError with the system's code. */
export function listenError(e: NodeJS.ErrnoException, host: string, port: number): CommError {
  if (e.code === 'EADDRINUSE') return new AddressInUseError(host, port);
  return new CommError(`the rendezvous store could not listen on ${host}:${port}: ${e.code ?? e.message}`, 'StoreServer.start');
}

/** Checks a job token: a string of 16 to 256 bytes. Throws ArgumentError saying how to make one. */
export function checkToken(call: string, token: unknown): string {
  const bytes = typeof token === 'string' ? Buffer.byteLength(token) : -1;
  if (typeof token !== 'string' || token.length < 16 || bytes > 256) {
    throw new ArgumentError(
      `${call}: the job token must be a string of 16 to 256 bytes, got ${typeof token === 'string' ? `${token.length} characters` : typeof token}; ` +
        'make one with e.g. `openssl rand -hex 32` and export it as NODETRON_STORE_TOKEN on every node',
    );
  }
  return token;
}

/** The job token the environment gives (NODETRON_STORE_TOKEN), checked; undefined when unset or empty. */
export function tokenFromEnv(env: NodeJS.ProcessEnv = process.env): string | undefined {
  const token = env.NODETRON_STORE_TOKEN;
  if (token === undefined || token === '') return undefined;
  return checkToken('environment variable NODETRON_STORE_TOKEN', token);
}



/** A client's host (default 127.0.0.1), checked port and connection timeout (default DEFAULT_STORE_TIMEOUT_MS). */
export function resolveConnectOptions(call: string, options: StoreConnectOptions): { host: string; port: number; timeoutMs: number } {
  const port = options.port;
  if (!Number.isInteger(port) || port <= 0 || port > 65535) {
    throw new ArgumentError(`${call}: port must be an integer in [1, 65535], got ${port}`);
  }
  return { host: options.host ?? '127.0.0.1', port, timeoutMs: checkTimeout(call, options.timeoutMs ?? DEFAULT_STORE_TIMEOUT_MS) };
}

export function checkTimeout(call: string, timeoutMs: number): number {
  if (typeof timeoutMs !== 'number' || !(timeoutMs >= 0) || !Number.isFinite(timeoutMs)) {
    throw new ArgumentError(`${call}: timeoutMs must be a finite number >= 0, got ${timeoutMs}`);
  }
  return Math.floor(timeoutMs);
}

export function checkKey(call: string, key: unknown): string {
  if (typeof key !== 'string') throw new ArgumentError(`${call}: key must be a string, got ${typeof key}`);
  return key;
}

export function checkValue(call: string, value: unknown): StoreValue {
  if (typeof value !== 'string' && !(value instanceof Uint8Array)) {
    throw new ArgumentError(`${call}: value must be a string or Uint8Array, got ${value === null ? 'null' : typeof value}`);
  }
  return value;
}

export function checkKeys(call: string, keys: unknown): string[] {
  if (!Array.isArray(keys)) throw new ArgumentError(`${call}: keys must be an array of strings`);
  keys.forEach((k) => checkKey(call, k));
  return keys as string[];
}




function openSocket(host: string, port: number, timeoutMs: number): Promise<Socket> {
  return new Promise<Socket>((resolve, reject) => {
    const socket = netConnect({ host, port, noDelay: true });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(Object.assign(new Error('connect timed out'), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    socket.once('connect', () => {
      clearTimeout(timer);
      socket.removeAllListeners('error');
      resolve(socket);
    });
    socket.once('error', (e) => {
      clearTimeout(timer);
      socket.destroy();
      reject(e);
    });
  });
}


export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));


/**
 * What the socket store clients (TCPStore, RedisStore) share: one connection to host:port with requests
 * answered in order, and a first failure that rejects every pending request and ends the connection.
 * `peer` names the server in errors ('the rendezvous store', 'redis'), `call` the client class.
 */
export abstract class SocketStoreClient<Reply> {
  /** The requests sent and not yet answered, in order. */
  protected readonly pending: {
    /** Settles the request with the server's reply. */
    resolve(reply: Reply): void;
    /** Fails the request. */
    reject(error: Error): void;
  }[] = [];
  /** The first connection failure; later requests fail with it. */
  protected failure: Error | undefined;

  /**
   * @param socket The connection to the server.
   * @param host Host of the server.
   * @param port Port of the server.
   * @param timeoutMs Default timeout of blocking calls (ms).
   * @param peer Names the server in errors.
   * @param call Names the client class in errors.
   */
  protected constructor(
    protected readonly socket: Socket,
    readonly host: string,
    readonly port: number,
    readonly timeoutMs: number,
    peer: string,
    call: string,
  ) {
    socket.on('error', (e: NodeJS.ErrnoException) =>
      this.fail(new CommError(`connection to ${peer} at ${this.address} failed: ${e.code ?? e.message}`, call)),
    );
    socket.on('close', () => this.fail(new CommError(`connection to ${peer} at ${this.address} was closed`, call)));
  }

  /** `host:port` of the server. */
  get address(): string {
    return `${this.host}:${this.port}`;
  }

  /** Records the first failure, rejects every pending request with it and closes the socket. */
  protected fail(error: Error): void {
    if (!this.failure) this.failure = error;
    for (const p of this.pending.splice(0)) p.reject(error);
    this.socket.destroy();
  }
}
/**
 * Opens a TCP connection to a store server and runs `handshake` on it, retrying with backoff until
 * `timeoutMs` has passed (ranks often start before the master listens). Throws CommError naming
 * `what`, host:port, the timeout and the last error.
 */
export async function connectWithRetry<T>(
  what: string,
  host: string,
  port: number,
  timeoutMs: number,
  handshake: (socket: Socket, remainingMs: number) => Promise<T>,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let backoffMs = 20;
  let lastError = 'no attempt made';
  for (;;) {
    try {
      const socket = await openSocket(host, port, Math.max(deadline - Date.now(), 1));
      // A handshake keeps a listener that does not speak the protocol (a wrong port) from hanging the caller.
      return await handshake(socket, Math.max(deadline - Date.now(), 1000));
    } catch (e) {
      // A refused token stays refused: fail at once with the server's reason.
      if (e instanceof StoreAuthError || e instanceof ArgumentError) throw e;
      lastError = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
    }
    if (Date.now() + backoffMs > deadline) break;
    await sleep(backoffMs);
    backoffMs = Math.min(backoffMs * 2, 500);
  }
  throw new CommError(
    `could not reach the ${what} at ${host}:${port} within ${timeoutMs} ms (last error: ${lastError}); ` +
      'is the master (node rank 0) running, and are MASTER_ADDR/MASTER_PORT (or the store URL) right?',
    'connect',
  );
}

/** The error of a get whose key did not appear in time (one wording for every backend). */
export function getTimeoutError(call: string, key: string, timeoutMs: number): TimeoutError {
  return new TimeoutError(`store get(${JSON.stringify(key)}) timed out after ${timeoutMs} ms: the key was not set`, call);
}

/** The error of a wait whose keys did not all appear in time, naming the ones still missing. */
export function waitTimeoutError(call: string, missing: string[], timeoutMs: number): TimeoutError {
  const names = missing.map((k) => JSON.stringify(k)).join(', ') || '(none by now)';
  return new TimeoutError(`store wait timed out after ${timeoutMs} ms; keys still missing: ${names}`, call);
}
