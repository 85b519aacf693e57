// finishSync, the one way the parallel layers finish a collective inside autograd: a collective that
// fails inside backward raises its own error on the caller and leaves no buffer behind, in each of its
// users (tensor-parallel mappings, expert parallelism's all-to-all, ring and Ulysses attention,
// ZeRO-3's gathers); a group without waitSync is a StateError whose buffers go once the work settles.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { finishSync } from '../../lib/distributed/finish-sync.js';
import type { CollectiveGroup, CollectiveWork } from '../../lib/distributed/group.js';
import { gatherFromSequenceRegion, scatterToRegion } from '../../lib/parallel/tensor-parallel/mappings.js';
import { allToAllRows } from '../../lib/parallel/expert-parallel.js';
import { ringAttentionPacked } from '../../lib/parallel/context-parallel/ring.js';
import { ulyssesAttentionPacked } from '../../lib/parallel/context-parallel/ulysses.js';
import { ZeroOptimizer } from '../../lib/parallel/zero/optimizer.js';

/** A collective that finished (its outputs are left as they are: these tests look at failures, not values). */
const done = (): CollectiveWork => ({ wait: () => Promise.resolve(), waitSync: () => {}, then: (a, b) => Promise.resolve().then(a, b) });
/** A collective that failed with `e`, seen by waitSync and by the promise alike. */
function failed(e: Error): CollectiveWork {
  return { wait: () => Promise.reject(e), waitSync: () => { throw e; }, then: (a, b) => Promise.reject(e).then(a, b) };
}
/** A collective still running that settles when `settle` is called; without waitSync unless `blocking`. */
function pending(blocking = false): { work: CollectiveWork; settle: () => void } {
  let settle!: () => void;
  const p = new Promise<void>((resolve) => { settle = resolve; });
  const work: CollectiveWork = { wait: () => p, then: (a, b) => p.then(a, b) };
  if (blocking) work.waitSync = () => { throw new Error('finishSync waited on a collective after one had failed'); };
  return { work, settle };
}

/**
 * Rank 0 of a group of `size` whose first `ok` collectives succeed and whose later ones fail with a
 * CommError (as a peer's death would make them). It counts the calls and keeps the output tensors of
 * the failed ones: buffers the layer made for the collective, which it must release.
 */
