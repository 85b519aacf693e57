// End to end: a tiny GPT memorizes a fixed batch (loss falls), recompute gives the same gradients with a lower
// peak, and generate() is deterministic per seed and respects topK.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const cfg = { vocabSize: 32, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
const ids = (n: number, seed: number) => Int32Array.from({ length: n }, (_, i) => (i * 7 + seed * 13 + ((i * i) % 5)) % 32);

describe('GPT training', () => {
  it('loss decreases on a fixed batch with AdamW', () => {
    const model = new nt.nn.GPT(cfg, { seed: 1 });
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 3e-3, weightDecay: 0 });
    const x = nt.tensor(ids(64, 1), [4, 16]), y = nt.tensor(ids(64, 2), [4, 16]);
    const losses = Array.from({ length: 25 }, () => nt.trainStep(model, opt, x, y, { maxGradNorm: 1 }).loss);
    expect(losses[0]!).toBeGreaterThan(Math.log(32) - 0.3);
    expect(losses.at(-1)!).toBeLessThan(losses[0]! * 0.6);
    opt.dispose(); model.dispose(); x.dispose(); y.dispose();
  });

  it('recompute gives the same gradients and a lower peak', () => {
    const big = { ...cfg, nLayer: 4, blockSize: 32 };
    const x = nt.tensor(ids(128, 3), [4, 32]), y = nt.tensor(ids(128, 4), [4, 32]);
    const run = (recompute: boolean) => {
      const model = new nt.nn.GPT({ ...big, recompute }, { seed: 2 });
      const base = nt.memoryStats().allocated;
      nt.resetPeakMemory();
      const grads = nt.scope(() => {
        const { loss } = model.forward(x, y);
        loss!.backward();
        return model.parameters().map((p) => p.grad!.toArraySync());
      });
      const peak = nt.memoryStats().peak - base;
      model.dispose();
      return { grads, peak };
    };
    const plain = run(false), re = run(true);
    plain.grads.forEach((g, i) => expect(Array.from(re.grads[i]!)).toEqual(Array.from(g)));
    expect(re.peak).toBeLessThan(plain.peak);
    x.dispose(); y.dispose();
  });

  it('generate is deterministic per seed, crops context, and topK 1 is greedy', () => {
    const model = new nt.nn.GPT(cfg, { seed: 3 });
    const idx = nt.tensor(Int32Array.from([1, 2, 3]), [1, 3]);
    const a = model.generate(idx, 20, { seed: 9 }), b = model.generate(idx, 20, { seed: 9 });
    expect(a).toEqual(b);
    expect(a[0]!.length).toBe(23);
    expect(a[0]!.slice(0, 3)).toEqual([1, 2, 3]);
    expect(a[0]!.every((t) => Number.isInteger(t) && t >= 0 && t < 32)).toBe(true);
    const g1 = model.generate(idx, 3, { topK: 1, seed: 1 }), g2 = model.generate(idx, 3, { topK: 1, seed: 2 });
    expect(g1).toEqual(g2);
    expect(() => model.generate(idx, 2, { temperature: 0 })).toThrow(nt.ArgumentError);
    expect(model.training).toBe(true);
    idx.dispose(); model.dispose();
  });

  it('sample() follows temperature and topK', () => {
    const logits = Float32Array.from([0, 1, 5, 2]);
    expect(nt.nn.sample(logits, 1, 1, 0.999)).toBe(2);
    const counts = [0, 0, 0, 0];
    for (let i = 0; i < 1000; i++) counts[nt.nn.sample(logits, 1, 2, (i + 0.5) / 1000)]!++;
    expect(counts[0]).toBe(0);
    expect(counts[1]).toBe(0);
    expect(counts[2]! / 1000).toBeCloseTo(Math.exp(5) / (Math.exp(5) + Math.exp(2)), 2);
  });
});
