// The image holder of in-job recovery (issue #37): an in-memory server, run inside the launcher's
// agent, that keeps each rank's newest state images (lib/ckpt/image.ts) sent by the workers of
// another node, and the client the workers use to put them after every step and a replacement uses
// to get its lost rank's image back. TCP, one request per frame: a 4-byte little-endian length, a
// JSON header, then `bytes` payload bytes when the header says (docs: the holder protocol of the
// in-job recovery contract). node:net only.
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, connect as netConnect, type Server, type Socket } from 'node:net';
import { constants as bufferConstants } from 'node:buffer';
import { ArgumentError, CommError, TimeoutError } from '../errors.js';

/** Largest JSON header of a frame, either way. */
export const HOLDER_MAX_HEADER_BYTES = 64 << 10;
/** Default cap on one image's payload (ImageHolderOptions.maxImageBytes). */
export const DEFAULT_HOLDER_MAX_IMAGE_BYTES = 16 * 2 ** 30;
/** Default request timeout of a HolderClient (ms), counted from the call. */
export const DEFAULT_HOLDER_TIMEOUT_MS = 60_000;
// How long a connection being closed after a refusal waits for its reply to be flushed.
const CLOSE_GRACE_MS = 5000;

/** Options of {@link ImageHolder.start}. */
export interface ImageHolderOptions {
  /** Interface to listen on; default 127.0.0.1 (the node's address for a multi-node job). */
  host?: string;
  /** Port; 0 (the default) lets the OS choose one, read back from `.port`. */
  port?: number;
  /** The job token every request must carry (NODETRON_STORE_TOKEN); undefined: none is checked. */
  token?: string;
  /** How many of each rank's newest steps are kept (default 2). */
  keep?: number;
  /** Largest payload of one put (default 16 GiB); a larger one is refused and its connection closed. */
  maxImageBytes?: number;
  /** Receives one line per refused request or broken connection (never per put). */
  log?: (line: string) => void;
}

/** One stored image: the payload as the chunks it was received in (Buffers the holder owns). */
interface Image {
  step: number;
  generation: number;
  bytes: number;
  parts: Buffer[];
}

/** A rank's images, ascending by step, and the newest generation that put one. */
interface RankImages {
  images: Image[];
  generation: number;
}

/** The put whose payload a connection is receiving. */
interface Receiving {
  rank: number;
  step: number;
  generation: number;
  total: number;
  received: number;
  /** The payload's pieces received so far; none when the payload is discarded. */
  parts: Buffer[];
  /** The staging Buffer small pieces are gathered in (the last of parts), and how much of it is filled. */
  stage?: Buffer;
  staged?: number;
  /** Why the payload is read and dropped instead of stored (a refused put whose framing is intact). */
  discard?: string;
}

// Pieces of at least SMALL_PIECE bytes are kept as they arrived; smaller ones (a slow link's reads) are
// gathered into staging Buffers of up to STAGE_BYTES, so that no piece costs more bookkeeping than bytes
// (a stage never reaches past the payload's end, so the last one ends full).
const SMALL_PIECE = 16 << 10;
const STAGE_BYTES = 256 << 10;

/** Adds a received piece of a put's payload to its parts. */
function keepPiece(put: Receiving, piece: Buffer): void {
  if (piece.length >= SMALL_PIECE) {
    sealStage(put);
    put.parts.push(piece);
    return;
  }
  if (put.stage && put.staged! + piece.length > put.stage.length) sealStage(put);
  if (!put.stage) {
    put.stage = Buffer.allocUnsafeSlow(Math.max(piece.length, Math.min(STAGE_BYTES, put.total - put.received)));
    put.staged = 0;
    put.parts.push(put.stage);
  }
  piece.copy(put.stage, put.staged);
  put.staged! += piece.length;
}

/** Ends a put's staging Buffer at what it holds (copied out when that is under half of it). */
function sealStage(put: Receiving): void {
  if (!put.stage) return;
  const used = put.stage.subarray(0, put.staged);
  put.parts[put.parts.length - 1] = put.staged! * 2 < put.stage.length ? Buffer.from(used) : used;
  put.stage = undefined;
}

