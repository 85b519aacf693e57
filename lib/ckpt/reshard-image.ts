// Restoring a rank's state from in-memory images (lib/ckpt/image.ts) taken under ANOTHER layout
// (issue #37 item 4: data parallelism shrinks when no spare is left, and grows back): this rank's
// parts under its new layout are filled from whichever old ranks' images hold their elements, with
// the resharding arithmetic of disk checkpoints (lib/ckpt/intervals.ts) and the disk load's rules
// for everything else (lib/ckpt/load.ts), so a state restored from memory equals the same state saved
// to disk under the old layout and loaded under the new one, byte for byte.
//
// An image's part says where it sits in its global tensor only together with its tensor-parallel
// split: takeLayoutImage (or annotateImage) records each part's split and whole shape in the image
// (extra fields of its parts, kept by encodeImage/decodeImage and ignored by restoreImage).
// planImages reads only the images' heads (their part tables and JSON state, a few kilobytes each),
// so a rank fetches the data of only the old ranks whose parts overlap its own.
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { dtypeSize, type DType } from '../dtype.js';
import { tensor } from '../creation.js';
import { bytesOf, valuesOf } from '../io/tensor-bytes.js';
import type { TensorSplit } from '../nn/module.js';
import { traceSpan } from '../observe/trace.js';
import { checkSplit, partIntervals, type Interval } from './intervals.js';
import type { StatePart } from './parts.js';
import { rankState, worldOf, type CheckpointItems } from './items.js';
import { takeImage, type ImagePart, type ImageState, type RankImage } from './image.js';

/** An image's part with where it sits in its global tensor (what takeLayoutImage records). */
export interface LayoutImagePart extends ImagePart {
  /** The global tensor's shape. */
  shape: number[];
  /** The tensor-parallel split the part is a slice of (null: the whole tensor); `start` counts in it. */
  split: TensorSplit | null;
}

/** An image without its tensor bytes: what planning reads (encodeImage's JSON header holds exactly this). */
export interface ImageHead {
  /** The completed step the image was taken after. */
  step: number;
  /** Its parts (with their splits: LayoutImagePart). */
  parts: readonly ImagePart[];
  /** Its JSON state. */
  state: ImageState;
}

/** Where an old rank's image comes from: the image itself, or a promise of it (fetched over the network). */
export type ImageSource = (oldRank: number) => RankImage | Promise<RankImage>;

/** Options of restoreFromImages and planImages. */
export interface RestoreFromImagesOptions {
  /**
   * The old ranks' heads (part tables and state, no tensor bytes). When given, only the images that
   * hold elements of this rank's parts are fetched (plus none other); without it every old image is.
   */
  heads?: (oldRank: number) => ImageHead | Promise<ImageHead>;
  /** Old ranks to read from first (e.g. this process's own old rank, then its node's); then the image holding most of what is left, and so on. */
  prefer?: readonly number[];
  /**
   * The old run's `items.layout` (disk checkpoints record it): with the same world size and layout,
   * each rank takes its own old rank's random generators, as a disk load does; otherwise old rank 0's.
   */
  oldLayout?: unknown;
}

/** Which old images a rank reads, and what it copies from each. */
export interface ImagePlan {
  /** The step every old image was taken after. */
  step: number;
  /** The old ranks whose tensor bytes this rank reads, in increasing order. */
  ranks: number[];
  /** Per new part (of rankState(items, true), empty ones left out): the pieces that fill it. */
  parts: Array<{ part: StatePart; pieces: Piece[] }>;
  /** The heads of every old rank (the non-tensor state comes from them). */
  heads: ImageHead[];
}

/** `length` elements of old rank `rank`'s part `source`, from its element `from`, go to element `to` of the new part. */
export interface Piece {
  /** The old rank. */
  rank: number;
  /** The old image's part. */
  source: LayoutImagePart;
  /** Element index (in the old part's split-local tensor) of the first element copied. */
  from: number;
  /** Element index (in the new part's split-local tensor) it goes to. */
  to: number;
  /** Number of elements. */
  length: number;
}

const json = <T>(v: T): T => (v === undefined ? v : JSON.parse(JSON.stringify(v)) as T);
const CONVERTIBLE: ReadonlySet<DType> = new Set<DType>(['f32', 'bf16', 'f16']);

