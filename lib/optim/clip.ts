// Gradient clipping by the global L2 norm over a set of parameters.
import { dtypeCode } from '../dtype.js';
import { ArgumentError } from '../errors.js';
import type { Tensor } from '../tensor.js';

/** The gradients of the parameters that have one, bucketed by device (one native call per device). */
function gradsByDevice(params: Iterable<Tensor>): Tensor[][] {
  const byDevice = new Map<string, Tensor[]>();
  for (const p of params) {
    const g = p.grad;
    if (!g) continue;
    const list = byDevice.get(g.device);
    if (list) list.push(g); else byDevice.set(g.device, [g]);
  }
  return [...byDevice.values()];
}

/** The sum of squares of all gradients (a distributed caller allreduces this before the square root). */
export function gradSumSquares(params: Iterable<Tensor>): number {
  let total = 0;
  for (const gs of gradsByDevice(params)) {
    const sums = gs[0]!.backend.sum_squares(gs.map((g) => g.storage), gs.map((g) => g.size), gs.map((g) => dtypeCode(g.dtype))) as Float64Array;
    for (const s of sums) total += s;
  }
  return total;
}

/** Multiplies every gradient by factor in place. */
export function scaleGrads(params: Iterable<Tensor>, factor: number): void {
  for (const gs of gradsByDevice(params)) {
    gs[0]!.backend.scale_in_place(gs.map((g) => g.storage), gs.map((g) => g.size), gs.map((g) => dtypeCode(g.dtype)), factor);
  }
}

/**
 * Scales all gradients so that their global L2 norm is at most maxNorm (PyTorch's clip_grad_norm_:
 * factor maxNorm / (norm + 1e-6), applied only when below 1). Returns the norm before clipping.
 */
export function clipGradNorm(params: Iterable<Tensor>, maxNorm: number): number {
  if (typeof maxNorm !== 'number' || !(maxNorm > 0)) throw new ArgumentError(`clipGradNorm: maxNorm must be a number > 0, got ${maxNorm}`);
  const list = [...params];
  const norm = Math.sqrt(gradSumSquares(list));
  const factor = clipFactor(norm, maxNorm);
  if (factor < 1) scaleGrads(list, factor);
  return norm;
}

/** The factor clipping applies to gradients of global norm `norm` (1 when no clipping is needed). */
export function clipFactor(norm: number, maxNorm: number): number {
  return Math.min(1, maxNorm / (norm + 1e-6));
}
