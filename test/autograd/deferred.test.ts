// deferWeightGrads: the weight-gradient work of a backward held back and run on demand (zero-bubble
// pipelines' B and W) gives bit for bit the gradients of an ordinary backward, computes the input
// gradients at once, and fires the weights' post-accumulate-grad hooks (and the callbacks they queue)
// only once the deferred work has run.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const config: nt.nn.GPTConfig = { vocabSize: 24, blockSize: 8, nLayer: 2, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
const idx = nt.tensor(Int32Array.from({ length: 2 * 7 }, (_, i) => (i * 5 + 3) % 24), [2, 7]);
const tgt = nt.tensor(Int32Array.from({ length: 2 * 7 }, (_, i) => (i * 11 + 1) % 24), [2, 7]);
const gradsOf = (m: nt.nn.Module) => new Map(m.namedParameters().map(([n, p]) => [n, p.grad ? Array.from(p.grad.toArraySync()) : null]));

describe('deferWeightGrads', () => {
  it('a GPT\'s gradients over two micro-batches equal an ordinary backward\'s bit for bit', () => {
    const plain = new nt.nn.GPT(config, { seed: 3 }), split = new nt.nn.GPT(config, { seed: 3 });
    for (let m = 0; m < 2; m++) nt.scope(() => plain.forward(nt.slice(idx, 0, m, m + 1), nt.slice(tgt, 0, m, m + 1)).loss!.backward());
    const held: nt.DeferredWeightGrads[] = [];
    for (let m = 0; m < 2; m++) {
      nt.scope(() => {
        const loss = split.forward(nt.slice(idx, 0, m, m + 1), nt.slice(tgt, 0, m, m + 1)).loss!;
        held.push(nt.deferWeightGrads(() => loss.backward()).weightGrads);
      });
    }
    // Before W: the linear layers' weights (and the embeddings, whose only gradient is a weight's) have none.
    for (const [n, g] of gradsOf(split)) {
      if (/(qkv|proj|fc)\.(weight|bias)$|^w[tp]e\./.test(n)) expect(g, n).toBeNull();
      else expect(g, n).not.toBeNull(); // LayerNorms: no split, computed in B
    }
    expect(held.every((h) => h.pending > 0)).toBe(true);
    for (const h of held) h.run();
    expect(held.every((h) => h.pending === 0)).toBe(true);
    held[0]!.run(); // a second run does nothing
    const a = gradsOf(plain), b = gradsOf(split);
    expect([...b.keys()]).toEqual([...a.keys()]);
    for (const [n, g] of a) expect(b.get(n), n).toEqual(g);
    plain.dispose(); split.dispose();
  });

  it('leaves listed in `now` get their gradient in B; hooks and their queued callbacks wait for W', () => {
    const w = nt.tensor(new Float32Array([0.5, -1, 2, 0.25, 1.5, -0.75]), [2, 3]); w.requiresGrad = true;
    const b = nt.tensor(new Float32Array([0.1, -0.2]), [2]); b.requiresGrad = true;
    const x = nt.tensor(new Float32Array([1, 2, 3, -1, 0.5, 4]), [2, 3]); x.requiresGrad = true;
    const events: string[] = [];
    w.registerPostAccumulateGradHook(() => { events.push('w'); nt.queueBackwardCallback(() => events.push('end')); });
    x.registerPostAccumulateGradHook(() => events.push('x'));
    const y = nt.sum(nt.tanh(nt.linear(x, w, b)));
    const { weightGrads } = nt.deferWeightGrads(() => y.backward(), { now: [x] });
    expect(x.grad).not.toBeNull();
    expect(w.grad).toBeNull();
    expect(b.grad).toBeNull();
    expect(events).toEqual([]); // the pass stays open: x's node is also w's
    weightGrads.run();
    expect(events).toEqual(['x', 'w', 'end']); // x's node is w's: both complete when it does
    // float64 reference: d/dW Σ tanh(xWᵀ + b) = (1 - tanh²)ᵀ x
    const X = [[1, 2, 3], [-1, 0.5, 4]], W = [[0.5, -1, 2], [0.25, 1.5, -0.75]], B = [0.1, -0.2];
    const dW = [[0, 0, 0], [0, 0, 0]], dB = [0, 0], dX = [[0, 0, 0], [0, 0, 0]];
    for (let r = 0; r < 2; r++) {
      for (let o = 0; o < 2; o++) {
        const t = Math.tanh(X[r]!.reduce((s, v, i) => s + v * W[o]![i]!, B[o]!)), d = 1 - t * t;
        dB[o] += d;
        for (let i = 0; i < 3; i++) { dW[o]![i] += d * X[r]![i]!; dX[r]![i] += d * W[o]![i]!; }
      }
    }
    Array.from(w.grad!.toArraySync()).forEach((v, i) => expect(v).toBeCloseTo(dW.flat()[i]!, 5));
    Array.from(b.grad!.toArraySync()).forEach((v, i) => expect(v).toBeCloseTo(dB[i]!, 5));
    Array.from(x.grad!.toArraySync()).forEach((v, i) => expect(v).toBeCloseTo(dX.flat()[i]!, 5));
  });

  it('a weight behind a gradient scale (expert parallelism\'s 1/ep) waits too; a scale two ops share does not', () => {
    const w = nt.tensor(new Float32Array([0.5, -1, 2, 0.25, 1.5, -0.75]), [2, 3]); w.requiresGrad = true;
    const b = nt.tensor(new Float32Array([0.1, -0.2]), [2]); b.requiresGrad = true;
    const x = nt.tensor(new Float32Array([1, 2, 3, -1, 0.5, 4]), [2, 3]); x.requiresGrad = true;
    const x2 = nt.tensor(new Float32Array([0.5, -2, 1, 3, 0.25, -1]), [2, 3]);
    const once = () => nt.sum(nt.tanh(nt.linear(x, nt.nn.scaleGrad(w, 0.5), b)));
    const shared = () => { const s = nt.nn.scaleGrad(w, 0.25); return nt.add(nt.sum(nt.tanh(nt.linear(x, s, b))), nt.sum(nt.linear(x2, s))); };
    for (const [name, loss, waits] of [['one consumer', once, true], ['two consumers', shared, false]] as const) {
      nt.zeroGrad([w, b, x]);
      nt.scope(() => loss().backward());
      const ref = [w, b, x].map((p) => Array.from(p.grad!.toArraySync()));
      nt.zeroGrad([w, b, x]);
      const events: string[] = [];
      const hook = w.registerPostAccumulateGradHook(() => events.push('w'));
      const { weightGrads } = nt.scope(() => { const l = loss(); return nt.deferWeightGrads(() => l.backward(), { now: [x] }); });
      expect(x.grad, name).not.toBeNull();
      // One consumer: the scale is absorbed into the linear's weight work, so the linear splits (its bias
      // gradient waits with the weight GEMM). Two: the linear runs whole in B (b's gradient is there)
      // and only the shared scale waits. Either way w's gradient and hook come in W.
      expect(b.grad === null, name).toBe(waits);
      expect(w.grad, name).toBeNull();
      expect(weightGrads.pending, name).toBe(1);
      expect(events, name).toEqual([]);
      weightGrads.run();
      expect(events, name).toEqual(['w']);
      hook.remove();
      expect([w, b, x].map((p) => Array.from(p.grad!.toArraySync())), name).toEqual(ref);
    }
    // float64 reference of the scaled case: d/dW of Σ tanh(xWᵀ + b) with the gradient scaled ½ = ½ (1 - tanh²)ᵀ x.
    nt.zeroGrad([w, b, x]);
    const { weightGrads } = nt.scope(() => { const l = once(); return nt.deferWeightGrads(() => l.backward()); });
    weightGrads.run();
    const X = [[1, 2, 3], [-1, 0.5, 4]], W = [[0.5, -1, 2], [0.25, 1.5, -0.75]], B = [0.1, -0.2];
    const dW = [[0, 0, 0], [0, 0, 0]];
    for (let r = 0; r < 2; r++) {
      for (let o = 0; o < 2; o++) {
        const t = Math.tanh(X[r]!.reduce((s, v, i) => s + v * W[o]![i]!, B[o]!));
        for (let i = 0; i < 3; i++) dW[o]![i] += 0.5 * (1 - t * t) * X[r]![i]!;
      }
    }
    Array.from(w.grad!.toArraySync()).forEach((v, i) => expect(v).toBeCloseTo(dW.flat()[i]!, 5));
  });

  it('linearGelu and a bias-free linear split too; dispose drops the work; misuse is a typed error', () => {
    const w = nt.tensor(new Float32Array([0.5, -1, 2, 0.25, 1.5, -0.75]), [2, 3]); w.requiresGrad = true;
    const b = nt.tensor(new Float32Array([0.1, -0.2]), [2]); b.requiresGrad = true;
    const v = nt.tensor(new Float32Array([0.3, -0.4]), [1, 2]); v.requiresGrad = true;
    const x = nt.tensor(new Float32Array([1, 2, 3, -1, 0.5, 4]), [2, 3]);
    const loss = () => nt.sum(nt.linear(nt.linearGelu(x, w, b), v));
    loss().backward();
    const ref = [w, b, v].map((p) => Array.from(p.grad!.toArraySync()));
    nt.zeroGrad([w, b, v]);
    const l = loss();
    const { weightGrads } = nt.deferWeightGrads(() => l.backward());
    expect(weightGrads.pending).toBe(2);
    weightGrads.run();
    expect([w, b, v].map((p) => Array.from(p.grad!.toArraySync()))).toEqual(ref);
    nt.zeroGrad([w, b, v]);
    // Dropped work frees what it held (the kept pre-GELU gradient and bias gradient, the output
    // gradients, the saved tensors): as much as an ordinary backward whose gradients are then cleared.
    const l2 = loss(), l3 = loss();
    const base = nt.memoryStats().allocated;
    l3.backward();
    nt.zeroGrad([w, b, v]);
    const afterPlain = nt.memoryStats().allocated;
    nt.deferWeightGrads(() => l2.backward()).weightGrads.dispose();
    expect(w.grad).toBeNull();
    expect(base - afterPlain).toBeGreaterThan(0);
    expect(afterPlain - nt.memoryStats().allocated).toBe(base - afterPlain);
    expect(() => nt.deferWeightGrads(() => nt.deferWeightGrads(() => 0))).toThrow(nt.AutogradError);
    expect(() => nt.deferWeightGrads(async () => 0)).toThrow(nt.ArgumentError);
  });
});