/**
 * Records each part's split and whole shape in `image`, which must have been taken from `items` (the
 * same parts in the same order); returns the image (its parts replaced). takeLayoutImage does both.
 */
export function annotateImage(items: CheckpointItems, image: RankImage): RankImage {
  const parts = rankState(items, true).parts.filter((p) => p.count > 0);
  if (parts.length !== image.parts.length) throw new StateError(`annotateImage: the image has ${image.parts.length} parts, these items ${parts.length}: it was taken from other items`);
  image.parts = image.parts.map((q, i) => {
    const p = parts[i]!;
    if (p.key !== q.key || p.start !== q.start || p.count !== q.count) throw new StateError(`annotateImage: part ${i} is '${q.key}' [${q.start}, +${q.count}), here '${p.key}' [${p.start}, +${p.count}): the image was taken from other items`);
    return { ...q, shape: [...p.fullShape], split: p.split ? json(p.split) : null } satisfies LayoutImagePart;
  });
  return image;
}

/** takeImage with each part's split and whole shape recorded, so the image can restore another layout. */
export function takeLayoutImage(items: CheckpointItems, step: number, reuse?: RankImage): RankImage {
  return annotateImage(items, takeImage(items, step, reuse));
}

/** A source part with its intervals of the whole tensor, checked. */
function sourceIntervals(q: ImagePart, oldRank: number, fullShape: readonly number[]): Interval[] {
  const l = q as Partial<LayoutImagePart>;
  const what = `restoreFromImages: old rank ${oldRank}'s part '${q.key}'`;
  if (l.split === undefined || !Array.isArray(l.shape)) {
    throw new StateError(`${what} does not say where it sits in the whole tensor (its split): take images with takeLayoutImage (or annotateImage) to restore them under another layout`);
  }
  if (l.shape.join() !== fullShape.join()) throw new ShapeError(`${what} has shape [${l.shape.join(', ')}], this model's is [${fullShape.join(', ')}]`);
  checkSplit(fullShape, l.split, what);
  try {
    return partIntervals(fullShape, { split: l.split, start: q.start, count: q.count });
  } catch (e) {
    throw new StateError(`${what}: ${(e as Error).message}`);
  }
}

/**
 * Removes from `remaining` (sorted by global index, disjoint) what `source` (sorted, disjoint) covers;
 * returns what is left and the pieces taken (element index in the wanted part, in the source part, length).
 */
function carve(remaining: Interval[], source: readonly Interval[]): { left: Interval[]; taken: Array<{ to: number; from: number; length: number }> } {
  const left: Interval[] = [], taken: Array<{ to: number; from: number; length: number }> = [];
  let j = 0;
  for (const w of remaining) {
    let g = w.global;
    const end = w.global + w.length;
    while (j < source.length && source[j]!.global + source[j]!.length <= g) j++;
    let k = j;
    while (g < end && k < source.length && source[k]!.global < end) {
      const s = source[k]!;
      if (s.global > g) { left.push({ global: g, local: w.local + (g - w.global), length: s.global - g }); g = s.global; }
      const stop = Math.min(end, s.global + s.length);
      if (stop > g) { taken.push({ to: w.local + (g - w.global), from: s.local + (g - s.global), length: stop - g }); g = stop; }
      if (s.global + s.length <= g) k++;
    }
    if (g < end) left.push({ global: g, local: w.local + (g - w.global), length: end - g });
  }
  return { left, taken };
}

const readHead = (image: RankImage): ImageHead => ({ step: image.step, parts: image.parts, state: image.state });

/**
 * Which old images this rank reads and what it copies from each, from the heads alone. Each element of
 * this rank's new parts comes from a preferred old rank (`prefer`, in order) when one holds it, else from
 * the image that holds the most of what is still missing (greedily, ties to the lower rank), first in the
 * part's own dtype, then in another of f32/bf16/f16 (converted, as a disk load converts). Checks that
 * every old image is of one step, that the whole shapes agree, and that every element is covered (a
 * StateError naming the tensor and the missing range of its elements); an optimizer state no old rank
 * holds at all is left as it is (a disk load starts it fresh too).
 */