class FailingGroup implements CollectiveGroup {
  readonly rank = 0;
  readonly name = 'failing';
  readonly ranks: number[];
  calls = 0;
  readonly failedOutputs: nt.Tensor[] = [];
  constructor(readonly size: number, readonly ok: number) { this.ranks = Array.from({ length: size }, (_, i) => i); }
  #next(op: string, out?: nt.Tensor): CollectiveWork {
    if (this.calls++ < this.ok) return done();
    if (out) this.failedOutputs.push(out);
    return failed(new nt.CommError(`${op} #${this.calls - 1}: peer rank 1 is gone`));
  }
  allReduce(): CollectiveWork { return this.#next('allReduce'); }
  allGather(out: nt.Tensor): CollectiveWork { return this.#next('allGather', out); }
  reduceScatter(out: nt.Tensor): CollectiveWork { return this.#next('reduceScatter', out); }
  broadcast(): CollectiveWork { return this.#next('broadcast'); }
  send(): CollectiveWork { return this.#next('send'); }
  recv(t: nt.Tensor): CollectiveWork { return this.#next('recv', t); }
  allToAll(out: nt.Tensor): CollectiveWork { return this.#next('allToAll', out); }
}

/** Lets promise callbacks run (buffers of works still in flight are released when they settle). */
const settle = (): Promise<unknown> => new Promise((resolve) => setTimeout(resolve, 0));

/**
 * Runs forward (its collectives succeed), then backward, whose first collective fails: the CommError
 * reaches the caller, and every buffer made for a failed collective is released.
 */
async function failingBackward(size: number, forward: (g: FailingGroup) => { inputs: nt.Tensor[]; out: nt.Tensor }): Promise<void> {
  // Count the forward's collectives first, then fail the first one backward makes.
  const probe = new FailingGroup(size, Infinity);
  const dry = forward(probe);
  dry.out.dispose();
  for (const t of dry.inputs) t.dispose();
  const g = new FailingGroup(size, probe.calls);
  const { inputs, out } = forward(g);
  expect(g.calls).toBe(probe.calls);
  const loss = nt.sum(out);
  try {
    expect(() => loss.backward()).toThrow(nt.CommError);
    expect(g.calls).toBeGreaterThan(probe.calls);
    await settle();
    expect(g.failedOutputs.length).toBeGreaterThan(0);
    for (const b of g.failedOutputs) expect(b.disposed, `${b.describe()} given to a failed collective`).toBe(true);
  } finally {
    loss.dispose();
    out.dispose();
    for (const t of inputs) t.dispose();
  }
}

const input = (shape: number[]): nt.Tensor => {
  const x = nt.randn(shape, { seed: 1 });
  x.requiresGrad = true;
  return x;
};

describe('finishSync', () => {
  it('a failing wait rethrows its error and releases the buffers at once; later works are left to settle first', async () => {
    const g = new FailingGroup(2, 0);
    const a = nt.ones([4]), b = nt.ones([4]);
    expect(() => finishSync(failed(new nt.CommError('gone')), { call: 'test', group: g, buffers: [a] })).toThrow(/^gone$/);
    expect(a.disposed).toBe(true);
    const later = pending(true);
    expect(() => finishSync([failed(new nt.CommError('gone')), later.work], { call: 'test', group: g, buffers: [b] })).toThrow(nt.CommError);
    // The second work may still write into b: it stays until that work settles.
    expect(b.disposed).toBe(false);
    later.settle();
    await new Promise((resolve) => setTimeout(resolve, 0));
    expect(b.disposed).toBe(true);
  });

  it('a group without waitSync is a StateError; the buffers go once the work settles; a start that throws releases them', async () => {
    const g = new FailingGroup(2, 0);
    const a = nt.ones([4]);
    const running = pending();
    expect(() => finishSync(running.work, { call: 'gatherFromRegion', group: g, buffers: [a] }))
      .toThrow(/^gatherFromRegion: group 'failing' cannot complete a collective synchronously \(its Work has no waitSync\)/);
    expect(a.disposed).toBe(false);
    running.settle();
    await new Promise((resolve) => setTimeout(resolve, 0));
    expect(a.disposed).toBe(true);
    const c = nt.ones([4]);
    expect(() => finishSync(() => { throw new nt.ArgumentError('bad counts'); }, { call: 'test', group: g, buffers: [c] })).toThrow(/bad counts/);
    expect(c.disposed).toBe(true);
  });

  it.each(['tp scatter', 'sp gather', 'ep', 'ring', 'ulysses'])('a collective failing inside backward raises on the caller and releases its buffers: %s', async (which) => {
    // Tensor parallelism: scatterToRegion's backward all-gathers the gradient.
    if (which === 'tp scatter') await failingBackward(2, (g) => {
      const x = input([3, 8]);
      return { inputs: [x], out: scatterToRegion(x, g) };
    });
    // Sequence parallelism: gatherFromSequenceRegion's backward reduce-scatters the gradient.
    if (which === 'sp gather') await failingBackward(2, (g) => {
      const x = input([1, 2, 4]);
      return { inputs: [x], out: gatherFromSequenceRegion(x, g) };
    });
    // Expert parallelism: the rows' reverse all-to-all.
    if (which === 'ep') await failingBackward(2, (g) => {
      const x = input([5, 4]);
      return { inputs: [x], out: allToAllRows(x, g, [3, 2], [3, 2]) };
    });
    // Context parallelism: ring attention's backward sends and receives key/value blocks; Ulysses all-to-alls.
    if (which === 'ring') await failingBackward(2, (g) => {
      const qkv = input([1, 4, 3 * 2 * 4]);
      return { inputs: [qkv], out: ringAttentionPacked(qkv, 2, g) };
    });
    if (which === 'ulysses') await failingBackward(2, (g) => {
      const qkv = input([1, 4, 3 * 2 * 4]);
      return { inputs: [qkv], out: ulyssesAttentionPacked(qkv, 2, g) };
    });
  });

  it('ZeRO-3: a gather failing in backward raises on the caller and releases its buffers', async () => {
    const config = { vocabSize: 16, blockSize: 8, nLayer: 2, nHead: 2, nEmbd: 8, dropout: 0 };
    const run = (g: FailingGroup): { forwardCalls: number; error: unknown } => {
      const model = new nt.nn.GPT(config, { seed: 3 });
      const zero = new ZeroOptimizer(model.parameters(), (ps) => new nt.optim.AdamW(ps, { lr: 1e-3 }), { group: g, stage: 3 }).attach(model);
      let error: unknown = null, forwardCalls = 0;
      try {
        nt.scope(() => {
          const ids = nt.tensor(Int32Array.from([1, 2, 3, 4, 5, 6, 7, 8]), [1, 8], { dtype: 'i32' });
          const targets = nt.tensor(Int32Array.from([2, 3, 4, 5, 6, 7, 8, 9]), [1, 8], { dtype: 'i32' });
          const { loss } = model.forward(ids, targets);
          forwardCalls = g.calls;
          try { loss!.backward(); } catch (e) { error = e; }
        });
      } finally {
        zero.dispose();
        model.dispose();
      }
      return { forwardCalls, error };
    };
    const { forwardCalls, error: none } = run(new FailingGroup(2, Infinity));
    expect(none).toBe(null);
    const g = new FailingGroup(2, forwardCalls);
    const { error } = run(g);
    expect(error).toBeInstanceOf(nt.CommError);
    await settle();
    expect(g.failedOutputs.length).toBeGreaterThan(0);
    for (const b of g.failedOutputs) expect(b.disposed, `${b.describe()} given to a failed collective`).toBe(true);
  });
});
