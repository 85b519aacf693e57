// Mixed precision helpers on the cpu backend: GradScaler's dynamic loss scaling and unscaling,
// the autocast policy, and f32 master weights with bf16 compute copies.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

describe('GradScaler', () => {
  it('unscales gradients in place (f32 and bf16) against a float64 reference', () => {
    const scaler = new nt.GradScaler({ initScale: 1024 });
    const g32 = nt.randn([7, 5], { seed: 1, std: 1000 });
    const g16 = nt.randn([13], { seed: 2, std: 1000, dtype: 'bf16' });
    const before32 = Array.from(g32.toArraySync()), before16 = Array.from(g16.toArraySync());
    expect(scaler.unscale([g32, g16])).toBe(false);
    const after32 = g32.toArraySync(), after16 = g16.toArraySync();
    before32.forEach((v, i) => expect(after32[i]).toBeCloseTo(v / 1024, 5));
    // bf16 keeps 8 bits of mantissa: relative error below 2^-8
    before16.forEach((v, i) => expect(Math.abs(after16[i]! - v / 1024)).toBeLessThanOrEqual(Math.abs(v / 1024) * 2 ** -8));
    // a second unscale in the same step does nothing
    expect(scaler.unscale([g32])).toBe(false);
    expect(g32.toArraySync()[0]).toBe(after32[0]);
    g32.dispose(); g16.dispose();
  });

  it('skips the step and backs off on inf/NaN, grows after growthInterval clean steps', () => {
    const scaler = new nt.GradScaler({ initScale: 256, growthInterval: 3 });
    const good = nt.ones([4]);
    const bad = nt.tensor([1, Infinity, 2]);
    const nan = nt.tensor([NaN]);
    let steps = 0;
    expect(scaler.step([good, bad], () => steps++)).toBe(false);
    scaler.update();
    expect(scaler.scale).toBe(128);
    expect(scaler.step([nan], () => steps++)).toBe(false);
    scaler.update();
    expect(scaler.scale).toBe(64);
    for (let i = 0; i < 3; i++) {
      const g = nt.ones([2]);
      expect(scaler.step([g], () => steps++)).toBe(true);
      scaler.update();
      g.dispose();
    }
    expect(steps).toBe(3);
    expect(scaler.scale).toBe(128);
    expect(scaler.stateDict()).toEqual({ scale: 128, growthTracker: 0 });
    good.dispose(); bad.dispose(); nan.dispose();
  });

  it('a disabled scaler has scale 1 and always steps; bad options are typed errors', () => {
    const s = new nt.GradScaler({ enabled: false });
    expect(s.scale).toBe(1);
    const g = nt.tensor([Infinity]);
    expect(s.step([g], () => {})).toBe(true);
    expect(g.toArraySync()[0]).toBe(Infinity);
    g.dispose();
    expect(() => new nt.GradScaler({ backoffFactor: 2 })).toThrow(nt.ArgumentError);
    expect(() => new nt.GradScaler({ growthInterval: 0 })).toThrow(nt.ArgumentError);
    expect(() => new nt.GradScaler().loadStateDict({ scale: -1, growthTracker: 0 })).toThrow(nt.ArgumentError);
  });

  it('update(foundInf) takes an externally computed overflow flag (fused optimizers)', () => {
    const s = new nt.GradScaler({ initScale: 8, growthInterval: 1 });
    s.update(false);
    expect(s.scale).toBe(16);
    s.update(true);
    expect(s.scale).toBe(8);
    s.loadStateDict({ scale: 4, growthTracker: 0 });
    expect(s.scale).toBe(4);
  });
});

describe('autocast policy', () => {
  it('maps ops to bf16/f16 or f32 inside autocast, nothing outside, across await and nesting', async () => {
    expect(nt.autocastDtypeFor('matmul')).toBeUndefined();
    await nt.autocast({ dtype: 'bf16' }, async () => {
      await new Promise((r) => setTimeout(r, 1));
      expect(nt.autocastDtypeFor('matmul')).toBe('bf16');
      expect(nt.autocastDtypeFor('softmax')).toBe('f32');
      expect(nt.autocastDtypeFor('add')).toBeUndefined();
      nt.autocast({ dtype: 'f16' }, () => expect(nt.autocastDtypeFor('linear')).toBe('f16'));
      nt.autocast({ enabled: false }, () => expect(nt.autocastState()).toEqual({ enabled: false, dtype: undefined, lowPrecisionResidual: false }));
      expect(nt.autocastState()).toEqual({ enabled: true, dtype: 'bf16', lowPrecisionResidual: false });
    });
    expect(nt.autocastState().enabled).toBe(false);
    expect(() => nt.autocast({ dtype: 'f32' as 'bf16' }, () => 0)).toThrow(nt.DTypeError);
  });
});

describe('MasterWeights', () => {
  it('keeps bf16 compute copies equal to the rounded f32 masters after refresh()', () => {
    const w = nt.randn([33], { seed: 4 });
    const mw = new nt.MasterWeights([w], 'bf16');
    const check = () => {
      const ref = w.to('bf16');
      expect(Array.from(mw.compute[0]!.toArraySync())).toEqual(Array.from(ref.toArraySync()));
      ref.dispose();
    };
    check();
    w.backend.fill(w.storage, 0, w.size, 0.123456789);
    mw.refresh();
    check();
    expect(mw.compute[0]!.toArraySync()[0]).not.toBe(w.toArraySync()[0]);  // rounded, not a copy
    expect(() => new nt.MasterWeights([mw.compute[0]!])).toThrow(nt.DTypeError);
    mw.dispose(); w.dispose();
  });
});
