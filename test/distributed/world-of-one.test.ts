// The distributed API in a single process without a launcher: a world of one with its own store,
// identity collectives, state errors before init and after destroy.
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

describe('world of one', () => {
  afterAll(async () => { await nt.distributed.destroy(); });

  it('accessors fail loudly before init', () => {
    expect(() => nt.distributed.world()).toThrow(nt.StateError);
  });

  it('collectives are identities and Work reports completion', async () => {
    const { world, rank, worldSize } = await nt.distributed.init({ timeoutMs: 5000, env: nt.distributed.readLaunchEnv({}) });
    expect([rank, worldSize, world.size, world.rank]).toEqual([0, 1, 1, 0]);
    const x = nt.tensor([1.5, -2, 3], [3]);
    const w = world.allReduce(x, { op: 'avg' });
    const y = await w;
    expect(w.isCompleted()).toBe(true);
    expect(y).toBe(x);
    expect(Array.from(x.toArraySync())).toEqual([1.5, -2, 3]);
    const out = nt.zeros([3]);
    await world.allGather(out, x);
    expect(Array.from(out.toArraySync())).toEqual([1.5, -2, 3]);
    await world.barrier();
    expect(() => world.send(x, 0)).toThrow(nt.ArgumentError);
    const solo = await nt.distributed.newGroup([0]);
    expect(solo.isMember).toBe(true);
    await expect(nt.distributed.init()).rejects.toThrow(nt.StateError);
  });
});
