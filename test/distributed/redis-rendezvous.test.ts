// Gloo's rendezvous through Redis: ranks of a job launched with --rdzv redis://… (NODETRON_RDZV) meet
// through the Redis store, with MASTER_PORT pointing nowhere to prove the TCP store is not used.
// Skipped, with the reason printed, when redis-server is not installed.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { distributed } from '../../lib/index.js';
import { runRanks } from './spawn-ranks.js';
import { freePort } from '../helpers/net.js';

const haveRedis = spawnSync('redis-server', ['--version']).status === 0;
if (!haveRedis) console.warn('redis rendezvous tests skipped: redis-server is not installed (apt-get install -y redis-server)');

describe.skipIf(!haveRedis)('Gloo rendezvous through Redis', () => {
  let redis: ChildProcess;
  let port: number;
  beforeAll(async () => {
    port = await freePort();
    redis = spawn('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  });
  afterAll(() => { redis?.kill('SIGTERM'); });

  it('2 ranks meet through Redis alone and their collectives agree', async () => {
    const deadPort = await freePort();
    const results = await runRanks('smoke.mjs', 2, [], {
      NODETRON_WARN_LEAKS: '0', NODETRON_RDZV: `redis://127.0.0.1:${port}`, MASTER_PORT: String(deadPort), NODETRON_STORE_PREFIX: 'rdzv-test',
    }, 120_000);
    for (const r of results) {
      expect(r.code, `rank ${r.rank}: ${r.stderr.slice(-2000)}`).toBe(0);
      expect(r.result.sum).toEqual([3, -1, 4]);
      expect(r.result.max).toEqual([2, 0, 2]);
    }
    const store = await distributed.RedisStore.connect({ port, timeoutMs: 5000 });
    try {
      const keys = await store.keys('rdzv-test/gloo/world/');
      // Gloo's own per-rank addresses and the shared-memory handshake both went through Redis.
      for (const k of ['0', '1', 'shm/host/0', 'shm/host/1', 'shm/name']) expect(keys).toContain(`rdzv-test/gloo/world/${k}`);
    } finally {
      await store.close();
    }
  }, 180_000);
});
