// The flight recorder inside one process: ops of a world of one land in the ring with their state,
// sizes and the caller's stack; the ring keeps the last N; per-group progress outlives the ring; the
// per-op cost stays small.
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { FLIGHT_SIZE, flightSnapshot, opIssued, opSettled, opStarted, resetFlightRecorder } from '../../lib/distributed/flight.js';
import { analyzeFlight } from '../../lib/launch/flight-analysis.js';

describe('flight recorder', () => {
  afterAll(async () => { await nt.distributed.destroy(); });

  it('records collectives with state, bytes, dtype and the issuing stack', async () => {
    expect(FLIGHT_SIZE).toBe(2000);
    resetFlightRecorder();
    const { world } = await nt.distributed.init({ timeoutMs: 5000, env: nt.distributed.readLaunchEnv({}) });
    const x = nt.tensor([1, 2, 3], [3]);
    const w = world.allReduce(x, { op: 'max' });
    await w;
    await world.broadcast(x);
    const snap = flightSnapshot('test');
    const ops = snap.ops.filter((o) => o.group === 'world');
    expect(ops.map((o) => [o.op, o.seq, o.state, o.bytes, o.dtype])).toEqual([['allReduce(max)', 0, 'completed', 12, 'f32'], ['broadcast', 1, 'completed', 12, 'f32']]);
    expect(ops[1]!.root).toBe(0);
    expect(ops[0]!.stack![0]).toContain('flight.test.ts');
    expect(ops[0]!.endedAt! >= ops[0]!.issuedAt).toBe(true);
    expect(snap.groups.world).toMatchObject({ ranks: [0], entered: 1, completed: 1 });
  });

  it('keeps the last N ops, and its per-op cost stays small', () => {
    resetFlightRecorder();
    const g = { name: 'fake', rank: 0, ranks: [0, 1] };
    const n = 20_000;
    const t0 = performance.now();
    for (let i = 0; i < n; i++) {
      const e = opIssued(g, 'allReduce(sum)', i, 1024, 'f32');
      opStarted(e);
      opSettled(e, false);
    }
    const usPerOp = ((performance.now() - t0) * 1000) / n;
    const snap = flightSnapshot('test');
    expect(snap.ops.length).toBe(FLIGHT_SIZE);
    expect(snap.ops[0]!.seq).toBe(n - FLIGHT_SIZE);
    expect(snap.groups.fake).toMatchObject({ entered: n - 1, completed: n - 1 });
    console.log(`flight recorder: ${usPerOp.toFixed(2)} µs per recorded op`);
    expect(usPerOp).toBeLessThan(50);  // generous: a loaded machine; typically a few µs
    resetFlightRecorder();
  });

  it('analysis: a pending recv whose peer never sent, and an absent rank on another node', () => {
    const base = { version: 1 as const, worldSize: 3, host: 'h', dumpedAt: 2000, reason: 'test' };
    const recv = { id: 0, group: 'pp', seq: 0, op: 'recv', p2p: true, bytes: 8, dtype: 'f32', peer: 1, tag: 0, state: 'started' as const, issuedAt: 1000 };
    const dumps = new Map([
      [0, { ...base, rank: 0, pid: 1, groups: { pp: { ranks: [0, 1], entered: -1, completed: -1 } }, ops: [recv] }],
      [1, { ...base, rank: 1, pid: 2, groups: { pp: { ranks: [0, 1], entered: -1, completed: -1 } }, ops: [] }],
    ]);
    const lines = analyzeFlight(dumps, { worldSize: 3, localRanks: [0, 1] });
    expect(lines[0]).toBe("rank 0 waits in recv #0 from rank 1 (group 'pp', tag 0, 8 bytes): rank 1 never posted the matching send (alive: it dumped)");
    expect(lines).toContain('dumps from rank(s) 0, 1 of 3; none from 2');
  });
});
