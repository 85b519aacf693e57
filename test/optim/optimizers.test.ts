// AdamW, SGD and LAMB against float64 references of their update rules, over several steps and odd shapes.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { AdamW, Lamb, SGD } from '../../lib/optim/index.js';

function rng(seed: number): () => number {
  let s = seed >>> 0;
  return () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s / 2 ** 32 * 2 - 1; };
}

const shapes = [[7], [3, 5], [2, 3, 4], [1]];

/** Parameters and a sequence of gradients as plain arrays plus live tensors holding the parameters. */
function setup(seed: number) {
  const r = rng(seed);
  const init = shapes.map((s) => Float64Array.from({ length: s.reduce((a, b) => a * b, 1) }, () => r()));
  const grads = (step: number) => shapes.map((s, i) => Float64Array.from({ length: init[i]!.length }, (_, j) => Math.sin(step * 7 + i * 3 + j) * (1 + step)));
  const params = shapes.map((s, i) => nt.tensor(Float32Array.from(init[i]!), s, { requiresGrad: true }));
  const ref = init.map((a) => Float64Array.from(Float32Array.from(a)));
  return { params, ref, grads };
}

function setGrads(params: nt.Tensor[], g: Float64Array[]): void {
  params.forEach((p, i) => { p.grad?.dispose(); p.grad = nt.tensor(Float32Array.from(g[i]!), p.shape as number[]); });
}

function expectClose(params: nt.Tensor[], ref: Float64Array[], tol: number): void {
  params.forEach((p, i) => {
    const got = p.toArraySync();
    for (let j = 0; j < got.length; j++) expect(Math.abs(got[j]! - ref[i]![j]!)).toBeLessThan(tol * (1 + Math.abs(ref[i]![j]!)));
  });
}

describe('AdamW', () => {
  it('matches the float64 update rule over 5 steps with weight decay and grad scale', () => {
    const { params, ref, grads } = setup(1);
    const [lr, b1, b2, eps, wd, scale] = [0.01, 0.9, 0.95, 1e-8, 0.1, 0.5];
    const opt = new AdamW(params, { lr, betas: [b1, b2], eps, weightDecay: wd });
    opt.gradScale = scale;
    const m = ref.map((a) => new Float64Array(a.length)), v = ref.map((a) => new Float64Array(a.length));
    for (let t = 1; t <= 5; t++) {
      const g = grads(t);
      setGrads(params, g);
      opt.step();
      ref.forEach((p, i) => {
        for (let j = 0; j < p.length; j++) {
          const gj = g[i]![j]! * scale;
          m[i]![j] = b1 * m[i]![j]! + (1 - b1) * gj;
          v[i]![j] = b2 * v[i]![j]! + (1 - b2) * gj * gj;
          const mh = m[i]![j]! / (1 - b1 ** t), vh = v[i]![j]! / (1 - b2 ** t);
          p[j] = p[j]! * (1 - lr * wd) - lr * mh / (Math.sqrt(vh) + eps);
        }
      });
    }
    expectClose(params, ref, 1e-5);
    const sd = opt.stateDict();
    expect(sd.state[0]!.step).toBe(5);
    expect(Array.from(sd.state[1]!.tensors.expAvg!.toArraySync()).map((x, j) => Math.abs(x - m[1]![j]!)).every((d) => d < 1e-5)).toBe(true);
  });

  it('skips parameters without gradients and uses per-group options', () => {
    const { params } = setup(2);
    const opt = new AdamW([{ params: [params[0]!], weightDecay: 0 }, { params: params.slice(1), lr: 0 }], { lr: 0.1 });
    const before = params.map((p) => p.toArraySync());
    params[0]!.grad = nt.ones(params[0]!.shape as number[]);
    params[2]!.grad = nt.ones(params[2]!.shape as number[]);
    opt.step();
    expect(Array.from(params[0]!.toArraySync()).every((x, j) => Math.abs(x - (before[0]![j]! - 0.1)) < 1e-5)).toBe(true);
    expect(params[1]!.toArraySync()).toEqual(before[1]);
    expect(params[2]!.toArraySync()).toEqual(before[2]); // lr 0 in its group
    expect(opt.state.has(params[1]!)).toBe(false);
  });

  it('round-trips stateDict into a fresh optimizer and continues identically', () => {
    const a = setup(3), b = setup(3);
    const optA = new AdamW(a.params, { lr: 0.05 }), optB = new AdamW(b.params, { lr: 0.05 });
    setGrads(a.params, a.grads(1)); optA.step();
    setGrads(b.params, b.grads(1)); optB.step();
    const fresh = setup(3);
    fresh.params.forEach((p, i) => p.backend.copy(p.storage, 0, b.params[i]!.storage, 0, p.nbytes));
    const optC = new AdamW(fresh.params, { lr: 0.05 });
    optC.loadStateDict(optB.stateDict());
    setGrads(a.params, a.grads(2)); optA.step();
    setGrads(fresh.params, a.grads(2)); optC.step();
    fresh.params.forEach((p, i) => expect(p.toArraySync()).toEqual(a.params[i]!.toArraySync()));
  });

  it('rejects bad hyperparameters and mismatched state with typed errors, then still works', () => {
    const { params } = setup(4);
    expect(() => new AdamW(params, { lr: -1 })).toThrow(nt.ArgumentError);
    expect(() => new AdamW(params, { betas: [0.9, 1.5] })).toThrow(nt.ArgumentError);
    expect(() => new AdamW([], {})).toThrow(nt.ArgumentError);
    expect(() => new AdamW([params[0]!, params[0]!])).toThrow(nt.ArgumentError);
    const opt = new AdamW(params);
    expect(() => opt.loadStateDict({ groups: [], state: [] })).toThrow(nt.StateError);
    params[0]!.grad = nt.ones([3]);
    expect(() => opt.step()).toThrow(nt.ShapeError);
    params[0]!.grad = nt.ones(params[0]!.shape as number[]);
    opt.step();
    expect(Number.isFinite(params[0]!.toArraySync()[0]!)).toBe(true);
  });
});

