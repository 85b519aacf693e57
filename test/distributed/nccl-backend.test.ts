// NcclBackend without a GPU: the unique-id exchange through the store, group creation, every
// collective through ProcessGroup against float64 references (fake NCCL on host memory), stream-
// ordered waits, batches, the watchdog's timeout and error paths, and backend selection in init.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { createStore, NCCL_UNIQUE_ID_KEY, selectBackends, StoreServer } from '../../lib/distributed/index.js';
import { createNcclBackend, NCCL_PENDING } from '../../lib/internal.js';
import { FakeNccl, ncclRanksClosedAfterEach } from './fake-nccl.js';

const makeRanks = ncclRanksClosedAfterEach();

let seed = 11;
function rand(count: number, dtype: 'f32' | 'i32', small = false): number[] {
  return Array.from({ length: count }, () => {
    seed = (seed * 1103515245 + 12345) % 2 ** 31;
    const u = seed / 2 ** 31;
    return dtype === 'i32' ? Math.floor(u * (small ? 5 : 41)) - (small ? 2 : 20) : (u - 0.5) * 8;
  });
}
const make = (v: number[], dtype: 'f32' | 'i32') => nt.tensor(v, [v.length], { dtype });
const read = (t: nt.Tensor) => Array.from(t.toArraySync());
function reduceRef(op: string, xs: number[], dtype: string): number {
  const s = xs.reduce((a, b) => a + b, 0);
  if (op === 'max') return Math.max(...xs);
  if (op === 'min') return Math.min(...xs);
  if (op === 'prod') return xs.reduce((a, b) => a * b, 1);
  return op === 'avg' ? (dtype === 'i32' ? Math.trunc(s / xs.length) : s / xs.length) : s;
}
function expectClose(got: number[], want: number[]): void {
  expect(got.length).toBe(want.length);
  got.forEach((g, i) => expect(Math.abs(g - want[i]!)).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(want[i]!))));
}

describe('nccl unique-id exchange and communicator setup', () => {
  it('rank 0 creates one id and publishes it under the group prefix; every rank joins with it', async () => {
    const { fake, stores, backends } = await makeRanks(3, { prefix: 'nccl/g7' });
    expect(fake.ids).toHaveLength(1);
    const published = await stores[1]!.get(`nccl/g7/${NCCL_UNIQUE_ID_KEY}`);
    expect(Buffer.from(published).equals(Buffer.from(fake.ids[0]!))).toBe(true);
    expect(fake.comms.map((c) => c.fabric)).toEqual([fake.comms[0]!.fabric, fake.comms[0]!.fabric, fake.comms[0]!.fabric]);
    expect(backends.map((b) => [b.rank, b.size])).toEqual([[0, 3], [1, 3], [2, 3]]);
  });

  it('a rank whose rank 0 never publishes times out naming the key, and the process stays healthy', async () => {
    const server = await StoreServer.start({ host: '127.0.0.1', port: 0 });
    const store = await createStore(`tcp://127.0.0.1:${server.port}`);
    try {
      const err = await createNcclBackend({ store, prefix: 'nccl/lonely', group: 'lonely', rank: 1, size: 2, device: 0, timeoutMs: 200, addon: new FakeNccl() })
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(nt.TimeoutError);
      expect((err as Error).message).toContain(`nccl/lonely/${NCCL_UNIQUE_ID_KEY}`);
      expect(read(nt.tensor([1, 2]).mul(2))).toEqual([2, 4]);
    } finally {
      await store.close();
      await server.close();
    }
  });

  it('initialization that never completes (a peer missing) fails with TimeoutError and aborts', async () => {
    const server = await StoreServer.start({ host: '127.0.0.1', port: 0 });
    const store = await createStore(`tcp://127.0.0.1:${server.port}`);
    const fake = new FakeNccl();
    try {
      const err = await createNcclBackend({ store, prefix: 'p', group: 'half', rank: 0, size: 2, device: 0, timeoutMs: 100, addon: fake }).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(nt.TimeoutError);
      expect((err as Error).message).toMatch(/connect on rank 0 of nccl group 'half' \(size 2, cuda:0\) did not finish within 100 ms/);
      expect(fake.calls).toContain('abort');
    } finally {
      await store.close();
      await server.close();
    }
  });
});

