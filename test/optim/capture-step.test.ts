// nt.captureTrainStep (lib/step.ts) in its cpu form, where graph() replays by calling the step: the
// same body the CUDA graph records (device-side clipping, AdamW reading lr and step from its device
// metadata, the loss copied into a tensor read after the step) against nt.trainStep; and
// clipGradNormOnDevice (lib/optim/clip.ts) against clipGradNorm. The capture itself needs a GPU (the
// device run's gpt2-step@graph lever).
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { lcgGlobalBatch } from '../helpers/token-batch.js';

const CFG = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
const B = 4, T = 16;
const bits = (t: nt.Tensor) => Array.from(new Uint32Array((t.toArraySync() as Float32Array).slice().buffer));

function batch(s: number) {
  const { x, y } = lcgGlobalBatch(s % 4, B, T, CFG.vocabSize);
  return { x: nt.tensor(x, [B, T]), y: nt.tensor(y, [B, T]) };
}

function run(kind: 'eager' | 'captured', steps: number, opts: { maxGradNorm?: number; lrs?: number[] } = {}) {
  const model = new nt.nn.GPT(CFG, { seed: 5 });
  const opt = new nt.optim.AdamW(model.parameters(), { lr: 3e-3, weightDecay: 0.1 });
  const stepper = kind === 'captured' ? nt.captureTrainStep(model, opt, opts.maxGradNorm !== undefined ? { maxGradNorm: opts.maxGradNorm } : {}) : null;
  const out: { loss: number; gradNorm?: number }[] = [];
  for (let s = 0; s < steps; s++) {
    const { x, y } = batch(s);
    const lr = opts.lrs?.[s];
    if (stepper) {
      if (lr !== undefined) opt.setLr(lr);
      out.push(stepper.step(x, y));
    } else {
      out.push(nt.trainStep(model, opt, x, y, { ...(opts.maxGradNorm !== undefined ? { maxGradNorm: opts.maxGradNorm } : {}), ...(lr !== undefined ? { lr } : {}) }));
    }
    x.dispose(); y.dispose();
  }
  const params = model.parameters().map(bits);
  expect(stepper?.captured ?? false).toBe(false); // the cpu form: no graph
  stepper?.dispose();
  opt.dispose(); model.dispose();
  return { out, params };
}

describe('captureTrainStep (cpu form)', () => {
  it('without clipping: the losses and the trained weights of trainStep, bit for bit, a learning-rate schedule included', () => {
    const lrs = [3e-3, 2e-3, 1e-3, 5e-4, 5e-4, 1e-4];
    const eager = run('eager', 6, { lrs }), captured = run('captured', 6, { lrs });
    expect(captured.out.map((r) => r.loss)).toEqual(eager.out.map((r) => r.loss));
    expect(captured.params).toEqual(eager.params);
    expect(captured.out[5]!.loss).toBeLessThan(captured.out[0]!.loss);
  });

  it('with clipping on the device: the norms and losses of trainStep within f32 summation error', () => {
    // maxGradNorm 0.05 clips every step here (norms about 1-4). The device sums the squares in f32 where
    // clipGradNorm sums in float64: a relative error of the norm below ~1e-6 (a few thousand elements
    // per tensor, tens of tensors), so the factor and the update differ in the last bits of f32.
    const eager = run('eager', 5, { maxGradNorm: 0.05 }), captured = run('captured', 5, { maxGradNorm: 0.05 });
    for (let s = 0; s < 5; s++) {
      expect(eager.out[s]!.gradNorm!).toBeGreaterThan(0.05);
      expect(Math.abs(captured.out[s]!.gradNorm! - eager.out[s]!.gradNorm!) / eager.out[s]!.gradNorm!).toBeLessThan(1e-4);
      expect(Math.abs(captured.out[s]!.loss - eager.out[s]!.loss)).toBeLessThan(1e-4);
    }
  });

  it('refuses an optimizer other than AdamW, active dropout, another batch shape or device', () => {
    using model = new nt.nn.GPT(CFG, { seed: 1 });
    const sgd = new nt.optim.SGD(model.parameters(), { lr: 0.1 });
    expect(() => nt.captureTrainStep(model, sgd as unknown as nt.optim.AdamW)).toThrow(/must be an nt.optim.AdamW/);
    const opt = new nt.optim.AdamW(model.parameters());
    expect(() => nt.captureTrainStep(model, opt, { maxGradNorm: -1 })).toThrow(nt.ArgumentError);
    expect(() => nt.captureTrainStep(model, opt, { warmup: 0 })).toThrow(/warmup must be an integer >= 1/);
    using dropped = new nt.nn.GPT({ ...CFG, dropout: 0.1 }, { seed: 1 });
    const opt2 = new nt.optim.AdamW(dropped.parameters());
    expect(() => nt.captureTrainStep(dropped, opt2)).toThrow(/Dropout with p 0.1.*same mask/);
    dropped.eval();
    expect(() => nt.captureTrainStep(dropped, opt2).dispose()).not.toThrow();
    const stepper = nt.captureTrainStep(model, opt);
    const { x, y } = batch(0);
    stepper.step(x, y);
    using x2 = nt.tensor(new Int32Array(2 * T), [2, T]);
    expect(() => stepper.step(x2, y)).toThrow(/differ from the captured/);
    stepper.dispose();
    expect(() => stepper.step(x, y)).toThrow(nt.StateError);
    x.dispose(); y.dispose(); opt.dispose(); opt2.dispose(); sgd.dispose();
  });
});

