// Argument checks and small helpers the process-group collectives share: reduce ops, tensor and
// rank validation, per-rank counts (equal or uneven).
import { ArgumentError, DTypeError, ShapeError } from '../errors.js';
import { checkTensor, type Tensor } from '../tensor.js';

/** How a reduction combines the ranks' values: sum, average, maximum, minimum or product. */
export type ReduceOp = 'sum' | 'avg' | 'max' | 'min' | 'prod';
/** Native codes of the reduce ops (native/cpu/comm/reduce_ops.h RedOp). */
export const REDUCE_OP_CODES: Readonly<Record<ReduceOp, number>> = { sum: 0, avg: 1, max: 2, min: 3, prod: 4 };

export function parseReduceOp(op: unknown, call: string): ReduceOp {
  if (op === undefined) return 'sum';
  if (typeof op !== 'string' || !Object.hasOwn(REDUCE_OP_CODES, op)) {
    throw new ArgumentError(`${call}: op must be one of ${Object.keys(REDUCE_OP_CODES).join(', ')}, got ${String(op)}`);
  }
  return op as ReduceOp;
}

/** A live tensor on `device` (the input's). */
export function checkCommTensor(t: unknown, call: string, arg: string, device: string): Tensor {
  const x = checkTensor(t, call, arg);
  if (x.device !== device) throw new ArgumentError(`${call}: ${arg} is on ${x.device} but the input is on ${device}`);
  return x;
}

export function checkSameDType(call: string, a: Tensor, b: Tensor, aName: string, bName: string): void {
  if (a.dtype !== b.dtype) throw new DTypeError(`${call}: ${aName} is ${a.dtype} but ${bName} is ${b.dtype}`);
}

export function checkSize(call: string, t: Tensor, expected: number, what: string): void {
  if (t.size !== expected) throw new ShapeError(`${call}: ${what} must hold ${expected} elements, got ${t.size} (${t.describe()})`);
}

/** options.out of an op whose output matches its input `t` (device, dtype, size); `t` itself when there is none. */
export function outLike(call: string, t: Tensor, out: unknown): Tensor {
  const o = out === undefined ? t : checkCommTensor(out, call, 'out', t.device);
  checkSameDType(call, t, o, 'tensor', 'out');
  checkSize(call, o, t.size, 'out');
  return o;
}

/** A group-local rank; ArgumentError when outside [0, size). */
export function checkRank(r: unknown, size: number, call: string, what: string): number {
  if (typeof r !== 'number' || !Number.isInteger(r) || r < 0 || r >= size) {
    throw new ArgumentError(`${call}: ${what} ${String(r)} is outside the group (ranks 0..${size - 1})`);
  }
  return r;
}

export function checkTimeoutMs(ms: unknown, fallback: number, call: string): number {
  if (ms === undefined) return fallback;
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 1) throw new ArgumentError(`${call}: timeoutMs must be a number >= 1, got ${String(ms)}`);
  return Math.floor(ms);
}

/** Per-rank element counts: given explicitly (uneven) or total/size when they divide evenly. */
export function splitCounts(total: number, size: number, counts: readonly number[] | undefined, call: string): number[] {
  if (counts === undefined) {
    if (total % size !== 0) throw new ShapeError(`${call}: ${total} elements do not split evenly over ${size} ranks; pass counts`);
    return new Array<number>(size).fill(total / size);
  }
  if (!Array.isArray(counts) || counts.length !== size) throw new ArgumentError(`${call}: counts must have one entry per rank (${size})`);
  let sum = 0;
  for (const c of counts) {
    if (!Number.isInteger(c) || c < 0) throw new ArgumentError(`${call}: counts must be non-negative integers, got ${String(c)}`);
    sum += c;
  }
  if (sum !== total) throw new ShapeError(`${call}: counts sum to ${sum} but the tensor holds ${total} elements`);
  return [...counts];
}