describe('nccl collectives through ProcessGroup (fake NCCL on host memory)', () => {
  it('allReduce: every op, f32 and i32, odd sizes, in place and out of place, on 2 and 3 ranks', async () => {
    for (const n of [2, 3]) {
      const { groups } = await makeRanks(n);
      for (const dtype of ['f32', 'i32'] as const) {
        for (const op of ['sum', 'avg', 'max', 'min', 'prod'] as const) {
          const count = 1 + (seed % 37);
          const inputs = groups.map(() => rand(count, dtype, op === 'prod'));
          const want = Array.from({ length: count }, (_, i) => reduceRef(op, inputs.map((x) => x[i]!), dtype));
          const xs = inputs.map((v) => make(v, dtype));
          const outs = inputs.map(() => nt.zeros([count], { dtype }));
          await Promise.all(groups.map((g, r) => g.allReduce(xs[r]!, { op, out: outs[r] })));
          for (let r = 0; r < n; r++) { expectClose(read(outs[r]!), want); expectClose(read(xs[r]!), inputs[r]!); }
          await Promise.all(groups.map((g, r) => g.allReduce(xs[r]!, { op })));
          for (let r = 0; r < n; r++) expectClose(read(xs[r]!), want);
        }
      }
    }
  });

  it('broadcast, reduce, allGather (equal, uneven), reduceScatter (equal, uneven), allToAll (equal, uneven), barrier on 3 ranks', async () => {
    const n = 3;
    const { groups, fake } = await makeRanks(n);
    // broadcast from rank 2
    const src = rand(11, 'f32');
    const b = groups.map((_, r) => make(r === 2 ? src : new Array(11).fill(0), 'f32'));
    await Promise.all(groups.map((g, r) => g.broadcast(b[r]!, { root: 2 })));
    for (const t of b) expectClose(read(t), src);
    // reduce(max) onto rank 1; others keep their input
    const rin = groups.map(() => rand(9, 'i32'));
    const rx = rin.map((v) => make(v, 'i32'));
    await Promise.all(groups.map((g, r) => g.reduce(rx[r]!, { root: 1, op: 'max' })));
    expectClose(read(rx[1]!), rin[0]!.map((_, i) => Math.max(...rin.map((x) => x[i]!))));
    expectClose(read(rx[0]!), rin[0]!);
    // allGather equal
    const ag = groups.map(() => rand(5, 'f32'));
    const agOut = groups.map(() => nt.zeros([15]));
    await Promise.all(groups.map((g, r) => g.allGather(agOut[r]!, make(ag[r]!, 'f32'))));
    for (const o of agOut) expectClose(read(o), ag.flat());
    // allGather uneven (rank 1 contributes nothing): group broadcasts
    const counts = [4, 0, 7];
    const agv = counts.map((c) => rand(c, 'f32'));
    const agvOut = groups.map(() => counts.map((c) => nt.zeros([c])));
    fake.calls.length = 0;
    await Promise.all(groups.map((g, r) => g.allGather(agvOut[r]!, make(agv[r]!, 'f32'))));
    for (const outs of agvOut) expectClose(outs.flatMap(read), agv.flat());
    expect(fake.calls.filter((c) => c === 'broadcast')).toHaveLength(2 * n);
    expect(fake.calls.filter((c) => c === 'groupStart')).toHaveLength(n);
    // reduceScatter equal and uneven
    for (const blocks of [[6, 6, 6], [2, 0, 5]]) {
      const total = blocks.reduce((a, c) => a + c, 0);
      const ins = groups.map(() => rand(total, 'f32'));
      const full = ins[0]!.map((_, i) => ins.reduce((a, x) => a + x[i]!, 0));
      const outs = blocks.map((c) => nt.zeros([c]));
      const uneven = blocks[0] !== blocks[1];
      await Promise.all(groups.map((g, r) => g.reduceScatter(outs[r]!, make(ins[r]!, 'f32'), uneven ? { counts: blocks } : {})));
      let off = 0;
      blocks.forEach((c, r) => { expectClose(read(outs[r]!), full.slice(off, off + c)); off += c; });
    }
    // allToAll equal
    const a2a = groups.map(() => rand(4 * n, 'i32'));
    const a2aOut = groups.map(() => nt.zeros([4 * n], { dtype: 'i32' }));
    await Promise.all(groups.map((g, r) => g.allToAll(a2aOut[r]!, make(a2a[r]!, 'i32'))));
    a2aOut.forEach((o, r) => expectClose(read(o), a2a.flatMap((x) => x.slice(4 * r, 4 * r + 4))));
    // allToAll uneven: rank r sends r+j elements to rank j (rank 0 sends nothing to itself)
    const sendCounts = (r: number) => Array.from({ length: n }, (_, j) => r + j);
    const payload = groups.map((_, r) => rand(sendCounts(r).reduce((a, c) => a + c, 0), 'f32'));
    const recvCounts = (r: number) => Array.from({ length: n }, (_, j) => sendCounts(j)[r]!);
    const vOut = groups.map((_, r) => nt.zeros([recvCounts(r).reduce((a, c) => a + c, 0)]));
    await Promise.all(groups.map((g, r) => g.allToAll(vOut[r]!, make(payload[r]!, 'f32'), { sendCounts: sendCounts(r), recvCounts: recvCounts(r) })));
    vOut.forEach((o, r) => expectClose(read(o), groups.flatMap((_, j) => {
      const start = sendCounts(j).slice(0, r).reduce((a, c) => a + c, 0);
      return payload[j]!.slice(start, start + sendCounts(j)[r]!);
    })));
    await Promise.all(groups.map((g) => g.barrier()));
  });

  it('in-place allGather and reduceScatter (equal and uneven) pass NCCL the in-place offsets', async () => {
    const n = 3;
    const { groups } = await makeRanks(n);
    const blocks = groups.map(() => rand(4, 'f32'));
    const gs = groups.map((_, r) => make(blocks.flatMap((b, j) => (j === r ? b : [0, 0, 0, 0])), 'f32'));
    await Promise.all(groups.map((g, r) => g.allGather(gs[r]!, gs[r]!)));
    for (const t of gs) expectClose(read(t), blocks.flat());
    for (const counts of [[3, 3, 3], [2, 0, 4]]) {
      const total = counts.reduce((a, c) => a + c, 0);
      const ins = groups.map(() => rand(total, 'i32'));
      const xs = ins.map((v) => make(v, 'i32'));
      const uneven = counts[0] !== counts[1];
      await Promise.all(groups.map((g, r) => g.reduceScatter(xs[r]!, xs[r]!, uneven ? { counts } : {})));
      xs.forEach((x, r) => {
        const off = counts.slice(0, r).reduce((a, c) => a + c, 0);
        expectClose(read(x), ins[r]!.map((v, i) => (i >= off && i < off + counts[r]! ? ins.reduce((a, row) => a + row[i]!, 0) : v)));
      });
    }
  });

  it('a ring of send/recv inside batch() is one group call; nonzero tags are refused', async () => {
    const n = 3;
    const { groups, fake } = await makeRanks(n);
    const data = groups.map(() => rand(13, 'f32'));
    const outs = groups.map(() => nt.zeros([13]));
    fake.calls.length = 0;
    const works = groups.map((g, r) => g.batch(() => [g.send(make(data[r]!, 'f32'), (r + 1) % n), g.recv(outs[r]!, (r + n - 1) % n)]));
    expect(fake.calls).toEqual(Array.from({ length: n }, () => ['groupStart', 'send', 'recv', 'groupEnd']).flat());
    await Promise.all(works.flat());
    outs.forEach((o, r) => expectClose(read(o), data[(r + n - 1) % n]!));
    // Both ops of a batch share the event of the group call.
    const waits = fake.streamWaits.slice(-2 * n);
    for (let r = 0; r < n; r++) expect(waits[2 * r]!.event).toBe(waits[2 * r + 1]!.event);
    expect(() => groups[0]!.send(make([1], 'f32'), 1, { tag: 3 })).toThrow(nt.ArgumentError);
    expect(() => groups[0]!.batch(() => { throw new RangeError('inside'); })).toThrow(RangeError);
    expect(fake.calls.slice(-1)).toEqual(['groupEnd']);
  });
});

