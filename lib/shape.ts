// Shape checks and arithmetic shared by creation functions and ops.
import { ArgumentError, ShapeError } from './errors.js';

export type Shape = readonly number[];

/** Validates a shape (non-negative integer dims) and returns a frozen copy. */
export function checkShape(shape: unknown, call: string): number[] {
  if (!Array.isArray(shape)) throw new ArgumentError(`${call}: shape must be an array of integers, got ${typeof shape}`);
  let n = 1;
  const out: number[] = [];
  for (let i = 0; i < shape.length; i++) {
    const d = shape[i];
    if (typeof d !== 'number' || !Number.isInteger(d) || d < 0) {
      throw new ArgumentError(`${call}: dimension ${i} of shape [${shape.join(', ')}] must be a non-negative integer, got ${String(d)}`);
    }
    n *= d;
    out.push(d);
  }
  if (n > Number.MAX_SAFE_INTEGER) throw new ArgumentError(`${call}: shape [${shape.join(', ')}] has more than 2^53 elements`);
  return out;
}

export function numel(shape: Shape): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Normalizes a possibly negative dimension index against a rank. */
export function normDim(dim: number, rank: number, call: string): number {
  if (!Number.isInteger(dim) || dim < -Math.max(rank, 1) || dim >= Math.max(rank, 1)) {
    throw new ArgumentError(`${call}: dimension ${dim} is out of range for a tensor of rank ${rank}`);
  }
  return dim < 0 ? dim + rank : dim;
}

/** Resolves a reshape target with at most one -1 against a known element count. */
export function inferShape(target: readonly number[], count: number, from: Shape, call = 'reshape'): number[] {
  if (!Array.isArray(target)) throw new ArgumentError(`${call}: shape must be an array of integers`);
  let infer = -1;
  let known = 1;
  target.forEach((d, i) => {
    if (d === -1 && infer < 0) infer = i;
    else if (typeof d !== 'number' || !Number.isInteger(d) || d < 0) {
      throw new ArgumentError(`${call}: dimension ${i} of [${target.join(', ')}] must be a non-negative integer or a single -1`);
    } else known *= d;
  });
  const out = [...target];
  if (infer >= 0) {
    if (known === 0 || count % known !== 0) {
      throw new ShapeError(`${call}: cannot infer -1 in [${target.join(', ')}] for ${count} elements (shape [${from.join(', ')}])`);
    }
    out[infer] = count / known;
  } else if (known !== count) {
    throw new ShapeError(`${call}: cannot reshape [${from.join(', ')}] (${count} elements) to [${target.join(', ')}] (${known} elements)`);
  }
  return out;
}

/** Broadcasts two shapes NumPy-style; throws ShapeError when they do not fit. */
export function broadcastShapes(a: Shape, b: Shape, call: string): number[] {
  const rank = Math.max(a.length, b.length);
  const out = new Array<number>(rank);
  for (let i = 0; i < rank; i++) {
    const da = a[a.length - rank + i] ?? 1;
    const db = b[b.length - rank + i] ?? 1;
    if (da !== db && da !== 1 && db !== 1) {
      throw new ShapeError(`${call}: shapes [${a.join(', ')}] and [${b.join(', ')}] cannot be broadcast (dimension ${i}: ${da} vs ${db})`);
    }
    out[i] = da === 1 ? db : da;
  }
  return out;
}

export function sameShape(a: Shape, b: Shape): boolean {
  return a.length === b.length && a.every((d, i) => d === b[i]);
}

export function fmtShape(s: Shape): string {
  return `[${s.join(', ')}]`;
}
