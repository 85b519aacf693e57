// Failure behaviour of the Gloo process groups: a dying rank, mismatched collectives, sizes that
// differ between ranks, bad arguments and an unreachable store, each in real processes.
import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { runRanks } from './spawn-ranks.js';

const quiet = { NODETRON_WARN_LEAKS: '0' };

async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as { port: number }).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe('gloo failures', () => {
  it('a rank that dies mid-job surfaces as CommError on the others within the timeout, and the group then fails fast', async () => {
    const results = await runRanks('failures.mjs', 3, ['die'], quiet);
    expect(results[1]!.code).toBe(7);
    for (const r of [results[0]!, results[2]!]) {
      expect(r.code, r.stderr).toBe(0);
      expect(['CommError', 'TimeoutError']).toContain(r.result.error.name);
      expect(r.result.elapsedMs).toBeLessThan(3000 + 1000);
      expect(r.result.error.message).toMatch(new RegExp(`allReduce\\(sum\\) #2 \\(800000 bytes\\) on rank ${r.rank} of group`));
      expect(r.result.next.name).toBe('CommError');
      expect(r.result.next.message).toMatch(/unusable after an earlier failure/);
    }
  });

  it('check mode names both descriptions when ranks run different collectives', async () => {
    const results = await runRanks('failures.mjs', 3, ['mismatch'], quiet);
    for (const r of results) {
      expect(r.code, r.stderr).toBe(0);
      expect(r.result.error.name).toBe('CommError');
      expect(r.result.error.message).toMatch(/allReduce\(sum\) dtype=f32 count=1000/);
      expect(r.result.error.message).toMatch(/broadcast dtype=f32 count=1000 root=0/);
    }
  });

  it('check mode catches sizes that differ between ranks', async () => {
    const results = await runRanks('failures.mjs', 2, ['sizes'], { ...quiet, NODETRON_COMM_CHECK: '1' });
    for (const r of results) {
      expect(r.code, r.stderr).toBe(0);
      expect(r.result.error.name).toBe('CommError');
      expect(r.result.error.message).toMatch(/count=100 .*count=1000|count=1000 .*count=100/);
    }
  });

  it('without check mode, differing sizes never hang: the peers of the failing rank get CommError', async () => {
    // Gloo 0.5.0 enforces the message size in its I/O thread, which aborts the receiving process;
    // the launcher reports that rank, the others see their connections close.
    const results = await runRanks('failures.mjs', 3, ['sizes'], quiet);
    const failed = results.filter((r) => r.code !== 0);
    expect(failed.length).toBeGreaterThanOrEqual(1);
    for (const r of results.filter((x) => x.code === 0)) {
      expect(['CommError', 'TimeoutError']).toContain(r.result.error.name);
      expect(r.result.elapsedMs).toBeLessThan(3000);
    }
  });

  it('bad arguments throw typed errors and the group stays healthy', async () => {
    const results = await runRanks('failures.mjs', 2, ['badinput'], quiet);
    for (const r of results) {
      expect(r.code, r.stderr).toBe(0);
      expect(r.result.errors).toEqual({
        dtype: 'DTypeError', size: 'ShapeError', root: 'ArgumentError', dst: 'ArgumentError', op: 'ArgumentError',
        notTensor: 'ArgumentError', disposed: 'DisposedError', timeout: 'ArgumentError', gatherSize: 'ShapeError',
        newGroupRank: 'ArgumentError',
      });
      expect(r.result.after).toEqual([3, 3, 3, 3, 3]);
    }
  });

  it('an unreachable master gives CommError after the timeout', async () => {
    const port = await closedPort();
    const results = await runRanks('failures.mjs', 1, ['unreachable'], { ...quiet, WORLD_SIZE: '2', MASTER_PORT: String(port) });
    const r = results[0]!;
    expect(r.code, r.stderr).toBe(0);
    expect(r.result.error.name).toBe('CommError');
    expect(r.result.error.message).toMatch(/could not reach/);
    expect(r.result.elapsedMs).toBeGreaterThanOrEqual(1000);
    expect(r.result.elapsedMs).toBeLessThan(5000);
  });
});
