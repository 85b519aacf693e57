// Tests of RedisStore against a redis-server this file starts on a random loopback port; skipped,
// with the reason printed, when the redis-server binary is not installed (apt-get install redis-server).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CommError, distributed, TimeoutError } from '../../lib/index.js';
import { freePort } from '../helpers/net.js';

const { RedisStore, PrefixStore, createStore } = distributed;

const haveRedis = spawnSync('redis-server', ['--version']).status === 0;
if (!haveRedis) console.warn('redis-store tests skipped: redis-server is not installed (apt-get install -y redis-server)');

const text = (b: Uint8Array) => new TextDecoder().decode(b);

describe.skipIf(!haveRedis)('RedisStore (redis-server on loopback)', () => {
  let redis: ChildProcess;
  let port: number;
  let store: InstanceType<typeof RedisStore>;
  beforeAll(async () => {
    port = await freePort();
    redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    // connect retries while redis-server starts up.
    store = await RedisStore.connect({ port, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await store?.close();
    redis?.kill('SIGTERM');
  });

  it('set/get/tryGet with strings and binary values', async () => {
    await store.set('s', 'héllo');
    expect(await store.getString('s')).toBe('héllo');
    const bytes = Uint8Array.from({ length: 3001 }, (_, i) => (i * 37) & 255);
    await store.set('b', bytes);
    expect(Buffer.from(await store.get('b')).equals(Buffer.from(bytes))).toBe(true);
    expect(await store.tryGet('none')).toBeUndefined();
  });

  it('blocking get and wait see keys set later by another client; timeouts name the key', async () => {
    const other = await RedisStore.connect({ port, timeoutMs: 5000 });
    const pending = store.getString('late', { timeoutMs: 5000 });
    const waiting = store.wait(['late', 'late2'], { timeoutMs: 5000 });
    setTimeout(() => void other.set('late', 'x').then(() => other.set('late2', 'y')), 100);
    expect(await pending).toBe('x');
    await waiting;
    const err = await store.get('nope', { timeoutMs: 60 }).catch((e) => e);
    expect(err).toBeInstanceOf(TimeoutError);
    expect(err.message).toContain('"nope"');
    const werr = await store.wait(['late', 'nope2'], { timeoutMs: 60 }).catch((e) => e);
    expect(werr).toBeInstanceOf(TimeoutError);
    expect(werr.message).toContain('"nope2"');
    await other.close();
  });

  it('add is atomic across clients; compareSet elects one winner', async () => {
    const clients = await Promise.all(Array.from({ length: 4 }, () => RedisStore.connect({ port, timeoutMs: 5000 })));
    await Promise.all(clients.map(async (c) => { for (let i = 0; i < 25; i++) await c.add('ctr', 2); }));
    expect(await store.add('ctr', 0)).toBe(200);
    expect(text(await store.compareSet('cas', '', 'a'))).toBe('a');
    expect(text(await store.compareSet('cas', 'zz', 'b'))).toBe('a');
    expect(text(await store.compareSet('cas', 'a', 'b'))).toBe('b');
    expect(text(await store.compareSet('cas-none', 'q', 'r'))).toBe('');
    const outcomes = await Promise.all(clients.map((c, i) => c.compareSet('leader', '', `r${i}`)));
    expect(new Set(outcomes.map(text)).size).toBe(1);
    await store.set('nan', 'abc');
    await expect(store.add('nan', 1)).rejects.toBeInstanceOf(CommError);
    await Promise.all(clients.map((c) => c.close()));
  });

  it('delete, check, keys with glob characters escaped, prefix views, createStore(redis://)', async () => {
    await store.set('p*[x]/1', '1');
    await store.set('p*[x]/2', '2');
    await store.set('pa/3', '3');
    expect((await store.keys('p*[x]/')).sort()).toEqual(['p*[x]/1', 'p*[x]/2']);
    expect(await store.check(['p*[x]/1', 'pa/3', 'pa/3'])).toBe(true);
    expect(await store.delete('pa/3')).toBe(true);
    expect(await store.delete('pa/3')).toBe(false);
    expect(await store.check(['pa/3'])).toBe(false);
    const viaUrl = await createStore(`redis://127.0.0.1:${port}`, { timeoutMs: 5000 });
    const view = new PrefixStore(viaUrl, 'job', true);
    await view.set('k', 'v');
    expect(await store.getString('job/k')).toBe('v');
    expect(await view.numKeys()).toBe(1);
    expect(await store.numKeys()).toBeGreaterThanOrEqual(5);
    await view.close();
    await expect(viaUrl.set('x', 'y')).rejects.toBeInstanceOf(Error);
  });
});
