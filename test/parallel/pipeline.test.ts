// Pipeline schedules on simulated stages: GPipe and 1F1B give every stage's parameters the
// gradients of the single-process full batch, and the same losses; layer partitioning and errors;
// forward-only evaluation and the backward hook; GPT stages against the whole GPT; trainer set-up checks.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { forwardOnly, gpipe, oneForwardOneBackward, partitionLayers } from '../../lib/parallel/pipeline/schedules.js';
import { maxAbsDiff, randomArray } from './helpers.js';

const LAYERS = 5, WIDTH = 6, MICRO = 4, ROWS = 3;
const weightOf = (l: number) => nt.tensor(randomArray(WIDTH * WIDTH, 50 + l).map((v) => v * 0.6), [WIDTH, WIDTH]);
const biasOf = (l: number) => nt.tensor(randomArray(WIDTH, 80 + l), [WIDTH]);
const inputs = randomArray(MICRO * ROWS * WIDTH, 3), targets = randomArray(MICRO * ROWS * WIDTH, 4);
const rowsOf = (a: Float32Array, m: number) => nt.tensor(a.slice(m * ROWS * WIDTH, (m + 1) * ROWS * WIDTH), [ROWS, WIDTH]);

function makeLayers(range: [number, number]) {
  const out: { w: nt.Tensor; b: nt.Tensor }[] = [];
  for (let l = range[0]; l < range[1]; l++) {
    const w = weightOf(l), b = biasOf(l);
    w.requiresGrad = true; b.requiresGrad = true;
    out.push({ w, b });
  }
  return out;
}
const apply = (layers: { w: nt.Tensor; b: nt.Tensor }[], x: nt.Tensor) => layers.reduce((h, { w, b }) => nt.linear(h, w, b).tanh(), x);

/** Single process, whole batch: the reference gradients of every layer. */
function reference() {
  const layers = makeLayers([0, LAYERS]);
  const y = apply(layers, nt.tensor(inputs, [MICRO * ROWS, WIDTH]));
  const loss = nt.sum(nt.mul(y, nt.tensor(targets, [MICRO * ROWS, WIDTH]))).scale(1 / MICRO);
  loss.backward();
  return { loss: loss.item(), grads: layers.map(({ w, b }) => [w.grad!.toArraySync(), b.grad!.toArraySync()]) };
}

describe('pipeline schedules', () => {
  it('partitions layers evenly and refuses more stages than layers', () => {
    expect(partitionLayers(5, 2)).toEqual([[0, 3], [3, 5]]);
    expect(partitionLayers(4, 4)).toEqual([[0, 1], [1, 2], [2, 3], [3, 4]]);
    expect(() => partitionLayers(2, 3)).toThrow(nt.ArgumentError);
    expect(() => partitionLayers(2, 3)).toThrow(/pp must be <= the number of layers/);
  });

  for (const [name, schedule] of [['GPipe', gpipe], ['1F1B', oneForwardOneBackward]] as const) {
    for (const stages of [2, 3]) {
      it(`${name} over ${stages} stages matches the full-batch gradients`, async () => {
        const ref = reference();
        const results = await runLocalRanks(stages, async (g) => {
          const range = partitionLayers(LAYERS, stages)[g.rank]!;
          const layers = makeLayers(range);
          const last = g.rank === stages - 1;
          const losses = await schedule({
            group: g,
            inputShape: () => [ROWS, WIDTH],
            forwardStep: (m, input) => {
              const y = apply(layers, input ?? rowsOf(inputs, m));
              return last ? nt.sum(nt.mul(y, rowsOf(targets, m))).scale(1 / MICRO) : y;
            },
          }, MICRO);
          return { range, losses, grads: layers.map(({ w, b }) => [w.grad!.toArraySync(), b.grad!.toArraySync()]) };
        });
        for (const r of results) {
          r.grads.forEach(([gw, gb], i) => {
            expect(maxAbsDiff(gw!, ref.grads[r.range[0] + i]![0]!)).toBeLessThan(1e-5);
            expect(maxAbsDiff(gb!, ref.grads[r.range[0] + i]![1]!)).toBeLessThan(1e-5);
          });
        }
        const lastLosses = results[stages - 1]!.losses;
        expect(lastLosses.length).toBe(MICRO);
        expect(Math.abs(lastLosses.reduce((a, b) => a + b, 0) - ref.loss)).toBeLessThan(1e-5);
        expect(results[0]!.losses).toEqual([]);
      });
    }
  }

  it('a last stage that returns a non-scalar fails with a StateError', async () => {
    const res = await runLocalRanks(1, async (g) => {
      try {
        await gpipe({ group: g, inputShape: () => [1], forwardStep: () => nt.ones([2]) }, 1);
        return 'no error';
      } catch (e) { return e; }
    });
    expect(res[0]).toBeInstanceOf(nt.StateError);
  });
});

