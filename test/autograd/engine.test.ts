// The tape: accumulation into leaves, grad mode, graph freeing (memory), errors, detach/zeroGrad,
// and that the gradient checker itself catches a wrong gradient.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { gradcheck, leaf } from '../helpers/gradcheck.js';

describe('backward', () => {
  it('accumulates into .grad across calls and through shared subexpressions', () => {
    const x = leaf([1, 2, 3], [3]);
    for (let i = 0; i < 2; i++) {
      nt.scope(() => {
        const y = nt.mul(x, x);             // x used twice in one node
        const z = nt.add(y, nt.mul(x, 3));  // and again in another branch
        nt.sum(z).backward();
      });
    }
    // d/dx Σ(x² + 3x) = 2x + 3, twice
    expect(Array.from(x.grad!.toArraySync())).toEqual([10, 14, 18]);
    nt.zeroGrad([x]);
    expect(x.grad).toBeNull();
    x.dispose();
  });

  it('takes an explicit output gradient and refuses a missing one for non-scalars', () => {
    const x = leaf([1, 2], [2]);
    const y = nt.mul(x, 2);
    expect(() => y.backward()).toThrow(nt.AutogradError);
    y.backward(nt.tensor([1, 10], [2]));
    expect(Array.from(x.grad!.toArraySync())).toEqual([2, 20]);
    expect(() => y.backward(nt.tensor([1, 2, 3], [3]))).toThrow(nt.ShapeError);
  });

  it('frees the graph: a second backward throws AutogradError unless retainGraph', () => {
    const x = leaf([0.5, 1.5], [2]);
    const y = nt.sum(nt.exp(x));
    y.backward(undefined, { retainGraph: true });
    y.backward();
    const e = Math.exp(0.5);
    expect(x.grad!.toArraySync()[0]).toBeCloseTo(2 * e, 5);
    expect(() => y.backward()).toThrow(nt.AutogradError);
    // healthy afterwards
    nt.sum(nt.mul(x, x)).backward();
    expect(x.grad!.toArraySync()[0]).toBeCloseTo(2 * e + 1, 5);
  });

  it('rejects gradients of integer tensors and of tensors without a graph', () => {
    const i = nt.zeros([2], { dtype: 'i32' });
    expect(() => i.backward()).toThrow(nt.AutogradError);
    const c = nt.ones([1]);
    expect(() => c.backward()).toThrow(nt.AutogradError);
    const d = leaf([1], [1]);
    d.dispose();
    expect(() => d.backward()).toThrow(nt.DisposedError);
  });

  it('noGrad (sync and async) records nothing; enableGrad re-enables inside it', async () => {
    const x = leaf([1, 2], [2]);
    const y = nt.noGrad(() => nt.mul(x, x));
    expect(y.requiresGrad).toBe(false);
    expect(y.gradFn).toBeNull();
    const z = await nt.noGrad(async () => {
      await new Promise((r) => setTimeout(r, 1));
      expect(nt.isGradEnabled()).toBe(false);
      return nt.enableGrad(() => nt.mul(x, x));
    });
    expect(z.requiresGrad).toBe(true);
    expect(nt.isGradEnabled()).toBe(true);
  });

  it('detach shares data and cuts the graph', () => {
    const x = leaf([3], [1]);
    const y = nt.mul(x, x);
    const d = y.detach();
    expect(d.requiresGrad).toBe(false);
    expect(d.item()).toBe(9);
    nt.sum(nt.mul(d, x)).backward();
    expect(x.grad!.item()).toBe(9);
  });

  it('frees saved tensors with the graph: no live tensors remain', () => {
    const w = leaf(new Float64Array(12).fill(0.5), [3, 4]);
    const before = nt.memoryStats().liveTensors;
    nt.scope(() => {
      const x = nt.randn([5, 3], { seed: 1 });
      const h = nt.tanh(nt.matmul(x, w));
      const loss = nt.mean(nt.mul(nt.exp(h), nt.div(h, 2)));
      loss.backward();
    });
    // only w.grad is new
    expect(nt.memoryStats().liveTensors).toBe(before + 1);
    // an output computed in a scope can still be differentiated after the scope closes
    const loss = nt.scope(() => nt.sum(nt.mul(nt.matmul(nt.ones([2, 3]), w), 2)));
    loss.backward();
    loss.dispose();
    expect(nt.memoryStats().liveTensors).toBe(before + 1);
    w.dispose();
    expect(nt.memoryStats().liveTensors).toBe(before - 1);
  });

  it('frees saved tensors of a graph whose output is disposed without backward', () => {
    const w = leaf(new Float64Array(12).fill(0.25), [3, 4]);
    const before = nt.memoryStats().liveTensors;
    const bytesBefore = nt.memoryStats().allocated;
    nt.scope(() => {
      const x = nt.randn([5, 3], { seed: 2 });
      const h = nt.gelu(nt.matmul(x, w));
      nt.sum(nt.layerNorm(h, nt.ones([4]), nt.zeros([4])));
    });
    expect(nt.memoryStats().liveTensors).toBe(before);
    expect(nt.memoryStats().allocated).toBe(bytesBefore);
    // with retainGraph, disposing the output frees what backward kept
    const y = nt.scope(() => nt.sum(nt.exp(nt.mul(w, 2))));
    y.backward(undefined, { retainGraph: true });
    y.dispose();
    expect(nt.memoryStats().liveTensors).toBe(before + 1);  // w.grad
    w.dispose();
  });

  it('gradcheck catches a wrong gradient', () => {
    // x · stopgrad(x) has true gradient 2x but autograd sees only x
    expect(() => gradcheck((x) => nt.mul(x!, nt.noGrad(() => x!.detach())), [{ data: [0.5, 1, 2], shape: [3] }])).toThrow(/grad of input 0/);
  });
});
