// `nodetron bench chaos --netns --net-delay MS`: network delay without the kernel's netem (this machine's
// kernel has none, nor fq or etf). Each node's namespace sends every new TCP connection to another node
// through a relay in the root namespace (nftables: `dnat` in the namespace's nat output chain to the
// relay's address on the bridge); the relay finds where the connection was going in that namespace's
// connection tracking table, connects there, and holds every chunk MS milliseconds in each direction, in
// order. So a round trip between two nodes takes 2 × MS longer; bandwidth is the relay's (one event
// loop). Connections within a node are not relayed. A half-close goes through after the data before it;
// a reset or error on one side resets the other; a destination that cannot be reached within
// CONNECT_TIMEOUT_MS resets the client (which saw its connect succeed at once: the relay accepted it).
import { execFile } from 'node:child_process';
import net from 'node:net';
import { StateError } from '../errors.js';

/** Where a relayed connection was going: its original destination. */
export interface Destination { address: string; port: number }

/**
 * The original destination of a connection from `client` that a namespace's nat rule sent to the relay
 * at port `relayPort`, from that namespace's /proc/net/nf_conntrack text (its line: the original tuple
 * `src=client dst=D sport=client.port dport=P`, then the reply tuple from the relay's port). Null when
 * no line matches.
 */
export function conntrackDestination(text: string, client: Destination, relayPort: number): Destination | null {
  for (const line of text.split('\n')) {
    const tuples = [...line.matchAll(/src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)/g)];
    if (tuples.length < 2) continue;
    const [orig, reply] = tuples as [RegExpMatchArray, RegExpMatchArray];
    if (orig[1] === client.address && Number(orig[3]) === client.port && Number(reply[3]) === relayPort && reply[2] === client.address) {
      return { address: orig[2]!, port: Number(orig[4]) };
    }
  }
  return null;
}

/** How many bytes a direction holds before it stops reading its source (resumed below half of it). */
const HOLD_LIMIT = 64 << 20;
/** How long the relay tries to reach a connection's destination before it resets the client. */
export const CONNECT_TIMEOUT_MS = 10_000;

/**
 * Forwards `from`'s bytes to `to`, each chunk `delayMs` after it arrived, in order; `to` ends when `from`
 * ended and everything held was written. Stops reading while more than HOLD_LIMIT bytes are held or
 * `to` is backed up. `count` is called with each chunk's size as it is written.
 */
export function delayPipe(from: net.Socket, to: net.Socket, delayMs: number, count: (bytes: number) => void = () => undefined): void {
  const held: Array<{ at: number; chunk: Buffer }> = [];
  let bytesHeld = 0, ended = false, timer: NodeJS.Timeout | null = null;
  const maybeResume = () => { if (from.isPaused() && bytesHeld < HOLD_LIMIT / 2 && !to.writableNeedDrain) from.resume(); };
  const pump = () => {
    timer = null;
    const now = performance.now();
    while (held.length > 0 && held[0]!.at <= now) {
      const { chunk } = held.shift()!;
      bytesHeld -= chunk.length;
      count(chunk.length);
      if (!to.destroyed) to.write(chunk);
    }
    if (held.length > 0) timer = setTimeout(pump, Math.max(1, held[0]!.at - now));
    else if (ended && !to.destroyed) to.end();
    maybeResume();
  };
  from.on('data', (chunk: Buffer) => {
    held.push({ at: performance.now() + delayMs, chunk });
    bytesHeld += chunk.length;
    if (!timer) timer = setTimeout(pump, Math.max(0, held[0]!.at - performance.now()));
    if (bytesHeld > HOLD_LIMIT || to.writableNeedDrain) from.pause();
  });
  to.on('drain', maybeResume);
  from.on('end', () => { ended = true; if (held.length === 0 && !timer && !to.destroyed) to.end(); });
  to.on('close', () => { if (timer) clearTimeout(timer); timer = null; held.length = 0; bytesHeld = 0; });
}

