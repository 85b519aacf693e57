// Gradient clipping by the global L2 norm: over the parameters of one process (clipGradNorm), and
// the one norm of a gradient split over ranks (globalGradNorm), which the tensor-parallel GPT, ZeRO
// and ParallelTrainer all take.
import { dtypeCode } from '../dtype.js';
import { BINARY } from '../kernel-codes.js';
import { noGrad } from '../autograd/grad-mode.js';
import { scope } from '../memory.js';
import { add, binaryRaw, div, mul, sqrt } from '../ops/elementwise.js';
import { sum } from '../ops/reduce.js';
import { emptyOn } from '../tensor.js';
import { ArgumentError, StateError } from '../errors.js';
import { checkTensorList, type Tensor } from '../tensor.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { reduceTotals } from '../distributed/totals.js';

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

/** One part of a gradient split over ranks: this rank's sum of squares of it, and the groups over which such sums add. */
export interface GradNormPart {
  /** This rank's sum of squared gradient elements of the part (gradSumSquares, a ZeRO shard's). */
  sumSquares: number;
  /**
   * The groups whose members hold the part's other pieces, summed over in turn (a ZeRO shard's
   * data-parallel group; the experts' expert-parallel group). Absent or empty: this rank holds the whole part.
   */
  groups?: readonly CollectiveGroup[];
}

/**
 * The L2 norm of a gradient split over ranks, the same on every rank: each part's sum of squares
 * summed over its own groups, the parts added, the total summed over `groups` (those holding the
 * model's other slices and stages: tensor- and pipeline-parallel). Sums cross ranks in f32 on each
 * group's agreement device (their relative rounding, 1e-7, is far below what clipping needs); a
 * sum that crosses no group of more than one rank stays a float64.
 */
export async function globalGradNorm(parts: readonly GradNormPart[], groups: readonly CollectiveGroup[] = []): Promise<number> {
  let total = 0;
  for (const p of parts) total += p.groups && p.groups.length > 0 ? (await reduceTotals([p.sumSquares], p.groups.map((group) => ({ group }))))[0]! : p.sumSquares;
  if (groups.length > 0) total = (await reduceTotals([total], groups.map((group) => ({ group }))))[0]!;
  return Math.sqrt(total);
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

/** Multiplies each gradient in place by the one-element `factor` (broadcast), on the gradients' device. */
function scaleGradsBy(grads: readonly Tensor[], factor: Tensor): void {
  const byDtype = new Map<string, Tensor>();
  for (const g of grads) {
    let f = byDtype.get(g.dtype);
    if (!f) { f = g.dtype === factor.dtype ? factor : factor.to(g.dtype); byDtype.set(g.dtype, f); }
    // In place: out aliases the gradient (an elementwise kernel), the factor read with stride 0.
    g.backend.binary(BINARY.mul, g.storage, f.storage, g.storage, dtypeCode(g.dtype), new Int32Array([g.size]), new Int32Array([1]), new Int32Array([0]));
  }
}

/**
 * The gradients' global L2 norm as a one-element f32 device tensor, and the gradients scaled in place by
 * min(1, maxNorm / (norm + 1e-6)) (PyTorch's clip_grad_norm_), without a host read. As clipGradNorm:
 * a NaN norm leaves the gradients as they are (fmin returns the other operand); an infinite one gives
 * the factor 0 (finite gradients become 0, infinite ones NaN), for the caller's overflow handling.
 */
export function clipGradNormOnDevice(params: readonly Tensor[], maxNorm: number): Tensor {
  if (typeof maxNorm !== 'number' || !(maxNorm > 0) || maxNorm === Infinity) throw new ArgumentError(`clipGradNormOnDevice: maxNorm must be a finite number > 0, got ${String(maxNorm)}`);
  const grads = params.map((p) => p.grad).filter((g): g is Tensor => g !== null && !g.disposed);
  if (grads.length === 0) throw new StateError('clipGradNormOnDevice: no parameter has a gradient');
  // The temporaries go with the scope; the norm (returned) moves to the caller's.
  return scope(() => noGrad(() => {
    let total: Tensor | null = null;
    for (const g of grads) {
      const g32 = g.dtype === 'f32' ? g : g.to('f32');
      const s = sum(mul(g32, g32));
      total = total === null ? s : add(total, s);
    }
    const norm = sqrt(total!);
    const ratio = div(maxNorm, add(norm, 1e-6));
    const one = emptyOn(ratio.shape, 'f32', ratio.deviceInfo);
    one.backend.fill(one.storage, dtypeCode('f32'), one.size, 1);
    scaleGradsBy(grads, binaryRaw(BINARY.min, one, ratio, 'clipGradNormOnDevice'));
    return norm;
  }));
}
