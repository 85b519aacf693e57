// In-place initializers drawing from a seeded Philox generator (the same stream on cpu and cuda).
import { dtypeCode } from '../dtype.js';
import { DRAW, defaultGenerator, type Generator } from '../random.js';
import type { Tensor } from '../tensor.js';

function draw(t: Tensor, kind: 'uniform' | 'normal', a: number, b: number, gen: Generator): void {
  const d = DRAW[kind];
  const base = gen.reserve(t.size, d.perBlock);
  const [hi, lo] = gen.seedHalves();
  t.backend.random_fill(t.storage, dtypeCode(t.dtype), t.size, d.kind, hi, lo, base, 0, a, b);
}

/** Fills with U[low, high). */
export function uniform(t: Tensor, low: number, high: number, gen: Generator = defaultGenerator): Tensor {
  draw(t, 'uniform', low, high, gen);
  return t;
}

/** Fills with N(mean, std²). */
export function normal(t: Tensor, mean: number, std: number, gen: Generator = defaultGenerator): Tensor {
  draw(t, 'normal', mean, std, gen);
  return t;
}

/** Fills with a constant. */
export function constant(t: Tensor, value: number): Tensor {
  t.backend.fill(t.storage, dtypeCode(t.dtype), t.size, value);
  return t;
}
