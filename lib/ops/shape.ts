// Shape ops with autograd: reshape/view (shared storage), squeeze/unsqueeze, permute/transpose,
// slice, split/chunk and cat (copies through the native strided copy).
import { alias, needsGrad, record } from '../autograd/engine.js';
import { ArgumentError, DTypeError, ShapeError } from '../errors.js';
import { fmtShape, inferShape, normDim } from '../shape.js';
import { checkSameDevice, checkTensor, Tensor } from '../tensor.js';
import { code, contiguousStrides, dimsProduct, emptyLike } from './common.js';

/** Same data in a new shape (one dimension may be -1); shares storage. */
export function reshape(x: Tensor, shape: readonly number[]): Tensor {
  checkTensor(x, 'reshape', 'x');
  const target = inferShape(shape, x.size, x.shape);
  const out = alias(x, target);
  if (!needsGrad(x)) return out;
  const from = x.shape;
  return record('reshape', out, [x], (g) => [alias(g, from)]);
}

/** Alias of reshape (tensors are always contiguous). */
export const view = reshape;

/** Removes size-1 dimensions (all, or only `dim`). */
export function squeeze(x: Tensor, dim?: number): Tensor {
  checkTensor(x, 'squeeze', 'x');
  if (dim === undefined) return reshape(x, x.shape.filter((d) => d !== 1));
  const d = normDim(dim, x.ndim, 'squeeze');
  return x.shape[d] === 1 ? reshape(x, x.shape.filter((_, i) => i !== d)) : reshape(x, x.shape);
}

/** Inserts a size-1 dimension at `dim` (negative counts from the end of the result). */
export function unsqueeze(x: Tensor, dim: number): Tensor {
  checkTensor(x, 'unsqueeze', 'x');
  const d = normDim(dim, x.ndim + 1, 'unsqueeze');
  const s = [...x.shape];
  s.splice(d, 0, 1);
  return reshape(x, s);
}

/** Strided copy: out[idx] = x[offset + Σ idx·srcStrides] over shape, into dst at dstOffset/dstStrides. */
function copyStrided(src: Tensor, dst: Tensor, shape: readonly number[], srcStrides: readonly number[], srcOffset: number,
  dstStrides: readonly number[], dstOffset: number): void {
  src.backend.copy_strided(src.storage, dst.storage, code(src), new Int32Array(shape), new Int32Array(srcStrides), srcOffset,
    new Int32Array(dstStrides), dstOffset);
}

function permuteRaw(x: Tensor, dims: readonly number[]): Tensor {
  const outShape = dims.map((d) => x.shape[d]!);
  const own = contiguousStrides(x.shape);
  const out = emptyLike(x, outShape);
  copyStrided(x, out, outShape, dims.map((d) => own[d]!), 0, contiguousStrides(outShape), 0);
  return out;
}

/** Reorders dimensions: out.shape[i] = x.shape[dims[i]]. Copies. */
export function permute(x: Tensor, dims: readonly number[]): Tensor {
  checkTensor(x, 'permute', 'x');
  if (!Array.isArray(dims) || dims.length !== x.ndim) throw new ShapeError(`permute: need ${x.ndim} dimensions for ${fmtShape(x.shape)}, got ${JSON.stringify(dims)}`);
  const norm = dims.map((d) => normDim(d, x.ndim, 'permute'));
  if (new Set(norm).size !== norm.length) throw new ArgumentError(`permute: repeated dimension in ${JSON.stringify(dims)}`);
  const out = permuteRaw(x, norm);
  if (!needsGrad(x)) return out;
  const inverse = new Array<number>(norm.length);
  norm.forEach((d, i) => { inverse[d] = i; });
  return record('permute', out, [x], (g) => [permuteRaw(g, inverse)]);
}

/** Swaps two dimensions. Copies. */
export function transpose(x: Tensor, dim0: number, dim1: number): Tensor {
  checkTensor(x, 'transpose', 'x');
  const a = normDim(dim0, x.ndim, 'transpose'), b = normDim(dim1, x.ndim, 'transpose');
  const dims = x.shape.map((_, i) => i);
  dims[a] = b;
  dims[b] = a;
  return permute(x, dims);
}

