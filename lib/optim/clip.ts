// Gradient clipping by the global L2 norm over a set of parameters.
import { dtypeCode } from '../dtype.js';
import { ArgumentError } from '../errors.js';
import { checkTensorList, type Tensor } from '../tensor.js';

/** The gradients of the parameters that have one, bucketed by device (one native call per device). */
function gradsByDevice(params: Iterable<Tensor>, call: string): Tensor[][] {
  const byDevice = new Map<string, Tensor[]>();
  for (const p of checkTensorList(params, call, 'params')) {
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
  for (const gs of gradsByDevice(params, 'gradSumSquares')) {
    const sums = gs[0]!.backend.sum_squares(gs.map((g) => g.storage), gs.map((g) => g.size), gs.map((g) => dtypeCode(g.dtype))) as Float64Array;
    for (const s of sums) total += s;
  }
  return total;
}

/** Multiplies every gradient by factor in place. */
export function scaleGrads(params: Iterable<Tensor>, factor: number): void {
  if (typeof factor !== 'number' || !Number.isFinite(factor)) throw new ArgumentError(`scaleGrads: factor must be a finite number, got ${String(factor)}`);
  for (const gs of gradsByDevice(params, 'scaleGrads')) {
    gs[0]!.backend.scale_in_place(gs.map((g) => g.storage), gs.map((g) => g.size), gs.map((g) => dtypeCode(g.dtype)), factor);
  }
}

/**
 * Scales all gradients so that their global L2 norm is at most maxNorm (PyTorch's clip_grad_norm_:
 * factor maxNorm / (norm + 1e-6), applied only when below 1). Returns the norm before clipping.
 */
export function clipGradNorm(params: Iterable<Tensor>, maxNorm: number): number {
  if (typeof maxNorm !== 'number' || !(maxNorm > 0) || maxNorm === Infinity) throw new ArgumentError(`clipGradNorm: maxNorm must be a finite number > 0, got ${String(maxNorm)}`);
  const list = checkTensorList(params, 'clipGradNorm', 'params');
  const norm = Math.sqrt(gradSumSquares(list));
  const factor = clipFactor(norm, maxNorm);
  if (factor < 1) scaleGrads(list, factor);
  return norm;
}

/** The factor clipping applies to gradients of global norm `norm` (1 when no clipping is needed). */
export function clipFactor(norm: number, maxNorm: number): number {
  // A NaN or infinite norm (overflowed gradients) passes through: the caller's overflow handling sees it.
  if (typeof norm !== 'number' || norm < 0) throw new ArgumentError(`clipFactor: norm must be a number >= 0, got ${String(norm)}`);
  if (typeof maxNorm !== 'number' || !(maxNorm > 0)) throw new ArgumentError(`clipFactor: maxNorm must be a finite number > 0, got ${String(maxNorm)}`);
  return Math.min(1, maxNorm / (norm + 1e-6));
}
