// A tensor's elements as bytes of a dtype and back (casts on the tensor's device), and host bytes of
// any dtype decoded to f32 values: the codecs model files (lib/interop) and checkpoints (lib/ckpt) share.
import { parseDevice } from '../device.js';
import { type DType, dtypeSize } from '../dtype.js';
import { StateError } from '../errors.js';
import { fmtShape } from '../shape.js';
import { emptyOn, type Tensor } from '../tensor.js';

/** A tensor's bytes in `dtype` (cast on its device when it holds another), copied to the host. */
export function bytesOf(t: Tensor, dtype: DType): Uint8Array {
  const src = t.dtype === dtype ? t : t.to({ dtype });
  try {
    const out = new Uint8Array(src.nbytes);
    src.backend.read(src.storage, 0, out);
    return out;
  } finally {
    if (src !== t) src.dispose();
  }
}

/** Overwrites a parameter with `bytes` holding its elements as `dtype` (cast on its device when that differs from its own). */
export function loadBytes(p: Tensor, bytes: Uint8Array, dtype: DType): void {
  if (bytes.byteLength !== p.size * dtypeSize(dtype)) {
    throw new StateError(`loadBytes: ${bytes.byteLength} bytes do not hold ${fmtShape(p.shape)} ${dtype}`);
  }
  p.markModified();
  if (dtype === p.dtype) {
    p.backend.write(p.storage, 0, bytes);
    return;
  }
  using staged = emptyOn(p.shape, dtype, p.deviceInfo);
  staged.backend.write(staged.storage, 0, bytes);
  using cast = staged.to({ dtype: p.dtype });
  p.backend.copy(p.storage, 0, cast.storage, 0, p.nbytes);
}

/** The elements of `bytes` (of `dtype`, on the host) as f32 values. */
export function valuesOf(bytes: Uint8Array, shape: readonly number[], dtype: DType): Float32Array {
  using t = emptyOn(shape, dtype, parseDevice('cpu'));
  t.backend.write(t.storage, 0, bytes);
  return t.toArraySync() as Float32Array;
}
