// nt.nn.MoE against a float64 reference written here in plain JavaScript: routing (top-k, renormalized
// weights, capacity drops), the SwiGLU experts, shared experts, the load-balancing and z-losses; the
// gradients (x, router, experts, shared) from backward against the reference's finite differences of
// loss = Σ out·R + aux, which checks that the auxiliary losses' gradients reach the router.
import { afterEach, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

type Cfg = nt.nn.MoEConfig;
const C = 6;

interface Weights { router: Float64Array; experts: { gate: Float64Array; up: Float64Array; down: Float64Array }[]; shared: { gate: Float64Array; up: Float64Array; down: Float64Array } | null; sharedGate: Float64Array | null }

function weightsOf(m: nt.nn.MoE): Weights {
  const f = (p: nt.Tensor) => Float64Array.from(p.toArraySync());
  const ex = (e: nt.nn.SwiGLUExpert) => ({ gate: f(e.gate), up: f(e.up), down: f(e.down) });
  return { router: f(m.router), experts: m.experts.map(ex), shared: m.shared ? ex(m.shared) : null, sharedGate: m.sharedGate ? f(m.sharedGate) : null };
}

/** y = W x for W [rows, cols]. */
function matvec(w: Float64Array, x: ArrayLike<number>, rows: number, cols: number): number[] {
  const y: number[] = [];
  for (let r = 0; r < rows; r++) { let s = 0; for (let c = 0; c < cols; c++) s += w[r * cols + c]! * x[c]!; y.push(s); }
  return y;
}
function swiglu(e: { gate: Float64Array; up: Float64Array; down: Float64Array }, x: ArrayLike<number>, h: number): number[] {
  const g = matvec(e.gate, x, h, C), u = matvec(e.up, x, h, C);
  const a = g.map((v, i) => (v / (1 + Math.exp(-v))) * u[i]!);
  return matvec(e.down, a, C, h);
}

/** The float64 MoE: out [N, C], the load-balancing loss, the z-loss, counts and drops. */
function reference(w: Weights, x: Float64Array, n: number, cfg: Cfg, h: number, sharedH: number) {
  const E = cfg.experts, k = cfg.topK;
  const out = new Float64Array(n * C);
  const counts = new Array<number>(E).fill(0);
  const pMean = new Array<number>(E).fill(0);
  let z = 0;
  const choices: number[][] = [];
  const probsAll: number[][] = [];
  for (let t = 0; t < n; t++) {
    const xt = x.subarray(t * C, (t + 1) * C);
    const logits = matvec(w.router, xt, E, C);
    const m = Math.max(...logits);
    const ex = logits.map((l) => Math.exp(l - m));
    const s = ex.reduce((a, b) => a + b, 0);
    const p = ex.map((v) => v / s);
    z += (m + Math.log(s)) ** 2;
    p.forEach((v, e) => { pMean[e]! += v / n; });
    const order = p.map((_, i) => i).sort((a, b) => p[b]! - p[a]! || a - b).slice(0, k);
    order.forEach((e) => counts[e]!++);
    choices.push(order);
    probsAll.push(p);
  }
  const cap = cfg.capacityFactor === undefined ? Infinity : Math.ceil((cfg.capacityFactor * n * k) / E);
  const filled = new Array<number>(E).fill(0);
  let dropped = 0;
  for (let t = 0; t < n; t++) {
    const xt = x.subarray(t * C, (t + 1) * C);
    const order = choices[t]!, p = probsAll[t]!;
    const tot = order.reduce((a, e) => a + p[e]!, 0);
    for (const e of order) {
      const wgt = (cfg.normalizeTopK ?? true) && k > 1 ? p[e]! / tot : p[e]!;
      if (filled[e]! >= cap) { dropped++; continue; }
      filled[e]!++;
      const y = swiglu(w.experts[e]!, xt, h);
      for (let c = 0; c < C; c++) out[t * C + c]! += wgt * y[c]!;
    }
    if (w.shared) {
      const y = swiglu(w.shared, xt, sharedH);
      // Qwen2-MoE's gate: sigmoid(x · g) per token.
      const g = w.sharedGate ? 1 / (1 + Math.exp(-matvec(w.sharedGate, xt, 1, C)[0]!)) : 1;
      for (let c = 0; c < C; c++) out[t * C + c]! += g * y[c]!;
    }
  }
  const slots = n * k;
  const lb = E * counts.reduce((a, cnt, e) => a + (cnt / slots) * pMean[e]!, 0);
  return { out, lb, z: z / n, counts, dropped };
}

const made: nt.nn.MoE[] = [];
afterEach(() => { for (const m of made.splice(0)) m.dispose(); });

function build(cfg: Cfg, seed = 1): nt.nn.MoE {
  const m = new nt.nn.MoE(C, cfg, { generator: new nt.Generator(seed), std: 0.5 });
  made.push(m);
  return m;
}

const inputs = (n: number, seed: number) => Float64Array.from({ length: n * C }, (_, i) => Math.sin(i * 1.37 + seed) * 1.3 + Math.cos(i * 0.31 * seed));

function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let err = 0, scale = 1e-12;
  for (let i = 0; i < b.length; i++) { err = Math.max(err, Math.abs(a[i]! - b[i]!)); scale = Math.max(scale, Math.abs(b[i]!)); }
  return err / scale;
}

