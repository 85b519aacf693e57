// Where a rank's part of a tensor sits in the whole tensor, as runs of consecutive elements: the
// arithmetic behind resharding. A part is a tensor-parallel slice (a TensorSplit: runs of one
// dimension) of which a rank may hold only a flat range (a ZeRO chunk); both reduce to intervals of
// the whole tensor's row-major element indices, which any other layout's parts can be cut from.
import { ArgumentError, StateError } from '../errors.js';
import type { TensorSplit } from '../nn/module.js';

/** `length` elements at `global` in the whole tensor are at `local` in the part. */
export interface Interval {
  /** Row-major element index in the whole tensor. */
  global: number;
  /** Element index in the part. */
  local: number;
  /** Number of consecutive elements. */
  length: number;
}

/** How a part is described in a manifest: a split (or none: the whole tensor) and a flat range of it. */
export interface PartSpec {
  /** The tensor-parallel split of the part, or null for the whole tensor. */
  split: TensorSplit | null;
  /** First element of the (split) local tensor held, and how many. */
  start: number;
  /** Number of elements held. */
  count: number;
}

const product = (dims: readonly number[]) => dims.reduce((a, b) => a * b, 1);

/** The shape of the local tensor a split describes. */
export function localShape(fullShape: readonly number[], split: TensorSplit | null): number[] {
  if (!split) return [...fullShape];
  const shape = [...fullShape];
  shape[split.dim] = split.runs.reduce((s, [, c]) => s + c, 0);
  return shape;
}

/** Checks a split against the whole tensor's shape (a manifest is input too). */
export function checkSplit(fullShape: readonly number[], split: TensorSplit | null, what: string): void {
  if (!split) return;
  const ok = Number.isInteger(split.dim) && split.dim >= 0 && split.dim < fullShape.length && Array.isArray(split.runs)
    && split.runs.every(([s, c]) => Number.isSafeInteger(s) && Number.isSafeInteger(c) && s >= 0 && c > 0 && s + c <= fullShape[split.dim]!);
  if (!ok) throw new StateError(`${what}: the split ${JSON.stringify(split)} does not fit the shape [${fullShape.join(', ')}]`);
}

/**
 * The intervals of the whole tensor that elements [start, start + count) of the part cover, in
 * increasing local order.
 */
export function partIntervals(fullShape: readonly number[], part: PartSpec): Interval[] {
  const { split, start, count } = part;
  const size = product(localShape(fullShape, split));
  if (!(Number.isSafeInteger(start) && Number.isSafeInteger(count) && start >= 0 && count >= 0 && start + count <= size)) {
    throw new ArgumentError(`checkpoint: elements [${start}, ${start + count}) are outside a part of ${size} elements`);
  }
  if (count === 0) return [];
  if (!split) return [{ global: start, local: start, length: count }];
  const inner = product(fullShape.slice(split.dim + 1));
  const outer = product(fullShape.slice(0, split.dim));
  const fullDim = fullShape[split.dim]!;
  const localDim = split.runs.reduce((s, [, c]) => s + c, 0);
  const end = start + count;
  const out: Interval[] = [];
  // Blocks in local order: for each index of the outer dimensions, each run's rows.
  const firstOuter = Math.floor(start / (localDim * inner));
  for (let o = firstOuter; o < outer; o++) {
    let localRow = 0;
    for (const [runStart, runCount] of split.runs) {
      const lo = (o * localDim + localRow) * inner, hi = lo + runCount * inner;
      localRow += runCount;
      if (hi <= start) continue;
      if (lo >= end) return out;
      const a = Math.max(lo, start), b = Math.min(hi, end);
      const global = (o * fullDim + runStart) * inner + (a - lo);
      const prev = out[out.length - 1];
      if (prev && prev.global + prev.length === global && prev.local + prev.length === a) prev.length += b - a;
      else out.push({ global, local: a, length: b - a });
    }
  }
  return out;
}

/**
 * Checks that parts tile the whole tensor: every element covered exactly once. Returns a problem,
 * or null.
 */
export function coverageProblem(size: number, intervals: readonly Interval[]): string | null {
  const sorted = [...intervals].sort((a, b) => a.global - b.global);
  let at = 0;
  for (const iv of sorted) {
    if (iv.global > at) return `elements [${at}, ${iv.global}) are in no part`;
    if (iv.global < at) return `elements from ${iv.global} are in two parts`;
    at += iv.length;
  }
  if (at !== size) return at < size ? `elements [${at}, ${size}) are in no part` : `parts cover ${at} elements, the tensor has ${size}`;
  return null;
}

/** A source of elements of the whole tensor (a saved part), by its intervals sorted by global index. */
export interface Source<T> { item: T; intervals: Interval[] }

/**
 * For each interval of `wanted`, the pieces of the sources that fill it: (source item, element
 * offset in the source part, element offset in the wanted part, length). Throws when an element is
 * in no source.
 */
export function cover<T>(wanted: readonly Interval[], sources: readonly Source<T>[], what: string): Array<{ item: T; from: number; to: number; length: number }> {
  const flat: Array<{ item: T; iv: Interval }> = [];
  for (const s of sources) for (const iv of s.intervals) flat.push({ item: s.item, iv });
  flat.sort((a, b) => a.iv.global - b.iv.global);
  const starts = flat.map((f) => f.iv.global);
  const out: Array<{ item: T; from: number; to: number; length: number }> = [];
  for (const w of wanted) {
    let g = w.global;
    const end = w.global + w.length;
    // The last source starting at or before g.
    let lo = 0, hi = starts.length - 1, k = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (starts[mid]! <= g) { k = mid; lo = mid + 1; } else hi = mid - 1;
    }
    while (g < end) {
      if (k < 0 || k >= flat.length) throw new StateError(`${what}: element ${g} is in no saved part`);
      const { item, iv } = flat[k]!;
      if (iv.global > g) throw new StateError(`${what}: element ${g} is in no saved part`);
      if (iv.global + iv.length <= g) {
        if (k + 1 < flat.length && flat[k + 1]!.iv.global <= g) { k++; continue; }
        throw new StateError(`${what}: element ${g} is in no saved part`);
      }
      const length = Math.min(end, iv.global + iv.length) - g;
      out.push({ item, from: iv.local + (g - iv.global), to: w.local + (g - w.global), length });
      g += length;
      k++;
    }
  }
  return out;
}