describe('clipGradNormOnDevice', () => {
  const setup = (scaleBy: number) => {
    const ps = [nt.tensor([3, 4], [2]), nt.tensor([[1, 2], [2, 4]], [2, 2])];
    for (const p of ps) { p.requiresGrad = true; p.grad = nt.scale(p, scaleBy); }
    return ps;
  };

  it('returns the norm on the device and scales the gradients by maxNorm / (norm + 1e-6) when above', () => {
    const ps = setup(1); // norm sqrt(9 + 16 + 1 + 4 + 4 + 16) = sqrt(50)
    const norm = nt.optim.clipGradNormOnDevice(ps, 1);
    expect(norm.device).toBe('cpu');
    expect(norm.item()).toBeCloseTo(Math.sqrt(50), 5);
    const f = 1 / (Math.sqrt(50) + 1e-6);
    expect(Array.from(ps[0]!.grad!.toArraySync())).toEqual([3, 4].map((v) => Math.fround(v * Math.fround(f))).map((v) => expect.closeTo(v, 6)));
    norm.dispose();
    for (const p of ps) p.dispose();
  });

  it('leaves the gradients bit for bit when the norm is below maxNorm, and passes a NaN norm through', () => {
    const ps = setup(0.01);
    const before = ps.map((p) => bits(p.grad!));
    nt.optim.clipGradNormOnDevice(ps, 1).dispose();
    expect(ps.map((p) => bits(p.grad!))).toEqual(before);
    ps[0]!.grad!.dispose();
    ps[0]!.grad = nt.tensor([NaN, 1], [2]);
    const n = nt.optim.clipGradNormOnDevice(ps, 1);
    expect(Number.isNaN(n.item())).toBe(true);
    using want = nt.scale(ps[1]!, 0.01);
    expect(Array.from(ps[1]!.grad!.toArraySync())).toEqual(Array.from(want.toArraySync()));
    using bare = nt.tensor([1], [1]);
    expect(() => nt.optim.clipGradNormOnDevice([bare], 1)).toThrow(/no parameter has a gradient/);
    expect(() => nt.optim.clipGradNormOnDevice(ps, 0)).toThrow(nt.ArgumentError);
    n.dispose();
    for (const p of ps) { p.grad?.dispose(); p.dispose(); }
  });
});

describe('AdamW.advanceDeviceMeta({ all: true }) (what a replay of a captured whole step is preceded by)', () => {
  it('advances every parameter that has state, gradients dropped or not, and writes [lr, step] into the metadata', () => {
    const w = nt.tensor([1, 2, 3], [3]), v = nt.tensor([4, 5], [2]);
    w.requiresGrad = true; v.requiresGrad = true;
    const opt = new nt.optim.AdamW([w, v], { lr: 0.5 });
    opt.deviceMeta = true;
    w.grad = nt.ones([3]); v.grad = nt.ones([2]);
    opt.step();
    opt.zeroGrad();
    expect([opt.state.get(w)!.step, opt.state.get(v)!.step]).toEqual([1, 1]);
    // As after a captured step's zeroGrad: no gradient, so the default advances nothing.
    opt.advanceDeviceMeta();
    expect([opt.state.get(w)!.step, opt.state.get(v)!.step]).toEqual([1, 1]);
    opt.setLr(0.25);
    opt.advanceDeviceMeta({ all: true });
    expect([opt.state.get(w)!.step, opt.state.get(v)!.step]).toEqual([2, 2]);
    const meta = opt.deviceMetaOf(0);
    expect(meta).toHaveLength(1);
    const bytes = new DataView((meta[0]!.toArraySync() as Uint8Array).slice().buffer);
    expect([bytes.getFloat64(0, true), bytes.getInt32(8, true)]).toEqual([0.25, 2]);
    opt.dispose(); w.dispose(); v.dispose();
  });
});
