// AdamW with its lr and step in device metadata (deviceMeta / NODETRON_ADAMW_DEVICE_META, the kernel
// adamw_step_meta): on the cpu backend the update is the host-scalar path's bit for bit (both compute
// AdamW's constants in double from the same lr and step), over steps with a changing lr, weight decay,
// a gradient scale, f32 and bf16 parameters, bf16 gradients and two parameter groups; the metadata's
// bytes; a replay as a captured graph would run it (advanceDeviceMeta, then the recorded kernel call);
// the switch and its typed errors. The capture itself needs a GPU (test/cuda/step-graph.test.ts).
import { afterEach, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { AdamW, adamwDeviceMetaFromEnv, adamwMetaBytes } from '../../lib/optim/adamw.js';
import { randomArray, rng } from '../helpers/gradcheck.js';
import { dtypeCode } from '../../lib/dtype.js';

function params(seed: number, dtype: 'f32' | 'bf16') {
  const r = rng(seed);
  return [[33, 7], [1000], [5]].map((shape) => {
    const n = shape.reduce((a, b) => a * b, 1);
    const p = nt.tensor(Float32Array.from(randomArray(n, r, -1, 1)), shape).to(dtype);
    p.requiresGrad = true;
    return p;
  });
}

function setGrads(ps: nt.Tensor[], step: number, gradDtype: 'f32' | 'bf16') {
  const r = rng(100 + step);
  for (const p of ps) {
    p.grad?.dispose();
    p.grad = nt.tensor(Float32Array.from(randomArray(p.size, r, -3, 3)), p.shape).to(gradDtype);
  }
}

const bits = (t: nt.Tensor) => Array.from(new Uint8Array((t.to('f32').toArraySync() as Float32Array).buffer));

function train(meta: boolean, dtype: 'f32' | 'bf16', gradDtype: 'f32' | 'bf16', steps = 5) {
  const ps = params(1, dtype);
  const opt = new AdamW([{ params: ps.slice(0, 2) }, { params: ps.slice(2), weightDecay: 0 }], { lr: 3e-3, weightDecay: 0.1 });
  opt.deviceMeta = meta;
  for (let s = 1; s <= steps; s++) {
    setGrads(ps, s, gradDtype);
    // A schedule: a new lr every step (not representable in f32, so a rounded lr would show).
    for (const g of opt.paramGroups) g.options.lr = 3e-3 * Math.cos(s / 7) + 1e-5 / 3;
    opt.gradScale = s % 2 ? 1 : 0.37;
    opt.step();
  }
  return { ps, opt };
}

afterEach(() => { delete process.env.NODETRON_ADAMW_DEVICE_META; });

describe('AdamW with device metadata', () => {
  for (const [dtype, gradDtype] of [['f32', 'f32'], ['bf16', 'bf16'], ['bf16', 'f32']] as const) {
    it(`${dtype} parameters, ${gradDtype} gradients: the host-scalar path's parameters and moments bit for bit`, () => {
      const a = train(false, dtype, gradDtype), b = train(true, dtype, gradDtype);
      for (let i = 0; i < a.ps.length; i++) {
        expect(bits(b.ps[i]!)).toEqual(bits(a.ps[i]!));
        const sa = a.opt.state.get(a.ps[i]!)!, sb = b.opt.state.get(b.ps[i]!)!;
        expect(sb.step).toBe(sa.step);
        expect(bits(sb.tensors.expAvg!)).toEqual(bits(sa.tensors.expAvg!));
        expect(bits(sb.tensors.expAvgSq!)).toEqual(bits(sa.tensors.expAvgSq!));
      }
      // The update is not a no-op and the runs differ from a run at a rounded (f32) lr.
      expect(bits(a.ps[1]!)).not.toEqual(bits(params(1, dtype)[1]!));
    });
  }

  it('the metadata holds the last step and lr of each group', () => {
    const { opt } = train(true, 'f32', 'f32', 3);
    for (const g of [0, 1]) {
      const m = opt.deviceMetaOf(g);
      expect(m).toHaveLength(1);
      expect(Array.from(m[0]!.toArraySync() as Uint8Array)).toEqual(Array.from(adamwMetaBytes(opt.paramGroups[g]!.options.lr, 3)));
    }
    const v = new DataView(adamwMetaBytes(0.1, 7).buffer);
    expect([v.getFloat64(0, true), v.getInt32(8, true), v.getInt32(12, true)]).toEqual([0.1, 7, 0]);
  });

  it('a replay as a captured graph runs it: advanceDeviceMeta, then the kernel call recorded at capture', () => {
    // Reference: three eager host-scalar steps.
    const ref = train(false, 'f32', 'f32', 3);
    // Two eager steps with metadata, then the third "replayed": the metadata written by
    // advanceDeviceMeta and the same native call a capture records (its arguments hold no lr or step).
    const { ps, opt } = train(true, 'f32', 'f32', 2);
    setGrads(ps, 3, 'f32');
    for (const g of opt.paramGroups) g.options.lr = 3e-3 * Math.cos(3 / 7) + 1e-5 / 3;
    opt.gradScale = 1;
    opt.advanceDeviceMeta();
    opt.paramGroups.forEach((g, gi) => {
      const o = g.options, st = g.params.map((p) => opt.state.get(p)!);
      expect(st.every((s) => s.step === 3)).toBe(true);
      const meta = opt.deviceMetaOf(gi)[0]!;
      ps[0]!.backend.adamw_step_meta(g.params.map((p) => p.storage), g.params.map((p) => p.grad!.storage),
        st.map((s) => s.tensors.expAvg!.storage), st.map((s) => s.tensors.expAvgSq!.storage), g.params.map((p) => p.size),
        g.params.map((p) => dtypeCode(p.dtype)), g.params.map((p) => dtypeCode(p.grad!.dtype)), meta.storage,
        o.betas[0], o.betas[1], o.eps, o.weightDecay, 1);
    });
    for (let i = 0; i < ps.length; i++) expect(bits(ps[i]!)).toEqual(bits(ref.ps[i]!));
  });

  it('the switch and its typed errors', () => {
    expect(adamwDeviceMetaFromEnv()).toBe(false);
    process.env.NODETRON_ADAMW_DEVICE_META = '1';
    expect(new AdamW(params(2, 'f32')).deviceMeta).toBe(true);
    process.env.NODETRON_ADAMW_DEVICE_META = 'yes';
    expect(() => new AdamW(params(2, 'f32'))).toThrow(nt.ArgumentError);
    delete process.env.NODETRON_ADAMW_DEVICE_META;
    const opt = new AdamW(params(2, 'f32'));
    expect(() => opt.advanceDeviceMeta()).toThrow(nt.StateError);
    opt.deviceMeta = true;
    for (const p of opt.paramGroups[0]!.params) p.grad = nt.zeros(p.shape);
    expect(() => opt.advanceDeviceMeta()).toThrow(/no metadata yet/);
    // A metadata step of 0 (never written) is refused by the kernel, not run with a division by zero.
    using meta = nt.zeros([16], { dtype: 'u8' });
    const p = opt.paramGroups[0]!.params[0]!, s = opt.ensureState(p);
    expect(() => p.backend.adamw_step_meta([p.storage], [p.grad!.storage], [s.tensors.expAvg!.storage], [s.tensors.expAvgSq!.storage], [p.size],
      [dtypeCode('f32')], [dtypeCode('f32')], meta.storage, 0.9, 0.999, 1e-8, 0, 1)).toThrow(/step in meta must be >= 1/);
  });
});