describe('SGD', () => {
  for (const cfg of [
    { momentum: 0, dampening: 0, weightDecay: 0, nesterov: false },
    { momentum: 0.9, dampening: 0.1, weightDecay: 0.01, nesterov: false },
    { momentum: 0.8, dampening: 0, weightDecay: 0.05, nesterov: true },
  ]) {
    it(`matches the float64 rule (${JSON.stringify(cfg)})`, () => {
      const { params, ref, grads } = setup(5);
      const lr = 0.05;
      const opt = new SGD(params, { lr, ...cfg });
      const buf = ref.map((a) => new Float64Array(a.length));
      for (let t = 1; t <= 4; t++) {
        const g = grads(t);
        setGrads(params, g);
        opt.step();
        ref.forEach((p, i) => {
          for (let j = 0; j < p.length; j++) {
            let d = g[i]![j]! + cfg.weightDecay * p[j]!;
            if (cfg.momentum !== 0) {
              buf[i]![j] = t === 1 ? d : cfg.momentum * buf[i]![j]! + (1 - cfg.dampening) * d;
              d = cfg.nesterov ? d + cfg.momentum * buf[i]![j]! : buf[i]![j]!;
            }
            p[j] = p[j]! - lr * d;
          }
        });
      }
      expectClose(params, ref, 1e-5);
    });
  }
  it('rejects nesterov without momentum', () => {
    const { params } = setup(6);
    expect(() => new SGD(params, { lr: 0.1, nesterov: true })).toThrow(nt.ArgumentError);
  });
});

describe('LAMB', () => {
  it('matches the float64 rule with per-tensor trust ratios', () => {
    const { params, ref, grads } = setup(7);
    const [lr, b1, b2, eps, wd] = [0.02, 0.9, 0.999, 1e-6, 0.01];
    const opt = new Lamb(params, { lr, betas: [b1, b2], eps, weightDecay: wd });
    const m = ref.map((a) => new Float64Array(a.length)), v = ref.map((a) => new Float64Array(a.length));
    for (let t = 1; t <= 3; t++) {
      const g = grads(t);
      setGrads(params, g);
      opt.step();
      ref.forEach((p, i) => {
        const u = new Float64Array(p.length);
        for (let j = 0; j < p.length; j++) {
          m[i]![j] = b1 * m[i]![j]! + (1 - b1) * g[i]![j]!;
          v[i]![j] = b2 * v[i]![j]! + (1 - b2) * g[i]![j]! ** 2;
          u[j] = (m[i]![j]! / (1 - b1 ** t)) / (Math.sqrt(v[i]![j]! / (1 - b2 ** t)) + eps) + wd * p[j]!;
        }
        const pn = Math.hypot(...p), un = Math.hypot(...u);
        const ratio = pn > 0 && un > 0 ? pn / un : 1;
        if (t === 3) expect(opt.lastTrustRatios.get(params[i]!)!).toBeCloseTo(ratio, 4);
        for (let j = 0; j < p.length; j++) p[j] = p[j]! - lr * ratio * u[j]!;
      });
    }
    expectClose(params, ref, 1e-4);
  });
});