const digest = (token: string): Buffer => createHash('sha256').update(token).digest();

/** A whole frame: length, JSON header. */
function frame(header: object): Buffer {
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const out = Buffer.allocUnsafe(4 + json.length);
  out.writeUInt32LE(json.length, 0);
  json.copy(out, 4);
  return out;
}

const isCount = (v: unknown): v is number => typeof v === 'number' && Number.isSafeInteger(v) && v >= 0;

/** Reads frames' length prefixes and JSON headers out of a byte stream; the caller reads payloads. */
class HeaderReader {
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

/** The first field of `names` that is not an integer >= 0, as a refusal message; undefined when all are. */
function badField(req: Record<string, unknown>, names: string[]): string | undefined {
  for (const n of names) if (!isCount(req[n])) return `${n} must be an integer >= 0, got ${JSON.stringify(req[n]) ?? 'nothing'}`;
  return undefined;
}

/**
 * The in-memory image server of in-job recovery. The launcher's agent of node (n+1) mod nnodes runs
 * the one that keeps node n's ranks' images. Per rank it keeps the images of the newest `keep` steps;
 * a put of step s first drops that rank's images of steps >= s (a rank that rolled back replaces what
 * it had after the rollback), and is refused when its generation is older than one the rank already
 * put with (a zombie of a replaced process). A put is stored only once its whole payload has arrived:
 * a connection lost mid-payload leaves the rank's images as they were. While a put arrives, its rank
 * holds up to keep + 1 images. Every refusal answers `{ok:false,error}`; nothing a client sends
 * throws out of the server.
 */
export class ImageHolder {
  private readonly ranks = new Map<number, RankImages>();
  private readonly sockets = new Set<Socket>();
  private closed = false;
  private held = 0;
  private arriving = 0;

  private constructor(
    private readonly server: Server,
    /** The interface it listens on. */
    readonly host: string,
    /** The port it listens on. */
    readonly port: number,
    /** How many of each rank's newest steps it keeps. */
    readonly keep: number,
    /** Largest payload of one put. */
    readonly maxImageBytes: number,
    private readonly tokenDigest: Buffer | undefined,
    private readonly log: (line: string) => void,
  ) {}

