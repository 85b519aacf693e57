// Creation functions: tensor() from typed or nested arrays, zeros/ones/full/arange, rand/randn.
import { checkValuesFit, type DType, dtypeCode, dtypeOfArray, isFloating } from './dtype.js';
import { ArgumentError, DTypeError, ShapeError } from './errors.js';
import { DRAW, type Generator, generatorFrom } from './random.js';
import { checkShape, fmtShape, numel, type Shape } from './shape.js';
import { emptyOn, resolveOptions, type Tensor, TENSOR_OPTIONS, type TensorOptions } from './tensor.js';

type Nested = number | boolean | readonly Nested[];

function flattenNested(data: Nested, call: string): { shape: number[]; values: number[] } {
  const shape: number[] = [];
  let probe: Nested = data;
  while (Array.isArray(probe)) {
    shape.push(probe.length);
    probe = probe[0] as Nested;
    if (probe === undefined) break;
  }
  const values: number[] = [];
  const walk = (x: Nested, dim: number, path: string): void => {
    if (dim === shape.length) {
      if (typeof x === 'boolean') { values.push(x ? 1 : 0); return; }
      if (typeof x !== 'number') throw new ArgumentError(`${call}: element ${path || '[]'} is ${typeof x}, not a number`);
      values.push(x);
      return;
    }
    if (!Array.isArray(x) || x.length !== shape[dim]) {
      throw new ShapeError(`${call}: ragged nested array at ${path || 'top level'} (expected length ${shape[dim]})`);
    }
    x.forEach((v, i) => walk(v as Nested, dim + 1, `${path}[${i}]`));
  };
  walk(data, 0, '');
  return { shape, values };
}

/**
 * A tensor from a typed array, a plain array, nested arrays or a number.
 * `shape` is required for flat data of rank > 1; dtype defaults to the array's (Float32Array → f32,
 * Int32Array → i32, Uint8Array → u8, numbers → f32).
 */
export function tensor(data: ArrayLike<number> | Nested, shape?: Shape, opts?: TensorOptions): Tensor;
export function tensor(data: ArrayLike<number> | Nested, opts?: TensorOptions): Tensor;
export function tensor(data: ArrayLike<number> | Nested, shapeOrOpts?: Shape | TensorOptions, maybeOpts?: TensorOptions): Tensor {
  const call = 'tensor';
  let shape: Shape | undefined;
  let opts: TensorOptions | undefined;
  if (Array.isArray(shapeOrOpts)) { shape = shapeOrOpts; opts = maybeOpts; } else { opts = shapeOrOpts as TensorOptions | undefined; }
  let values: ArrayLike<number>;
  let inferred: number[];
  let natural: DType = 'f32';
  if (typeof data === 'number' || typeof data === 'boolean') {
    values = [Number(data)];
    inferred = [];
  } else if (data instanceof DataView) {
    throw new ArgumentError(`${call}: a DataView has no element type; pass a typed array (e.g. new Float32Array(view.buffer, view.byteOffset, n))`);
  } else if (ArrayBuffer.isView(data)) {
    values = data as unknown as ArrayLike<number>;
    inferred = [values.length];
    natural = dtypeOfArray(values) ?? 'f32';
    if (data instanceof BigInt64Array || data instanceof BigUint64Array) throw new DTypeError(`${call}: 64-bit integer arrays are not supported`);
  } else if (Array.isArray(data)) {
    const flat = flattenNested(data as Nested, call);
    values = flat.values;
    inferred = flat.shape;
  } else {
    throw new ArgumentError(`${call}: data must be a typed array, an array or a number, got ${data === null ? 'null' : typeof data}`);
  }
  if (shape !== undefined && !Array.isArray(shape)) throw new ArgumentError(`${call}: shape must be an array of integers`);
  const finalShape = shape === undefined ? inferred : checkShape(shape, call);
  if (numel(finalShape) !== values.length) {
    throw new ShapeError(`${call}: shape ${fmtShape(finalShape)} needs ${numel(finalShape)} elements, the data has ${values.length}`);
  }
  const { dtype, device, requiresGrad } = resolveOptions(opts, call, natural, TENSOR_OPTIONS);
  checkValuesFit(values, dtype, call);
  const out = emptyOn(finalShape, dtype, device);
  // Upload in the narrowest array that holds the values exactly, then convert on the device.
  const src = natural === dtype && ArrayBuffer.isView(values) && !(values instanceof Float64Array) ? (values as unknown as ArrayBufferView)
    : dtype === 'i32' ? Int32Array.from(values)
    : dtype === 'u8' ? Uint8Array.from(values)
    : Float32Array.from(values);
  const srcDtype: DType = src instanceof Int32Array ? 'i32' : src instanceof Uint8Array ? 'u8' : 'f32';
  if (srcDtype === dtype && (src as ArrayBufferView).byteLength === out.nbytes) {
    out.backend.write(out.storage, 0, src);
  } else {
    const staging = emptyOn(finalShape, srcDtype, device);
    try {
      staging.backend.write(staging.storage, 0, src);
      out.backend.cast(staging.storage, dtypeCode(srcDtype), out.storage, dtypeCode(dtype), out.size);
    } finally {
      staging.dispose();
    }
  }
  if (requiresGrad) out.requiresGrad = true;
  return out;
}

