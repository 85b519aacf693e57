// Tests of the rendezvous store's defences: the job token (AUTH first, constant-time check, clients
// without it refused at once), request limits (frame, key, value, key count, connections), deadlines
// for unauthenticated and stalled connections, HTTP refused, a busy port as one line, and all of it
// against a real launcher job that must survive every refused request and finish.
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ArgumentError, CommError, distributed } from '../../lib/index.js';
import { encodeFrame, Op, Status } from '../../lib/distributed/store-wire.js';
import { launchStoreSecurity } from '../../lib/launch/cli.js';
import { storeSecurity } from '../../lib/distributed/store-security.js';
import { freePort } from '../helpers/net.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const { StoreServer, TCPStore, StoreAuthError, AddressInUseError, storeLimitsFromEnv, DEFAULT_STORE_LIMITS } = distributed;

const TOKEN = 'test-token-0123456789abcdef';
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const text = (b: Uint8Array) => new TextDecoder().decode(b);

interface Exchange {
  /** Every byte the server sent. */
  data: Buffer;
  /** Whether the server closed the connection (rather than the wait running out). */
  closed: boolean;
  /** ms from connecting to the close (or to giving up). */
  ms: number;
}

/** Opens a connection, sends `bytes` and collects what comes back until the server closes or `ms` pass. */
function exchange(port: number, bytes: Buffer | Buffer[], ms = 3000): Promise<Exchange> {
  return new Promise((resolve) => {
    const t0 = Date.now();
    const s = connect({ port, host: '127.0.0.1' });
    const got: Buffer[] = [];
    let settled = false;
    const done = (closed: boolean) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      s.destroy();
      resolve({ data: Buffer.concat(got), closed, ms: Date.now() - t0 });
    };
    s.on('data', (c) => got.push(c));
    s.on('error', () => done(true));
    s.on('close', () => done(true));
    s.on('connect', () => {
      for (const b of Array.isArray(bytes) ? bytes : [bytes]) s.write(b);
    });
    const timer = setTimeout(() => done(false), ms);
  });
}

