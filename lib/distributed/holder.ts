// The image holder of in-job recovery (issue #37): an in-memory server, run inside the launcher's
// agent, that keeps each rank's newest state images (lib/ckpt/image.ts) sent by the workers of
// another node. The client the workers use to put them after every step and a replacement uses to
// get its lost rank's image back is HolderClient (lib/distributed/holder-client.ts, re-exported here).
// TCP, one request per frame: a 4-byte little-endian length, a JSON header, then `bytes` payload
// bytes when the header says (docs: the holder protocol of the in-job recovery contract). node:net only.
import { createHash, timingSafeEqual } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import { ArgumentError, CommError } from '../errors.js';
import { frame, HeaderReader, isCount } from './holder-client.js';

export {
  HolderClient, type HolderClientOptions, HOLDER_MAX_HEADER_BYTES, DEFAULT_HOLDER_TIMEOUT_MS, DEFAULT_HOLDER_RECONNECT_ATTEMPTS,
  DEFAULT_HOLDER_RECONNECT_TIMEOUT_MS,
} from './holder-client.js';

/** Default cap on one image's payload (ImageHolderOptions.maxImageBytes). */
export const DEFAULT_HOLDER_MAX_IMAGE_BYTES = 16 * 2 ** 30;
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

  /** The keys (ranks) with images held. */
  heldKeys(): number[] {
    return [...this.ranks].filter(([, r]) => r.images.length > 0).map(([k]) => k);
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
        if (r.limit !== undefined && !isCount(r.limit)) return refuse('malformed get: limit must be an integer >= 0');
        const image = this.ranks.get(r.rank as number)?.images.find((i) => i.step === r.step);
        if (!image) return refuse(`get: no image of rank ${r.rank as number} at step ${r.step as number} (held: [${this.steps(r.rank as number).join(', ')}])`);
        // The stored chunks go to the socket as they are (one writev); a later put that drops them does not touch them.
        // With a limit, only the image's first bytes (a reader's header).
        const bytes = r.limit === undefined ? image.bytes : Math.min(image.bytes, r.limit as number);
        socket.cork();
        reply({ ok: true, bytes, generation: image.generation });
        let left = bytes;
        for (const part of image.parts) {
          if (left <= 0) break;
          socket.write(part.byteLength <= left ? part : part.subarray(0, left));
          left -= part.byteLength;
        }
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

/**
 * The holder key of world rank `rank`'s images in the world that reshape generation `epoch` made (0:
 * the job's first world; in-job recovery's shrink and grow back, lib/train/shrink.ts).
 */
export function imageKey(epoch: number, rank: number): number {
  return epoch * 1_000_000 + rank;
}

/** The world (reshape generation) whose images `key` names. */
export function imageEpoch(key: number): number {
  return Math.floor(key / 1_000_000);
}
