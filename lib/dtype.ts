// Dtypes: names, native codes (shared with native/core/nt.h), sizes and the typed arrays that hold them.
import { DTypeError } from './errors.js';

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

export function dtypeCode(d: DType): number { return codes[d]; }
/** Bytes per element of a dtype (f32/i32: 4, f16/bf16: 2, u8: 1). */
export function dtypeSize(d: DType): number { return sizes[d]; }
/** Whether a dtype is a floating-point type (f32, f16, bf16). */
export function isFloating(d: DType): boolean { return d === 'f32' || d === 'f16' || d === 'bf16'; }

/** Accepts 'f32' and PyTorch-style aliases ('float32', 'bfloat16'); throws DTypeError otherwise. */
export function parseDType(d: unknown, call = 'dtype'): DType {
  if (typeof d === 'string') {
    if ((DTYPES as readonly string[]).includes(d)) return d as DType;
    const a = aliases[d];
    if (a) return a;
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
