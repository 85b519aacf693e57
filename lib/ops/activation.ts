// Activations and their gradients: gelu (tanh form), silu and the fused swiglu (Llama's MLP), softmax
// and log-softmax over a dimension, and dropout seeded from the Philox generator.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { checkGenerator, defaultGenerator, DRAW, Generator } from '../random.js';
import { fmtShape, normDim, sameShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { BINARY, UNARY } from '../kernel-codes.js';
import { autocastRun, promoteTypes, runCast } from './autocast.js';
import { checkFloats, checkOptions, code, emptyLike } from './common.js';
import { binaryRaw } from './elementwise.js';
import { transpose } from './shape.js';

/** GELU with the tanh approximation (GPT-2's): 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))). */
export function gelu(x: Tensor): Tensor {
  checkFloats('gelu', { x });
  const out = emptyLike(x);
  x.backend.gelu_forward(x.storage, out.storage, x.size, code(x));
  if (!needsGrad(x)) return out;
  const xs = save(x);
  return record('gelu', out, [x], (g) => {
    const gi = emptyLike(g);
    g.backend.gelu_backward(xs.storage, g.storage, gi.storage, g.size, code(g));
    return [gi];
  }, [xs]);
}

/** SiLU (swish): x·σ(x). Computed in f32 inside the kernel and rounded once for bf16/f16 inputs. */
export function silu(x: Tensor): Tensor {
  checkFloats('silu', { x });
  const out = emptyLike(x);
  x.backend.swiglu_forward(x.storage, null, out.storage, x.size, code(x));
  if (!needsGrad(x)) return out;
  const xs = save(x);
  return record('silu', out, [x], (g) => {
    const gi = emptyLike(g);
    g.backend.swiglu_backward(xs.storage, null, g.storage, gi.storage, null, g.size, code(g));
    return [gi];
  }, [xs]);
}

/**
 * SwiGLU's gating, fused: silu(gate)·up for gate and up of one shape (Llama's MLP:
 * down(swiglu(gate(x), up(x)))). One pass forward, one backward for both gradients; nothing but the
 * two inputs is saved. Inputs of two floating dtypes (under autocast) compute in the wider one.
 */
export function swiglu(gate: Tensor, up: Tensor): Tensor {
  checkFloats('swiglu', { gate }); checkFloats('swiglu', { up });
  if (gate.dtype !== up.dtype) {
    const dt = promoteTypes(gate.dtype, up.dtype);
    return runCast(dt, [gate, up] as const, (g2, u2) => swiglu(g2, u2));
  }
  checkFloats('swiglu', { gate, up });
  if (!sameShape(gate.shape, up.shape)) throw new ShapeError(`swiglu: gate ${fmtShape(gate.shape)} and up ${fmtShape(up.shape)} must have one shape`);
  const out = emptyLike(gate);
  gate.backend.swiglu_forward(gate.storage, up.storage, out.storage, gate.size, code(gate));
  if (!needsGrad(gate, up)) return out;
  const gs = save(gate), us = save(up);
  return record('swiglu', out, [gate, up], (g) => {
    const dg = emptyLike(g), du = emptyLike(g);
    g.backend.swiglu_backward(gs.storage, us.storage, g.storage, dg.storage, du.storage, g.size, code(g));
    return [dg, du];
  }, [gs, us]);
}

function softmaxLike(call: string, x: Tensor, dim: number, log: boolean): Tensor {
  const cast = autocastRun(call, [x] as const, (x2) => softmaxLike(call, x2, dim, log));
  if (cast) return cast;
  checkFloats(call, { x });
  const d = normDim(dim, x.ndim, call);
  if (x.ndim > 0 && d !== x.ndim - 1) {
    // Kernels work on the last dimension; move `dim` there and back (autograd follows).
    const moved = transpose(x, d, -1);
    const y = softmaxLike(call, moved, -1, log);
    const out = transpose(y, d, -1);
    moved.dispose();
    y.dispose();
    return out;
  }
  const cols = x.ndim === 0 ? 1 : x.shape[x.ndim - 1]!;
  const rows = cols === 0 ? 0 : x.size / cols;
  const out = emptyLike(x);
  x.backend.softmax_forward(x.storage, out.storage, rows, cols, code(x), log);
  if (!needsGrad(x)) return out;
  const ys = save(out);
  return record(call, out, [x], (g) => {
    const gi = emptyLike(g);
    g.backend.softmax_backward(ys.storage, g.storage, gi.storage, rows, cols, code(g), log);
    return [gi];
  }, [ys]);
}

/** Softmax over `dim` (default: the last). */
export function softmax(x: Tensor, dim = -1): Tensor { return softmaxLike('softmax', x, dim, false); }
/** Log-softmax over `dim` (default: the last). */
export function logSoftmax(x: Tensor, dim = -1): Tensor { return softmaxLike('logSoftmax', x, dim, true); }

/** Options of {@link dropout}. */
export interface DropoutOptions {
  /** Drop only while training (default true); in eval mode dropout is the identity. */
  training?: boolean;
  /** Generator to draw the mask from (default: the global one, see manualSeed). */
  generator?: Generator;
  /** Seed a fresh generator instead. */
  seed?: number | bigint;
  /**
   * x is the entries [start, start + x.shape[dim]) along `dim` of a tensor whose `dim` has `extent`
   * entries: the mask is that part of the whole tensor's mask, and the generator advances as for
   * the whole tensor. This is how a process holding a chunk of the sequence (sequence parallelism)
   * drops exactly what one process holding all of it would.
   */
  part?: { dim: number; start: number; extent: number };
}

/** Fills mask with the Bernoulli(keepProb) draw at `base`, or with opts.part's entries of the whole tensor's draw. */
function fillMask(mask: Tensor, keepProb: number, gen: Generator, part: DropoutOptions['part']): void {
  const [hi, lo] = gen.seedHalves();
  const draw = DRAW.bernoulli;
  if (part === undefined) {
    const base = gen.reserve(mask.size, draw.perBlock);
    mask.backend.random_fill(mask.storage, code(mask), mask.size, draw.kind, hi, lo, base, 0, keepProb, 0);
    return;
  }
  const { dim, start, extent } = part;
  if (!Number.isInteger(dim) || dim < 0 || dim >= mask.ndim) throw new ArgumentError(`dropout: part.dim ${dim} is not a dimension of ${mask.describe()}`);
  const held = mask.shape[dim]!;
  if (!Number.isInteger(start) || !Number.isInteger(extent) || start < 0 || start + held > extent) {
    throw new ArgumentError(`dropout: entries [${start}, ${start + held}) of dimension ${dim} do not lie inside its extent ${extent}`);
  }
  const outer = mask.shape.slice(0, dim).reduce((a, b) => a * b, 1), inner = mask.shape.slice(dim + 1).reduce((a, b) => a * b, 1);
  const run = held * inner;
  const base = gen.reserve(outer * extent * inner, draw.perBlock);
  if (run === 0) return;
  // One contiguous run of the whole tensor's draw per outer index.
  const row = emptyLike(mask, [run]);
  try {
    for (let o = 0; o < outer; o++) {
      row.backend.random_fill(row.storage, code(row), run, draw.kind, hi, lo, base, (o * extent + start) * inner, keepProb, 0);
      row.backend.copy_strided(row.storage, mask.storage, code(mask), new Int32Array([run]), new Int32Array([1]), 0, new Int32Array([1]), o * run);
    }
  } finally {
    row.dispose();
  }
}

/**
 * Zeroes each element with probability p and scales the rest by 1/(1−p). The mask is a Philox
 * draw, so the same generator state gives the same mask on every backend. Identity when not
 * training or p = 0 (returns x itself).
 */
export function dropout(x: Tensor, p: number, opts: DropoutOptions = {}): Tensor {
  checkFloats('dropout', { x });
  // p = 1 would scale the (all-zero) result by 1/0.
  if (typeof p !== 'number' || !(p >= 0 && p < 1)) throw new ArgumentError(`dropout: p must be a number in [0, 1), got ${typeof p === 'number' ? p : typeof p}`);
  checkOptions('dropout', opts, { training: 'boolean', generator: 'any', seed: 'any', part: 'any' });
  const gen = opts.generator !== undefined ? checkGenerator(opts.generator, 'dropout') : opts.seed !== undefined ? new Generator(opts.seed) : defaultGenerator;
  if (opts.training === false || p === 0) return x;
  const keepProb = 1 - p;
  const mask = emptyLike(x);
  try {
    fillMask(mask, keepProb, gen, opts.part);
  } catch (e) {
    mask.dispose();
    throw e;
  }
  const factor = keepProb === 0 ? 0 : 1 / keepProb;
  const out = binaryRaw(BINARY.mul, x, mask, 'dropout');
  out.backend.unary(UNARY.scale, out.storage, out.storage, out.size, code(out), factor);
  if (!needsGrad(x)) { mask.dispose(); return out; }
  return record('dropout', out, [x], (g) => {
    const gi = binaryRaw(BINARY.mul, g, mask, 'dropout');
    gi.backend.unary(UNARY.scale, gi.storage, gi.storage, gi.size, code(gi), factor);
    return [gi];
  }, [own(mask)]);
}
