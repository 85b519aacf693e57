// Normalization over the last dimension with autograd: layerNorm (PyTorch's LayerNorm) and rmsNorm.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape, sameShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { autocastRun } from './autocast.js';
import { checkFloats, code, emptyLike } from './common.js';

function checkNorm(call: string, x: Tensor, weight: Tensor, bias: Tensor | null | undefined, eps: number): number {
  checkFloats(call, { x, weight }, { bias });
  if (x.ndim === 0) throw new ShapeError(`${call}: input must have at least one dimension`);
  const cols = x.shape[x.ndim - 1]!;
  if (weight.ndim !== 1 || weight.shape[0] !== cols) throw new ShapeError(`${call}: weight must be [${cols}] for input ${fmtShape(x.shape)}, got ${fmtShape(weight.shape)}`);
  if (bias && (bias.ndim !== 1 || bias.shape[0] !== cols)) throw new ShapeError(`${call}: bias must be [${cols}], got ${fmtShape(bias.shape)}`);
  if (typeof eps !== 'number' || !(eps >= 0)) throw new ArgumentError(`${call}: eps must be a non-negative number, got ${eps}`);
  return cols;
}

/** (x − mean)/√(var + eps)·weight + bias over the last dimension (biased variance, as PyTorch). */
export function layerNorm(x: Tensor, weight: Tensor, bias?: Tensor | null, eps = 1e-5): Tensor {
  const cast = autocastRun('layerNorm', [x, weight, bias] as const, (x2, w2, b2) => layerNorm(x2, w2, b2, eps));
  if (cast) return cast;
  const cols = checkNorm('layerNorm', x, weight, bias, eps);
  const rows = cols === 0 ? 0 : x.size / cols;
  const out = emptyLike(x);
  const mean = emptyLike(x, [rows], 'f32'), rstd = emptyLike(x, [rows], 'f32');
  x.backend.layernorm_forward(x.storage, weight.storage, bias ? bias.storage : null, out.storage, mean.storage, rstd.storage, rows, cols, eps, code(x));
  if (!needsGrad(x, weight, bias)) { mean.dispose(); rstd.dispose(); return out; }
  const xs = save(x), ws = save(weight);
  return record('layerNorm', out, bias ? [x, weight, bias] : [x, weight], (g) => {
    const dx = emptyLike(g), dw = emptyLike(ws), db = bias ? emptyLike(ws) : null;
    g.backend.layernorm_backward(xs.storage, ws.storage, mean.storage, rstd.storage, g.storage, dx.storage, dw.storage, db ? db.storage : null, rows, cols, code(g));
    return [dx, dw, db];
  }, [xs, ws, own(mean), own(rstd)]);
}

/** What {@link addLayerNorm} returns. */
export interface AddLayerNormResult {
  /** x + residual (the residual stream after the add). */
  sum: Tensor;
  /** layerNorm(sum, weight, bias, eps). */
  out: Tensor;
}

/**
 * The pre-LayerNorm block's residual add and the next norm in one pass over the rows:
 * `sum = x + residual`, `out = layerNorm(sum, weight, bias, eps)` (x and residual of one shape).
 * Gradients flow as through the two ops (the norm's backward reads the stored sum).
 */
export function addLayerNorm(x: Tensor, residual: Tensor, weight: Tensor, bias?: Tensor | null, eps = 1e-5): AddLayerNormResult {
  // Under autocast the sum and the norm run in f32 (the norm is an f32 op; the residual stream stays f32).
  const cast = autocastRun('layerNorm', [x, residual, weight, bias] as const, (x2, r2, w2, b2) => addLayerNorm(x2, r2, w2, b2, eps));
  if (cast) return cast;
  const cols = checkNorm('addLayerNorm', x, weight, bias, eps);
  checkFloats('addLayerNorm', { x, residual });
  if (!sameShape(x.shape, residual.shape)) throw new ShapeError(`addLayerNorm: x ${fmtShape(x.shape)} and residual ${fmtShape(residual.shape)} must have one shape`);
  const rows = cols === 0 ? 0 : x.size / cols;
  const sum = emptyLike(x), out = emptyLike(x);
  const mean = emptyLike(x, [rows], 'f32'), rstd = emptyLike(x, [rows], 'f32');
  x.backend.add_layernorm_forward(x.storage, residual.storage, weight.storage, bias ? bias.storage : null, sum.storage, out.storage,
    mean.storage, rstd.storage, rows, cols, eps, code(x));
  if (!needsGrad(x, residual, weight, bias)) { mean.dispose(); rstd.dispose(); return { sum, out }; }
  const needX = x.requiresGrad || x.gradFn !== null, needR = residual.requiresGrad || residual.gradFn !== null;
  // The sum's node passes its gradient to both addends (the same tensor, as add's backward does).
  record('add', sum, [x, residual], (g) => [needX ? g : null, needR ? g : null]);
  const ss = save(sum), ws = save(weight);
  record('layerNorm', out, bias ? [sum, weight, bias] : [sum, weight], (g) => {
    const dx = emptyLike(g), dw = emptyLike(ws), db = bias ? emptyLike(ws) : null;
    g.backend.layernorm_backward(ss.storage, ws.storage, mean.storage, rstd.storage, g.storage, dx.storage, dw.storage, db ? db.storage : null, rows, cols, code(g));
    return [dx, dw, db];
  }, [ss, ws, own(mean), own(rstd)]);
  return { sum, out };
}

/** x/√(mean(x²) + eps)·weight over the last dimension. */
export function rmsNorm(x: Tensor, weight: Tensor, eps = 1e-6): Tensor {
  const cast = autocastRun('rmsNorm', [x, weight] as const, (x2, w2) => rmsNorm(x2, w2, eps));
  if (cast) return cast;
  const cols = checkNorm('rmsNorm', x, weight, null, eps);
  const rows = cols === 0 ? 0 : x.size / cols;
  const out = emptyLike(x);
  const rstd = emptyLike(x, [rows], 'f32');
  x.backend.rmsnorm_forward(x.storage, weight.storage, out.storage, rstd.storage, rows, cols, eps, code(x));
  if (!needsGrad(x, weight)) { rstd.dispose(); return out; }
  const xs = save(x), ws = save(weight);
  return record('rmsNorm', out, [x, weight], (g) => {
    const dx = emptyLike(g), dw = emptyLike(ws);
    g.backend.rmsnorm_backward(xs.storage, ws.storage, rstd.storage, g.storage, dx.storage, dw.storage, rows, cols, code(g));
    return [dx, dw];
  }, [xs, ws, own(rstd)]);
}