export interface DelayRelayOptions {
  /** The address to listen on (the bridge's, in the root namespace). */
  host: string;
  /** The port (0: any free one; see {@link DelayRelay.port}). */
  port?: number;
  delayMs: number;
  /** Where a connection from `client` was going (its namespace's conntrack table), or null. */
  destination(client: Destination, relayPort: number): Promise<Destination | null>;
  log?: (line: string) => void;
}

/** The relay: a TCP server that forwards each connection to its original destination with the delay. */
export class DelayRelay {
  connections = 0;
  /** Connections whose destination was not found, or which could not be opened. */
  failed = 0;
  /** Bytes forwarded, both directions, all connections. */
  bytes = 0;
  readonly #sockets = new Set<net.Socket>();
  private constructor(private readonly server: net.Server, readonly port: number, private readonly o: DelayRelayOptions) {}

  /** Listens (StateError when it cannot). */
  static async start(o: DelayRelayOptions): Promise<DelayRelay> {
    if (!(o.delayMs >= 0 && Number.isFinite(o.delayMs))) throw new StateError(`delay relay: the delay must be a finite number of ms >= 0, got ${o.delayMs}`);
    // (Half-open: a side's FIN is passed on after the data held before it, not taken as the end of both.)
    const server = net.createServer({ allowHalfOpen: true });
    await new Promise<void>((resolve, reject) => {
      server.once('error', (e) => reject(new StateError(`delay relay: cannot listen on ${o.host}:${o.port ?? 0}: ${e.message}`)));
      server.listen(o.port ?? 0, o.host, resolve);
    });
    const relay = new DelayRelay(server, (server.address() as net.AddressInfo).port, o);
    server.on('connection', (s) => relay.#accept(s));
    return relay;
  }

  #accept(client: net.Socket): void {
    this.#sockets.add(client);
    client.on('close', () => this.#sockets.delete(client));
    client.on('error', () => undefined);
    client.pause();
    const from = { address: (client.remoteAddress ?? '').replace(/^::ffff:/, ''), port: client.remotePort ?? 0 };
    void this.o.destination(from, this.port).catch(() => null).then((to) => {
      if (client.destroyed) return;
      if (!to) {
        this.failed++;
        this.o.log?.(`[delay relay] no original destination for a connection from ${from.address}:${from.port}; reset`);
        client.resetAndDestroy();
        return;
      }
      const up = net.connect({ host: to.address, port: to.port, allowHalfOpen: true });
      this.#sockets.add(up);
      let connected = false;
      const timeout = setTimeout(() => { if (!connected) up.destroy(new Error(`not reached within ${CONNECT_TIMEOUT_MS} ms`)); }, CONNECT_TIMEOUT_MS);
      // A reset or error on either side resets the other (a peer's abrupt end stays abrupt); a clean
      // close follows both directions' ends, each passed on by delayPipe.
      up.on('error', () => { if (!connected) this.failed++; if (!client.destroyed) client.resetAndDestroy(); });
      client.on('error', () => { if (!up.destroyed) up.resetAndDestroy(); });
      up.on('close', () => { clearTimeout(timeout); this.#sockets.delete(up); });
      up.once('connect', () => {
        connected = true;
        this.connections++;
        client.setNoDelay(true);
        up.setNoDelay(true);
        const count = (n: number) => { this.bytes += n; };
        delayPipe(client, up, this.o.delayMs, count);
        delayPipe(up, client, this.o.delayMs, count);
        client.resume();
      });
    });
  }

  /** Stops listening and closes every relayed connection. */
  async close(): Promise<void> {
    for (const s of this.#sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}

/**
 * The original destination of a connection relayed from one of `namespaces` (the one whose node has the
 * client's address, `addresses` in the same order), from that namespace's conntrack table.
 */
export function namespaceDestination(namespaces: readonly string[], addresses: readonly string[]): (client: Destination, relayPort: number) => Promise<Destination | null> {
  return (client, relayPort) => new Promise((resolve) => {
    const ns = namespaces[addresses.indexOf(client.address)];
    if (ns === undefined) { resolve(null); return; }
    execFile('ip', ['netns', 'exec', ns, 'cat', '/proc/net/nf_conntrack'], { maxBuffer: 64 << 20 }, (e, out) => resolve(e ? null : conntrackDestination(out, client, relayPort)));
  });
}