export async function planImages(items: CheckpointItems, heads: (oldRank: number) => ImageHead | Promise<ImageHead>, oldWorld: number,
  opts: Pick<RestoreFromImagesOptions, 'prefer'> = {}): Promise<ImagePlan> {
  if (!Number.isInteger(oldWorld) || oldWorld < 1) throw new ArgumentError(`restoreFromImages: oldWorld must be an integer >= 1, got ${oldWorld}`);
  const prefer = opts.prefer ?? [];
  for (const r of prefer) if (!Number.isInteger(r) || r < 0 || r >= oldWorld) throw new ArgumentError(`restoreFromImages: prefer names rank ${r}, outside the old world of ${oldWorld}`);
  const all: ImageHead[] = await Promise.all(Array.from({ length: oldWorld }, (_, r) => heads(r)));
  all.forEach((h, r) => {
    if (!h || !Array.isArray(h.parts) || !h.state || !Number.isInteger(h.step)) throw new StateError(`restoreFromImages: old rank ${r}'s image is not one (takeLayoutImage or decodeImage makes one)`);
  });
  const step = all[0]!.step;
  const other = all.findIndex((h) => h.step !== step);
  if (other >= 0) throw new StateError(`restoreFromImages: old rank 0's image is of step ${step}, old rank ${other}'s of step ${all[other]!.step}: restore images of one step`);

  // Every old part by key and old rank.
  const byKey = new Map<string, Map<number, ImagePart[]>>();
  all.forEach((h, r) => {
    for (const q of h.parts) {
      if (q.count <= 0) continue;
      let ranks = byKey.get(q.key);
      if (!ranks) byKey.set(q.key, ranks = new Map());
      let list = ranks.get(r);
      if (!list) ranks.set(r, list = []);
      list.push(q);
    }
  });
  const cache = new Map<ImagePart, Interval[]>();
  const intervalsOf = (rank: number, q: ImagePart, shape: readonly number[]) => {
    let iv = cache.get(q);
    if (!iv) { iv = [...sourceIntervals(q, rank, shape)].sort((a, b) => a.global - b.global); cache.set(q, iv); }
    return iv;
  };

  // What this rank wants: its parts' intervals of the whole tensors, still to be found.
  const wants: Array<{ part: StatePart; remaining: Interval[]; pieces: Piece[]; sources: Map<number, ImagePart[]> }> = [];
  for (const part of rankState(items, true).parts) {
    if (part.count <= 0) continue;
    const sources = byKey.get(part.key);
    if (!sources) {
      if (part.key.startsWith('optim/')) continue;
      throw new StateError(`restoreFromImages: no old image holds '${part.key}' (images of another model?)`);
    }
    wants.push({ part, remaining: [...partIntervals(part.fullShape, part)].sort((a, b) => a.global - b.global), pieces: [], sources });
  }
  const usable = (q: ImagePart, dtype: DType, converted: boolean) => (converted
    ? q.dtype !== dtype && CONVERTIBLE.has(q.dtype) && CONVERTIBLE.has(dtype) : q.dtype === dtype);
  /** Takes (or, with `dry`, counts) what old rank r's image holds of what is still wanted. */
  const take = (r: number, converted: boolean, dry: boolean): number => {
    let elements = 0;
    for (const w of wants) {
      const qs = w.sources.get(r);
      if (!qs || w.remaining.length === 0) continue;
      let remaining = w.remaining;
      for (const q of qs) {
        if (!usable(q, w.part.tensor.dtype, converted)) continue;
        const { left, taken } = carve(remaining, intervalsOf(r, q, w.part.fullShape));
        remaining = left;
        for (const t of taken) {
          elements += t.length;
          if (!dry) w.pieces.push({ rank: r, source: q as LayoutImagePart, ...t });
        }
      }
      if (!dry) w.remaining = remaining;
    }
    return elements;
  };
  // The preferred images first, then (greedily) the image that holds the most of what is left, in the
  // parts' own dtype before any conversion: few images fetched, each element copied once.
  const used = new Set<number>();
  for (const converted of [false, true]) {
    for (const r of [...prefer, ...used]) if (take(r, converted, false) > 0) used.add(r);
    for (;;) {
      let best = -1, most = 0;
      for (let r = 0; r < oldWorld; r++) {
        if (used.has(r)) continue;
        const n = take(r, converted, true);
        if (n > most) { best = r; most = n; }
      }
      if (best < 0) break;
      take(best, converted, false);
      used.add(best);
    }
  }
  const plans: ImagePlan['parts'] = [];
  for (const { part, remaining, pieces, sources } of wants) {
    if (remaining.length > 0) {
      const m = remaining[0]!;
      const dtypes = [...new Set([...sources.values()].flat().map((q) => q.dtype))];
      throw new StateError(`restoreFromImages: elements [${m.global}, ${m.global + m.length}) of '${part.key}' (shape [${part.fullShape.join(', ')}]) are in no old image${remaining.length > 1 ? ` (and ${remaining.length - 1} more ranges)` : ''}`
        + (dtypes.some((d) => d !== part.tensor.dtype && !(CONVERTIBLE.has(d) && CONVERTIBLE.has(part.tensor.dtype))) ? `; the images hold it as ${dtypes.join('/')}, which cannot be loaded into ${part.tensor.dtype}` : ''));
    }
    pieces.sort((a, b) => a.to - b.to);
    plans.push({ part, pieces });
  }
  return { step, ranks: [...used].sort((a, b) => a - b), parts: plans, heads: all };
}

