// The GPT's training loss through the fused head (the default) against config.fusedHead: false (logits,
// then crossEntropy): the same loss and gradients, no logits with targets, logits without; evaluation
// under noGrad gives the same loss; generation is unchanged.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const config: nt.nn.GPTConfig = { vocabSize: 97, blockSize: 12, nLayer: 2, nHead: 2, nEmbd: 16, dropout: 0, bias: true };
const ids = (seed: number) => nt.tensor(Int32Array.from({ length: 3 * 12 }, (_, i) => (i * 31 + seed * 7) % 97), [3, 12]);

function lossAndGrads(fusedHead: boolean) {
  const model = new nt.nn.GPT({ ...config, fusedHead }, { seed: 3 });
  try {
    return nt.scope(() => {
      const out = model.forward(ids(1), ids(2));
      out.loss!.backward();
      return { logits: out.logits, loss: out.loss!.item(), grads: new Map(model.namedParameters().map(([n, p]) => [n, p.grad!.toArraySync()])) };
    });
  } finally {
    model.dispose();
  }
}

describe('GPT with the fused head', () => {
  it('gives the unfused loss and every gradient, and no logits', () => {
    const fused = lossAndGrads(true), plain = lossAndGrads(false);
    expect(fused.logits).toBeNull();
    expect(plain.logits).not.toBeNull();
    expect(Math.abs(fused.loss - plain.loss)).toBeLessThan(1e-6);
    expect([...fused.grads.keys()]).toEqual([...plain.grads.keys()]);
    for (const [name, g] of fused.grads) {
      const want = plain.grads.get(name)!;
      let err = 0, scale = 1e-12;
      for (let i = 0; i < want.length; i++) { err = Math.max(err, Math.abs(g[i]! - want[i]!)); scale = Math.max(scale, Math.abs(want[i]!)); }
      expect(err / scale, name).toBeLessThan(1e-5);
    }
  });

  it('logits without targets; evaluation under noGrad gives the same loss; generate is unchanged', () => {
    const model = new nt.nn.GPT(config, { seed: 3 }), plain = new nt.nn.GPT({ ...config, fusedHead: false }, { seed: 3 });
    try {
      nt.scope(() => {
        const { logits, loss } = model.forward(ids(1));
        expect(loss).toBeNull();
        expect(logits.shape).toEqual([3, 12, 97]);
        const evalLoss = nt.noGrad(() => model.forward(ids(1), ids(2)).loss!);
        expect(evalLoss.gradFn).toBeNull();
        expect(Math.abs(evalLoss.item() - nt.noGrad(() => plain.forward(ids(1), ids(2)).loss!.item()))).toBeLessThan(1e-6);
        const prompt = nt.tensor(Int32Array.from([5, 6, 7]), [1, 3]);
        expect(model.generate(prompt, 4, { seed: 2 })).toEqual(plain.generate(prompt, 4, { seed: 2 }));
      });
    } finally {
      model.dispose(); plain.dispose();
    }
  });

  it('trainStep trains the same with and without the fused head', () => {
    const losses = (fusedHead: boolean) => {
      const model = new nt.nn.GPT({ ...config, fusedHead }, { seed: 5 });
      const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-2 });
      try {
        return Array.from({ length: 3 }, (_, s) => nt.trainStep(model, opt, ids(s), ids(s + 1)).loss);
      } finally {
        opt.dispose(); model.dispose();
      }
    };
    const a = losses(true), b = losses(false);
    expect(a[2]!).toBeLessThan(a[0]!);
    a.forEach((l, i) => expect(Math.abs(l - b[i]!), `step ${i}`).toBeLessThan(1e-5));
  });
});