/** A raw connection that has authenticated with `token`; resolves once the server said OK. */
async function authedSocket(port: number, token = TOKEN): Promise<{ socket: Socket; replies: Buffer[] }> {
  const socket = connect({ port, host: '127.0.0.1' });
  const replies: Buffer[] = [];
  socket.on('data', (c) => replies.push(c));
  socket.on('error', () => {});
  await new Promise<void>((r) => socket.on('connect', () => r()));
  socket.write(encodeFrame(Op.AUTH, [{ bytes: token }]));
  const deadline = Date.now() + 5000;
  while (Buffer.concat(replies).length < 5 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  expect(Buffer.concat(replies)[4]).toBe(Status.OK);
  replies.length = 0;
  return { socket, replies };
}

/** A request frame's bytes with a hand-written header: `bodyBytes` claimed, `body` actually following. */
function claimed(bodyBytes: number, body: Buffer = Buffer.alloc(0)): Buffer {
  const head = Buffer.alloc(4);
  head.writeUInt32LE(bodyBytes, 0);
  return Buffer.concat([head, body]);
}

/** A WAIT frame listing `n` empty keys (the attack that used to exhaust the launcher). */
function waitEmptyKeys(n: number): Buffer {
  const body = Buffer.alloc(1 + 4 + 4 * n + 8);
  body.writeUInt8(Op.WAIT, 0);
  body.writeUInt32LE(n, 1);
  return Buffer.concat([claimed(body.length), body]);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('StoreServer with a job token', () => {
  let server: InstanceType<typeof StoreServer>;
  beforeAll(async () => {
    server = await StoreServer.start({ token: TOKEN, limits: { authTimeoutMs: 400, frameTimeoutMs: 400, maxKeysPerRequest: 1000, maxValueBytes: 4096, maxKeyBytes: 64 } });
  });
  afterAll(async () => {
    await server.close();
  });

  it('a client with the token works; without it or with a wrong one it is refused at once (no retrying until the timeout)', async () => {
    const good = await TCPStore.connect({ port: server.port, timeoutMs: 5000, token: TOKEN });
    await good.set('secret', 'value');
    expect(await good.getString('secret')).toBe('value');

    const t0 = Date.now();
    const none = await TCPStore.connect({ port: server.port, timeoutMs: 20_000 }).catch((e) => e);
    expect(none).toBeInstanceOf(StoreAuthError);
    expect(none).toBeInstanceOf(CommError);
    expect(none.message).toContain('authentication required');
    expect(none.message).toContain('NODETRON_STORE_TOKEN');
    const wrong = await TCPStore.connect({ port: server.port, timeoutMs: 20_000, token: 'x'.repeat(32) }).catch((e) => e);
    expect(wrong).toBeInstanceOf(StoreAuthError);
    expect(wrong.message).toContain('wrong job token');
    // Refused on the first answer, far from the 20 s the connection would otherwise retry for.
    expect(Date.now() - t0).toBeLessThan(10_000);
    await expect(TCPStore.connect({ port: server.port, token: 'short' })).rejects.toBeInstanceOf(ArgumentError);
    expect(await good.getString('secret')).toBe('value');
    await good.close();
  });

  it('an unauthenticated client can neither list, read, write nor stop the job', async () => {
    const requests = [
      encodeFrame(Op.KEYS, [{ bytes: '' }]),
      encodeFrame(Op.GET, [{ bytes: 'secret' }, { i64: 0 }]),
      encodeFrame(Op.SET, [{ bytes: 'secret' }, { bytes: 'overwritten' }]),
      encodeFrame(Op.CAS, [{ bytes: 'nodetron/attempt0/agent/failed' }, { bytes: '' }, { bytes: '{"reason":"x"}' }]),
    ];
    const before = server.refusals.unauthenticated;
    for (const r of requests) {
      // Even pipelined behind the request, nothing after the refused first frame is executed.
      const x = await exchange(server.port, [r, encodeFrame(Op.KEYS, [{ bytes: '' }])]);
      expect(x.closed).toBe(true);
      expect(x.data[4]).toBe(Status.ERROR);
      expect(x.data.toString('latin1')).toContain('authentication required');
      expect(x.data.toString('latin1')).not.toContain('secret');
    }
    // A wrong token in a well-formed AUTH frame.
    const wrong = await exchange(server.port, [encodeFrame(Op.AUTH, [{ bytes: 'y'.repeat(40) }]), encodeFrame(Op.KEYS, [{ bytes: '' }])]);
    expect(wrong.closed).toBe(true);
    expect(wrong.data.toString('latin1')).toContain('wrong job token');
    expect(server.refusals.unauthenticated).toBe(before + requests.length + 1);
    const store = await TCPStore.connect({ port: server.port, timeoutMs: 5000, token: TOKEN });
    expect(await store.getString('secret')).toBe('value');
    expect(await store.tryGet('nodetron/attempt0/agent/failed')).toBeUndefined();
    await store.close();
  });

  it('before authentication only a tiny frame is accepted: a large length prefix is refused on its 4 bytes', async () => {
    for (const size of [1024, 256 << 20, 520 << 20, 2 ** 32 - 1]) {
      const x = await exchange(server.port, claimed(size));
      expect(x.closed, `${size}`).toBe(true);
      expect(x.data.toString('latin1')).toContain('exceeds');
    }
  });

  it('HTTP (and TLS) requests are refused at once', async () => {
    const http = await exchange(server.port, Buffer.from('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    expect(http.closed).toBe(true);
    expect(http.data.toString('latin1')).toContain('not an HTTP or TLS server');
    const post = await exchange(server.port, Buffer.from('POST /v1 HTTP/1.1\r\nContent-Length: 536870912\r\n\r\n'));
    expect(post.closed).toBe(true);
    const tls = await exchange(server.port, Buffer.from([0x16, 0x03, 0x01, 0x02, 0x00, 0x01]));
    expect(tls.closed).toBe(true);
  });

  it('an idle unauthenticated connection, and one stuck in a partial AUTH frame, are dropped after the auth deadline', async () => {
    const idle = await exchange(server.port, Buffer.alloc(0), 10_000);
    expect(idle.closed).toBe(true);
    expect(idle.data.toString('latin1')).toContain('no authentication within 400 ms');
    const partial = await exchange(server.port, encodeFrame(Op.AUTH, [{ bytes: TOKEN }]).subarray(0, 10), 10_000);
    expect(partial.closed).toBe(true);
  });

  it('an authenticated connection stalled mid-frame is dropped after the frame deadline; idle whole-frame connections stay', async () => {
    const stalled = await authedSocket(server.port);
    const idle = await authedSocket(server.port);
    const closed = new Promise<number>((r) => {
      const t0 = Date.now();
      stalled.socket.on('close', () => r(Date.now() - t0));
    });
    // Half of a SET frame, then nothing.
    stalled.socket.write(encodeFrame(Op.SET, [{ bytes: 'k' }, { bytes: 'v'.repeat(100) }]).subarray(0, 40));
    await closed;
    expect(Buffer.concat(stalled.replies).toString('latin1')).toContain('did not complete within 400 ms');
    await sleep(600);
    expect(idle.socket.destroyed).toBe(false);
    idle.socket.write(encodeFrame(Op.PING));
    const deadline = Date.now() + 5000;
    while (Buffer.concat(idle.replies).length < 5 && Date.now() < deadline) await sleep(10);
    expect(Buffer.concat(idle.replies)[4]).toBe(Status.OK);
    idle.socket.destroy();
  });

  it('too many keys, a long key, a large value: ERROR naming the limit, and the connection goes on', async () => {
    const store = await TCPStore.connect({ port: server.port, timeoutMs: 5000, token: TOKEN });
    const keys = Array.from({ length: 1001 }, (_, i) => `k${i}`);
    await expect(store.check(keys)).rejects.toThrow(/1001 keys exceed the limit of 1000 per request \(NODETRON_STORE_MAX_KEYS\)/);
    await expect(store.set('x'.repeat(65), 'v')).rejects.toThrow(/65 bytes exceeds the 64-byte limit \(NODETRON_STORE_MAX_KEY_BYTES\)/);
    await expect(store.set('big', new Uint8Array(4097))).rejects.toThrow(/4097 bytes exceeds the 4096-byte limit \(NODETRON_STORE_MAX_VALUE_BYTES\)/);
    await expect(store.compareSet('big', '', new Uint8Array(4097))).rejects.toThrow(/NODETRON_STORE_MAX_VALUE_BYTES/);
    await store.set('fits', new Uint8Array(4096));
    expect((await store.get('fits')).length).toBe(4096);
    expect(await store.check(keys.slice(0, 1000))).toBe(false);
    await store.close();
  });

  it('a client pipelining hundreds of requests behind a blocked WAIT is held back, then answered in order', async () => {
    const { socket, replies } = await authedSocket(server.port);
    const pings = 700;
    socket.write(Buffer.concat([
      encodeFrame(Op.WAIT, [{ u32: 1 }, { bytes: 'gate' }, { i64: 30_000 }]),
      ...Array.from({ length: pings }, () => encodeFrame(Op.PING)),
    ]));
    await sleep(300);
    expect(Buffer.concat(replies).length).toBe(0);  // everything waits behind the WAIT
    const store = await TCPStore.connect({ port: server.port, timeoutMs: 5000, token: TOKEN });
    await store.set('gate', 'open');
    const deadline = Date.now() + 20_000;
    while (Buffer.concat(replies).length < 5 * (pings + 1) && Date.now() < deadline) await sleep(20);
    const all = Buffer.concat(replies);
    expect(all.length).toBe(5 * (pings + 1));
    for (let i = 0; i <= pings; i++) expect(all[5 * i + 4]).toBe(Status.OK);
    socket.destroy();
    await store.close();
  });

  it('a key count the body cannot hold is refused before any key is read', async () => {
    const { socket, replies } = await authedSocket(server.port);
    // Claims 900 keys (under the limit) in a body that holds none.
    const body = Buffer.alloc(1 + 4 + 8);
    body.writeUInt8(Op.WAIT, 0);
    body.writeUInt32LE(900, 1);
    socket.write(Buffer.concat([claimed(body.length), body]));
    socket.write(encodeFrame(Op.PING));
    const deadline = Date.now() + 5000;
    while (Buffer.concat(replies).length < 10 && Date.now() < deadline) await sleep(10);
    const all = Buffer.concat(replies);
    expect(all[4]).toBe(Status.ERROR);
    expect(all.toString('latin1')).toContain('WAIT lists 900 keys but its body holds at most 0');
    expect(all[all.length - 1]).toBe(Status.OK);  // the PING after it
    socket.destroy();
  });
});

describe('StoreServer limits and listening', () => {
  it('limits come from options, then NODETRON_STORE_* variables, then the defaults; bad values are named', () => {
    expect(storeLimitsFromEnv({})).toEqual(DEFAULT_STORE_LIMITS);
    const l = storeLimitsFromEnv({ NODETRON_STORE_MAX_KEYS: '10', NODETRON_STORE_MAX_FRAME_BYTES: '1048576' }, { maxKeysPerRequest: 20 });
    expect(l.maxKeysPerRequest).toBe(20);
    expect(l.maxFrameBytes).toBe(1 << 20);
    expect(() => storeLimitsFromEnv({ NODETRON_STORE_MAX_VALUE_BYTES: 'lots' })).toThrow(/NODETRON_STORE_MAX_VALUE_BYTES="lots"/);
    expect(() => storeLimitsFromEnv({ NODETRON_STORE_MAX_CONNECTIONS: '0' })).toThrow(ArgumentError);
    expect(() => storeLimitsFromEnv({}, { maxFrameBytes: 2 ** 31 })).toThrow(ArgumentError);
  });

  it('refuses connections beyond the limit at once; the ones it holds keep working', async () => {
    const server = await StoreServer.start({ limits: { maxConnections: 3 } });
    const stores = await Promise.all([0, 1, 2].map(() => TCPStore.connect({ port: server.port, timeoutMs: 5000 })));
    const extra = await exchange(server.port, encodeFrame(Op.PING));
    expect(extra.closed).toBe(true);
    expect(extra.data.length).toBe(0);
    expect(server.refusals.overLimit).toBeGreaterThanOrEqual(1);
    await stores[0]!.set('a', '1');
    expect(await stores[2]!.getString('a')).toBe('1');
    await stores[1]!.close();
    // A slot freed by a closed connection is usable again.
    const deadline = Date.now() + 5000;
    while (server.connections > 2 && Date.now() < deadline) await sleep(10);
    const again = await TCPStore.connect({ port: server.port, timeoutMs: 5000 });
    await again.ping();
    for (const s of [stores[0]!, stores[2]!, again]) await s.close();
    await server.close();
  });

  it('a frame over the limit is refused on its length prefix, even without a token', async () => {
    const server = await StoreServer.start();
    const x = await exchange(server.port, claimed(DEFAULT_STORE_LIMITS.maxFrameBytes + 1));
    expect(x.closed).toBe(true);
    expect(x.data.toString('latin1')).toContain(`exceeds the ${DEFAULT_STORE_LIMITS.maxFrameBytes}-byte limit`);
    const http = await exchange(server.port, Buffer.from('GET / HTTP/1.0\r\n\r\n'));
    expect(http.closed).toBe(true);
    await server.close();
  });

  it('will not listen beyond loopback without a token; tokens must be 16 to 256 bytes', async () => {
    await expect(StoreServer.start({ host: '0.0.0.0' })).rejects.toThrow(/needs a job token/);
    await expect(StoreServer.start({ token: 'short' })).rejects.toBeInstanceOf(ArgumentError);
    await expect(StoreServer.start({ token: 'x'.repeat(257) })).rejects.toBeInstanceOf(ArgumentError);
    const wide = await StoreServer.start({ host: '0.0.0.0', token: TOKEN });
    expect(wide.authenticates).toBe(true);
    await wide.close();
  });

  it('a busy port is an AddressInUseError: one line naming the address and what to do', async () => {
    const server = await StoreServer.start();
    const err = await StoreServer.start({ port: server.port }).catch((e) => e);
    expect(err).toBeInstanceOf(AddressInUseError);
    expect(err).toBeInstanceOf(CommError);
    expect(err.message).not.toContain('\n');
    expect(err.message).toContain(`127.0.0.1:${server.port}`);
    expect(err.message).toContain('already in use');
    expect(err.message).toContain('MASTER_PORT');
    await server.close();
  });

  it('the launcher makes a token for one node, needs a shared one across hosts, and takes NODETRON_STORE_TOKEN', () => {
    const one = launchStoreSecurity({ nnodes: 1, masterAddr: '127.0.0.1', masterPort: undefined }, {});
    expect(one.token).toMatch(/^[0-9a-f]{64}$/);
    expect(launchStoreSecurity({ nnodes: 1, masterAddr: '127.0.0.1', masterPort: undefined }, {}).token).not.toBe(one.token);
    expect(one.listenHost).toBe('127.0.0.1');
    expect(() => launchStoreSecurity({ nnodes: 2, masterAddr: 'node0', masterPort: 29500 }, {})).toThrow(/node 0's launcher .*node0:29500.*export NODETRON_STORE_TOKEN=\$\(openssl rand -hex 32\) before nodetron launch/);
    const shared = launchStoreSecurity({ nnodes: 2, masterAddr: 'node0', masterPort: 29500 }, { NODETRON_STORE_TOKEN: TOKEN });
    expect(shared).toEqual({ token: TOKEN, listenHost: '0.0.0.0' });
    const loop = launchStoreSecurity({ nnodes: 2, masterAddr: '127.0.0.1', masterPort: 29500 }, {});
    expect(loop.token).toBeUndefined();
    expect(loop.warning).toContain('127.0.0.1:29500 has no job token');
    expect(loop.warning).toContain('NODETRON_STORE_TOKEN');
    expect(() => launchStoreSecurity({ nnodes: 1, masterAddr: '127.0.0.1', masterPort: undefined }, { NODETRON_STORE_TOKEN: 'short' })).toThrow(ArgumentError);
    // A one-node launch whose ranks dial a host name (--master-addr given): the store listens where they
    // dial, guarded by the token the launcher made (it listened on loopback only, out of their reach).
    const named = launchStoreSecurity({ nnodes: 1, masterAddr: 'node0', masterPort: undefined }, {});
    expect(named.listenHost).toBe('0.0.0.0');
    expect(named.token).toMatch(/^[0-9a-f]{64}$/);
    expect(launchStoreSecurity({ nnodes: 1, masterAddr: 'localhost', masterPort: undefined }, {}).listenHost).toBe('127.0.0.1');
  });

  it('one policy for the launcher and init(): the same address and token decisions, each naming its server', () => {
    const cases = [
      { masterAddr: '127.0.0.1', token: undefined }, { masterAddr: '127.0.0.2', token: TOKEN }, { masterAddr: 'localhost', token: undefined },
      { masterAddr: '::1', token: TOKEN }, { masterAddr: 'node0', token: TOKEN }, { masterAddr: '10.0.0.1', token: undefined },
    ];
    for (const c of cases) {
      const viaLaunch = () => launchStoreSecurity({ nnodes: 2, masterAddr: c.masterAddr, masterPort: 29500 }, c.token ? { NODETRON_STORE_TOKEN: c.token } : {});
      const viaInit = () => storeSecurity({ ...c, masterPort: 29500, makeToken: false, server: 'init: rank 0', startedBy: 'srun/mpirun' });
      if (c.token === undefined && c.masterAddr === '10.0.0.1') {
        expect(viaLaunch).toThrow(/^node 0's launcher would serve the rendezvous store on every interface \(clients dial 10\.0\.0\.1:29500\) without a job token/);
        expect(viaInit).toThrow(/^init: rank 0 would serve the rendezvous store on every interface .* before srun\/mpirun, the same value for every process/);
        continue;
      }
      const a = viaLaunch(), b = viaInit();
      expect({ token: a.token, listenHost: a.listenHost }, c.masterAddr).toEqual({ token: b.token, listenHost: b.listenHost });
      expect(a.listenHost).toBe(c.masterAddr === 'localhost' ? '127.0.0.1' : c.masterAddr === 'node0' ? '0.0.0.0' : c.masterAddr);
      expect(a.warning === undefined).toBe(c.token !== undefined);
    }
  });
});

/** Resident memory of a process, in bytes (Linux). */
function rss(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) * 1024;
}

describe('a running launcher job under attack', () => {
  it('refuses unauthenticated and malformed requests without growing, and the job completes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nodetron-guard-'));
    const go = join(dir, 'go');
    const port = await freePort();
    const child = spawn(process.execPath, [...nodeArgs(join(root, 'test', 'fixtures', 'launch', 'launcher.ts')),
      '--nproc-per-node', '2', '--master-port', String(port), scriptPath(join(root, 'test', 'fixtures', 'launch', 'guarded.ts'))], {
      cwd: root, env: { ...process.env, GO_FILE: go, NODETRON_STORE_TOKEN: TOKEN, NODETRON_WARN_LEAKS: '0' }, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    const exited = new Promise<number | null>((r) => child.on('close', (code) => r(code)));
    try {
      const deadline = Date.now() + 120_000;
      while ((stdout.match(/READY/g)?.length ?? 0) < 2) {
        if (Date.now() > deadline || child.exitCode !== null) throw new Error(`the job did not get ready:\n${stdout}\n${stderr}`);
        await sleep(100);
      }
      const rssBefore = rss(child.pid!);

      // 1. A client without the token (as any process on the machine would be) is refused.
      await expect(TCPStore.connect({ port, timeoutMs: 5000, token: undefined })).rejects.toBeInstanceOf(StoreAuthError);
      // 2. Listing keys and writing the job's failure key, unauthenticated.
      for (const r of [encodeFrame(Op.KEYS, [{ bytes: '' }]), encodeFrame(Op.SET, [{ bytes: 'nodetron/attempt0/agent/failed' }, { bytes: '{"reason":"pwned"}' }])]) {
        const x = await exchange(port, r);
        expect(x.closed).toBe(true);
        expect(x.data.toString('latin1')).toContain('authentication required');
        expect(x.data.toString('latin1')).not.toContain('attempt0');
      }
      // 3. The frames that used to exhaust the launcher: a 520 MiB WAIT header, then 64 MiB of its body.
      const huge = await exchange(port, [claimed(520 << 20), Buffer.alloc(64 << 20)]);
      expect(huge.closed).toBe(true);
      // Authenticated, the same frame is refused on its length prefix too (with the body following, the
      // server's reset can discard its answer, so the message is checked on a header alone).
      const huge2 = await exchange(port, [encodeFrame(Op.AUTH, [{ bytes: TOKEN }]), claimed(520 << 20)]);
      expect(huge2.closed).toBe(true);
      expect(huge2.data.toString('latin1')).toContain('exceeds the 8388608-byte limit');
      expect((await exchange(port, [encodeFrame(Op.AUTH, [{ bytes: TOKEN }]), claimed(520 << 20), Buffer.alloc(64 << 20)])).closed).toBe(true);
      // 4. HTTP, garbage opcodes, a stalled partial frame.
      expect((await exchange(port, Buffer.from('GET /keys HTTP/1.1\r\nHost: x\r\n\r\n'))).closed).toBe(true);
      expect((await exchange(port, encodeFrame(99, [{ bytes: 'junk' }]))).closed).toBe(true);
      // 5. Authenticated WAITs listing millions of empty keys: over the frame limit, or within it but over the key count.
      const tooMany = await exchange(port, [encodeFrame(Op.AUTH, [{ bytes: TOKEN }]), waitEmptyKeys(1_500_000)], 5000);
      expect(tooMany.data.toString('latin1')).toMatch(/exceeds the 8388608-byte limit|keys exceed the limit/);
      const manyKeys = await exchange(port, [encodeFrame(Op.AUTH, [{ bytes: TOKEN }]), waitEmptyKeys(100_000)], 2000);
      expect(manyKeys.data.toString('latin1')).toContain('100000 keys exceed the limit of 65536 per request');
      // 6. Many connections opened and abandoned.
      await Promise.all(Array.from({ length: 50 }, () => exchange(port, Buffer.alloc(0), 200)));

      // The launcher held no attacker's bytes: its memory is about where it was (the 520 MiB frame
      // alone used to take it to 2.9 GiB).
      const grown = rss(child.pid!) - rssBefore;
      expect(grown, `launcher RSS grew by ${(grown / 2 ** 20).toFixed(1)} MiB`).toBeLessThan(96 * 2 ** 20);

      writeFileSync(go, '');
      expect(await exited, stderr).toBe(0);
      const done = [...stdout.matchAll(/DONE rank=(\d) sum=([\d.]+),([\d.]+)/g)];
      expect(done.map((m) => m[1]).sort()).toEqual(['0', '1']);
      for (const m of done) expect([m[2], m[3]]).toEqual(['3', '3']);
      expect(stderr).not.toContain('pwned');
    } catch (e) {
      (e as Error).message += `\n--- launcher stdout:\n${stdout}\n--- launcher stderr:\n${stderr}`;
      throw e;
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  }, 240_000);
});

describe('a Redis store with a password', () => {
  it('createStore passes redis://:password@ to AUTH; a missing or wrong password is a StoreAuthError at once', async () => {
    const { spawnSync } = await import('node:child_process');
    if (spawnSync('redis-server', ['--version']).status !== 0) {
      console.warn('redis password test skipped: redis-server is not installed');
      return;
    }
    const port = await freePort();
    const redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--requirepass', TOKEN], { stdio: 'ignore' });
    try {
      const store = await distributed.createStore(`redis://:${TOKEN}@127.0.0.1:${port}`, { timeoutMs: 10_000 });
      await store.set('k', 'v');
      expect(text(await store.get('k'))).toBe('v');
      await store.close();
      const t0 = Date.now();
      const none = await distributed.createStore(`redis://127.0.0.1:${port}`, { timeoutMs: 20_000 }).catch((e) => e);
      expect(none).toBeInstanceOf(StoreAuthError);
      expect(none.message).toContain('needs a password');
      const wrong = await distributed.createStore(`redis://:wrong-password-123456@127.0.0.1:${port}`, { timeoutMs: 20_000 }).catch((e) => e);
      expect(wrong).toBeInstanceOf(StoreAuthError);
      expect(Date.now() - t0).toBeLessThan(15_000);
    } finally {
      redis.kill('SIGTERM');
    }
  }, 120_000);
});
