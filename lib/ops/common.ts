// Argument checks and allocation shared by the ops: every op validates its tensors here so that
// bad input becomes the same typed error everywhere, before any native call.
import { dtypeCode, isFloating } from '../dtype.js';
import { DTypeError } from '../errors.js';
import { checkSameDevice, checkTensor, emptyOn, type Tensor } from '../tensor.js';

/**
 * Checks live floating tensors of one dtype on one device; returns the first required one.
 * `optional` tensors (a bias) may be null or undefined.
 */
export function checkFloats(call: string, required: Record<string, unknown>, optional: Record<string, unknown> = {}): Tensor {
  const ts: Tensor[] = [];
  for (const [name, t] of Object.entries(required)) ts.push(checkTensor(t, call, name));
  for (const [name, t] of Object.entries(optional)) if (t !== undefined && t !== null) ts.push(checkTensor(t, call, name));
  checkSameDevice(call, ...ts);
  const first = ts[0]!;
  for (const t of ts) {
    if (!isFloating(t.dtype)) throw new DTypeError(`${call}: ${t.describe()} is not floating point (f32, bf16, f16)`);
    if (t.dtype !== first.dtype) throw new DTypeError(`${call}: dtypes differ (${first.dtype} and ${t.dtype})`);
  }
  return first;
}

/** Checks an integer index tensor (i32). */
export function checkIndices(call: string, name: string, t: unknown): Tensor {
  const x = checkTensor(t, call, name);
  if (x.dtype !== 'i32') throw new DTypeError(`${call}: ${name} must be i32 indices, got ${x.dtype}`);
  return x;
}

/** A new uninitialized tensor like `t` with another shape (same dtype and device). */
export function emptyLike(t: Tensor, shape: readonly number[] = t.shape, dtype = t.dtype): Tensor {
  return emptyOn(shape, dtype, t.deviceInfo);
}

/** Native dtype code of a tensor. */
export function code(t: Tensor): number {
  return dtypeCode(t.dtype);
}

/** Contiguous row-major strides of a shape, in elements. */
export function contiguousStrides(shape: readonly number[]): number[] {
  const s = new Array<number>(shape.length);
  let acc = 1;
  for (let i = shape.length - 1; i >= 0; i--) { s[i] = acc; acc *= shape[i]!; }
  return s;
}

/** Product of dims [from, to). */
export function dimsProduct(shape: readonly number[], from = 0, to = shape.length): number {
  let n = 1;
  for (let i = from; i < to; i++) n *= shape[i]!;
  return n;
}
