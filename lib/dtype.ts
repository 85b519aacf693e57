// Dtypes: names, native codes (shared with native/core/nt.h), sizes and the typed arrays that hold them.
import { ArgumentError, DTypeError } from './errors.js';

/** Element types: 32-bit float, IEEE half, bfloat16, 32-bit signed integer, unsigned byte. */
export type DType = 'f32' | 'f16' | 'bf16' | 'i32' | 'u8';
/** Every supported dtype, in native-code order. */
export const DTYPES: readonly DType[] = ['f32', 'f16', 'bf16', 'i32', 'u8'];

const codes: Record<DType, number> = { f32: 0, f16: 1, bf16: 2, i32: 3, u8: 4 };
const sizes: Record<DType, number> = { f32: 4, f16: 2, bf16: 2, i32: 4, u8: 1 };
const aliases: Record<string, DType> = {
  float32: 'f32', float: 'f32', float16: 'f16', half: 'f16', bfloat16: 'bf16', int32: 'i32', int: 'i32', uint8: 'u8',
};

/** The array type `toArray()` returns: floats of any width read back as Float32Array. */
export type ArrayFor<D extends DType> = D extends 'i32' ? Int32Array : D extends 'u8' ? Uint8Array : Float32Array;
export type TypedArray = Float32Array | Int32Array | Uint8Array;

/** Native code of a dtype; throws DTypeError for a name that is not a dtype. */
export function dtypeCode(d: DType): number {
  const c = codes[d];
  if (typeof c !== 'number' || !Object.hasOwn(codes, d)) throw unknownDType(d, 'dtypeCode');
  return c;
}
/** Bytes per element of a dtype (f32/i32: 4, f16/bf16: 2, u8: 1); DTypeError for anything else. */
export function dtypeSize(d: DType): number {
  const s = sizes[d];
  if (typeof s !== 'number' || !Object.hasOwn(sizes, d)) throw unknownDType(d, 'dtypeSize');
  return s;
}
/** Whether a dtype is a floating-point type (f32, f16, bf16); DTypeError for a name that is not a dtype. */
export function isFloating(d: DType): boolean {
  if (d === 'f32' || d === 'f16' || d === 'bf16') return true;
  if (d === 'i32' || d === 'u8') return false;
  throw unknownDType(d, 'isFloating');
}

function unknownDType(d: unknown, call: string): DTypeError {
  return new DTypeError(`${call}: unknown dtype ${typeof d === 'string' ? JSON.stringify(d) : String(d)} (use one of ${DTYPES.join(', ')})`);
}

/** The values an integer dtype holds: [min, max]. */
export const INTEGER_RANGES: Readonly<Record<'i32' | 'u8', readonly [number, number]>> = { i32: [-2147483648, 2147483647], u8: [0, 255] };

/**
 * Checks that every value fits an integer dtype (integers inside its range); floating dtypes accept
 * anything (out-of-range values round to ±Infinity as IEEE casts do). With `truncate` (a cast, which
 * drops fractions toward zero as PyTorch's does) fractional values are fine if their integer part fits.
 * Throws ArgumentError naming the first bad element, the dtype and its range.
 */
export function checkValuesFit(values: ArrayLike<number>, dtype: DType, call: string, truncate = false): void {
  if (dtype !== 'i32' && dtype !== 'u8') return;
  if (dtype === 'i32' && (values instanceof Int32Array || values instanceof Int16Array || values instanceof Int8Array || values instanceof Uint16Array || values instanceof Uint8Array || values instanceof Uint8ClampedArray)) return;
  if (dtype === 'u8' && (values instanceof Uint8Array || values instanceof Uint8ClampedArray)) return;
  const [lo, hi] = INTEGER_RANGES[dtype];
  for (let i = 0; i < values.length; i++) {
    const v = truncate ? Math.trunc(values[i]!) : values[i]!;
    if (Number.isInteger(v) && v >= lo && v <= hi) continue;
    const where = values.length === 1 ? 'value' : `element ${i}`;
    if (!Number.isInteger(v)) throw new ArgumentError(`${call}: ${where} ${values[i]} is not an integer; ${dtype} holds integers in [${lo}, ${hi}]`);
    throw new ArgumentError(`${call}: ${where} ${values[i]} is out of range for ${dtype} (integers in [${lo}, ${hi}]); it would wrap around`);
  }
}

/** Accepts 'f32' and PyTorch-style aliases ('float32', 'bfloat16'); throws DTypeError otherwise. */
export function parseDType(d: unknown, call = 'dtype'): DType {
  if (typeof d === 'string') {
    if ((DTYPES as readonly string[]).includes(d)) return d as DType;
    if (Object.hasOwn(aliases, d)) return aliases[d]!;
  }
  throw new DTypeError(`${call}: unknown dtype ${JSON.stringify(d)} (use one of ${DTYPES.join(', ')})`);
}

/** The typed array that reads back a dtype (bf16 and f16 widen to Float32Array). */
export function readArrayFor(d: DType, length: number): TypedArray {
  if (d === 'i32') return new Int32Array(length);
  if (d === 'u8') return new Uint8Array(length);
  return new Float32Array(length);
}

/** The dtype a typed array's elements naturally carry, when it maps to one. */
export function dtypeOfArray(a: ArrayLike<number>): DType | undefined {
  if (a instanceof Float32Array || a instanceof Float64Array) return 'f32';
  if (a instanceof Int32Array || a instanceof Int16Array || a instanceof Int8Array || a instanceof Uint16Array) return 'i32';
  if (a instanceof Uint8Array || a instanceof Uint8ClampedArray) return 'u8';
  return undefined;
}
