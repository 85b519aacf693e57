// Memory: dispose, `using`, scopes across await, statistics, host cache, and the leak backstop.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

describe('memory', () => {
  it('dispose releases bytes and the live count', () => {
    const before = nt.memoryStats();
    const t = nt.zeros([1024, 1024]);
    const during = nt.memoryStats();
    expect(during.allocated - before.allocated).toBeGreaterThanOrEqual(4 * 1024 * 1024);
    expect(during.liveTensors - before.liveTensors).toBe(1);
    expect(during.peak).toBeGreaterThanOrEqual(during.allocated);
    t.dispose();
    const after = nt.memoryStats();
    expect(after.allocated).toBe(before.allocated);
    expect(after.liveTensors).toBe(before.liveTensors);
    // The freed 4 MiB block stays cached (reserved) until emptyCache().
    expect(after.reserved).toBeGreaterThan(after.allocated);
    nt.emptyCache();
    expect(nt.memoryStats().reserved).toBe(nt.memoryStats().allocated);
  });

  it('`using` disposes at the end of the block', () => {
    const live = nt.memoryStats().liveTensors;
    let inner: nt.Tensor;
    {
      using t = nt.ones([3]);
      inner = t;
      expect(nt.memoryStats().liveTensors).toBe(live + 1);
    }
    expect(inner.disposed).toBe(true);
    expect(nt.memoryStats().liveTensors).toBe(live);
  });

  it('sync scopes release everything but what they return', () => {
    const live = nt.memoryStats().liveTensors;
    const out = nt.scope(() => {
      const a = nt.ones([4]), b = nt.ones([4, 1]);
      nt.zeros([8]);
      return { result: nt.matmul(b, a.reshape([1, 4])), a };
    });
    expect(out.result.disposed).toBe(false);
    expect(out.a.disposed).toBe(false);
    expect(nt.memoryStats().liveTensors).toBe(live + 2);
    out.result.dispose(); out.a.dispose();
  });

  it('async scopes work across await and do not release each other\'s tensors', async () => {
    const live = nt.memoryStats().liveTensors;
    const tick = () => new Promise((r) => setTimeout(r, 5));
    const job = (n: number) => nt.scope(async () => {
      const a = nt.full([n], n);
      await tick();
      const b = nt.full([n], 2 * n);
      await tick();
      expect(a.disposed).toBe(false);
      return b;
    });
    const [x, y] = await Promise.all([job(3), job(5)]);
    expect(Array.from(x.toArraySync())).toEqual([6, 6, 6]);
    expect(Array.from(y.toArraySync())).toEqual([10, 10, 10, 10, 10]);
    expect(nt.memoryStats().liveTensors).toBe(live + 2);
    x.dispose(); y.dispose();
  });

  it('nested scopes hand returned tensors to the parent; keep() exempts; errors still release', async () => {
    const live = nt.memoryStats().liveTensors;
    let kept!: nt.Tensor;
    const outer = await nt.scope(async () => {
      const inner = nt.scope(() => { nt.ones([1]); return nt.ones([2]); });
      kept = nt.keep(nt.ones([3]));
      nt.ones([4]);
      expect(inner.disposed).toBe(false);
      return inner;
    });
    expect(outer.disposed).toBe(false);
    expect(kept.disposed).toBe(false);
    expect(nt.memoryStats().liveTensors).toBe(live + 2);
    outer.dispose(); kept.dispose();
    await expect(nt.scope(async () => { nt.ones([5]); throw new Error('boom'); })).rejects.toThrow('boom');
    expect(nt.memoryStats().liveTensors).toBe(live);
  });

  it('resetPeakMemory starts a new peak', () => {
    nt.resetPeakMemory();
    const base = nt.memoryStats().peak;
    nt.zeros([256, 1024]).dispose();
    expect(nt.memoryStats().peak - base).toBeGreaterThanOrEqual(1024 * 1024);
    nt.resetPeakMemory();
    expect(nt.memoryStats().peak).toBe(nt.memoryStats().allocated);
  });
});
