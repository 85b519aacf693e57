// Where each parameter lives inside a contiguous flat buffer, and the byte copies between a
// parameter-shaped tensor and its range: what gradient buckets and ZeRO shards are built from.
import { ArgumentError, DTypeError } from '../errors.js';
import { dtypeSize, type DType } from '../dtype.js';
import type { Tensor } from '../tensor.js';

/** Where one parameter sits in a flat buffer. */
export interface FlatEntry {
  /** The parameter. */
  param: Tensor;
  /** First element of the parameter inside the flat buffer. */
  offset: number;
  /** Its number of elements. */
  count: number;
}

/** Parameters packed back to back (in the given order), the total padded to a multiple of `padTo`. */
export class FlatLayout {
  /** The parameters' entries, in the given order. */
  readonly entries: FlatEntry[];
  readonly #index = new Map<Tensor, FlatEntry>();
  /** Elements of all parameters together. */
  readonly count: number;
  /** `count` rounded up to a multiple of padTo. */
  readonly paddedCount: number;
  /** The parameters' common dtype. */
  readonly dtype: DType;

  /**
   * Lays the parameters out. Throws DTypeError or ArgumentError unless they share one dtype and device and none
   * repeats.
   * @param params The parameters, in buffer order.
   * @param padTo The padded total is a multiple of this (default 1).
   * @param call Names the caller in errors.
   */
  constructor(params: readonly Tensor[], padTo = 1, call = 'FlatLayout') {
    if (params.length === 0) throw new ArgumentError(`${call}: got no parameters`);
    this.dtype = params[0]!.dtype;
    let offset = 0;
    this.entries = params.map((p) => {
      if (p.dtype !== this.dtype) throw new DTypeError(`${call}: parameters must share one dtype; ${p.describe()} differs from ${this.dtype}`);
      if (p.device !== params[0]!.device) throw new ArgumentError(`${call}: parameters must share one device; ${p.describe()} is not on ${params[0]!.device}`);
      if (this.#index.has(p)) throw new ArgumentError(`${call}: parameter ${p.describe()} appears more than once`);
      const e = { param: p, offset, count: p.size };
      this.#index.set(p, e);
      offset += p.size;
      return e;
    });
    this.count = offset;
    this.paddedCount = Math.ceil(offset / padTo) * padTo;
  }

  /** The entry of a parameter, or undefined when it is not in the layout. */
  entry(p: Tensor): FlatEntry | undefined { return this.#index.get(p); }
  /** Whether a parameter is in the layout. */
  has(p: Tensor): boolean { return this.#index.has(p); }
  /** Bytes per element of the dtype. */
  get elementBytes(): number { return dtypeSize(this.dtype); }
}

/**
 * Copies `count` elements from src (starting at element srcOffset) to dst (at dstOffset); both
 * tensors of `dtype` on one device. ZeRO's buckets and shards move data with these copies;
 * GradBuffer copies only a gradient that is not already its bucket's view (`viewOf`).
 */
export function copyElements(dst: Tensor, dstOffset: number, src: Tensor, srcOffset: number, count: number): void {
  if (count <= 0) return;
  const b = dtypeSize(dst.dtype);
  if (src.dtype !== dst.dtype) throw new DTypeError(`copyElements: ${src.describe()} → ${dst.describe()} needs one dtype`);
  if (srcOffset + count > src.size || dstOffset + count > dst.size) {
    throw new ArgumentError(`copyElements: range out of bounds (${count} elements from ${srcOffset} of ${src.size} to ${dstOffset} of ${dst.size})`);
  }
  dst.backend.copy(dst.storage, dstOffset * b, src.storage, srcOffset * b, count * b);
}