  /** Starts listening; resolves once the port is bound. CommError when it cannot bind, ArgumentError for a bad option. */
  static async start(options: ImageHolderOptions = {}): Promise<ImageHolder> {
    const host = options.host ?? '127.0.0.1';
    const port = options.port ?? 0;
    const keep = options.keep ?? 2;
    const cap = options.maxImageBytes ?? DEFAULT_HOLDER_MAX_IMAGE_BYTES;
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ArgumentError(`ImageHolder.start: port must be an integer in [0, 65535], got ${port}`);
    if (!Number.isSafeInteger(keep) || keep < 1) throw new ArgumentError(`ImageHolder.start: keep must be an integer >= 1, got ${keep}`);
    if (!Number.isSafeInteger(cap) || cap < 0) throw new ArgumentError(`ImageHolder.start: maxImageBytes must be an integer >= 0, got ${cap}`);
    if (options.token !== undefined && (typeof options.token !== 'string' || options.token === '')) {
      throw new ArgumentError('ImageHolder.start: token must be a non-empty string (or undefined for none)');
    }
    let holder: ImageHolder | undefined;
    const server = createServer({ noDelay: true }, (socket) => holder!.serve(socket));
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e: NodeJS.ErrnoException) => reject(new CommError(`the image holder could not listen on ${host}:${port}: ${e.code ?? e.message}`, 'ImageHolder.start')));
      server.listen(port, host, () => resolve());
    });
    // A failed accept (EMFILE, ...) must not become an unhandled 'error' that ends the agent.
    server.on('error', () => {});
    const address = server.address();
    const bound = typeof address === 'object' && address ? address.port : port;
    holder = new ImageHolder(server, host, bound, keep, cap, options.token === undefined ? undefined : digest(options.token), options.log ?? (() => {}));
    return holder;
  }

  /** `host:port`, what NODETRON_HOLDER carries (an IPv6 host in brackets). */
  get address(): string { return `${this.host.includes(':') ? `[${this.host}]` : this.host}:${this.port}`; }

  /** Bytes of the images held (the payloads; headers and bookkeeping not counted). */
  get bytesHeld(): number { return this.held; }

  /** Bytes of puts being received and not stored yet. */
  get bytesArriving(): number { return this.arriving; }

  /** Number of open connections. */
  get connections(): number { return this.sockets.size; }

  /** The steps held for `rank`, ascending. */
  steps(rank: number): number[] {
    return (this.ranks.get(rank)?.images ?? []).map((i) => i.step);
  }

  /** Forgets `rank`'s images (its generation floor stays, so an old process cannot put again). */
  drop(rank: number): void {
    const r = this.ranks.get(rank);
    if (!r) return;
    for (const i of r.images) this.held -= i.bytes;
    r.images = [];
  }

  /** Stops listening and drops every connection and every image. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const s of this.sockets) s.destroy();
    this.ranks.clear();
    this.held = 0;
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Stores a fully received put; the error message when it is refused. */
  private store(put: Receiving): string | undefined {
    let r = this.ranks.get(put.rank);
    if (r && put.generation < r.generation) {
      return `stale generation: rank ${put.rank} already put images in generation ${r.generation}, this put is of generation ${put.generation}`;
    }
    if (!r) this.ranks.set(put.rank, (r = { images: [], generation: put.generation }));
    r.generation = put.generation;
    const kept: Image[] = [];
    for (const i of r.images) {
      if (i.step >= put.step) this.held -= i.bytes;
      else kept.push(i);
    }
    kept.push({ step: put.step, generation: put.generation, bytes: put.total, parts: put.parts });
    this.held += put.total;
    while (kept.length > this.keep) this.held -= kept.shift()!.bytes;
    r.images = kept;
    return undefined;
  }

  // ---- one connection: requests are answered in order, a put's payload is kept in the chunks it arrives in ----
  private serve(socket: Socket): void {
    if (this.closed) return void socket.destroy();
    this.sockets.add(socket);
    socket.setKeepAlive(true, 10_000);
    const peer = `${socket.remoteAddress}:${socket.remotePort}`;
    const frames = new HeaderReader();
    let receiving: Receiving | undefined;
    let closing = false;

    const dropReceiving = (): void => {
      if (!receiving) return;
      this.arriving -= receiving.received;
      receiving = undefined;
    };
    socket.on('error', () => socket.destroy());
    socket.on('close', () => {
      this.sockets.delete(socket);
      if (receiving && !receiving.discard) {
        this.log(`image holder ${this.address}: connection from ${peer} closed mid-put (rank ${receiving.rank}, step ${receiving.step}: ` +
          `${receiving.received} of ${receiving.total} bytes); nothing stored`);
      }
      dropReceiving();
    });
    const reply = (h: object): void => {
      if (!socket.destroyed) socket.write(frame(h));
    };
    // Answers with an error and closes: the stream cannot be trusted past this frame.
    const refuseAndClose = (error: string): void => {
      this.log(`image holder ${this.address}: closing the connection from ${peer}: ${error}`);
      reply({ ok: false, error });
      closing = true;
      dropReceiving();
      socket.end();
      setTimeout(() => socket.destroy(), CLOSE_GRACE_MS).unref();
    };
    const refuse = (error: string): void => {
      this.log(`image holder ${this.address}: refused a request from ${peer}: ${error}`);
      reply({ ok: false, error });
    };

    const finishPut = (): void => {
      const put = receiving!;
      this.arriving -= put.total;
      receiving = undefined;
      const error = put.discard ?? this.store(put);
      if (error === undefined) reply({ ok: true });
      else refuse(`put(rank ${put.rank}, step ${put.step}) refused: ${error}`);
    };

    const handle = (raw: Buffer): void => {
      let req: unknown;
      try {
        req = JSON.parse(raw.toString('utf8'));
      } catch {
        return refuseAndClose('malformed request: the header is not JSON');
      }
      if (typeof req !== 'object' || req === null || Array.isArray(req)) return refuseAndClose('malformed request: the header is not a JSON object');
      const r = req as Record<string, unknown>;
      if (this.tokenDigest) {
        const t = r.token;
        if (typeof t !== 'string' || !timingSafeEqual(digest(t), this.tokenDigest)) return refuseAndClose('bad token');
      }
      if (r.op === 'put') {
        if (!isCount(r.bytes)) return refuseAndClose(`malformed put: bytes must be an integer >= 0, got ${JSON.stringify(r.bytes) ?? 'nothing'}`);
        if (r.bytes > this.maxImageBytes) return refuseAndClose(`put of ${r.bytes} bytes exceeds the holder's cap of ${this.maxImageBytes} bytes`);
        const bad = badField(r, ['rank', 'step', 'generation']);
        const put: Receiving = {
          rank: bad ? -1 : (r.rank as number), step: bad ? -1 : (r.step as number), generation: bad ? -1 : (r.generation as number),
          total: r.bytes, received: 0, parts: [], ...(bad ? { discard: `malformed put: ${bad}` } : {}),
        };
        receiving = put;
        if (put.total === 0) finishPut();
        return;
      }
      if (r.bytes !== undefined) return refuseAndClose(`malformed request: op ${JSON.stringify(r.op)} carries no payload, but the header says bytes`);
      if (r.op === 'list') {
        const bad = badField(r, ['rank']);
        if (bad) return refuse(`malformed list: ${bad}`);
        return reply({ ok: true, steps: this.steps(r.rank as number) });
      }
      if (r.op === 'get') {
        const bad = badField(r, ['rank', 'step']);
        if (bad) return refuse(`malformed get: ${bad}`);
        const image = this.ranks.get(r.rank as number)?.images.find((i) => i.step === r.step);
        if (!image) return refuse(`get: no image of rank ${r.rank as number} at step ${r.step as number} (held: [${this.steps(r.rank as number).join(', ')}])`);
        // The stored chunks go to the socket as they are (one writev); a later put that drops them does not touch them.
        socket.cork();
        reply({ ok: true, bytes: image.bytes, generation: image.generation });
        for (const part of image.parts) socket.write(part);
        socket.uncork();
        return;
      }
      refuse(`unknown op ${JSON.stringify(r.op) ?? 'nothing'} (the holder knows put, list, get)`);
    };

    socket.on('data', (chunk: Buffer) => {
      let at = 0;
      while (at < chunk.length && !closing) {
        if (receiving) {
          const put = receiving;
          const k = Math.min(put.total - put.received, chunk.length - at);
          // A large piece is kept as received (Node gives each read its own exactly sized memory): no copy.
          if (!put.discard) keepPiece(put, k === chunk.length ? chunk : chunk.subarray(at, at + k));
          put.received += k;
          this.arriving += k;
          at += k;
          if (put.received === put.total) finishPut();
          continue;
        }
        const got = frames.take(chunk, at);
        at = got.at;
        if (got.error) return refuseAndClose(got.error);
        if (got.header) handle(got.header);
      }
    });
  }
}