describe('routeTopK', () => {
  it('chooses the top k per row, sorts rows by expert in token order, and drops beyond the capacity', () => {
    // 4 tokens, 3 experts, top-2
    const probs = [0.5, 0.3, 0.2, 0.1, 0.6, 0.3, 0.2, 0.2, 0.6, 0.7, 0.2, 0.1];
    const r = nt.nn.routeTopK(probs, 4, 3, 2);
    expect([...r.experts]).toEqual([0, 1, 1, 2, 2, 0, 0, 1]); // token 2 ties 0 and 1: the lower wins
    expect(r.counts).toEqual([3, 3, 2]);
    expect([...r.gather]).toEqual([0, 2, 3, 0, 1, 3, 1, 2]);
    expect([...r.combine]).toEqual([0, 3, 4, 6, 7, 1, 2, 5]);
    expect(r.dropped).toBe(0);
    const capped = nt.nn.routeTopK(probs, 4, 3, 2, 2);
    expect(capped.kept).toEqual([2, 2, 2]);
    expect(capped.dropped).toBe(2);
    expect([...capped.gather]).toEqual([0, 2, 0, 1, 1, 2]);
    // token 3's slots (experts 0 and 1) overflow: they point at the zero row (6)
    expect([...capped.combine]).toEqual([0, 2, 3, 4, 5, 1, 6, 6]);
  });
});

