// Pipeline schedules on simulated stages: GPipe and 1F1B give every stage's parameters the
// gradients of the single-process full batch, and the same losses; layer partitioning and errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/parallel/local-group.js';
import { gpipe, oneForwardOneBackward, partitionLayers } from '../../lib/parallel/pipeline/schedules.js';
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
