// Bigger under context parallelism: a sequence whose training does not fit one process's memory limit
// (NODETRON_MEMORY_LIMIT, the host allocator's cap) trains under CP2 ring and CP2 Ulysses, with the
// losses of one process without the limit; the limit itself is an OutOfMemoryError naming it, and a bad
// value is an ArgumentError when the addon loads.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/index.js';
import { parseMemoryLimit } from '../../lib/native.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const script = join(root, 'test', 'fixtures', 'parallel', 'cp-memory-limit.ts');
const pool = new JobPool();
const CTX = 2048;
// One process peaks at about 25.6 MiB here; CP2 at 14.8 (ring) and 16.3 MiB (Ulysses) per rank.
const LIMIT = '20M';

function launch(nproc: number, flags: string[], limit?: string) {
  return pool.run(async () => {
    const r = await runProcess(process.execPath, [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(script), '--ctx', String(CTX), ...flags],
      { cwd: root, limitMs: 300_000, env: { ...process.env, ...(limit ? { NODETRON_MEMORY_LIMIT: limit } : {}) } });
    const results = r.output.split('\n').filter((l) => l.includes('CPMEM ')).map((l) => JSON.parse(l.slice(l.indexOf('CPMEM ') + 6)) as { rank: number; losses: number[]; peak: number });
    return { ...r, results };
  });
}

describe('a sequence too long for one process trains under cp', () => {
  it(`ctx ${CTX} under NODETRON_MEMORY_LIMIT=${LIMIT}: one process runs out of memory, CP2 ring and Ulysses train with its losses`, async () => {
    const [free, capped, ring, ulysses] = await Promise.all([
      launch(1, []), launch(1, [], LIMIT), launch(2, ['--cp', '2'], LIMIT), launch(2, ['--cp', '2', '--cp-mode', 'ulysses'], LIMIT),
    ]);
    expect(free.code, free.output).toBe(0);
    const want = free.results[0]!.losses;
    expect(free.results[0]!.peak).toBeGreaterThan(parseMemoryLimit(LIMIT));
    expect(capped.code).not.toBe(0);
    expect(capped.output).toMatch(/OutOfMemoryError: cannot allocate \d+ bytes on cpu: NODETRON_MEMORY_LIMIT is 20971520 bytes and \d+ are allocated/);
    for (const run of [ring, ulysses]) {
      expect(run.code, run.output).toBe(0);
      expect(run.results).toHaveLength(2);
      for (const r of run.results) {
        expect(r.peak).toBeLessThanOrEqual(parseMemoryLimit(LIMIT));
        r.losses.forEach((l, i) => expect(Math.abs(l - want[i]!) / want[i]!).toBeLessThan(1e-5));
      }
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it('NODETRON_MEMORY_LIMIT reads bytes with K, M, G, T suffixes and rejects anything else', () => {
    expect(parseMemoryLimit('1048576')).toBe(1048576);
    expect(parseMemoryLimit('20M')).toBe(20 * 2 ** 20);
    expect(parseMemoryLimit('1.5GiB')).toBe(1.5 * 2 ** 30);
    expect(parseMemoryLimit(' 64 kb ')).toBe(65536);
    for (const bad of ['lots', '0', '-1M', '12X', '']) {
      expect(() => parseMemoryLimit(bad)).toThrow(ArgumentError);
      expect(() => parseMemoryLimit(bad)).toThrow(/NODETRON_MEMORY_LIMIT=.*expected a number of bytes/);
    }
  });
});
