// Tests of the rendezvous store: TCPStore against StoreServer (ops, blocking, concurrency, atomicity,
// timeouts, malformed frames, unreachable master), PrefixStore, createStore, and the raw wire format.
import { connect, createServer } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ArgumentError, CommError, distributed, TimeoutError } from '../../lib/index.js';
import { encodeFrame, Op, Status } from '../../lib/distributed/store-wire.js';
import { freePort } from '../helpers/net.js';

const { StoreServer, TCPStore, PrefixStore, createStore } = distributed;

/** Sends raw bytes on a fresh connection and collects every byte the server answers until it closes or `ms` pass. */
function rawExchange(port: number, bytes: Buffer, ms = 300): Promise<Buffer> {
  return new Promise((resolve) => {
    const s = connect({ port, host: '127.0.0.1' });
    const got: Buffer[] = [];
    s.on('data', (c) => got.push(c));
    s.on('error', () => {});
    s.on('connect', () => s.write(bytes));
    const done = () => resolve(Buffer.concat(got));
    s.on('close', done);
    setTimeout(() => {
      s.destroy();
      done();
    }, ms);
  });
}

/** A port nothing listens on: bind an ephemeral one, then release it. */
const text = (b: Uint8Array) => new TextDecoder().decode(b);

describe('TCPStore + StoreServer', () => {
  let server: InstanceType<typeof StoreServer>;
  let store: InstanceType<typeof TCPStore>;
  beforeAll(async () => {
    server = await StoreServer.start({ port: 0 });
    store = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
  });
  afterAll(async () => {
    await store.close();
    await server.close();
  });

  it('binds an ephemeral port and round-trips strings and arbitrary bytes', async () => {
    expect(server.port).toBeGreaterThan(0);
    await store.set('a', 'hello ✓');
    expect(await store.getString('a')).toBe('hello ✓');
    const bytes = new Uint8Array(70_001);
    for (let i = 0; i < bytes.length; i++) bytes[i] = (i * 2654435761) >>> 24;
    await store.set('bin', bytes);
    expect(Buffer.from(await store.get('bin')).equals(Buffer.from(bytes))).toBe(true);
    await store.set('empty', new Uint8Array(0));
    expect((await store.get('empty')).length).toBe(0);
    expect(await store.tryGet('never-set')).toBeUndefined();
  });

  it('a blocking get returns once another client sets the key', async () => {
    const other = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
    const t0 = Date.now();
    const pending = store.getString('late', { timeoutMs: 5000 });
    setTimeout(() => void other.set('late', 'arrived'), 150);
    expect(await pending).toBe('arrived');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(100);
    await other.close();
  });

  it('wait blocks until every key exists; check reports presence', async () => {
    const other = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
    expect(await store.check(['w1', 'w2'])).toBe(false);
    let done = false;
    const pending = store.wait(['w1', 'w2'], { timeoutMs: 5000 }).then(() => (done = true));
    await other.set('w1', '1');
    await new Promise((r) => setTimeout(r, 50));
    expect(done).toBe(false);
    await other.set('w2', '2');
    await pending;
    expect(done).toBe(true);
    expect(await store.check(['w1', 'w2'])).toBe(true);
    await other.close();
  });

  it('timeouts raise TimeoutError naming the key and the time, and the client keeps working', async () => {
    const t0 = Date.now();
    const err = await store.get('missing-key', { timeoutMs: 120 }).catch((e) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    expect(err.message).toContain('"missing-key"');
    expect(err.message).toContain('120 ms');
    expect(Date.now() - t0).toBeGreaterThanOrEqual(100);
    const werr = await store.wait(['a', 'missing-2'], { timeoutMs: 80 }).catch((e) => e);
    expect(werr).toBeInstanceOf(TimeoutError);
    expect(werr.message).toContain('"missing-2"');
    expect(werr.message).not.toContain('"a"');
    await store.set('after-timeout', 'ok');
    expect(await store.getString('after-timeout')).toBe('ok');
  });

  it('add is atomic across concurrent clients', async () => {
    const clients = await Promise.all(Array.from({ length: 6 }, () => TCPStore.connect({ port: server.port, timeoutMs: 5000 })));
    const perClient = 50;
    const results = await Promise.all(
      clients.map(async (c, i) => {
        const seen: number[] = [];
        for (let j = 0; j < perClient; j++) seen.push(await c.add('counter', i + 1));
        return seen;
      }),
    );
    const expectedTotal = perClient * ((6 * 7) / 2);
    expect(await store.add('counter', 0)).toBe(expectedTotal);
    // Every returned value is distinct: no two increments observed the same state.
    const all = results.flat();
    expect(new Set(all).size).toBe(all.length);
    expect(await store.getString('counter')).toBe(String(expectedTotal));
    expect(await store.add('negative', -7)).toBe(-7);
    await store.set('not-a-number', 'abc');
    const err = await store.add('not-a-number', 1).catch((e) => e);
    expect(err).toBeInstanceOf(CommError);
    expect(err.message).toContain('not a decimal integer');
    await Promise.all(clients.map((c) => c.close()));
  });

  it('compareSet swaps only on a match, creates on empty expected, and elects exactly one winner', async () => {
    expect(text(await store.compareSet('cas', '', 'first'))).toBe('first');
    expect(text(await store.compareSet('cas', 'wrong', 'second'))).toBe('first');
    expect(text(await store.compareSet('cas', 'first', 'second'))).toBe('second');
    expect(text(await store.compareSet('cas-missing', 'x', 'y'))).toBe('');
    expect(await store.tryGet('cas-missing')).toBeUndefined();
    const clients = await Promise.all(Array.from({ length: 5 }, () => TCPStore.connect({ port: server.port, timeoutMs: 5000 })));
    const outcomes = await Promise.all(clients.map((c, i) => c.compareSet('leader', '', `rank${i}`)));
    const leader = text(outcomes[0]!);
    expect(outcomes.every((o) => text(o) === leader)).toBe(true);
    expect(leader).toMatch(/^rank[0-4]$/);
    await Promise.all(clients.map((c) => c.close()));
  });

  it('delete, numKeys and keys(prefix)', async () => {
    const before = await store.numKeys();
    await store.set('k/x', '1');
    await store.set('k/y', '2');
    await store.set('kz', '3');
    expect(await store.numKeys()).toBe(before + 3);
    expect((await store.keys('k/')).sort()).toEqual(['k/x', 'k/y']);
    expect(await store.delete('k/x')).toBe(true);
    expect(await store.delete('k/x')).toBe(false);
    expect(await store.keys('k/')).toEqual(['k/y']);
    expect(await store.numKeys()).toBe(before + 2);
  });

  it('PrefixStore namespaces keys and nests', async () => {
    const job = new PrefixStore(store, 'job1');
    const group = new PrefixStore(job, 'tp0');
    await group.set('id', 'abc');
    expect(await store.getString('job1/tp0/id')).toBe('abc');
    expect(await group.getString('id')).toBe('abc');
    expect(await new PrefixStore(store, 'job2').tryGet('tp0/id')).toBeUndefined();
    expect(await group.add('n', 3)).toBe(3);
    expect((await group.keys()).sort()).toEqual(['id', 'n']);
    expect(await group.numKeys()).toBe(2);
    expect(await group.check(['id', 'n'])).toBe(true);
    // The setter uses its own connection: on one connection a blocked wait holds back later requests.
    const other = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
    const waiting = group.wait(['later'], { timeoutMs: 3000 });
    await other.set('job1/tp0/later', '1');
    await waiting;
    await other.close();
    await group.close();
    expect(await store.getString('job1/tp0/id')).toBe('abc');
  });

  it('rejects bad arguments with ArgumentError and stays usable', async () => {
    await expect(store.set(5 as unknown as string, 'v')).rejects.toBeInstanceOf(ArgumentError);
    await expect(store.set('k', null as unknown as string)).rejects.toBeInstanceOf(ArgumentError);
    await expect(store.get('k', { timeoutMs: -1 })).rejects.toBeInstanceOf(ArgumentError);
    await expect(store.add('k', 0.5)).rejects.toBeInstanceOf(ArgumentError);
    await store.set('still-fine', 'yes');
    expect(await store.getString('still-fine')).toBe('yes');
  });

  it('answers in request order on one connection while a blocking get waits', async () => {
    const other = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
    const order: string[] = [];
    const blocked = store.get('order-key', { timeoutMs: 3000 }).then(() => order.push('get'));
    const after = store.numKeys().then(() => order.push('numKeys'));
    await new Promise((r) => setTimeout(r, 50));
    expect(order).toEqual([]);
    await other.set('order-key', 'v');
    await Promise.all([blocked, after]);
    expect(order).toEqual(['get', 'numKeys']);
    await other.close();
  });

  it('survives malformed frames: garbage args, unknown ops, oversized and truncated frames, dropped waiters', async () => {
    // Unknown opcode, then a GET whose body ends early: both answered with ERROR on a live connection.
    const reply = await rawExchange(server.port, Buffer.concat([encodeFrame(77), encodeFrame(Op.GET, [{ u32: 1000 }])]));
    expect(reply.readUInt32LE(0)).toBeGreaterThan(1);
    expect(reply[4]).toBe(Status.ERROR);
    expect(reply.toString('latin1')).toContain('unknown opcode 77');
    expect(reply.toString('latin1')).toContain('malformed request');
    // A length over the 1 GiB limit: ERROR and the connection is closed.
    const huge = Buffer.alloc(4);
    huge.writeUInt32LE(2 ** 31, 0);
    const big = await rawExchange(server.port, huge, 2000);
    expect(big[4]).toBe(Status.ERROR);
    expect(big.toString('latin1')).toContain('exceeds');
    // An empty frame, trailing bytes, and a frame cut off by a closing peer.
    const zero = await rawExchange(server.port, Buffer.alloc(4), 2000);
    expect(zero[4]).toBe(Status.ERROR);
    const trailing = Buffer.concat([encodeFrame(Op.PING), Buffer.from([1, 0, 0, 0, Op.PING])]);
    trailing.writeUInt32LE(2, 0);
    const tr = await rawExchange(server.port, trailing);
    expect(tr.toString('latin1')).toContain('trailing');
    await rawExchange(server.port, encodeFrame(Op.SET, [{ bytes: 'k' }, { bytes: 'v' }]).subarray(0, 9), 50);
    // A client that disconnects while blocked must not leave the server confused.
    await rawExchange(server.port, encodeFrame(Op.WAIT, [{ u32: 1 }, { bytes: 'abandoned' }, { i64: 60_000 }]), 50);
    await store.set('abandoned', 'x');
    expect(await store.getString('abandoned')).toBe('x');
    const fresh = await TCPStore.connect({ port: server.port, timeoutMs: 2000 });
    await fresh.ping();
    await fresh.close();
  });
});

describe('connecting', () => {
  it('an unreachable master is a CommError naming host:port and the timeout', async () => {
    const port = await freePort();
    const t0 = Date.now();
    const err = await TCPStore.connect({ host: '127.0.0.1', port, timeoutMs: 400 }).catch((e) => e);
    expect(err).toBeInstanceOf(CommError);
    expect(err.message).toContain(`127.0.0.1:${port}`);
    expect(err.message).toContain('400 ms');
    expect(err.message).toContain('ECONNREFUSED');
    expect(Date.now() - t0).toBeLessThan(3000);
  });

  it('retries until a late server comes up', async () => {
    const port = await freePort();
    const connecting = TCPStore.connect({ port, timeoutMs: 5000 });
    await new Promise((r) => setTimeout(r, 300));
    const server = await StoreServer.start({ port });
    const store = await connecting;
    await store.set('x', '1');
    expect(await store.getString('x')).toBe('1');
    await store.close();
    await server.close();
  });

  it('a listener that does not speak the protocol fails within the timeout', async () => {
    const silent = createServer(() => {});
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
    const port = (silent.address() as { port: number }).port;
    const err = await TCPStore.connect({ port, timeoutMs: 1200 }).catch((e) => e);
    expect(err).toBeInstanceOf(CommError);
    silent.close();
  });

  it('pending calls fail with CommError when the server goes away; createStore parses URLs', async () => {
    const server = await StoreServer.start();
    const store = await createStore(`tcp://127.0.0.1:${server.port}`, { timeoutMs: 2000 });
    const blocked = store.get('never', { timeoutMs: 10_000 }).catch((e) => e);
    await new Promise((r) => setTimeout(r, 50));
    await server.close();
    const err = await blocked;
    expect(err).toBeInstanceOf(CommError);
    expect(err.message).toContain(`127.0.0.1:${server.port}`);
    await expect(store.set('x', 'y')).rejects.toBeInstanceOf(CommError);
    await expect(createStore('nonsense')).rejects.toBeInstanceOf(ArgumentError);
    await expect(createStore('http://a:1')).rejects.toBeInstanceOf(ArgumentError);
    await expect(createStore('tcp://hostonly')).rejects.toBeInstanceOf(ArgumentError);
    const again = await StoreServer.start();
    const s2 = await createStore(`tcp://localhost:${again.port}`, { timeoutMs: 2000 });
    await s2.set('ok', '1');
    await s2.close();
    await again.close();
  });

  it('a port in use is a CommError from StoreServer.start', async () => {
    const server = await StoreServer.start();
    const err = await StoreServer.start({ port: server.port }).catch((e) => e);
    expect(err).toBeInstanceOf(CommError);
    expect(err.message).toContain(String(server.port));
    await server.close();
  });
});
