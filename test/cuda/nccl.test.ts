// NCCL through the process-group API on a GPU: a single-rank communicator (one GPU cannot host two
// NCCL ranks) runs every collective, dtype and reduce op against the input, plus the error paths.
// Without a GPU the suite is skipped with the reason; the no-GPU error path runs everywhere.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import type { ProcessGroup } from '../../lib/distributed/index.js';

const hasGpu = nt.cuda.isAvailable();
const why = hasGpu ? '' : ` (skipped: no usable GPU: ${nt.cuda.unavailableReason()})`;
const DTYPES = ['f32', 'bf16', 'f16', 'i32', 'u8'] as const;

describe('nccl without a GPU', () => {
  it.skipIf(hasGpu)("init({ backend: 'nccl' }) names what is missing and leaves the process healthy", async () => {
    const err = await nt.distributed.init({ backend: 'nccl', env: nt.distributed.readLaunchEnv({}) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(nt.BackendUnavailableError);
    expect((err as Error).message).toMatch(/driver|GPU|not built|cannot load|without NCCL/i);
    expect(nt.distributed.isInitialized()).toBe(false);
    expect(Array.from(nt.tensor([1, 2]).add(nt.tensor([3, 4])).toArraySync())).toEqual([4, 6]);
  });
});

describe.skipIf(!hasGpu)(`nccl single-rank communicator through ProcessGroup${why}`, () => {
  let world: ProcessGroup;
  beforeAll(async () => {
    ({ world } = await nt.distributed.init({ backend: 'nccl', timeoutMs: 30_000, env: nt.distributed.readLaunchEnv({}) }));
  });
  afterAll(async () => { await nt.distributed.destroy(); });

  const randomOn = (n: number, dtype: (typeof DTYPES)[number], seed: number) =>
    (dtype === 'i32' || dtype === 'u8' ? nt.rand([n], { seed }).mul(50).to(dtype) : nt.randn([n], { seed, dtype })).to('cuda');
  const host = (t: nt.Tensor) => Array.from(t.toArraySync());

  it('the world has one NCCL communicator on cuda:0', () => {
    expect(world.devices).toEqual(['cuda:0']);
    expect([world.rank, world.size]).toEqual([0, 1]);
  });

  for (const dtype of DTYPES) {
    it(`allReduce every op, in place and out of place, ${dtype}; later kernels see the result`, async () => {
      for (const op of ['sum', 'avg', 'max', 'min', 'prod'] as const) {
        const x = randomOn(1031, dtype, 3), want = host(x);
        const out = nt.zeros([1031], { dtype, device: 'cuda' });
        await world.allReduce(x, { op, out });
        expect(host(out)).toEqual(want);
        world.allReduce(x, { op }).waitSync();
        expect(host(x)).toEqual(want);
      }
    });
  }

  it('broadcast, reduce, allGather, reduceScatter, allToAll (equal and counted), barrier, batch', async () => {
    const x = randomOn(777, 'f32', 5), want = host(x);
    await world.broadcast(x);
    expect(host(x)).toEqual(want);
    await world.reduce(x, { op: 'max' });
    expect(host(x)).toEqual(want);
    const g = nt.zeros([777], { device: 'cuda' });
    await world.allGather(g, x);
    expect(host(g)).toEqual(want);
    const list = [nt.zeros([777], { device: 'cuda' })];
    await world.allGather(list, x);
    expect(host(list[0]!)).toEqual(want);
    const rs = nt.zeros([777], { device: 'cuda' });
    await world.reduceScatter(rs, x);
    expect(host(rs)).toEqual(want);
    const a2a = nt.zeros([777], { device: 'cuda' });
    await world.allToAll(a2a, x, { sendCounts: [777], recvCounts: [777] });
    expect(host(a2a)).toEqual(want);
    await world.barrier();
    const a = randomOn(64, 'f32', 1), b = randomOn(65, 'bf16', 2), wa = host(a), wb = host(b);
    const works = world.batch(() => [world.allReduce(a), world.allReduce(b, { op: 'max' })]);
    await Promise.all(works);
    expect(host(a)).toEqual(wa);
    expect(host(b)).toEqual(wb);
  });

  it('bad input gives typed errors and the communicator keeps working', async () => {
    expect(() => world.allReduce(nt.zeros([4]))).toThrow(/tensor is on cpu but group 'world' communicates on cuda:0/);
    const d = nt.zeros([4], { device: 'cuda' });
    d.dispose();
    expect(() => world.allReduce(d)).toThrow(nt.DisposedError);
    expect(() => world.allReduce(nt.zeros([4], { device: 'cuda' }), { out: nt.zeros([5], { device: 'cuda' }) })).toThrow(nt.ShapeError);
    expect(() => world.allReduce(nt.zeros([4], { device: 'cuda' }), { out: nt.zeros([4], { device: 'cuda', dtype: 'bf16' }) })).toThrow(nt.DTypeError);
    const ok = randomOn(9, 'f32', 8), want = host(ok);
    await world.allReduce(ok);
    expect(host(ok)).toEqual(want);
  });
});