/** Options of {@link HolderClient.connect}. */
export interface HolderClientOptions {
  /** The job token (NODETRON_STORE_TOKEN), when the holder checks one. */
  token?: string;
  /** Time for the connection, and for each request from its call to its reply (default DEFAULT_HOLDER_TIMEOUT_MS). */
  timeoutMs?: number;
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

/**
 * A worker's connection to its image holder. Requests are pipelined in order on one connection and
 * answered in order. A put writes its header, then the caller's bytes as they are (no copy): the caller
 * must not change them until the put resolves. Errors name the holder and the op: CommError when the
 * connection is lost or the holder refuses, TimeoutError when a request is not answered in time (the
 * connection is then abandoned). After a failure every later call fails with CommError at once.
 */
export class HolderClient {
  private readonly pending: Pending[] = [];
  private failure: string | undefined;
  // Reading replies: the length, the header, then a get's payload.
  private readonly frames = new HeaderReader();
  private body: { buf: Buffer; have: number; reply: Record<string, unknown> } | undefined;

  private constructor(
    private readonly socket: Socket,
    /** `host:port` of the holder. */ readonly address: string,
    private readonly token: string | undefined,
    /** Time for each request from its call to its reply (ms). */ readonly timeoutMs: number,
  ) {
    socket.on('data', (chunk: Buffer) => this.onData(chunk));
    socket.on('error', (e: NodeJS.ErrnoException) => this.fail(`the connection failed (${e.code ?? e.message})`));
    socket.on('close', () => this.fail('the connection was lost'));
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
    const deadline = Date.now() + timeoutMs;
    let backoff = 20;
    let last = 'no attempt made';
    for (;;) {
      const socket = await new Promise<Socket | undefined>((resolve) => {
        const s = netConnect({ host, port, noDelay: true });
        const timer = setTimeout(() => { last = 'ETIMEDOUT'; s.destroy(); resolve(undefined); }, Math.max(deadline - Date.now(), 1));
        s.once('connect', () => { clearTimeout(timer); s.removeAllListeners('error'); resolve(s); });
        s.once('error', (e: NodeJS.ErrnoException) => { clearTimeout(timer); last = e.code ?? e.message; s.destroy(); resolve(undefined); });
      });
      if (socket) {
        const client = new HolderClient(socket, `${host.includes(':') ? `[${host}]` : host}:${port}`, options.token, timeoutMs);
        try {
          await client.list(0);
        } catch (e) {
          client.socket.destroy();
          throw e;
        }
        return client;
      }
      if (Date.now() + backoff >= deadline) break;
      await new Promise((r) => setTimeout(r, backoff));
      backoff = Math.min(backoff * 2, 500);
    }
    throw new CommError(`could not reach the image holder at ${address} within ${timeoutMs} ms (last error: ${last})`, 'HolderClient.connect');
  }

