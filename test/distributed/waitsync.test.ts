// Work.waitSync across processes: blocking waits mixed with awaited ops, and a peer that dies while
// a rank blocks (test/fixtures/dist/waitsync.mjs, failures.mjs).
import { describe, expect, it } from 'vitest';
import { runRanks } from './spawn-ranks.js';

const quiet = { NODETRON_WARN_LEAKS: '0' };

describe('Work.waitSync', () => {
  it('blocking and awaited collectives interleave with correct results on 2 ranks', async () => {
    const results = await runRanks('waitsync.mjs', 2, [], quiet);
    for (const r of results) {
      expect(r.code, r.stderr.slice(-2000)).toBe(0);
      expect(r.result.wrong).toEqual({});
      expect(r.result.cases).toBeGreaterThan(80);
    }
  });

  it('a peer dying during waitSync gives CommError within the timeout, and await gives the same error', async () => {
    const results = await runRanks('failures.mjs', 2, ['waitsync-die'], quiet);
    expect(results[1]!.code).toBe(7);
    const r = results[0]!;
    expect(r.code, r.stderr).toBe(0);
    expect(['CommError', 'TimeoutError']).toContain(r.result.error.name);
    expect(r.result.error.message).toMatch(/allReduce\(sum\) #2 \(800000 bytes\) on rank 0 of group/);
    expect(r.result.elapsedMs).toBeLessThan(3000 + 1000);
    expect(r.result.sameErrorAwaited).toBe(true);
    expect(r.result.failed).toBe(true);
    expect(r.result.next.name).toBe('CommError');
    expect(r.result.next.message).toMatch(/unusable after an earlier failure/);
  });
});
