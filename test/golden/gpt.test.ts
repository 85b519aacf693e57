// nodetron's GPT against PyTorch golden values (test/golden/gpt_small.json, from scripts/golden/gpt_golden.py):
// logits, loss, every parameter gradient, and 3 AdamW steps; plus the parallel-block + sliding-window variant.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

interface Case {
  config: nt.nn.GPTConfig; batch: number; seq: number; idx: number[]; targets: number[];
  params: Record<string, { shape: number[]; data: string }>; logits: string; loss: number; grads: Record<string, string>;
  adamw?: { lr: number; betas: [number, number]; eps: number; weightDecay: number; steps: number; losses: number[]; params: Record<string, string> };
}
const golden = JSON.parse(readFileSync(join(__dirname, 'gpt_small.json'), 'utf8')) as { standard: Case; parallelWindow: Case };

function f32(b64: string): Float32Array {
  const buf = Buffer.from(b64, 'base64');
  return new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
}

/** Max |a - b| relative to the reference's largest magnitude (gradients span orders of magnitude across tensors). */
function relErr(got: ArrayLike<number>, want: Float32Array): number {
  let err = 0, scale = 1e-12;
  for (let i = 0; i < want.length; i++) { err = Math.max(err, Math.abs(got[i]! - want[i]!)); scale = Math.max(scale, Math.abs(want[i]!)); }
  return err / scale;
}

function build(c: Case) {
  const model = new nt.nn.GPT(c.config, { seed: 0 });
  const sd = Object.fromEntries(Object.entries(c.params).map(([k, v]) => [k, nt.tensor(f32(v.data), v.shape)]));
  model.loadStateDict(sd);
  for (const t of Object.values(sd)) t.dispose();
  const idx = nt.tensor(Int32Array.from(c.idx), [c.batch, c.seq]);
  const targets = nt.tensor(Int32Array.from(c.targets), [c.batch, c.seq]);
  return { model, idx, targets };
}

function checkForwardBackward(c: Case): void {
  const { model, idx, targets } = build(c);
  // Logits come from a forward without targets; the loss and gradients from the fused head (no logits).
  const logits = nt.noGrad(() => model.forward(idx).logits);
  expect(logits.shape).toEqual([c.batch, c.seq, c.config.vocabSize]);
  expect(relErr(logits.toArraySync(), f32(c.logits))).toBeLessThan(1e-4);
  logits.dispose();
  const { logits: none, loss } = model.forward(idx, targets);
  expect(none).toBeNull();
  expect(Math.abs(loss!.item() - c.loss)).toBeLessThan(1e-4);
  loss!.backward();
  for (const [name, p] of model.namedParameters()) {
    expect(p.grad, name).not.toBeNull();
    expect(relErr(p.grad!.toArraySync(), f32(c.grads[name]!)), name).toBeLessThan(2e-3);
  }
  expect(Object.keys(c.grads).sort()).toEqual(model.namedParameters().map(([n]) => n).sort());
  model.dispose();
}

describe('GPT golden values (PyTorch)', () => {
  it('standard pre-LN GPT: logits, loss and every gradient', () => checkForwardBackward(golden.standard));
  it('parallel block with sliding-window attention: logits, loss and every gradient', () => checkForwardBackward(golden.parallelWindow));

  it('3 AdamW steps: losses and final parameters', () => {
    const c = golden.standard, a = c.adamw!;
    const { model, idx, targets } = build(c);
    const opt = new nt.optim.AdamW(model.parameters(), { lr: a.lr, betas: a.betas, eps: a.eps, weightDecay: a.weightDecay });
    const losses: number[] = [];
    for (let s = 0; s < a.steps; s++) losses.push(nt.trainStep(model, opt, idx, targets).loss);
    losses.push(nt.scope(() => nt.noGrad(() => model.forward(idx, targets).loss!.item())));
    losses.forEach((l, i) => expect(Math.abs(l - a.losses[i]!), `loss ${i}`).toBeLessThan(2e-4));
    for (const [name, p] of model.namedParameters()) expect(relErr(p.toArraySync(), f32(a.params[name]!)), name).toBeLessThan(1e-3);
    opt.dispose();
    model.dispose();
  });
});
