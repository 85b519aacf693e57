// `bench chaos --net-delay`'s relay (lib/bench/delay-relay.ts): the original destination read from a
// conntrack table, the delay each way (a round trip through the relay takes at least twice it), the bytes
// in order and whole, and a connection whose destination is unknown closed. On the loopback, with the
// destination given; the namespaces' rules that send connections to it are in chaos-netns.test.ts.
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { conntrackDestination, DelayRelay, type Destination } from '../../lib/bench/delay-relay.js';

const closers: Array<() => Promise<void> | void> = [];
afterEach(async () => { for (const c of closers.splice(0).reverse()) await c(); });

/** An echo server on the loopback. */
async function echo(): Promise<Destination> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((s) => { sockets.add(s); s.on('error', () => undefined); s.pipe(s); });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  closers.push(() => new Promise<void>((r) => { for (const s of sockets) s.destroy(); server.close(() => r()); }));
  return { address: '127.0.0.1', port: (server.address() as net.AddressInfo).port };
}

async function relayTo(to: Destination | null, delayMs: number): Promise<DelayRelay> {
  const relay = await DelayRelay.start({ host: '127.0.0.1', delayMs, destination: async () => to });
  closers.push(() => relay.close());
  return relay;
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => { const s = net.connect({ host: '127.0.0.1', port }, () => resolve(s)); s.once('error', reject); });
}

/** Sends `data` and reads back as many bytes; resolves with them and the ms from the first write to the first byte back. */
function roundTrip(s: net.Socket, data: Buffer): Promise<{ back: Buffer; firstMs: number }> {
  return new Promise((resolve, reject) => {
    const parts: Buffer[] = [];
    let got = 0, firstMs = -1;
    const t0 = performance.now();
    s.on('data', (c: Buffer) => {
      if (firstMs < 0) firstMs = performance.now() - t0;
      parts.push(c);
      got += c.length;
      if (got >= data.length) resolve({ back: Buffer.concat(parts), firstMs });
    });
    s.once('error', reject);
    s.write(data);
  });
}

describe('bench chaos --net-delay: the relay', () => {
  it("reads a relayed connection's original destination from the conntrack table, and nothing else", () => {
    const table = [
      'ipv4     2 tcp      6 117 TIME_WAIT src=10.9.8.1 dst=10.9.8.2 sport=40000 dport=29500 src=10.9.8.2 dst=10.9.8.1 sport=29500 dport=40000 [ASSURED] mark=0 zone=0 use=2',
      'ipv4     2 tcp      6 431999 ESTABLISHED src=10.9.8.1 dst=10.9.8.2 sport=59106 dport=9000 src=10.9.8.254 dst=10.9.8.1 sport=7777 dport=59106 [ASSURED] mark=0 zone=0 use=2',
      'ipv4     2 udp      17 29 src=10.9.8.1 dst=10.9.8.3 sport=5353 dport=5353 [UNREPLIED] src=10.9.8.3 dst=10.9.8.1 sport=5353 dport=5353 mark=0 zone=0 use=2',
    ].join('\n');
    expect(conntrackDestination(table, { address: '10.9.8.1', port: 59106 }, 7777)).toEqual({ address: '10.9.8.2', port: 9000 });
    // Another source port, a connection not sent to this relay's port, or nothing at all: no answer.
    expect(conntrackDestination(table, { address: '10.9.8.1', port: 59107 }, 7777)).toBeNull();
    expect(conntrackDestination(table, { address: '10.9.8.1', port: 40000 }, 7777)).toBeNull();
    expect(conntrackDestination(table, { address: '10.9.8.1', port: 59106 }, 7778)).toBeNull();
    expect(conntrackDestination('', { address: '10.9.8.1', port: 59106 }, 7777)).toBeNull();
  });

  it('holds every chunk the delay in each direction: a round trip takes at least twice it; the bytes come back whole and in order', async () => {
    const delayMs = 60;
    const relay = await relayTo(await echo(), delayMs);
    const s = await connect(relay.port);
    closers.push(() => { s.destroy(); });
    const small = await roundTrip(s, Buffer.from('ping'));
    expect(small.back.toString()).toBe('ping');
    // (Node's timers may fire up to a millisecond early; nothing makes them fire sooner.)
    expect(small.firstMs).toBeGreaterThanOrEqual(2 * delayMs - 2);
    s.removeAllListeners('data');
    // 8 MiB in many chunks: whole and in order.
    const big = randomBytes(8 << 20);
    const r = await roundTrip(s, big);
    expect(r.back.length).toBe(big.length);
    expect(createHash('sha256').update(r.back).digest('hex')).toBe(createHash('sha256').update(big).digest('hex'));
    expect(relay.connections).toBe(1);
    expect(relay.bytes).toBe(2 * (4 + big.length));
  }, 60_000);

  it('without a delay it forwards at once', async () => {
    const relay = await relayTo(await echo(), 0);
    const s = await connect(relay.port);
    closers.push(() => { s.destroy(); });
    expect((await roundTrip(s, Buffer.from('x'))).back.toString()).toBe('x');
  });

  it('resets a connection whose destination it cannot find, and counts it', async () => {
    const relay = await relayTo(null, 10);
    // (The reset may come before the client has seen its connect complete.)
    const s = net.connect({ host: '127.0.0.1', port: relay.port });
    const error = await new Promise<NodeJS.ErrnoException | null>((r) => { s.once('error', (e) => r(e)); s.once('close', () => r(null)); });
    expect(error?.code).toBe('ECONNRESET');
    expect(relay.failed).toBe(1);
    expect(relay.connections).toBe(0);
  });

  it('passes a half-close on after the data before it: a client that writes and ends at once still gets its echo, then the end', async () => {
    const relay = await relayTo(await echo(), 30);
    const s = await connect(relay.port);
    const back: Buffer[] = [];
    s.on('data', (c: Buffer) => back.push(c));
    const ended = new Promise<void>((r) => s.once('end', () => r()));
    s.end('last words');
    await ended;
    expect(Buffer.concat(back).toString()).toBe('last words');
    await expect(DelayRelay.start({ host: '127.0.0.1', delayMs: -1, destination: async () => null })).rejects.toThrow(/delay must be/);
  });

  it('resets the client when the destination refuses the connection, and counts it', async () => {
    // A port nothing listens on: take one, then free it.
    const probe = net.createServer();
    await new Promise<void>((r) => probe.listen(0, '127.0.0.1', r));
    const port = (probe.address() as net.AddressInfo).port;
    await new Promise<void>((r) => probe.close(() => r()));
    const relay = await relayTo({ address: '127.0.0.1', port }, 5);
    const s = net.connect({ host: '127.0.0.1', port: relay.port });
    const error = await new Promise<NodeJS.ErrnoException | null>((r) => { s.once('error', (e) => r(e)); s.once('close', () => r(null)); });
    expect(error?.code).toBe('ECONNRESET');
    expect(relay.failed).toBe(1);
  });
});