/** Elements start..end (exclusive) along `dim`; negative indices count from the end. Copies. */
export function slice(x: Tensor, dim: number, start: number, end?: number): Tensor {
  checkTensor(x, 'slice', 'x');
  const d = normDim(dim, x.ndim, 'slice');
  const len = x.shape[d]!;
  const clampIndex = (v: number) => Math.min(Math.max(v < 0 ? v + len : v, 0), len);
  if (!Number.isInteger(start) || (end !== undefined && !Number.isInteger(end))) throw new ArgumentError(`slice: start and end must be integers`);
  const s = clampIndex(start), e = Math.max(s, clampIndex(end ?? len));
  const outer = dimsProduct(x.shape, 0, d), inner = dimsProduct(x.shape, d + 1);
  const outShape = x.shape.map((v, i) => (i === d ? e - s : v));
  const out = emptyLike(x, outShape);
  const region = [outer, e - s, inner];
  copyStrided(x, out, region, [len * inner, inner, 1], s * inner, [(e - s) * inner, inner, 1], 0);
  if (!needsGrad(x)) return out;
  const xShape = x.shape;
  return record('slice', out, [x], (g) => {
    const gi = emptyLike(g, xShape);
    g.backend.fill(gi.storage, code(gi), gi.size, 0);
    copyStrided(g, gi, region, [(e - s) * inner, inner, 1], 0, [len * inner, inner, 1], s * inner);
    return [gi];
  });
}

/** Splits along `dim` into pieces of `size` elements (last may be smaller) or of the listed sizes. */
export function split(x: Tensor, size: number | readonly number[], dim = 0): Tensor[] {
  checkTensor(x, 'split', 'x');
  const d = normDim(dim, x.ndim, 'split');
  const len = x.shape[d]!;
  let sizes: number[];
  if (typeof size === 'number') {
    if (!Number.isInteger(size) || size <= 0) throw new ArgumentError(`split: size must be a positive integer, got ${size}`);
    sizes = [];
    for (let at = 0; at < len; at += size) sizes.push(Math.min(size, len - at));
  } else {
    sizes = [...size];
    if (sizes.some((v) => !Number.isInteger(v) || v < 0) || sizes.reduce((a, b) => a + b, 0) !== len) {
      throw new ShapeError(`split: sizes ${JSON.stringify(size)} do not add up to dimension ${d} of ${fmtShape(x.shape)}`);
    }
  }
  let at = 0;
  return sizes.map((n) => { const t = slice(x, d, at, at + n); at += n; return t; });
}

/** Splits along `dim` into `chunks` nearly equal pieces (PyTorch's rule: ceil-sized pieces). */
export function chunk(x: Tensor, chunks: number, dim = 0): Tensor[] {
  checkTensor(x, 'chunk', 'x');
  if (!Number.isInteger(chunks) || chunks <= 0) throw new ArgumentError(`chunk: chunks must be a positive integer, got ${chunks}`);
  const d = normDim(dim, x.ndim, 'chunk');
  return split(x, Math.max(1, Math.ceil(x.shape[d]! / chunks)), d);
}

/** Concatenates tensors along `dim`; all other dimensions must match. */
export function cat(list: readonly Tensor[], dim = 0): Tensor {
  if (!Array.isArray(list) || list.length === 0) throw new ArgumentError('cat: need a non-empty array of tensors');
  const tensors: readonly Tensor[] = list;
  tensors.forEach((t, i) => checkTensor(t, 'cat', `tensors[${i}]`));
  checkSameDevice('cat', ...tensors);
  const first = tensors[0]!;
  const d = normDim(dim, first.ndim, 'cat');
  for (const t of tensors) {
    if (t.dtype !== first.dtype) throw new DTypeError(`cat: dtypes differ (${first.dtype} and ${t.dtype})`);
    if (t.ndim !== first.ndim || t.shape.some((v, i) => i !== d && v !== first.shape[i])) {
      throw new ShapeError(`cat: ${fmtShape(t.shape)} does not match ${fmtShape(first.shape)} outside dimension ${d}`);
    }
  }
  const total = tensors.reduce((a, t) => a + t.shape[d]!, 0);
  const outer = dimsProduct(first.shape, 0, d), inner = dimsProduct(first.shape, d + 1);
  const out = emptyLike(first, first.shape.map((v, i) => (i === d ? total : v)));
  const offsets: number[] = [];
  let at = 0;
  for (const t of tensors) {
    const n = t.shape[d]!;
    copyStrided(t, out, [outer, n, inner], [n * inner, inner, 1], 0, [total * inner, inner, 1], at * inner);
    offsets.push(at);
    at += n;
  }
  if (!needsGrad(...tensors)) return out;
  const lens = tensors.map((t) => t.shape[d]!), shapes = tensors.map((t) => t.shape);
  return record('cat', out, tensors, (g) => lens.map((n, i) => {
    const gi = emptyLike(g, shapes[i]!);
    copyStrided(g, gi, [outer, n, inner], [total * inner, inner, 1], offsets[i]! * inner, [n * inner, inner, 1], 0);
    return gi;
  }));
}

// Tensor.reshape records the graph too (the class method predates autograd and only shares storage).
Tensor.prototype.reshape = function (this: Tensor, shape: readonly number[]) { return reshape(this, shape); };
