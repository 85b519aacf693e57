// Fused cross-entropy with autograd: the forward keeps one logsumexp per row, the backward
// recomputes softmax row by row directly into the logits' gradient. Also the argument checks every
// cross-entropy shares (the fused heads', the vocabulary-parallel ones'): inputs, options, targets.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { autocastRun } from './autocast.js';
import { checkFloats, checkIndices, code, emptyLike } from './common.js';

/** Options of {@link crossEntropy}. */
export interface CrossEntropyOptions {
  /** Targets equal to this contribute no loss and no gradient (default −100, as PyTorch). */
  ignoreIndex?: number;
  /** 'mean' over non-ignored rows (default) or 'sum'. */
  reduction?: 'mean' | 'sum';
}

/**
 * Checks a loss's inputs, for every cross-entropy (crossEntropy, the fused heads, the
 * vocabulary-parallel ones): `scores` (named `name` in messages) a floating tensor [..., lastDim] and
 * targets i32 of its shape without the last dimension. Returns the size of the last dimension.
 */
export function checkLossInputs(call: string, name: string, lastDim: string, scores: Tensor, targets: Tensor): number {
  checkFloats(call, { [name]: scores });
  checkIndices(call, 'targets', targets);
  if (scores.ndim < 1) throw new ShapeError(`${call}: ${name} must be [..., ${lastDim}], got a scalar`);
  const lead = scores.shape.slice(0, -1);
  if (targets.ndim !== lead.length || targets.shape.some((d, i) => d !== lead[i])) {
    throw new ShapeError(`${call}: targets ${fmtShape(targets.shape)} must match ${name} ${fmtShape(scores.shape)} without its last dimension`);
  }
  return scores.shape[scores.ndim - 1]!;
}

/** Checks a loss's reduction and ignoreIndex; returns them with their defaults ('mean', −100). */
export function checkLossOptions(call: string, opts: CrossEntropyOptions): { reduction: 'mean' | 'sum'; ignoreIndex: number } {
  const reduction = opts.reduction ?? 'mean';
  if (reduction !== 'mean' && reduction !== 'sum') throw new ArgumentError(`${call}: reduction must be 'mean' or 'sum', got ${String(reduction)}`);
  const ignoreIndex = opts.ignoreIndex ?? -100;
  if (!Number.isInteger(ignoreIndex)) throw new ArgumentError(`${call}: ignoreIndex must be an integer, got ${String(ignoreIndex)}`);
  return { reduction, ignoreIndex };
}

/**
 * The rows whose loss counts (target not ignoreIndex); an ArgumentError naming the first target
 * outside the vocabulary [0, vocab) that is not ignoreIndex.
 */
export function countTargets(call: string, targets: ArrayLike<number>, ignoreIndex: number, vocab: number): number {
  let counted = 0;
  for (let i = 0; i < targets.length; i++) {
    const id = targets[i]!;
    if (id === ignoreIndex) continue;
    if (id < 0 || id >= vocab) throw new ArgumentError(`${call}: target ${id} at row ${i} is outside the vocabulary [0, ${vocab}) (and is not ignoreIndex ${ignoreIndex})`);
    counted++;
  }
  return counted;
}

/**
 * Cross-entropy of logits [..., V] against i32 targets [...]: −log softmax(logits)[target],
 * reduced to a scalar. Never materializes the probability matrix apart from the gradient itself.
 */
export function crossEntropy(logits: Tensor, targets: Tensor, opts: CrossEntropyOptions = {}): Tensor {
  const cast = autocastRun('crossEntropy', [logits] as const, (l2) => crossEntropy(l2, targets, opts));
  if (cast) return cast;
  const V = checkLossInputs('crossEntropy', 'logits', 'V', logits, targets);
  const { reduction, ignoreIndex } = checkLossOptions('crossEntropy', opts);
  const N = targets.size;
  const losses = emptyLike(logits, [N], 'f32'), lse = emptyLike(logits, [N], 'f32');
  logits.backend.cross_entropy_forward(logits.storage, targets.storage, losses.storage, lse.storage, N, V, ignoreIndex, code(logits));
  const perRow = losses.toArraySync();
  const t = targets.toArraySync();
  let total = 0, count = 0;
  for (let i = 0; i < N; i++) { total += perRow[i]!; if (t[i] !== ignoreIndex) count++; }
  losses.dispose();
  const value = reduction === 'sum' ? total : total / count;
  const out = emptyLike(logits, []);
  out.backend.fill(out.storage, code(out), 1, value);
  if (!needsGrad(logits)) { lse.dispose(); return out; }
  const scale = reduction === 'sum' ? 1 : count > 0 ? 1 / count : 0;
  const ls = save(logits), ts = save(targets);
  return record('crossEntropy', out, [logits, targets], (g) => {
    const gl = emptyLike(ls);
    g.backend.cross_entropy_backward(ls.storage, ts.storage, lse.storage, g.storage, gl.storage, N, V, ignoreIndex, scale, code(g));
    return [gl, null];
  }, [ls, ts, own(lse)]);
}