describe('nt.nn.MoE against float64', () => {
  const cases: Array<[string, Cfg]> = [
    ['top-2 of 4, dropless', { experts: 4, topK: 2, hidden: 5, zLossCoef: 0.01, auxLossCoef: 0.1 }],
    ['top-1 of 3 with a shared expert, not renormalized', { experts: 3, topK: 1, hidden: 4, sharedExperts: 1, normalizeTopK: false, auxLossCoef: 0.2 }],
    ['top-2 of 4, a sigmoid-gated shared expert of its own width (Qwen2-MoE), not renormalized', { experts: 4, topK: 2, hidden: 3, sharedExperts: 1, sharedHidden: 5, sharedGate: true, normalizeTopK: false, auxLossCoef: 0.1, zLossCoef: 0 }],
    ['top-2 of 4, capacity factor 0.5 (drops)', { experts: 4, topK: 2, hidden: 3, capacityFactor: 0.5, zLossCoef: 0.05 }],
  ];
  for (const [name, cfg] of cases) {
    it(`${name}: output, aux losses and statistics`, () => {
      const m = build(cfg);
      const n = 10, h = cfg.hidden!, sh = cfg.sharedHidden ?? (cfg.sharedExperts ?? 0) * h;
      const xv = inputs(n, 2);
      const ref = reference(weightsOf(m), xv, n, cfg, h, sh);
      nt.scope(() => {
        const out = m.forward(nt.tensor(Float32Array.from(xv), [2, 5, C]));
        expect(out.shape).toEqual([2, 5, C]);
        expect(relErr(out.toArraySync(), ref.out)).toBeLessThan(1e-5);
      });
      const s = m.takeStats();
      expect(s.forwards).toBe(1);
      expect(s.tokensPerExpert).toEqual(ref.counts);
      expect(s.routed).toBe(n * cfg.topK);
      expect(s.dropped).toBe(ref.dropped);
      if (cfg.capacityFactor !== undefined) expect(s.dropped).toBeGreaterThan(0);
      expect(s.loadBalanceLoss).toBeCloseTo(ref.lb, 5);
      expect(s.zLoss).toBeCloseTo(ref.z, 4);
      const ca = cfg.auxLossCoef ?? 0.01, cz = cfg.zLossCoef ?? 0.001;
      expect(s.auxLoss).toBeCloseTo(ca * ref.lb + cz * ref.z, 5);
      expect(m.takeStats().forwards).toBe(0);
    });

    it(`${name}: gradients of Σ out·R + aux against finite differences`, () => {
      const m = build(cfg, 3);
      const n = 8, h = cfg.hidden!, sh = cfg.sharedHidden ?? (cfg.sharedExperts ?? 0) * h;
      const xv = inputs(n, 5);
      const R = Float64Array.from({ length: n * C }, (_, i) => Math.cos(i * 0.7) + 0.3);
      const ca = cfg.auxLossCoef ?? 0.01, cz = cfg.zLossCoef ?? 0.001;
      const w0 = weightsOf(m);
      const objective = (w: Weights, x: Float64Array) => {
        const r = reference(w, x, n, cfg, h, sh);
        return r.out.reduce((a, v, i) => a + v * R[i]!, 0) + ca * r.lb + cz * r.z;
      };
      const grads = nt.scope(() => {
        const x = nt.tensor(Float32Array.from(xv), [n, C]);
        x.requiresGrad = true;
        const out = m.forward(x);
        nt.sum(nt.mul(out, nt.tensor(Float32Array.from(R), [n, C]))).backward();
        const g = (t: nt.Tensor) => Float64Array.from(t.grad!.toArraySync());
        return {
          x: g(x), router: g(m.router), gate0: g(m.experts[0]!.gate), down1: g(m.experts[1]!.down), up0: g(m.experts[0]!.up), sharedDown: m.shared ? g(m.shared.down) : null,
          sharedGate: m.sharedGate ? g(m.sharedGate) : null,
        };
      });
      const eps = 1e-6;
      const fd = (get: (w: Weights, x: Float64Array) => Float64Array, count: number) => {
        const out = new Float64Array(count);
        for (let i = 0; i < count; i++) {
          const wp = structuredClone(w0), xp = xv.slice();
          const wm = structuredClone(w0), xm = xv.slice();
          get(wp, xp)[i]! += eps;
          get(wm, xm)[i]! -= eps;
          out[i] = (objective(wp, xp) - objective(wm, xm)) / (2 * eps);
        }
        return out;
      };
      expect(relErr(grads.router, fd((w) => w.router, w0.router.length))).toBeLessThan(2e-3);
      expect(relErr(grads.x, fd((_, x) => x, xv.length))).toBeLessThan(2e-3);
      expect(relErr(grads.gate0, fd((w) => w.experts[0]!.gate, w0.experts[0]!.gate.length))).toBeLessThan(2e-3);
      expect(relErr(grads.up0, fd((w) => w.experts[0]!.up, w0.experts[0]!.up.length))).toBeLessThan(2e-3);
      expect(relErr(grads.down1, fd((w) => w.experts[1]!.down, w0.experts[1]!.down.length))).toBeLessThan(2e-3);
      if (grads.sharedDown) expect(relErr(grads.sharedDown, fd((w) => w.shared!.down, w0.shared!.down.length))).toBeLessThan(2e-3);
      expect(grads.sharedGate === null).toBe(!cfg.sharedGate);
      if (grads.sharedGate) expect(relErr(grads.sharedGate, fd((w) => w.sharedGate!, w0.sharedGate!.length))).toBeLessThan(2e-3);
    });
  }

  it('the aux losses alone move the router: their gradient equals the reference (scale 1 and 0.25)', () => {
    const cfg: Cfg = { experts: 4, topK: 2, hidden: 3, auxLossCoef: 0.5, zLossCoef: 0.1 };
    const n = 8;
    const gradFor = (s: number) => {
      const m = build(cfg, 4);
      const prev = nt.nn.setMoEAuxLossScale(s);
      try {
        return nt.scope(() => {
          const out = m.forward(nt.tensor(Float32Array.from(inputs(n, 1)), [n, C]));
          // The output's own gradient is zero: only the auxiliary losses reach the router.
          nt.sum(nt.mul(out, 0)).backward();
          return { g: Float64Array.from(m.router.grad!.toArraySync()), w: weightsOf(m) };
        });
      } finally { nt.nn.setMoEAuxLossScale(prev); }
    };
    const one = gradFor(1), quarter = gradFor(0.25);
    const xv = inputs(n, 1), eps = 1e-6;
    const want = new Float64Array(one.w.router.length);
    for (let i = 0; i < want.length; i++) {
      const aux = (d: number) => { const w = structuredClone(one.w); w.router[i]! += d; const r = reference(w, xv, n, cfg, 3, 0); return 0.5 * r.lb + 0.1 * r.z; };
      want[i] = (aux(eps) - aux(-eps)) / (2 * eps);
    }
    expect(Math.max(...want.map(Math.abs))).toBeGreaterThan(1e-3);
    expect(relErr(one.g, want)).toBeLessThan(2e-3);
    expect(relErr(quarter.g, want.map((v) => v * 0.25))).toBeLessThan(2e-3);
  });

  it('every expert gets a gradient, also one that no token chose (zero)', () => {
    const m = build({ experts: 4, topK: 1, hidden: 3 }, 2);
    nt.scope(() => {
      // One token: three experts receive nothing.
      const out = m.forward(nt.tensor(Float32Array.from(inputs(1, 1)), [1, C]));
      nt.sum(out).backward();
    });
    for (const e of m.experts) for (const p of [e.gate, e.up, e.down]) expect(p.grad).not.toBeNull();
    const zeroExperts = m.experts.filter((e) => e.down.grad!.toArraySync().every((v) => v === 0));
    expect(zeroExperts.length).toBe(3);
  });

  it('bad configs are ArgumentErrors naming the problem', () => {
    expect(() => new nt.nn.MoE(C, { experts: 2, topK: 3 })).toThrow(/topK \(3\) must not exceed the number of experts \(2\)/);
    expect(() => new nt.nn.MoE(C, { experts: 0, topK: 1 })).toThrow(nt.ArgumentError);
    expect(() => new nt.nn.MoE(C, { experts: 4, topK: 1, capacityFactor: 0 })).toThrow(/capacityFactor/);
    expect(() => new nt.nn.MoE(C, { experts: 4, topK: 1, auxLossCoef: -1 })).toThrow(/auxLossCoef/);
    expect(() => nt.nn.setMoEAuxLossScale(NaN)).toThrow(nt.ArgumentError);
    expect(() => new nt.nn.MoE(C, { experts: 4, topK: 1, sharedGate: true })).toThrow(/sharedExperts must be >= 1/);
    expect(() => new nt.nn.MoE(C, { experts: 4, topK: 1, sharedExperts: 1, sharedHidden: 0 })).toThrow(/sharedHidden must be an integer >= 1/);
  });
});

