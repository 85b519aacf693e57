// lib/ops and lib/optim on the cuda backend against the cpu backend: each op forward and backward on
// the same random inputs, in f32 and bf16. Needs a GPU; without one the suite is skipped with the reason.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import type { Tensor } from '../../lib/index.js';
import { geluMlp } from '../../lib/internal.js';

const hasGpu = nt.cuda.isAvailable();
const why = hasGpu ? '' : ` (skipped: no usable GPU: ${nt.cuda.unavailableReason()})`;
const TOL = { f32: 1e-4, bf16: 3e-2 } as const;

function close(got: Tensor, want: Tensor, tol: number, what: string): void {
  expect(got.shape).toEqual(want.shape);
  const g = got.to('cpu').toArraySync(), w = want.toArraySync();
  let worst = 0;
  for (let i = 0; i < w.length; i++) worst = Math.max(worst, Math.abs(Number(g[i]) - Number(w[i])) / (1 + Math.abs(Number(w[i]))));
  expect(worst, what).toBeLessThanOrEqual(tol);
}

type Case = { name: string; shapes: number[][]; run: (xs: Tensor[]) => Tensor; positive?: boolean };
const cases: Case[] = [
  { name: 'add broadcast', shapes: [[3, 5, 7], [5, 1]], run: ([a, b]) => nt.add(a!, b!) },
  { name: 'mul/div/sub', shapes: [[4, 9], [9]], run: ([a, b]) => nt.sub(nt.div(nt.mul(a!, b!), nt.add(nt.mul(b!, b!), 1)), a!) },
  { name: 'exp/tanh/pow', shapes: [[33, 7]], run: ([a]) => nt.add(nt.tanh(nt.exp(nt.scale(a!, 0.3))), nt.pow(a!, 3)) },
  { name: 'log/sqrt', shapes: [[129]], run: ([a]) => nt.add(nt.log(a!), nt.sqrt(a!)), positive: true },
  { name: 'sum/mean/max', shapes: [[6, 17, 5]], run: ([a]) => nt.add(nt.add(nt.sum(a!, 1), nt.mean(a!, 1)), nt.max(a!, 1)) },
  { name: 'gelu', shapes: [[1025]], run: ([a]) => nt.gelu(a!) },
  { name: 'softmax/logSoftmax', shapes: [[7, 300]], run: ([a]) => nt.add(nt.softmax(a!), nt.logSoftmax(a!)) },
  { name: 'layerNorm', shapes: [[9, 70], [70], [70]], run: ([x, w, b]) => nt.layerNorm(x!, w!, b!) },
  { name: 'rmsNorm', shapes: [[9, 70], [70]], run: ([x, w]) => nt.rmsNorm(x!, w!) },
  { name: 'linear', shapes: [[5, 3, 24], [17, 24], [17]], run: ([x, w, b]) => nt.linear(x!, w!, b!) },
  { name: 'linearGelu', shapes: [[5, 3, 24], [17, 24], [17]], run: ([x, w, b]) => nt.linearGelu(x!, w!, b!) },
  // geluMlp on cuBLASLt's epilogues (hidden 32: GELU_AUX_BIAS, DGELU_BGRAD; hidden 17: the kernel fallbacks), BGRADB for the biases.
  { name: 'geluMlp', shapes: [[5, 3, 24], [32, 24], [32], [8, 32], [8]], run: ([x, w1, b1, w2, b2]) => geluMlp(x!, w1!, b1!, w2!, b2!) },
  { name: 'geluMlp fallback', shapes: [[5, 3, 24], [17, 24], [17], [8, 17], [8]], run: ([x, w1, b1, w2, b2]) => geluMlp(x!, w1!, b1!, w2!, b2!) },
  { name: 'addLayerNorm', shapes: [[9, 70], [9, 70], [70], [70]], run: ([x, r, w, b]) => { const o = nt.addLayerNorm(x!, r!, w!, b!); return nt.add(o.sum, o.out); } },
  { name: 'permute/slice/cat', shapes: [[4, 6, 5]], run: ([a]) => nt.cat([nt.permute(a!, [2, 0, 1]), nt.slice(nt.permute(a!, [2, 0, 1]), 1, 1, 3)], 1) },
  { name: 'attention causal', shapes: [[2, 3, 11, 8], [2, 3, 11, 8], [2, 3, 11, 8]], run: ([q, k, v]) => nt.attention(q!, k!, v!, { causal: true }) },
  { name: 'attention window', shapes: [[1, 2, 13, 8], [1, 2, 13, 8], [1, 2, 13, 8]], run: ([q, k, v]) => nt.attention(q!, k!, v!, { causal: true, window: 4 }) },
  { name: 'silu/swiglu', shapes: [[7, 33], [7, 33]], run: ([g, u]) => nt.add(nt.swiglu(g!, u!), nt.silu(g!)) },
  { name: 'rope offset', shapes: [[2, 5, 3, 8]], run: ([x]) => nt.rope(x!, { offset: 11, theta: 500 }) },
  { name: 'rope positions', shapes: [[2, 5, 3, 8]], run: ([x]) => nt.rope(x!, { positions: nt.tensor(Int32Array.from([0, 9, 2, 7, 4, 5, 6, 1, 8, 3]), [2, 5], { device: x!.device }) }) },
  { name: 'groupedQueryAttention', shapes: [[2, 9, 4, 8], [2, 9, 2, 8], [2, 9, 2, 8]], run: ([q, k, v]) => nt.groupedQueryAttention(q!, k!, v!) },
  { name: 'attention multi-query', shapes: [[1, 4, 9, 8], [1, 1, 9, 8], [1, 1, 9, 8]], run: ([q, k, v]) => nt.attention(q!, k!, v!) },
];

