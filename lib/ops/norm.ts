// Normalization over the last dimension with autograd: layerNorm (PyTorch's LayerNorm) and rmsNorm.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
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

/** x/√(mean(x²) + eps)·weight over the last dimension. */
export function rmsNorm(x: Tensor, weight: Tensor, eps = 1e-6): Tensor {
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
