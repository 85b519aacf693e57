// Tests of the image holder of in-job recovery (lib/distributed/holder.ts): put/list/get round trips,
// the newest-`keep` eviction and the rollback rule (a put of step s drops steps >= s), stale
// generations, the token, malformed and hostile frames answered without harm, a client lost
// mid-payload leaving nothing half-stored, concurrent clients, a 64 MB image, and the client's
// errors (connection lost, holder refusal, timeout) as CommError/TimeoutError naming holder and op, and
// its reconnection: a holder process SIGKILLed and restarted costs the puts made while it is down, not
// the later ones; a connection lost under a put is reopened and the put sent again.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { connect, createServer, type Socket } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { ArgumentError, CommError, TimeoutError } from '../../lib/errors.js';
import { HolderClient, ImageHolder } from '../../lib/distributed/holder.js';

const TOKEN = 'holder-test-token-0123456789';
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const open: { close(): Promise<void> }[] = [];
afterEach(async () => {
  for (const o of open.splice(0).reverse()) await o.close();
});

async function holder(options: Parameters<typeof ImageHolder.start>[0] = {}): Promise<ImageHolder> {
  const h = await ImageHolder.start(options);
  open.push(h);
  return h;
}
async function client(address: string, options: Parameters<typeof HolderClient.connect>[1] = {}): Promise<HolderClient> {
  const c = await HolderClient.connect(address, { timeoutMs: 30_000, ...options });
  open.push(c);
  return c;
}

/** A whole request frame: length, JSON header, then the payload when given. */
function frame(header: unknown, payload?: Buffer): Buffer {
  const json = Buffer.from(typeof header === 'string' ? header : JSON.stringify(header));
  const len = Buffer.alloc(4);
  len.writeUInt32LE(json.length, 0);
  return Buffer.concat([len, json, ...(payload ? [payload] : [])]);
}

/** The JSON headers of the complete frames in a stream of replies (payloads skipped by their `bytes`). */
function replies(data: Buffer): Record<string, unknown>[] {
  const out: Record<string, unknown>[] = [];
  let at = 0;
  while (at + 4 <= data.length) {
    const n = data.readUInt32LE(at);
    if (at + 4 + n > data.length) break;
    const h = JSON.parse(data.subarray(at + 4, at + 4 + n).toString()) as Record<string, unknown>;
    out.push(h);
    at += 4 + n + (h.ok === true && typeof h.bytes === 'number' ? h.bytes : 0);
  }
  return out;
}

/**
 * Connects, sends `bytes` and collects what comes back until the holder closes, `count` replies have
 * come, or `ms` pass.
 */
function exchange(port: number, bytes: Buffer, count = Infinity, ms = 10_000): Promise<{ data: Buffer; closed: boolean }> {
  return new Promise((resolve) => {
    const s = connect({ port, host: '127.0.0.1' });
    const got: Buffer[] = [];
    let settled = false;
    const done = (closed: boolean): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ data: Buffer.concat(got), closed });
    };
    const timer = setTimeout(() => done(false), ms);
    s.on('data', (d: Buffer) => {
      got.push(d);
      if (replies(Buffer.concat(got)).length >= count) done(false);
    });
    s.on('error', () => {});
    s.on('close', () => done(true));
    s.on('connect', () => s.write(bytes));
  });
}

