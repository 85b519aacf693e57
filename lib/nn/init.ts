// In-place initializers drawing from a seeded Philox generator (the same stream on cpu and cuda).
import { dtypeCode, isFloating } from '../dtype.js';
import { ArgumentError, DTypeError } from '../errors.js';
import { checkGenerator, DRAW, defaultGenerator, type Generator } from '../random.js';
import { checkTensor, type Tensor } from '../tensor.js';

function draw(t: Tensor, kind: 'uniform' | 'normal', a: number, b: number, gen: Generator): void {
  const call = `init.${kind}`;
  checkTensor(t, call, 'tensor');
  checkGenerator(gen, call);
  if (!isFloating(t.dtype)) throw new DTypeError(`${call}: random values are floating point (f32, bf16, f16), not ${t.dtype}`);
  if (typeof a !== 'number' || typeof b !== 'number' || !Number.isFinite(a) || !Number.isFinite(b)) throw new ArgumentError(`${call}: ${kind === 'normal' ? 'mean and std' : 'low and high'} must be finite numbers, got ${String(a)} and ${String(b)}`);
  if (kind === 'normal' && b < 0) throw new ArgumentError(`init.normal: std must be >= 0, got ${b}`);
  if (kind === 'uniform' && a > b) throw new ArgumentError(`init.uniform: low (${a}) must not exceed high (${b})`);
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
