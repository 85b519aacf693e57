// Tensor data as host typed arrays for the groups implemented in TypeScript (in-process and
// file-backed): reading a tensor out, writing it back, and the rank-order reduction they share.
import { tensor } from '../creation.js';
import { dtypeCode, readArrayFor, type TypedArray } from '../dtype.js';
import type { Tensor } from '../tensor.js';
import type { ReduceOp } from '../distributed/collectives.js';

/** f32/i32/u8 as themselves; f16/bf16 widened to f32. */
export function hostArrayFor(t: Tensor, length = t.size): TypedArray {
  return readArrayFor(t.dtype === 'i32' || t.dtype === 'u8' ? t.dtype : 'f32', length);
}

export function readData(t: Tensor): TypedArray {
  const out = hostArrayFor(t);
  if (t.dtype === 'f32' || t.dtype === 'i32' || t.dtype === 'u8') t.backend.read(t.storage, 0, out);
  else out.set(t.toArraySync());
  return out;
}

export function writeData(t: Tensor, data: TypedArray): void {
  if (t.dtype === 'f32' || t.dtype === 'i32' || t.dtype === 'u8') { t.backend.write(t.storage, 0, data); return; }
  // Half precision: round from f32 on the native side.
  using wide = tensor(data as Float32Array, [t.size]);
  t.backend.cast(wide.storage, dtypeCode('f32'), t.storage, dtypeCode(t.dtype), t.size);
}

/** Reduces element-wise in rank order in the array's type, so every rank computes bit-identical results. */
export function reduceInRankOrder(parts: TypedArray[], op: ReduceOp): TypedArray {
  const acc = parts[0]!.slice();
  for (let r = 1; r < parts.length; r++) {
    const x = parts[r]!;
    for (let i = 0; i < acc.length; i++) {
      const a = acc[i]!, b = x[i]!;
      acc[i] = op === 'max' ? (a > b ? a : b) : op === 'min' ? (a < b ? a : b) : op === 'prod' ? a * b : a + b;
    }
  }
  if (op === 'avg') for (let i = 0; i < acc.length; i++) acc[i] = acc[i]! / parts.length;
  return acc;
}
