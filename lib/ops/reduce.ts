// Reductions with autograd: sum, mean (over everything or one dimension, keepdim) and max over a
// dimension (or everything), whose gradient goes to the first maximal element.
import { alias, needsGrad, own, record } from '../autograd/engine.js';
import { normDim } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { UNARY } from '../kernel-codes.js';
import { autocastRun } from './autocast.js';
import { checkDimArg, checkFloats, checkOptions, code, dimsProduct, emptyLike } from './common.js';
import { sumTo, unaryRaw } from './elementwise.js';

/** Options of {@link sum}, {@link mean} and {@link max}. */
export interface ReduceOptions {
  /** Keep the reduced dimension with size 1. */
  keepdim?: boolean;
}

function reducedShapes(x: Tensor, dim: number | undefined, keepdim: boolean, call: string): { keep: number[]; out: number[] } {
  if (dim === undefined) {
    const keep = x.shape.map(() => 1);
    return { keep, out: keepdim ? keep : [] };
  }
  const d = normDim(dim, x.ndim, call);
  const keep = x.shape.map((s, i) => (i === d ? 1 : s));
  return { keep, out: keepdim ? keep : x.shape.filter((_, i) => i !== d) };
}

/** Broadcasts g (shaped like the reduced tensor) back to `shape`, times `factor`. */
function expandGrad(g: Tensor, keepShape: number[], shape: readonly number[], factor: number): Tensor {
  const src = alias(g, keepShape);
  const out = emptyLike(g, shape);
  const strides = new Int32Array(shape.length);
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) { strides[i] = keepShape[i] === 1 ? 0 : acc; acc *= keepShape[i]!; }
  g.backend.copy_strided(src.storage, out.storage, code(g), new Int32Array(shape), strides, 0,
    contiguous(shape), 0);
  src.dispose();
  if (factor !== 1) out.backend.unary(UNARY.scale, out.storage, out.storage, out.size, code(out), factor);
  return out;
}

function contiguous(shape: readonly number[]): Int32Array {
  const s = new Int32Array(shape.length);
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]!; }
  return s;
}

function sumLike(call: string, x: Tensor, dim: number | undefined, opts: ReduceOptions, mean: boolean): Tensor {
  const cast = autocastRun(call, [x] as const, (x2) => sumLike(call, x2, dim, opts, mean));
  if (cast) return cast;
  checkFloats(call, { x });
  checkDimArg(call, dim);
  checkOptions(call, opts, { keepdim: 'boolean' });
  const { keep, out: outShape } = reducedShapes(x, dim, !!opts.keepdim, call);
  const count = x.size / Math.max(dimsProduct(keep), 1);
  // An f16 mean sums in f32 and rounds once at the end, as PyTorch does: the f16 sum itself would
  // overflow past 65504 (the mean of a million ones would be Infinity). bf16 shares f32's range.
  const widen = mean && x.dtype === 'f16';
  const src = widen ? x.to('f32') : x;
  const summed = sumTo(src, keep);
  let out = summed === x ? x.clone() : summed;
  if (src !== x && summed !== src) src.dispose();
  if (mean) {
    const scaled = unaryRaw('scale', out, 1 / count);
    out.dispose();
    out = scaled;
  }
  if (widen) {
    const narrowed = out.to('f16');
    out.dispose();
    out = narrowed;
  }
  const shaped = alias(out, outShape);
  out.dispose();
  if (!needsGrad(x)) return shaped;
  const xShape = x.shape;
  return record(call, shaped, [x], (g) => [expandGrad(g, keep, xShape, mean ? 1 / count : 1)]);
}

/** Sum of all elements, or over `dim`. */
export function sum(x: Tensor, dim?: number, opts: ReduceOptions = {}): Tensor { return sumLike('sum', x, dim, opts, false); }
/** Mean of all elements, or over `dim`. */
export function mean(x: Tensor, dim?: number, opts: ReduceOptions = {}): Tensor { return sumLike('mean', x, dim, opts, true); }

/** Maximum of all elements, or over `dim`; the gradient flows to the first maximal element. */
export function max(x: Tensor, dim?: number, opts: ReduceOptions = {}): Tensor {
  checkFloats('max', { x });
  checkDimArg('max', dim);
  checkOptions('max', opts, { keepdim: 'boolean' });
  const d = dim === undefined ? undefined : normDim(dim, x.ndim, 'max');
  const { out: outShape } = reducedShapes(x, d, !!opts.keepdim, 'max');
  const outer = d === undefined ? 1 : dimsProduct(x.shape, 0, d);
  const red = d === undefined ? x.size : x.shape[d]!;
  const inner = d === undefined ? 1 : dimsProduct(x.shape, d + 1);
  const out = emptyLike(x, outShape);
  const arg = emptyLike(x, outShape, 'i32');
  x.backend.max_dim(x.storage, out.storage, arg.storage, outer, red, inner, code(x));
  if (!needsGrad(x)) { arg.dispose(); return out; }
  const xShape = x.shape;
  return record('max', out, [x], (g) => {
    const gi = emptyLike(g, xShape);
    g.backend.max_dim_backward(g.storage, arg.storage, gi.storage, outer, red, inner, code(g));
    return [gi];
  }, [own(arg)]);
}
