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
      expect(r.result.errors.count.name).toBe('CommError');
      expect(r.result.errors.count.message).toMatch(/count=100 .*count=1000|count=1000 .*count=100/);
    }
  });

  for (const n of [2, 3]) {
    it(`without check mode, differing sizes give every one of ${n} ranks a CommError naming both sizes, and the group stays usable`, async () => {
      const results = await runRanks('failures.mjs', n, ['sizes'], quiet);
      const expected = Array.from({ length: n }, (_, r) => r + 1).reduce((a, b) => a + b, 0);
      for (const r of results) {
        // Exit code 0 and no signal: no rank was aborted by Gloo.
        expect(r.code, r.stderr).toBe(0);
        const { errors } = r.result;
        for (const [name, e] of Object.entries(errors) as [string, any][]) {
          expect(e.name, `${name}: ${e.message}`).toBe('CommError');
        }
        expect(errors.count.message).toMatch(/element counts differ between ranks: 100 \(400 bytes\) on some, 1000 \(4000 bytes\) on others \(this rank: (100|1000)\)/);
        expect(errors.dtype.message).toMatch(/dtype: f32 on some, i32 on others/);
        expect(errors.gather.message).toMatch(/element counts differ|per-rank counts/);
        expect(errors.kind.message).toMatch(/different collectives/);
        if (n === 2) {
          expect(errors.root.message).toMatch(/root: from 0 to 1/);
          expect(errors.allToAll.message).toMatch(/rank 0 sends 2 elements to rank 0, which expects 1/);
        }
        expect(r.result.elapsedMs).toBeLessThan(3000);
        expect(r.result.after).toEqual(new Array(5).fill(expected));
      }
    });
  }

  it('a send and a recv of different sizes time out on both sides instead of aborting the receiver', async () => {
    const results = await runRanks('failures.mjs', 2, ['p2psizes'], quiet);
    for (const r of results) {
      expect(r.code, r.stderr).toBe(0);
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
