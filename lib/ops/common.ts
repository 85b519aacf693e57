// Argument checks and allocation shared by the ops: every op validates its tensors here so that
// bad input becomes the same typed error everywhere, before any native call.
import { dtypeCode, isFloating } from '../dtype.js';
import { ArgumentError, DTypeError } from '../errors.js';
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

/**
 * Where an op's backward writes a gradient it overwrites completely: `home` (a leaf's gradient home
 * from the engine's GradTarget, written in place) when it is what emptyLike(t, shape) would make,
 * else a new tensor. On cpu the kernels compute the same on either (OpenBLAS and the bf16 GEMM do
 * not look at where C starts), so the gradient's bits do not change. On cuda the home is not taken:
 * cuBLASLt picks its algorithm by the pointers' alignment (native/cuda/gemm_plan.h), and a bucket
 * packs its views without aligning them, so a view could get another algorithm than a fresh buffer.
 */
export function gradOut(home: Tensor | null, t: Tensor, shape: readonly number[] = t.shape): Tensor {
  if (home && home.deviceInfo.type === 'cpu' && home.dtype === t.dtype && home.device === t.device && home.shape.length === shape.length && home.shape.every((d, i) => d === shape[i])) return home;
  return emptyLike(t, shape);
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

/** What an option of an op may hold: a boolean, a finite number, an integer, or anything (checked by the op). */
export type OptionKind = 'boolean' | 'number' | 'integer' | 'any';

/**
 * Checks an op's options argument: undefined or an object whose keys the op knows, each of its kind.
 * Returns the options ({} for undefined). Every op with options calls this first, so a typo
 * (`{ keepDim: true }`) or a wrong type is an ArgumentError naming the op, the option and what is allowed.
 */
export function checkOptions<T extends object>(call: string, opts: T | undefined, spec: Readonly<Record<string, OptionKind>>): T {
  if (opts === undefined) return {} as T;
  if (opts === null || typeof opts !== 'object' || Array.isArray(opts)) {
    throw new ArgumentError(`${call}: options must be an object (${Object.keys(spec).join(', ')}), got ${opts === null ? 'null' : Array.isArray(opts) ? 'an array' : typeof opts}`);
  }
  for (const [k, v] of Object.entries(opts)) {
    const kind = Object.hasOwn(spec, k) ? spec[k] : undefined;
    if (kind === undefined) throw new ArgumentError(`${call}: unknown option ${JSON.stringify(k)} (options: ${Object.keys(spec).join(', ')})`);
    if (v === undefined || kind === 'any') continue;
    if (kind === 'boolean' && typeof v !== 'boolean') throw new ArgumentError(`${call}: option ${k} must be a boolean, got ${typeof v}`);
    if (kind === 'number' && (typeof v !== 'number' || !Number.isFinite(v))) throw new ArgumentError(`${call}: option ${k} must be a finite number, got ${String(v)}`);
    if (kind === 'integer' && !Number.isSafeInteger(v)) throw new ArgumentError(`${call}: option ${k} must be an integer, got ${String(v)}`);
  }
  return opts;
}

/** Checks an optional dimension argument (undefined or a number; the range is checked against the rank by normDim). */
export function checkDimArg(call: string, dim: unknown): void {
  if (dim !== undefined && typeof dim !== 'number') throw new ArgumentError(`${call}: dim must be an integer, got ${typeof dim}`);
}