describe('pipeline schedule hooks', () => {
  it('forwardOnly gives the training schedules\' losses and records no gradients', async () => {
    const ref = reference();
    const results = await runLocalRanks(2, async (g) => {
      const layers = makeLayers(partitionLayers(LAYERS, 2)[g.rank]!);
      const losses = await forwardOnly({
        group: g,
        inputShape: () => [ROWS, WIDTH],
        forwardStep: (m, input) => {
          const y = apply(layers, input ?? rowsOf(inputs, m));
          return g.rank === 1 ? nt.sum(nt.mul(y, rowsOf(targets, m))).scale(1 / MICRO) : y;
        },
      }, MICRO);
      return { losses, grads: layers.map(({ w }) => w.grad) };
    });
    expect(Math.abs(results[1]!.losses.reduce((a, b) => a + b, 0) - ref.loss)).toBeLessThan(1e-5);
    for (const r of results) expect(r.grads.every((gr) => gr === null)).toBe(true);
  });

  it('1F1B holds at most (stages - stage index) micro-batches in flight, GPipe all of them', async () => {
    const stages = 3, micro = 6;
    for (const [schedule, bound] of [[oneForwardOneBackward, (r: number) => stages - r], [gpipe, () => micro]] as const) {
      const peaks = await runLocalRanks(stages, async (g) => {
        const layers = makeLayers(partitionLayers(LAYERS, stages)[g.rank]!);
        let inFlight = 0, peak = 0;
        await schedule({
          group: g,
          inputShape: () => [ROWS, WIDTH],
          forwardStep: (m, input) => {
            peak = Math.max(peak, ++inFlight);
            const y = apply(layers, input ?? rowsOf(inputs, m % MICRO));
            return g.rank === stages - 1 ? nt.sum(y) : y;
          },
          runBackward: (_m, _final, run) => { inFlight--; run(); },
        }, micro);
        return peak;
      });
      expect(peaks).toEqual(peaks.map((_, r) => bound(r)));
    }
  });

  it('runBackward sees every micro-batch once and marks only the last backward final; no group means one stage', async () => {
    for (const schedule of [gpipe, oneForwardOneBackward]) {
      const calls: [number, boolean][] = [];
      const layers = makeLayers([0, LAYERS]);
      const losses = await schedule({
        inputShape: () => [ROWS, WIDTH],
        forwardStep: (m) => nt.sum(nt.mul(apply(layers, rowsOf(inputs, m)), rowsOf(targets, m))).scale(1 / MICRO),
        runBackward: (m, final, run) => { calls.push([m, final]); run(); },
      }, MICRO);
      expect(calls.map(([m]) => m).sort()).toEqual([0, 1, 2, 3]);
      expect(calls.filter(([, f]) => f)).toEqual([calls[calls.length - 1]]);
      const ref = reference();
      expect(Math.abs(losses.reduce((a, b) => a + b, 0) - ref.loss)).toBeLessThan(1e-5);
      layers.forEach(({ w }, i) => expect(maxAbsDiff(w.grad!.toArraySync(), ref.grads[i]![0]!)).toBeLessThan(1e-5));
    }
  });
});