describe.skipIf(!hasGpu)(`lib/ops on cuda match cpu${why}`, () => {
  for (const dtype of ['f32', 'bf16'] as const) {
    for (const c of cases) {
      it(`${c.name} ${dtype}: forward and gradients`, () => {
        const inputs = c.shapes.map((s, i) => {
          const r = nt.randn(s, { seed: 100 + i, dtype });
          return c.positive ? nt.add(nt.mul(r, r), 0.5) : r;
        });
        const onDevice = (device: string) => {
          const xs = inputs.map((t) => { const d = t.to(device); d.requiresGrad = true; return d; });
          const y = c.run(xs);
          nt.sum(nt.mul(y, y)).backward();
          return { y, grads: xs.map((x) => x.grad!) };
        };
        const want = onDevice('cpu'), got = onDevice('cuda');
        close(got.y, want.y, TOL[dtype], `${c.name} output`);
        got.grads.forEach((g, i) => close(g, want.grads[i]!, TOL[dtype] * 4, `${c.name} grad ${i}`));
      });
    }
    it(`embedding + crossEntropy ${dtype}: loss and gradients`, () => {
      const V = 37, D = 12;
      const ids = nt.tensor(Int32Array.from({ length: 20 }, (_, i) => (i * 7) % V), [4, 5]);
      const targets = nt.tensor(Int32Array.from({ length: 20 }, (_, i) => (i === 3 ? -100 : (i * 5) % V)), [4, 5]);
      const table = nt.randn([V, D], { seed: 5, dtype }), proj = nt.randn([V, D], { seed: 6, dtype });
      const run = (device: string) => {
        const w = table.to(device), p = proj.to(device);
        w.requiresGrad = true; p.requiresGrad = true;
        const loss = nt.crossEntropy(nt.linear(nt.embedding(ids.to(device), w), p), targets.to(device));
        loss.backward();
        return { loss, gw: w.grad!, gp: p.grad! };
      };
      const want = run('cpu'), got = run('cuda');
      close(got.loss, want.loss, TOL[dtype], 'loss');
      close(got.gw, want.gw, TOL[dtype] * 4, 'embedding grad');
      close(got.gp, want.gp, TOL[dtype] * 4, 'projection grad');
    });
  }

  for (const Opt of ['AdamW', 'Lamb', 'SGD'] as const) {
    it(`${Opt} steps and clipGradNorm match cpu`, () => {
      const run = (device: string) => {
        const ps = [nt.randn([33, 5], { seed: 1 }), nt.randn([7], { seed: 2 })].map((t) => { const d = t.to(device); d.requiresGrad = true; return d; });
        const opt = Opt === 'AdamW' ? new nt.optim.AdamW(ps, { lr: 1e-2, weightDecay: 0.1 })
          : Opt === 'Lamb' ? new nt.optim.Lamb(ps, { lr: 1e-2, weightDecay: 0.1 }) : new nt.optim.SGD(ps, { lr: 1e-2, momentum: 0.9 });
        for (let s = 0; s < 3; s++) {
          opt.zeroGrad();
          nt.sum(nt.mul(nt.mul(ps[0]!, ps[0]!), 0.5 + s)).backward();
          nt.sum(nt.tanh(ps[1]!)).backward();
          nt.optim.clipGradNorm(ps, 1.0);
          opt.step();
        }
        return ps;
      };
      const want = run('cpu'), got = run('cuda');
      got.forEach((p, i) => close(p, want[i]!, 1e-4, `${Opt} param ${i}`));
    });
  }
});
