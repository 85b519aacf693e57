// The fused head's target count on the device (what a CUDA graph capture of a loss step needs: no host
// read of the targets). countTargetsOnDevice against the host count; linearCrossEntropy with
// NODETRON_HEAD_DEVICE_COUNT=1 (the path a capture takes) against the host-count path: f32 loss and
// gradients bit for bit (both scale by the correctly rounded f32 1/count), 16-bit within the rounding
// of 1/count to the logits' dtype, no counted rows, and the switch's typed error.
import { afterEach, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { countTargetsOnDevice } from '../../lib/ops/linear-cross-entropy.js';
import { countTargets } from '../../lib/ops/loss.js';
import { randomArray, rng } from '../helpers/gradcheck.js';

afterEach(() => { delete process.env.NODETRON_HEAD_DEVICE_COUNT; });

function run(n: number, c: number, v: number, seed: number, opts: nt.LinearCrossEntropyOptions, ignore: number[], device: boolean, dtype: 'f32' | 'bf16' = 'f32') {
  const r = rng(seed);
  const x = Float32Array.from(randomArray(n * c, r, -2, 2)), w = Float32Array.from(randomArray(v * c, r, -1, 1));
  const t = Int32Array.from({ length: n }, () => Math.floor(r() * v));
  for (const i of ignore) t[i] = opts.ignoreIndex ?? -100;
  if (device) process.env.NODETRON_HEAD_DEVICE_COUNT = '1'; else delete process.env.NODETRON_HEAD_DEVICE_COUNT;
  return nt.scope(() => {
    const xt = nt.tensor(x, [n, c]).to(dtype), wt = nt.tensor(w, [v, c]).to(dtype);
    xt.requiresGrad = true; wt.requiresGrad = true;
    const loss = nt.linearCrossEntropy(xt, wt, nt.tensor(t, [n]), opts);
    nt.scale(loss, 1.25).backward();
    return { loss: loss.to('f32').item(), dx: Array.from(xt.grad!.to('f32').toArraySync() as Float32Array), dw: Array.from(wt.grad!.to('f32').toArraySync() as Float32Array) };
  });
}

describe('the head counts its targets on the device', () => {
  it('countTargetsOnDevice equals the host count', () => {
    const r = rng(3);
    for (const [n, ignoreIndex, v] of [[0, -100, 10], [1, -100, 10], [777, -100, 50257], [300, 2, 9], [64, 50256, 50257]] as const) {
      const t = Int32Array.from({ length: n }, () => (r() < 0.3 ? ignoreIndex : Math.floor(r() * v)));
      using tt = nt.tensor(t, [n]);
      using got = countTargetsOnDevice(tt, ignoreIndex);
      expect(got.shape).toEqual([1]);
      expect(got.item()).toBe(countTargets('test', t, ignoreIndex, v));
    }
  });

  const cases: [string, number, number, number, nt.LinearCrossEntropyOptions, number[]][] = [
    ['one chunk', 16, 8, 32, {}, []],
    ['chunks, ignored rows', 37, 13, 61, { chunkRows: 5 }, [0, 7, 36]],
    ['a custom ignoreIndex that is a vocabulary id', 20, 4, 9, { chunkRows: 6, ignoreIndex: 2 }, [3, 4]],
    ['sum reduction', 25, 9, 31, { chunkRows: 7, reduction: 'sum' }, [1]],
    ['padded vocabulary', 30, 6, 97, { chunkRows: 8, padVocab: 64 }, [5]],
  ];
  for (const [name, n, c, v, opts, ignore] of cases) {
    it(`${name}: f32 loss and gradients bit for bit`, () => {
      const host = run(n, c, v, n, opts, ignore, false), dev = run(n, c, v, n, opts, ignore, true);
      expect(dev.loss).toBe(host.loss);
      expect(dev.dx).toEqual(host.dx);
      expect(dev.dw).toEqual(host.dw);
    });
  }

  it('bf16: bit for bit when the count is a power of two (1/count exact in bf16), else within its rounding', () => {
    const a = run(32, 8, 40, 5, { chunkRows: 8 }, [], false, 'bf16'), b = run(32, 8, 40, 5, { chunkRows: 8 }, [], true, 'bf16');
    expect(b.loss).toBe(a.loss);
    expect(b.dx).toEqual(a.dx);
    expect(b.dw).toEqual(a.dw);
    // 29 counted rows: the kernel's factor 1/29 is rounded to bf16 (relative 2⁻⁹) before it scales
    // each gradient element, which is itself rounded to bf16: the gradients agree within 2 bf16 ulps.
    const c = run(32, 8, 40, 6, { chunkRows: 8 }, [0, 1, 2], false, 'bf16'), d = run(32, 8, 40, 6, { chunkRows: 8 }, [0, 1, 2], true, 'bf16');
    const rel = (p: number[], q: number[]) => Math.max(...p.map((x, i) => Math.abs(x - q[i]!))) / Math.max(...q.map(Math.abs));
    expect(Math.abs(d.loss - c.loss)).toBeLessThanOrEqual(2 ** -8 * Math.abs(c.loss));
    expect(rel(d.dx, c.dx)).toBeLessThanOrEqual(2 ** -7);
    expect(rel(d.dw, c.dw)).toBeLessThanOrEqual(2 ** -7);
  });

  it('no counted rows: a NaN mean as on the host path; the switch refuses other values', () => {
    const host = run(6, 3, 5, 9, {}, [0, 1, 2, 3, 4, 5], false), dev = run(6, 3, 5, 9, {}, [0, 1, 2, 3, 4, 5], true);
    expect(host.loss).toBeNaN();
    expect(dev.loss).toBeNaN();
    process.env.NODETRON_HEAD_DEVICE_COUNT = 'on';
    expect(() => nt.linearCrossEntropy(nt.zeros([2, 3]), nt.zeros([5, 3]), nt.tensor(new Int32Array(2), [2]))).toThrow(nt.ArgumentError);
  });
});
