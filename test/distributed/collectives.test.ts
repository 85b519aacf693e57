// Multi-process tests of the Gloo process groups: every collective, dtype and reduce op against
// float64 references computed in each rank (test/fixtures/dist/collectives.mjs), on 2, 3 and 4 ranks.
import { describe, expect, it } from 'vitest';
import { runRanks } from './spawn-ranks.js';

const quiet = { NODETRON_WARN_LEAKS: '0' };

describe('gloo collectives across processes', () => {
  for (const n of [2, 3, 4]) {
    it(`all collectives agree with the reference on ${n} ranks`, async () => {
      const results = await runRanks('collectives.mjs', n, [], quiet);
      for (const r of results) {
        expect(r.code, `rank ${r.rank} stderr: ${r.stderr.slice(-2000)}`).toBe(0);
        expect(r.result.wrong).toEqual({});
        expect(r.result.cases).toBeGreaterThan(250);
        // One host: allreduce and the size agreement go through the shared-memory segment.
        expect(r.result.sharedMemory).toBe(true);
      }
    });
  }

  it('the TCP path (NODETRON_COMM_SHM=0) agrees with the reference on 3 ranks', async () => {
    const results = await runRanks('collectives.mjs', 3, [], { ...quiet, NODETRON_COMM_SHM: '0' });
    for (const r of results) {
      expect(r.code, `rank ${r.rank} stderr: ${r.stderr.slice(-2000)}`).toBe(0);
      expect(r.result.wrong).toEqual({});
      expect(r.result.sharedMemory).toBe(false);
    }
  });

  it('the host-staged path (device tensors through Gloo in host memory) agrees with the reference on 3 ranks', async () => {
    // NODETRON_TEST_HOST_STAGING=1 routes cpu tensors through the staging a cuda tensor takes without NCCL.
    const results = await runRanks('collectives.mjs', 3, [], { ...quiet, NODETRON_TEST_HOST_STAGING: '1' });
    for (const r of results) {
      expect(r.code, `rank ${r.rank} stderr: ${r.stderr.slice(-2000)}`).toBe(0);
      expect(r.result.wrong).toEqual({});
      expect(r.result.stagedOps).toBeGreaterThan(200);
    }
  });

  it('check mode passes when all ranks run the same collectives', async () => {
    const results = await runRanks('collectives.mjs', 2, [], { ...quiet, NODETRON_COMM_CHECK: '1' });
    for (const r of results) {
      expect(r.code, r.stderr.slice(-2000)).toBe(0);
      expect(r.result.wrong).toEqual({});
    }
  });
});