/** The old ranks whose images' tensor bytes this rank needs under its new layout (from their heads alone). */
export async function imagesNeeded(items: CheckpointItems, heads: (oldRank: number) => ImageHead | Promise<ImageHead>, oldWorld: number,
  opts: Pick<RestoreFromImagesOptions, 'prefer'> = {}): Promise<number[]> {
  return (await planImages(items, heads, oldWorld, opts)).ranks;
}

/** A piece's bytes, in the new part's dtype (converted through f32 when the old part's differs). */
function pieceBytes(image: RankImage, p: Piece, dtype: DType): Uint8Array {
  const q = p.source, size = dtypeSize(q.dtype);
  const at = q.at + (p.from - q.start) * size;
  const raw = image.data.subarray(at, at + p.length * size);
  if (q.dtype === dtype) return raw;
  const aligned = raw.byteOffset % 4 === 0 ? raw : raw.slice();
  const f32 = q.dtype === 'f32' ? new Float32Array(aligned.buffer, aligned.byteOffset, p.length) : valuesOf(raw, [p.length], q.dtype);
  if (dtype === 'f32') return new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);
  using wide = tensor(f32, [p.length]);
  return bytesOf(wide, dtype);
}

/**
 * Fills `items` (this rank, under its new layout) from the images of the `oldWorld` ranks of another
 * layout, all taken after one step with takeLayoutImage; returns that step and the old ranks whose
 * images were read. With `opts.heads` it plans from the heads and fetches only the images it needs;
 * without, it fetches every image. Everything is checked (and every needed image fetched) before
 * anything is written: a failure leaves the run as it was.
 *
 * The rules are the disk load's (lib/ckpt/load.ts), so memory and disk restore the same bytes:
 * - tensors: each element from an old image holding it (copies are equal); bf16/f16/f32 converted;
 * - optimizer step counts: every old rank's, merged in rank order (the last non-null count wins);
 * - optimizer options (lr, betas, ...): old rank 0's first optimizer's groups, when the group counts
 *   agree; its gradScale too;
 * - loader, schedule and scaler positions: old rank 0's;
 * - random generators: with the same world size and layout (`opts.oldLayout` against `items.layout`)
 *   this rank's own old rank's, otherwise old rank 0's (draws then differ from an uninterrupted run);
 * - then the bf16/f16 compute copies are refreshed (items.masterWeights).
 * The trainer's own state beyond its training state (TrainerRecoveryState: the gradient buckets' order
 * and its step count) belongs to a layout and does not transfer: the new trainer keeps its own.
 * Call between steps (after a failed step: ParallelTrainer.abandonStep first).
 */