/** A tensor filled with one value (which must fit the dtype: an integer in range for i32 and u8). */
export function full(shape: Shape, value: number, opts?: TensorOptions): Tensor {
  const s = checkShape(shape, 'full');
  if (typeof value !== 'number') throw new ArgumentError(`full: value must be a number, got ${typeof value}`);
  const { dtype, device, requiresGrad } = resolveOptions(opts, 'full', 'f32', TENSOR_OPTIONS);
  checkValuesFit([value], dtype, 'full');
  const out = emptyOn(s, dtype, device);
  out.backend.fill(out.storage, dtypeCode(dtype), out.size, value);
  if (requiresGrad) out.requiresGrad = true;
  return out;
}

/** A tensor filled with zeros. */
export function zeros(shape: Shape, opts?: TensorOptions): Tensor {
  const s = checkShape(shape, 'zeros');
  const { dtype, device, requiresGrad } = resolveOptions(opts, 'zeros', 'f32', TENSOR_OPTIONS);
  const out = emptyOn(s, dtype, device, true);
  if (requiresGrad) out.requiresGrad = true;
  return out;
}

/** A tensor filled with ones. */
export function ones(shape: Shape, opts?: TensorOptions): Tensor {
  return full(shape, 1, opts);
}

/** Values start, start + step, ... below end (like torch.arange); arange(n) counts 0..n-1. Default dtype i32 when all arguments are integers. */
export function arange(end: number, opts?: TensorOptions): Tensor;
export function arange(start: number, end: number, step?: number, opts?: TensorOptions): Tensor;
export function arange(a: number, b?: number | TensorOptions, c?: number | TensorOptions, d?: TensorOptions): Tensor {
  let start = 0, end: number, step = 1, opts: TensorOptions | undefined;
  if (typeof b === 'number') {
    start = a; end = b;
    if (typeof c === 'number') { step = c; opts = d; } else opts = c;
  } else { end = a; opts = b; }
  for (const [k, v] of [['start', start], ['end', end], ['step', step]] as const) {
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new ArgumentError(`arange: ${k} must be a finite number, got ${String(v)}`);
  }
  if (step === 0) throw new ArgumentError('arange: step must not be 0');
  const n = Math.max(0, Math.ceil((end - start) / step));
  if (!Number.isSafeInteger(n)) throw new ArgumentError(`arange: [${start}, ${end}) in steps of ${step} has ${n} elements, more than 2^53`);
  const allInt = Number.isInteger(start) && Number.isInteger(end) && Number.isInteger(step);
  const { dtype, device, requiresGrad } = resolveOptions(opts, 'arange', allInt ? 'i32' : 'f32', TENSOR_OPTIONS);
  if (n > 0) checkValuesFit([start, start + (n - 1) * step], dtype, 'arange');
  const out = emptyOn([n], dtype, device);
  out.backend.arange(out.storage, dtypeCode(dtype), n, start, step);
  if (requiresGrad) out.requiresGrad = true;
  return out;
}

