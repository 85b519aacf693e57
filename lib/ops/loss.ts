// Fused cross-entropy with autograd: the forward keeps one logsumexp per row, the backward
// recomputes softmax row by row directly into the logits' gradient.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { checkFloats, checkIndices, code, emptyLike } from './common.js';

/** Options of {@link crossEntropy}. */
export interface CrossEntropyOptions {
  /** Targets equal to this contribute no loss and no gradient (default −100, as PyTorch). */
  ignoreIndex?: number;
  /** 'mean' over non-ignored rows (default) or 'sum'. */
  reduction?: 'mean' | 'sum';
}

/**
 * Cross-entropy of logits [..., V] against i32 targets [...]: −log softmax(logits)[target],
 * reduced to a scalar. Never materializes the probability matrix apart from the gradient itself.
 */
export function crossEntropy(logits: Tensor, targets: Tensor, opts: CrossEntropyOptions = {}): Tensor {
  checkFloats('crossEntropy', { logits });
  checkIndices('crossEntropy', 'targets', targets);
  if (logits.ndim < 1) throw new ShapeError('crossEntropy: logits must have a vocabulary dimension');
  const V = logits.shape[logits.ndim - 1]!;
  const lead = logits.shape.slice(0, -1);
  if (targets.ndim !== lead.length || targets.shape.some((d, i) => d !== lead[i])) {
    throw new ShapeError(`crossEntropy: targets ${fmtShape(targets.shape)} must match logits ${fmtShape(logits.shape)} without its last dimension`);
  }
  const reduction = opts.reduction ?? 'mean';
  if (reduction !== 'mean' && reduction !== 'sum') throw new ArgumentError(`crossEntropy: reduction must be 'mean' or 'sum', got ${String(reduction)}`);
  const ignoreIndex = opts.ignoreIndex ?? -100;
  if (!Number.isInteger(ignoreIndex)) throw new ArgumentError(`crossEntropy: ignoreIndex must be an integer`);
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