  /** Whether the connection has failed or was closed (every call then fails). */
  get broken(): boolean { return this.failure !== undefined; }

  /**
   * Sends `bytes` as rank's image of `step` (taken in `generation`); resolves once the holder has stored
   * it. The header and the bytes are handed to the socket before put returns; do not change them until then.
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
    await this.request(`put(rank ${rank}, step ${step}, ${n} bytes)`, header, false, pieces);
  }

  /** The steps the holder has for `rank`, ascending. */
  async list(rank: number): Promise<number[]> {
    checkCount('HolderClient.list', 'rank', rank);
    const { reply } = await this.request(`list(rank ${rank})`, { op: 'list', rank }, false);
    const steps = reply.steps;
    if (!Array.isArray(steps) || !steps.every(isCount)) throw this.fail(`it answered list(rank ${rank}) with a malformed reply`);
    return steps as number[];
  }

  /** Rank's image of `step`; CommError when the holder has none. */
  async get(rank: number, step: number): Promise<Uint8Array> {
    checkCount('HolderClient.get', 'rank', rank);
    checkCount('HolderClient.get', 'step', step);
    const { payload } = await this.request(`get(rank ${rank}, step ${step})`, { op: 'get', rank, step }, true);
    return payload!;
  }

  /** Closes the connection; requests still pending fail with CommError. */
  async close(): Promise<void> {
    if (this.socket.destroyed) return;
    const closed = new Promise<void>((resolve) => this.socket.once('close', () => resolve()));
    this.fail('the client closed the connection');
    await closed;
  }

  private request(what: string, header: Record<string, unknown>, payload: boolean, bytes?: readonly Uint8Array[]): Promise<{ reply: Record<string, unknown>; payload: Buffer | undefined }> {
    if (this.failure) return Promise.reject(new CommError(`image holder ${this.address}: ${what} failed: ${this.failure}`, 'HolderClient'));
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
   * the connection. Returns the CommError of the failure.
   */
  private fail(reason: string): CommError {
    if (!this.failure) this.failure = reason;
    for (const p of this.pending.splice(0)) {
      clearTimeout(p.timer);
      p.reject(new CommError(`image holder ${this.address}: ${p.what} failed: ${this.failure}`, 'HolderClient'));
    }
    this.body = undefined;
    this.socket.destroy();
    return new CommError(`image holder ${this.address}: ${this.failure}`, 'HolderClient');
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