async function until(cond: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

describe('ImageHolder and HolderClient', () => {
  it('round-trips images: put, list, get with the bytes compared, ranks kept apart', async () => {
    const h = await holder();
    expect(h.address).toBe(`127.0.0.1:${h.port}`);
    const c = await client(h.address);
    const a = randomBytes(100_003);
    const b = randomBytes(7);
    const view = new Uint8Array(randomBytes(4096).buffer, 1024, 2048); // a view into a larger buffer
    await c.put(0, 10, 0, a);
    await c.put(3, 10, 0, b);
    await c.put(5, 1, 0, view);
    await c.put(6, 2, 0, new Uint8Array(0));
    expect(await c.list(0)).toEqual([10]);
    expect(await c.list(3)).toEqual([10]);
    expect(await c.list(4)).toEqual([]);
    expect(Buffer.from(await c.get(0, 10)).equals(a)).toBe(true);
    expect(Buffer.from(await c.get(3, 10)).equals(b)).toBe(true);
    expect(Buffer.from(await c.get(5, 1)).equals(Buffer.from(view))).toBe(true);
    expect((await c.get(6, 2)).length).toBe(0);
    expect(h.steps(0)).toEqual([10]);
    expect(h.bytesHeld).toBe(a.length + b.length + view.length);
    await expect(c.get(0, 9)).rejects.toThrow(CommError);
    await expect(c.get(0, 9)).rejects.toThrow(new RegExp(`image holder 127\\.0\\.0\\.1:${h.port}: get\\(rank 0, step 9\\) failed: .*no image of rank 0 at step 9 \\(held: \\[10\\]\\)`));
    // A refused request leaves the connection usable.
    expect(await c.list(0)).toEqual([10]);
    h.drop(0);
    expect(await c.list(0)).toEqual([]);
    expect(h.bytesHeld).toBe(b.length + view.length);
  });

  it('stores payloads that arrive in many small pieces, and frames that share a read with payloads', async () => {
    const h = await holder();
    const payload = randomBytes(3001);
    const stream = Buffer.concat([
      frame({ op: 'put', rank: 9, step: 1, generation: 0, bytes: payload.length }, payload),
      frame({ op: 'put', rank: 9, step: 2, generation: 0, bytes: 5 }, Buffer.from('hello')),
      frame({ op: 'list', rank: 9 }),
    ]);
    const s = connect({ port: h.port, host: '127.0.0.1', noDelay: true });
    s.on('error', () => {});
    const got: Buffer[] = [];
    s.on('data', (d: Buffer) => got.push(d));
    await new Promise<void>((r) => s.on('connect', () => r()));
    for (let at = 0, k = 1; at < stream.length; at += k, k = (k % 13) + 1) {
      s.write(stream.subarray(at, at + k));
      await new Promise((r) => setImmediate(r));
    }
    await until(() => replies(Buffer.concat(got)).length === 3);
    s.destroy();
    expect(replies(Buffer.concat(got))).toEqual([{ ok: true }, { ok: true }, { ok: true, steps: [1, 2] }]);
    const c = await client(h.address);
    expect(Buffer.from(await c.get(9, 1)).equals(payload)).toBe(true);
    expect(Buffer.from(await c.get(9, 2)).toString()).toBe('hello');
    expect(h.bytesHeld).toBe(3006);
  });

  it('keeps the newest `keep` steps per rank and accounts their bytes', async () => {
    const h = await holder();
    const c = await client(h.address);
    for (let step = 1; step <= 5; step++) await c.put(2, step, 0, Buffer.alloc(1000 * step, step));
    expect(await c.list(2)).toEqual([4, 5]);
    expect(h.bytesHeld).toBe(4000 + 5000);
    expect(Buffer.from(await c.get(2, 4)).equals(Buffer.alloc(4000, 4))).toBe(true);
    await expect(c.get(2, 3)).rejects.toThrow(CommError);
    const h3 = await holder({ keep: 3 });
    const c3 = await client(h3.address);
    for (let step = 1; step <= 5; step++) await c3.put(0, step, 0, Buffer.alloc(10));
    expect(h3.steps(0)).toEqual([3, 4, 5]);
    await expect(ImageHolder.start({ keep: 0 })).rejects.toThrow(ArgumentError);
  });

  it('a put of step s drops the rank\'s images of steps >= s (a rollback replaces what came after it)', async () => {
    const h = await holder();
    const c = await client(h.address);
    await c.put(1, 5, 0, Buffer.alloc(50, 5));
    await c.put(1, 6, 0, Buffer.alloc(60, 6));
    await c.put(1, 6, 1, Buffer.alloc(61, 7)); // the same step again: replaced, 5 kept
    expect(await c.list(1)).toEqual([5, 6]);
    expect(Buffer.from(await c.get(1, 6)).equals(Buffer.alloc(61, 7))).toBe(true);
    await c.put(1, 3, 1, Buffer.alloc(30, 3)); // below both: both dropped
    expect(await c.list(1)).toEqual([3]);
    expect(h.bytesHeld).toBe(30);
    await c.put(1, 4, 1, Buffer.alloc(40, 4));
    expect(await c.list(1)).toEqual([3, 4]);
  });

  it('refuses a put of an older generation than the rank already put with (a zombie process)', async () => {
    const h = await holder();
    const c = await client(h.address);
    await c.put(0, 7, 2, Buffer.alloc(8));
    await expect(c.put(0, 8, 1, Buffer.alloc(8))).rejects.toThrow(/put\(rank 0, step 8, 8 bytes\) failed: .*stale generation/);
    expect(await c.list(0)).toEqual([7]);
    await c.put(0, 8, 2, Buffer.alloc(8));
    expect(await c.list(0)).toEqual([7, 8]);
  });

  it('checks the token: a wrong or missing one is refused with "bad token" and the connection closed', async () => {
    const h = await holder({ token: TOKEN });
    await expect(HolderClient.connect(h.address, { token: 'wrong-token-0123456789', timeoutMs: 10_000 })).rejects.toThrow(/bad token/);
    await expect(HolderClient.connect(h.address, { timeoutMs: 10_000 })).rejects.toThrow(CommError);
    const raw = await exchange(h.port, frame({ op: 'list', rank: 0 }));
    expect(raw.closed).toBe(true);
    expect(replies(raw.data)).toEqual([{ ok: false, error: 'bad token' }]);
    // A bad token on a put: nothing stored, even with the payload sent along.
    const put = await exchange(h.port, frame({ op: 'put', rank: 0, step: 1, generation: 0, bytes: 4, token: 'nope' }, Buffer.alloc(4)));
    expect(replies(put.data)).toEqual([{ ok: false, error: 'bad token' }]);
    expect(h.steps(0)).toEqual([]);
    const good = await client(h.address, { token: TOKEN });
    await good.put(0, 1, 0, Buffer.from('ok'));
    expect(Buffer.from(await good.get(0, 1)).toString()).toBe('ok');
  });

  it('answers malformed and hostile frames with {ok:false,error} and goes on serving', async () => {
    const logs: string[] = [];
    const h = await holder({ maxImageBytes: 1 << 20, log: (l) => logs.push(l) });
    const notJson = await exchange(h.port, frame('{"op":"list", rank'));
    expect(notJson.closed).toBe(true);
    expect(replies(notJson.data)).toEqual([{ ok: false, error: expect.stringMatching(/not JSON/) }]);
    const notObject = await exchange(h.port, frame('[1,2]'));
    expect(replies(notObject.data)).toEqual([{ ok: false, error: expect.stringMatching(/not a JSON object/) }]);
    // A length prefix over 64 KiB (e.g. an HTTP request read as a frame) is refused before anything is waited for.
    const http = await exchange(h.port, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    expect(http.closed).toBe(true);
    expect(replies(http.data)[0]!.error).toMatch(/malformed frame: a header of \d+ bytes/);
    const huge = Buffer.alloc(4);
    huge.writeUInt32LE(65 * 1024, 0);
    expect(replies((await exchange(h.port, huge)).data)[0]!.error).toMatch(/1 to 65536 allowed/);
    // Over the cap, or a bytes field that is not a count: refused, closed (the framing cannot be trusted).
    const over = await exchange(h.port, frame({ op: 'put', rank: 0, step: 1, generation: 0, bytes: 2 << 20 }));
    expect(over.closed).toBe(true);
    expect(replies(over.data)[0]!.error).toMatch(/exceeds the holder's cap of 1048576 bytes/);
    expect(replies((await exchange(h.port, frame({ op: 'put', rank: 0, step: 1, generation: 0, bytes: -1 }))).data)[0]!.error).toMatch(/bytes must be an integer >= 0/);
    // Refusals whose framing is intact keep the connection: unknown op, negative or fractional fields
    // (a put's payload then read and dropped), then a good request on the same connection.
    const stream = Buffer.concat([
      frame({ op: 'delete', rank: 0 }),
      frame({ op: 'list', rank: -1 }),
      frame({ op: 'get', rank: 0, step: 1.5 }),
      frame({ op: 'put', rank: 0, step: -3, generation: 0, bytes: 5 }, Buffer.from('xxxxx')),
      frame({ op: 'put', rank: 0, step: 2, generation: 0, bytes: 3 }, Buffer.from('abc')),
      frame({ op: 'list', rank: 0 }),
    ]);
    const mixed = await exchange(h.port, stream, 6);
    expect(mixed.closed).toBe(false);
    const r = replies(mixed.data);
    expect(r.map((x) => x.ok)).toEqual([false, false, false, false, true, true]);
    expect(r[0]!.error).toMatch(/unknown op "delete"/);
    expect(r[1]!.error).toMatch(/rank must be an integer >= 0, got -1/);
    expect(r[2]!.error).toMatch(/step must be an integer >= 0, got 1.5/);
    expect(r[3]!.error).toMatch(/step must be an integer >= 0, got -3/);
    expect(r[5]).toEqual({ ok: true, steps: [2] });
    expect(h.steps(0)).toEqual([2]);
    expect(logs.some((l) => /unknown op/.test(l))).toBe(true);
    const c = await client(h.address);
    expect(Buffer.from(await c.get(0, 2)).toString()).toBe('abc');
  });

  it('a client that disconnects mid-payload leaves nothing half-stored', async () => {
    const logs: string[] = [];
    const h = await holder({ log: (l) => logs.push(l) });
    const c = await client(h.address);
    await c.put(4, 1, 0, Buffer.alloc(100, 1));
    await c.put(4, 2, 0, Buffer.alloc(200, 2));
    const held = h.bytesHeld;
    const s = connect({ port: h.port, host: '127.0.0.1' });
    s.on('error', () => {});
    await new Promise<void>((r) => s.on('connect', () => r()));
    // A put of step 1 (which would drop steps 1 and 2) of 1 MiB, of which half arrives.
    s.write(frame({ op: 'put', rank: 4, step: 1, generation: 0, bytes: 1 << 20 }, Buffer.alloc(1 << 19, 9)));
    await until(() => h.bytesArriving === 1 << 19);
    s.destroy();
    await until(() => h.connections === 1);
    expect(h.bytesArriving).toBe(0);
    expect(h.bytesHeld).toBe(held);
    expect(await c.list(4)).toEqual([1, 2]);
    expect(Buffer.from(await c.get(4, 2)).equals(Buffer.alloc(200, 2))).toBe(true);
    expect(logs.some((l) => /closed mid-put \(rank 4, step 1: 524288 of 1048576 bytes\); nothing stored/.test(l))).toBe(true);
  });

  it('serves two clients at once, each pipelining puts and gets on its connection', async () => {
    const h = await holder({ keep: 3 });
    const [c1, c2] = await Promise.all([client(h.address), client(h.address)]);
    const images = (rank: number) => [1, 2, 3].map((step) => randomBytes(300_000 + rank * 1000 + step));
    const i1 = images(0);
    const i2 = images(1);
    // Not awaited one by one: every request is in flight together.
    const work = [
      ...i1.map((b, k) => c1.put(0, k + 1, 0, b)),
      ...i2.map((b, k) => c2.put(1, k + 1, 0, b)),
      c1.get(0, 1), c2.get(1, 2), c1.list(0), c2.list(1),
    ];
    const out = await Promise.all(work);
    expect(Buffer.from(out[6] as Uint8Array).equals(i1[0]!)).toBe(true);
    expect(Buffer.from(out[7] as Uint8Array).equals(i2[1]!)).toBe(true);
    expect(out[8]).toEqual([1, 2, 3]);
    expect(out[9]).toEqual([1, 2, 3]);
    const cross = await Promise.all([c2.get(0, 3), c1.get(1, 3)]);
    expect(Buffer.from(cross[0]).equals(i1[2]!)).toBe(true);
    expect(Buffer.from(cross[1]).equals(i2[2]!)).toBe(true);
  });

  it('round-trips a 64 MB image', async () => {
    const h = await holder();
    const c = await client(h.address);
    const image = Buffer.allocUnsafe(64 << 20);
    for (let i = 0; i < image.length; i += 65536) randomBytes(65536).copy(image, i);
    await c.put(0, 100, 0, image);
    expect(h.bytesHeld).toBe(64 << 20);
    const back = await c.get(0, 100);
    expect(back.length).toBe(image.length);
    expect(Buffer.from(back.buffer, back.byteOffset, back.length).equals(image)).toBe(true);
  }, 120_000);

  it('serves an image\'s first bytes (get with a limit: a reader\'s header), across the chunks it arrived in', async () => {
    const h = await holder();
    const c = await client(h.address);
    const image = randomBytes(3 << 20);
    await c.put(7, 4, 0, [image.subarray(0, 100), image.subarray(100, 5000), image.subarray(5000)]);
    for (const limit of [0, 50, 100, 4321, 5000, 70_000]) expect(Buffer.from(await c.get(7, 4, limit)).equals(image.subarray(0, limit))).toBe(true);
    expect((await c.get(7, 4, 10 << 20)).length).toBe(image.length);
    expect(Buffer.from(await c.get(7, 4)).equals(image)).toBe(true);
  });

  it('fails pending and later calls with CommError when the holder goes away, without unhandled rejections', async () => {
    const h = await ImageHolder.start();
    const c = await client(h.address);
    await c.put(0, 1, 0, Buffer.alloc(10));
    const pending = c.put(0, 2, 0, Buffer.alloc(32 << 20));
    await h.close();
    await expect(pending).rejects.toThrow(CommError);
    await expect(pending).rejects.toThrow(new RegExp(`image holder 127\\.0\\.0\\.1:${h.port}: put\\(rank 0, step 2, ${32 << 20} bytes\\) failed`));
    expect(c.broken).toBe(true);
    await expect(c.list(0)).rejects.toThrow(/list\(rank 0\) failed/);
    await expect(c.get(0, 1)).rejects.toThrow(CommError);
    await expect(HolderClient.connect(h.address, { timeoutMs: 300 })).rejects.toThrow(/could not reach the image holder/);
  });

  it('times out a request that is not answered (TimeoutError naming holder and op) and abandons the connection', async () => {
    const sockets: Socket[] = [];
    const silent = createServer((s) => { sockets.push(s); s.on('error', () => {}); });
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
    const port = (silent.address() as { port: number }).port;
    try {
      const e = await HolderClient.connect(`127.0.0.1:${port}`, { timeoutMs: 1000 }).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(TimeoutError);
      expect((e as Error).message).toMatch(new RegExp(`image holder 127\\.0\\.0\\.1:${port}: list\\(rank 0\\) was not answered within 1000 ms`));
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise<void>((r) => silent.close(() => r()));
    }
  });

  it('checks arguments', async () => {
    const h = await holder();
    const c = await client(h.address);
    await expect(c.put(-1, 0, 0, Buffer.alloc(1))).rejects.toThrow(ArgumentError);
    await expect(c.put(0, 0.5, 0, Buffer.alloc(1))).rejects.toThrow(ArgumentError);
    await expect(c.put(0, 0, -1, Buffer.alloc(1))).rejects.toThrow(ArgumentError);
    await expect(c.put(0, 0, 0, 'text' as unknown as Uint8Array)).rejects.toThrow(ArgumentError);
    expect(await c.list(0)).toEqual([]);
    await expect(c.get(0, -2)).rejects.toThrow(ArgumentError);
    await expect(HolderClient.connect('no-port')).rejects.toThrow(ArgumentError);
    await expect(HolderClient.connect('[::1]:0')).rejects.toThrow(ArgumentError);
  });

  it('reconnects after its holder process is SIGKILLed and restarted: the puts made while it is down fail, later ones go through', async () => {
    // The holder in its own process (as in an agent), on a port the restarted one takes again.
    const script = `const { ImageHolder } = await import(process.argv[1]);
      const h = await ImageHolder.start({ port: Number(process.argv[2]), token: process.argv[3] });
      console.log(String(h.port));
      setInterval(() => {}, 1 << 30);`;
    const children: ChildProcess[] = [];
    const startHolder = async (port: number): Promise<number> => {
      const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script, pathToFileURL(join(root, 'lib/distributed/holder.ts')).href, String(port), TOKEN],
        { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
      children.push(child);
      let err = '';
      child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
      return new Promise<number>((resolve, reject) => {
        child.stdout!.once('data', (d: Buffer) => resolve(Number(d.toString().trim())));
        child.once('exit', (code) => reject(new Error(`the holder process exited (${code}): ${err}`)));
      });
    };
    const killed = (child: ChildProcess) => new Promise<void>((r) => { child.once('exit', () => r()); child.kill('SIGKILL'); });
    try {
      const port = await startHolder(0);
      const c = await client(`127.0.0.1:${port}`, { token: TOKEN });
      await c.put(3, 1, 0, Buffer.from('one'));
      await killed(children[0]!);
      // Down: the put fails within its bounded attempts (a refused connection is quick), naming the op.
      const t0 = Date.now();
      const e = await c.put(3, 2, 0, Buffer.from('two')).catch((x: unknown) => x);
      expect(e).toBeInstanceOf(CommError);
      expect((e as Error).message).toMatch(/put\(rank 3, step 2, 3 bytes\) failed: .*could not reconnect in 3 attempt\(s\) \(last error: ECONNREFUSED\)/);
      expect(Date.now() - t0).toBeLessThan(10_000);
      expect(c.broken).toBe(true);
      // Within the hold-off a call fails at once, without dialing.
      const t1 = Date.now();
      await expect(c.list(3)).rejects.toThrow(/next try in \d+ ms/);
      expect(Date.now() - t1).toBeLessThan(500);
      // Restarted (empty, as a new agent's holder is): once the hold-off has passed, puts go through again.
      expect(await startHolder(port)).toBe(port);
      await new Promise((r) => setTimeout(r, 1100));
      await c.put(3, 3, 0, Buffer.from('three'));
      await c.put(3, 4, 0, Buffer.from('four'));
      expect(c.broken).toBe(false);
      expect(c.reconnections).toBe(1);
      expect(await c.list(3)).toEqual([3, 4]);
      expect(Buffer.from(await c.get(3, 4)).toString()).toBe('four');
    } finally {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) await killed(child);
    }
  }, 120_000);

  it('a connection lost under a put is reopened and the put sent again: no copy lost', async () => {
    const h = await holder();
    const c = await client(h.address);
    await c.put(0, 1, 0, Buffer.alloc(10, 1));
    const image = randomBytes(16 << 20);
    const put = c.put(0, 2, 0, image);
    await until(() => h.bytesArriving > 0);
    // The holder's side of the connection goes (a reset link), the holder itself stays.
    for (const s of (h as unknown as { sockets: Set<Socket> }).sockets) s.destroy();
    await put;
    expect(c.reconnections).toBe(1);
    expect(h.steps(0)).toEqual([1, 2]);
    expect(Buffer.from(await c.get(0, 2)).equals(image)).toBe(true);
  }, 60_000);

  it('with reconnectAttempts 0 keeps the old behaviour: after a failure every call fails at once', async () => {
    const h = await holder();
    const c = await client(h.address, { reconnectAttempts: 0 });
    await c.put(0, 1, 0, Buffer.alloc(4));
    for (const s of (h as unknown as { sockets: Set<Socket> }).sockets) s.destroy();
    await until(() => c.broken);
    await expect(c.put(0, 2, 0, Buffer.alloc(4))).rejects.toThrow(/put\(rank 0, step 2, 4 bytes\) failed: the connection was lost/);
    expect(c.reconnections).toBe(0);
    await expect(HolderClient.connect(h.address, { reconnectAttempts: -1 })).rejects.toThrow(ArgumentError);
    await expect(HolderClient.connect(h.address, { reconnectTimeoutMs: 0 })).rejects.toThrow(ArgumentError);
  });
});