describe('GPT with MoE blocks', () => {
  const base: nt.nn.GPTConfig = { vocabSize: 32, blockSize: 8, nLayer: 3, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
  const ids = (seed: number) => nt.tensor(Int32Array.from({ length: 2 * 8 }, (_, i) => (i * 13 + seed * 5) % 32), [2, 8]);
  const moe: nt.nn.MoEConfig = { experts: 4, topK: 2, hidden: 12, every: 2, auxLossCoef: 0.3, zLossCoef: 0.05 };

  function lossAndGrads(config: nt.nn.GPTConfig) {
    const model = new nt.nn.GPT(config, { seed: 7 });
    try {
      return nt.scope(() => {
        const out = model.forward(ids(1), ids(2));
        out.loss!.backward();
        return { loss: out.loss!.item(), stats: model.takeMoEStats(), grads: new Map(model.namedParameters().map(([n, p]) => [n, Float64Array.from(p.grad!.toArraySync())])) };
      });
    } finally { model.dispose(); }
  }

  it('every-th block holds the MoE (named experts.i), the others the dense MLP', () => {
    const model = new nt.nn.GPT({ ...base, moe }, { seed: 7 });
    try {
      expect(model.h.map((b) => b.mlp instanceof nt.nn.MoE)).toEqual([false, true, false]);
      const names = model.namedParameters().map(([n]) => n);
      expect(names).toContain('h.1.mlp.router');
      expect(names).toContain('h.1.mlp.experts.3.down');
      expect(names).toContain('h.0.mlp.fc.weight');
    } finally { model.dispose(); }
  });

  it('recomputed blocks give the same loss and every gradient, the auxiliary losses\' included', () => {
    const plain = lossAndGrads({ ...base, moe }), again = lossAndGrads({ ...base, moe, recompute: true });
    expect(again.loss).toBe(plain.loss);
    for (const [n, g] of plain.grads) expect(relErr(again.grads.get(n)!, g), n).toBeLessThan(1e-6);
    // Statistics are counted once per forward (not again when backward re-runs the block).
    expect(plain.stats!.forwards).toBe(1);
    expect(again.stats!.forwards).toBe(1);
    expect(again.stats!.tokensPerExpert).toEqual(plain.stats!.tokensPerExpert);
    expect(plain.stats!.tokensPerExpert.reduce((a, b) => a + b, 0)).toBe(16 * 2);
  });

  it('the auxiliary losses reach the router through the GPT: its gradient moves with their coefficients, the LM loss does not', () => {
    const withAux = lossAndGrads({ ...base, moe }), without = lossAndGrads({ ...base, moe: { ...moe, auxLossCoef: 0, zLossCoef: 0 } });
    expect(withAux.loss).toBe(without.loss);
    const router = 'h.1.mlp.router';
    expect(relErr(withAux.grads.get(router)!, without.grads.get(router)!)).toBeGreaterThan(1e-3);
    // Parameters the auxiliary losses do not depend on keep their gradients (block 1's experts, the block after it).
    for (const n of ['h.1.mlp.experts.0.gate', 'h.2.attn.qkv.weight']) expect(relErr(withAux.grads.get(n)!, without.grads.get(n)!), n).toBeLessThan(1e-6);
    // Those before the router get the auxiliary losses' gradient too.
    expect(relErr(withAux.grads.get('h.0.attn.qkv.weight')!, without.grads.get('h.0.attn.qkv.weight')!)).toBeGreaterThan(1e-4);
  });

  it('trains through nt.trainStep (loss falls)', () => {
    const model = new nt.nn.GPT({ ...base, moe }, { seed: 7 });
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-2 });
    try {
      const losses = Array.from({ length: 8 }, () => nt.trainStep(model, opt, ids(1), ids(2)).loss);
      expect(losses.at(-1)!).toBeLessThan(losses[0]! - 0.1);
      expect(model.takeMoEStats()!.forwards).toBe(8);
    } finally { model.dispose(); opt.dispose(); }
  });

  it('bad MoE configs in a GPTConfig are ArgumentErrors', () => {
    expect(() => new nt.nn.GPT({ ...base, moe: { experts: 2, topK: 3 } })).toThrow(/GPTConfig\.moe: topK \(3\) must not exceed the number of experts \(2\)/);
    expect(() => new nt.nn.GPT({ ...base, moe: { experts: 2, topK: 1, every: 4 } })).toThrow(/every \(4\) exceeds nLayer \(3\)/);
  });
});