describe('GPTStage', () => {
  const config: nt.nn.GPTConfig = { vocabSize: 24, blockSize: 8, nLayer: 3, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
  const idx = nt.tensor(Int32Array.from({ length: 2 * 7 }, (_, i) => (i * 5 + 3) % 24), [2, 7]);
  const tgt = nt.tensor(Int32Array.from({ length: 2 * 7 }, (_, i) => (i * 11 + 1) % 24), [2, 7]);
  const gradsOf = (m: nt.nn.Module) => new Map(m.namedParameters().map(([n, p]) => [n, p.grad!.toArraySync()]));

  it('stages hold exactly the GPT\'s weights and, chained, give its loss and gradients', () => {
    const full = new nt.nn.GPT(config, { seed: 5 });
    const loss = full.forward(idx, tgt).loss!;
    loss.backward();
    const fullParams = new Map(full.namedParameters().map(([n, p]) => [n, p.toArraySync()]));
    const fullGrads = gradsOf(full);
    const stages = [0, 1, 2].map((s) => new nt.parallel.pp.GPTStage(new nt.nn.GPT(config, { seed: 5 }), s, 3));
    expect(stages.map((s) => s.layers)).toEqual([[0, 1], [1, 2], [2, 3]]);
    expect(stages.map((s) => s.namedParameters().map(([n]) => n).filter((n) => !n.startsWith('h.')))).toEqual([['wte.weight', 'wpe.weight'], [], ['wte.weight', 'lnF.weight', 'lnF.bias']]);
    for (const s of stages) for (const [n, p] of s.namedParameters()) expect(maxAbsDiff(p.toArraySync(), fullParams.get(n)!), n).toBe(0);
    // Chain the stages in one process: each stage's input is a fresh leaf, as a received activation is.
    const x0 = stages[0]!.forwardStage(idx, null);
    const in1 = nt.tensor(x0.toArraySync(), x0.shape); in1.requiresGrad = true;
    const x1 = stages[1]!.forwardStage(in1, null);
    const in2 = nt.tensor(x1.toArraySync(), x1.shape); in2.requiresGrad = true;
    expect(stages[1]!.activationShape(2, 7)).toEqual([2, 7, 8]);
    const stageLoss = stages[2]!.forwardStage(in2, tgt);
    expect(Math.abs(stageLoss.item() - loss.item())).toBeLessThan(1e-6);
    stageLoss.backward();
    x1.backward(in2.grad!);
    x0.backward(in1.grad!);
    const wte = stages[0]!.tiedParameters[0]!.grad!.toArraySync().map((v, i) => v + stages[2]!.tiedParameters[0]!.grad!.toArraySync()[i]!);
    expect(maxAbsDiff(wte, fullGrads.get('wte.weight')!)).toBeLessThan(1e-6);
    for (const s of stages) {
      for (const [n, g] of gradsOf(s)) if (n !== 'wte.weight') expect(maxAbsDiff(g, fullGrads.get(n)!), n).toBeLessThan(1e-6);
    }
    expect(stages[2]!.tiedCountedElsewhere).toEqual(stages[2]!.tiedParameters);
    expect(stages[0]!.tiedCountedElsewhere).toEqual([]);
    expect(stages[1]!.tiedParameters).toEqual([]);
    stages[1]!.eval();
    expect(stages[1]!.training).toBe(false);
    expect(() => stages[2]!.forwardStage(in2, null)).toThrow(nt.ArgumentError);
    for (const s of stages) s.dispose();
    full.dispose();
  });

  it('one stage is the whole model; a stage outside the pipeline is an ArgumentError', () => {
    const gpt = new nt.nn.GPT(config, { seed: 5 });
    const names = gpt.namedParameters().map(([n]) => n);
    const whole = new nt.parallel.pp.GPTStage(gpt, 0, 1);
    expect(whole.namedParameters().map(([n]) => n)).toEqual(names);
    expect(whole.model).toBe(gpt);
    expect(whole.tiedParameters).toEqual([]);
    expect(() => new nt.parallel.pp.GPTStage(new nt.nn.GPT(config), 3, 3)).toThrow(nt.ArgumentError);
    expect(() => new nt.parallel.pp.GPTStage(new nt.nn.GPT(config), 0, 4)).toThrow(/pp must be <= the number of layers/);
    expect(nt.ones([1]).item()).toBe(1);
    whole.dispose();
  });
});

describe('ParallelTrainer setup checks', () => {
  const config: nt.nn.GPTConfig = { vocabSize: 16, blockSize: 4, nLayer: 1, nHead: 1, nEmbd: 4, dropout: 0, bias: true };
  const createOptimizer = (groups: nt.parallel.zero.ZeroParamGroup<nt.optim.AdamWOptions>[]) => new nt.optim.AdamW(groups, { lr: 1e-3 });
  it('a parameter outside the optimizer, a foreign one, or ZeRO without data parallelism is an ArgumentError', async () => {
    const stage = new nt.parallel.pp.GPTStage(new nt.nn.GPT(config), 0, 1);
    const ps = stage.parameters();
    await expect(nt.parallel.ParallelTrainer.create(stage, [{ params: ps.slice(1) }], { mesh: null, createOptimizer }))
      .rejects.toThrow(/wte\.weight are in no parameter group/);
    using foreign = nt.zeros([2]);
    await expect(nt.parallel.ParallelTrainer.create(stage, [{ params: [...ps, foreign] }], { mesh: null, createOptimizer }))
      .rejects.toThrow(/not one of the model's parameters/);
    await expect(nt.parallel.ParallelTrainer.create(stage, [{ params: ps }], { mesh: null, zero: 1, createOptimizer }))
      .rejects.toThrow(nt.ArgumentError);
    const trainer = await nt.parallel.ParallelTrainer.create(stage, [{ params: ps }], { mesh: null, microBatches: 2, createOptimizer });
    using x = nt.tensor(new Int32Array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]), [3, 4]);
    await expect(trainer.step(x, x)).rejects.toThrow(/divisible by the 2 micro-batches/);
    const { loss } = await trainer.step(nt.slice(x, 0, 0, 2), nt.slice(x, 0, 0, 2));
    expect(Math.abs(loss - Math.log(16))).toBeLessThan(0.5);
    trainer.dispose();
    stage.dispose();
  });
});