describe('nccl Work semantics and failures', () => {
  it('await orders the current stream after the op (no host wait); completed events are destroyed, not waited on', async () => {
    const { groups, fake } = await makeRanks(2);
    const xs = [make([1, 2], 'f32'), make([3, 4], 'f32')];
    const works = groups.map((g, r) => g.allReduce(xs[r]!));
    expect(works.every((w) => !w.isCompleted())).toBe(true);
    await Promise.all(works);
    expect(fake.streamWaits.slice(-2).map((w) => [w.device, w.stream])).toEqual([[0, 7], [0, 7]]);
    expect(read(xs[0]!)).toEqual([4, 6]);
    // waitSync is the same stream ordering, usable inside autograd backward.
    const w2 = groups.map((g, r) => g.allReduce(xs[r]!));
    w2.forEach((w) => w.waitSync());
    expect(read(xs[1]!)).toEqual([8, 12]);
    // An op left alone completes through the watchdog: its event is destroyed and nothing waits on it.
    const before = fake.streamWaits.length;
    const w3 = groups.map((g, r) => g.allReduce(xs[r]!));
    await new Promise((r) => setTimeout(r, 30));
    expect(w3.every((w) => w.isCompleted())).toBe(true);
    await Promise.all(w3);
    expect(fake.streamWaits.length).toBe(before);
    await Promise.all(groups.map((g) => g.destroy()));
    expect(fake.events.size).toBe(0);
    expect(fake.calls.filter((c) => c === 'destroy')).toHaveLength(2);
  });

  it('an op that never finishes times out naming rank, group, op, seq and bytes; the communicator is aborted; later ops throw', async () => {
    const { groups, fake } = await makeRanks(2, { timeoutMs: 5000 });
    fake.hang = true;
    const works = groups.map((g) => g.allReduce(nt.zeros([10]), { timeoutMs: 50 }));
    // wait() only orders the stream (no host block), so it resolves; the watchdog then finds the timeout.
    const errs = await Promise.all(works.map((w) => w.wait().then(() => undefined, (e: unknown) => e)));
    expect(errs).toEqual([undefined, undefined]);
    await new Promise((r) => setTimeout(r, 200));
    let later: unknown;
    try { groups[0]!.allReduce(nt.zeros([4])); } catch (e) { later = e; }
    expect(later).toBeInstanceOf(nt.CommError);
    expect((later as Error).message).toMatch(/allReduce #0 \(40 bytes\) on rank 0 of nccl group 'world' \(size 2, cuda:0\) did not finish within its timeout/);
    expect(fake.calls.filter((c) => c === 'abort').length).toBeGreaterThanOrEqual(2);
    expect(read(nt.tensor([1, 2]).mul(3))).toEqual([3, 6]);
  });

  it('the op promise itself rejects with TimeoutError (host-side completion)', async () => {
    const { backends, fake } = await makeRanks(2);
    fake.hang = true;
    const buf = nt.zeros([5]);
    const p = backends[0]!.allReduce(buf.storage, buf.storage, 0, 5, 0, 4, 30);
    const err = await p.then(() => undefined, (e: unknown) => e);
    expect(err).toBeInstanceOf(nt.TimeoutError);
    expect((err as Error).message).toMatch(/allReduce #4 \(20 bytes\) on rank 0 of nccl group 'world'/);
  });

  it('an asynchronous NCCL error (ranks disagree on the size) rejects with CommError', async () => {
    const { backends } = await makeRanks(2);
    const a = nt.zeros([4]), b = nt.zeros([5]);
    const ps = [backends[0]!.allReduce(a.storage, a.storage, 0, 4, 0, 0, 5000), backends[1]!.allReduce(b.storage, b.storage, 0, 5, 0, 0, 5000)];
    const errs = await Promise.all(ps.map((p) => p.then(() => undefined, (e: unknown) => e)));
    for (const e of errs) {
      expect(e).toBeInstanceOf(nt.CommError);
      expect((e as Error).message).toMatch(/ranks disagree at collective 0/);
    }
  });

  it('a tensor on a device the group has no communicator for is an ArgumentError naming both; the group still works', async () => {
    const { groups } = await makeRanks(2, { deviceKey: 'cuda:0' });
    expect(() => groups[0]!.allReduce(nt.zeros([2]))).toThrow(/tensor is on cpu but group 'world' communicates on cuda:0/);
    expect(() => groups[1]!.broadcast(nt.zeros([2]))).toThrow(nt.ArgumentError);
    await Promise.all(groups.map((g) => g.barrier()));
  });
});

describe("nccl's non-blocking enqueue (ncclInProgress)", () => {
  it('a call NCCL is still enqueueing gets its completion event only after the state leaves in-progress; results are right', async () => {
    const { groups, fake } = await makeRanks(3);
    fake.enqueuePolls = 4;
    const xs = [0, 1, 2].map((r) => make([r + 1, 10 * (r + 1), -r], 'f32'));
    await Promise.all(groups.map((g, r) => g.allReduce(xs[r]!)));
    for (const x of xs) expect(read(x)).toEqual([6, 60, -3]);
    // uneven allGather: one group call of broadcasts; its groupEnd is the pending call.
    const parts = [[1], [2, 3], [4, 5, 6]];
    const outs = [0, 1, 2].map(() => parts.map((p) => nt.zeros([p.length])));
    await Promise.all(groups.map((g, r) => g.allGather(outs[r]!, make(parts[r]!, 'f32'))));
    for (const o of outs) expect(o.map(read)).toEqual(parts);
    // a ring of send/recv inside one batch
    const got = [0, 1, 2].map(() => nt.zeros([2]));
    await Promise.all(groups.map((g, r) => Promise.all(g.batch(() => [g.send(make([r, r], 'f32'), (r + 1) % 3), g.recv(got[r]!, (r + 2) % 3)]))));
    expect(got.map(read)).toEqual([[2, 2], [0, 0], [1, 1]]);
    expect(fake.violations).toEqual([]);
    expect(fake.polls).toBeGreaterThanOrEqual(3 * 3 * 5);
    expect(fake.calls.filter((c) => c === 'recordCompletion').length).toBe(9);
  });

  it('the fake refuses a completion event taken while NCCL is still enqueueing (so the test above can fail)', async () => {
    const { backends, fake } = await makeRanks(2);
    fake.enqueuePolls = 2;
    const native = (backends[0] as unknown as { native: { allReduce: (...a: unknown[]) => number; recordCompletion(): number } }).native;
    const buf = nt.zeros([3]);
    expect(native.allReduce(buf.storage, 0, buf.storage, 0, 3, 0, 0)).toBe(NCCL_PENDING);
    expect(() => native.recordCompletion()).toThrow(/while in progress/);
    expect(fake.violations).toHaveLength(1);
  });

  it('an enqueue that never leaves in-progress is a TimeoutError naming rank, op, seq and bytes; the communicator is aborted', async () => {
    const { groups, fake } = await makeRanks(2);
    fake.stuckEnqueue = true;
    const t0 = Date.now();
    let err: unknown;
    try { groups[1]!.allReduce(nt.zeros([8]), { timeoutMs: 80 }); } catch (e) { err = e; }
    expect(Date.now() - t0).toBeGreaterThanOrEqual(75);
    expect(err).toBeInstanceOf(nt.TimeoutError);
    expect((err as Error).message).toMatch(/allReduce #0 \(32 bytes\) on rank 1 of nccl group 'world' \(size 2, cuda:0\) was still being enqueued by NCCL \(ncclInProgress\) after 80 ms/);
    expect(fake.calls).toContain('abort');
    expect(fake.violations).toEqual([]);
    expect(() => groups[1]!.allReduce(nt.zeros([2]))).toThrow(nt.CommError);
    expect(read(nt.tensor([1, 2]).mul(2))).toEqual([2, 4]);
  });

  it('an asynchronous NCCL failure while enqueueing is a CommError naming the op', async () => {
    const { groups, fake } = await makeRanks(2);
    fake.stuckEnqueue = true;
    fake.comms[0]!.fabric.error = 'remote process exited';
    let err: unknown;
    try { groups[0]!.broadcast(nt.zeros([4]), { timeoutMs: 5000 }); } catch (e) { err = e; }
    expect(err).toBeInstanceOf(nt.CommError);
    expect((err as Error).message).toMatch(/broadcast #0 \(16 bytes\) on rank 0 .* failed while NCCL enqueued it: remote process exited/);
  });
});

describe('backend selection', () => {
  const env = (localWorldSize: number, localRank = 0) => ({ ...nt.distributed.readLaunchEnv({}), localWorldSize, localRank, worldSize: localWorldSize, rank: localRank });

  it('auto picks NCCL beside Gloo only when every local rank has its own GPU', () => {
    expect(selectBackends(undefined, env(2), () => 0)).toEqual({ gloo: true, nccl: false });
    expect(selectBackends('auto', env(2), () => 2)).toEqual({ gloo: true, nccl: true });
    expect(selectBackends('auto', env(4), () => 2)).toEqual({ gloo: true, nccl: false });
    expect(selectBackends('gloo', env(1), () => 8)).toEqual({ gloo: true, nccl: false });
    expect(() => selectBackends('mpi', env(1))).toThrow(nt.ArgumentError);
  });

  it("init({ backend: 'nccl' }) without a usable GPU throws BackendUnavailableError naming what is missing; init() then works", async () => {
    const err = await nt.distributed.init({ backend: 'nccl', env: nt.distributed.readLaunchEnv({}) }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(nt.BackendUnavailableError);
    expect((err as Error).message).toMatch(/nccl backend .*(driver|GPU|not built|cannot load|without NCCL)/i);
    expect(nt.distributed.isInitialized()).toBe(false);
    const { world } = await nt.distributed.init({ timeoutMs: 5000, env: nt.distributed.readLaunchEnv({}) });
    // cpu through Gloo; with a GPU, cuda:0 too (NCCL, or Gloo through host memory when NCCL is unusable).
    expect(world.devices[0]).toBe('cpu');
    expect(world.devices.includes('cuda:0')).toBe(nt.cuda.isAvailable());
    const x = nt.tensor([1, 2]);
    await world.allReduce(x);
    expect(read(x)).toEqual([1, 2]);
    await nt.distributed.destroy();
  });
});