export async function restoreFromImages(items: CheckpointItems, images: ImageSource, oldWorld: number,
  opts: RestoreFromImagesOptions = {}): Promise<{ step: number; ranks: number[] }> {
  const fetched = new Map<number, RankImage>();
  const fetch = async (r: number): Promise<RankImage> => {
    let image = fetched.get(r);
    if (!image) {
      image = await images(r);
      if (!image || !Array.isArray(image.parts) || !(image.data instanceof Uint8Array) || !image.state) throw new StateError(`restoreFromImages: old rank ${r}'s image is not one (takeLayoutImage or decodeImage makes one)`);
      fetched.set(r, image);
    }
    return image;
  };
  const plan = await planImages(items, opts.heads ?? (async (r) => readHead(await fetch(r))), oldWorld, opts);
  await Promise.all(plan.ranks.map(fetch));
  // The images fetched must be those planned from (same parts, bytes enough for them).
  for (const r of plan.ranks) {
    const image = fetched.get(r)!, head = plan.heads[r]!;
    if (image.step !== plan.step) throw new StateError(`restoreFromImages: old rank ${r}'s image is of step ${image.step}, its head of step ${plan.step}`);
    if (image.parts !== head.parts && JSON.stringify(image.parts) !== JSON.stringify(head.parts)) throw new StateError(`restoreFromImages: old rank ${r}'s image holds other parts than its head`);
    const end = image.parts.reduce((m, q) => Math.max(m, q.at + q.count * dtypeSize(q.dtype)), 0);
    if (image.data.byteLength < end) throw new StateError(`restoreFromImages: old rank ${r}'s image holds ${image.data.byteLength} bytes, its parts ${end}`);
  }
  const first = plan.heads[0]!.state;
  const state = rankState(items, true);
  const world = worldOf(items);
  const sameLayout = oldWorld === (world?.size ?? 1) && JSON.stringify(opts.oldLayout ?? null) === JSON.stringify(items.layout ?? null);
  const rngFrom = plan.heads[sameLayout ? (world?.rank ?? 0) : 0]!.state.rng ?? {};

  // What may refuse first (a loader or schedule that rejects its position), then the tensors.
  if (items.loader && first.loader !== undefined) items.loader.loadState(json(first.loader) as never);
  if (items.scheduler && first.scheduler !== undefined) items.scheduler.loadState(json(first.scheduler) as never);
  if (items.scaler && first.scaler) items.scaler.loadStateDict(first.scaler);
  const bytes = plan.parts.reduce((s, { part }) => s + part.count * dtypeSize(part.tensor.dtype), 0);
  traceSpan('recovery reshard', () => {
    // A part of few pieces goes straight from the images' bytes into the tensor (no staging copy); one
    // of many (a tensor-parallel slice's rows) is assembled in host memory first and written at once.
    let scratch: Uint8Array | null = null;
    for (const { part, pieces } of plan.parts) {
      const t = part.tensor, size = dtypeSize(t.dtype);
      t.markModified();
      if (pieces.length <= 16) {
        for (const p of pieces) t.backend.write(t.storage, (part.offset + p.to - part.start) * size, pieceBytes(fetched.get(p.rank)!, p, t.dtype));
        continue;
      }
      if (!scratch || scratch.byteLength < part.count * size) scratch = new Uint8Array(part.count * size);
      const host = scratch.subarray(0, part.count * size);
      for (const p of pieces) host.set(pieceBytes(fetched.get(p.rank)!, p, t.dtype), (p.to - part.start) * size);
      t.backend.write(t.storage, part.offset * size, host);
    }
  }, 'checkpoint', { step: plan.step, bytes });

  const steps = new Map<string, number>();
  for (const h of plan.heads) for (const [name, n] of h.state.steps) if (n !== null) steps.set(name, n);
  for (const s of state.steps) { const n = steps.get(s.name); if (n !== undefined) s.set(n); }
  const saved = first.optimizers[0];
  if (state.optimizer && saved && saved.groups.length === state.optimizer.paramGroups.length) {
    state.optimizer.paramGroups.forEach((g, i) => Object.assign(g.options as object, json(saved.groups[i])));
    if (saved.gradScale !== undefined) (state.optimizer as unknown as { gradScale: number }).gradScale = saved.gradScale;
  }
  for (const [name, g] of Object.entries(items.rng ?? {})) if (rngFrom[name]) g.loadState(rngFrom[name]);
  items.masterWeights?.refresh();
  return { step: plan.step, ranks: plan.ranks };
}