/** Options of random creation: a seed (a fresh generator at offset 0) or a generator to advance. */
export interface RandomOptions extends TensorOptions {
  /** Seed of a fresh generator for this draw (the global generator is not advanced). */
  seed?: number | bigint;
  /** Generator to draw from and advance (default: the global one, see manualSeed). */
  generator?: Generator;
}

/** Checks a random draw's options (floating dtype, generator, mean and std) before anything is allocated or drawn. */
function resolveRandom(call: string, opts: (RandomOptions & { mean?: number; std?: number }) | undefined, normal: boolean) {
  const resolved = resolveOptions(opts, call, 'f32', [...TENSOR_OPTIONS, 'seed', 'generator', ...(normal ? ['mean', 'std'] : [])]);
  if (!isFloating(resolved.dtype)) throw new DTypeError(`${call}: random values are floating point (f32, bf16, f16), not ${resolved.dtype}`);
  const gen = generatorFrom(opts, call);
  let a = 0, b = 1;
  if (normal) {
    a = opts?.mean ?? 0; b = opts?.std ?? 1;
    if (typeof a !== 'number' || !Number.isFinite(a)) throw new ArgumentError(`${call}: mean must be a finite number, got ${String(a)}`);
    if (typeof b !== 'number' || !Number.isFinite(b) || b < 0) throw new ArgumentError(`${call}: std must be a finite number >= 0, got ${String(b)}`);
  }
  return { ...resolved, gen, a, b };
}

/**
 * Elements [first, first + size) of a draw of `total` values, into a new tensor of `shape`: the one
 * fill behind rand, randn (first 0, total their size) and randomShard. The generator advances by `total`.
 */
function randomTensor(call: string, shape: Shape, opts: (RandomOptions & { mean?: number; std?: number }) | undefined, draw: (typeof DRAW)[keyof typeof DRAW],
  range?: { first: number; total: number }): Tensor {
  const s = checkShape(shape, call);
  const first = range?.first ?? 0, total = range?.total ?? numel(s);
  if (!Number.isSafeInteger(first) || !Number.isSafeInteger(total) || first < 0 || first + numel(s) > total) {
    throw new ArgumentError(`${call}: elements [${first}, ${first + numel(s)}) do not lie inside a draw of ${total} (first and total are integers, 0 <= first, first + shard size <= total)`);
  }
  const { dtype, device, requiresGrad, gen, a, b } = resolveRandom(call, opts, draw === DRAW.normal);
  const out = emptyOn(s, dtype, device);
  try {
    const base = gen.reserve(total, draw.perBlock);
    const [hi, lo] = gen.seedHalves();
    out.backend.random_fill(out.storage, dtypeCode(dtype), out.size, draw.kind, hi, lo, base, first, a, b);
  } catch (e) {
    out.dispose();
    throw e;
  }
  if (requiresGrad) out.requiresGrad = true;
  return out;
}

/** Uniform in [0, 1) from the seeded Philox generator. */
export function rand(shape: Shape, opts?: RandomOptions): Tensor {
  return randomTensor('rand', shape, opts, DRAW.uniform);
}

/** Standard normal (mean 0, std 1) from the seeded Philox generator. */
export function randn(shape: Shape, opts?: RandomOptions & { mean?: number; std?: number }): Tensor {
  return randomTensor('randn', shape, opts, DRAW.normal);
}

/**
 * Elements [first, first + count) of the draw a full-size rand/randn with this generator state
 * would make, without drawing the rest: how a rank draws exactly its shard of a parallel tensor.
 * Advances the generator as the full draw would (by `total` elements).
 */
export function randomShard(kind: 'uniform' | 'normal', shape: Shape, first: number, total: number, opts?: RandomOptions & { mean?: number; std?: number }): Tensor {
  if (kind !== 'uniform' && kind !== 'normal') throw new ArgumentError(`randomShard: kind must be 'uniform' or 'normal', got ${typeof kind === 'string' ? JSON.stringify(kind) : typeof kind}`);
  return randomTensor('randomShard', shape, opts, DRAW[kind], { first, total });
}
