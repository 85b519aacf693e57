// A rank's in-memory image (in-job recovery, issue #37): everything this rank needs to go on
// bit-exactly after a rollback under the same layout, copied into one host buffer: every part of the
// training state it loads (lib/ckpt/items.ts's rankState for a load: replicas included, not only the
// parts it would save), the optimizer step counts and every optimizer's group options, the random
// generators, the loader, schedule and scaler positions, and what the trainer holds beyond its
// training state (its bucket order and step count: ParallelTrainer.recoveryState). restoreImage checks
// that the image fits this rank's state before it writes anything. encodeImage/decodeImage give one
// contiguous byte layout (a small JSON header, then the tensor bytes) that a holder keeps opaquely.
import { StateError } from '../errors.js';
import { dtypeSize, type DType } from '../dtype.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { TrainerHoldings, TrainerRecoveryState } from '../parallel/trainer.js';
import { traceSpan } from '../observe/trace.js';
import type { RankState } from './parts.js';
import { rankState, type CheckpointItems } from './items.js';

/** One part of an image: `count` elements at element `offset` of the tensor of global tensor `key`'s part starting at `start`. */
export interface ImagePart {
  /** The global tensor's name (`model/<name>`, `optim/<state>/<name>`). */
  key: string;
  /** First element of the global tensor held. */
  start: number;
  /** Number of elements. */
  count: number;
  /** Element offset in the local tensor. */
  offset: number;
  /** The local tensor's dtype (the bytes are stored as they are). */
  dtype: DType;
  /** Byte offset of the part's bytes in the image's data. */
  at: number;
}

/** What an image holds besides the tensor bytes (JSON). */
export interface ImageState {
  /** Each optimizer state's step count, by parameter name, in the rank state's order. */
  steps: Array<[string, number | null]>;
  /** Every optimizer's parameter groups' options (lr, betas, ...) and its gradScale, in a fixed order. */
  optimizers: Array<{ groups: Record<string, unknown>[]; gradScale?: number }>;
  /** The random generators' states, by name. */
  rng: Record<string, { seed: string; offsetBlocks: number }>;
  /** The loader's position (undefined: none). */
  loader?: unknown;
  /** The schedule's position. */
  scheduler?: unknown;
  /** The loss scaler's state. */
  scaler?: { scale: number; growthTracker: number };
  /** The trainer's state beyond its training state (ParallelTrainer.recoveryState), when it has one. */
  trainer?: TrainerRecoveryState;
}

/** A rank's whole state after step `step`, in host memory. */
export interface RankImage {
  /** The completed step the image was taken after. */
  step: number;
  /** The tensor parts, in the rank state's order. */
  parts: ImagePart[];
  /** The parts' bytes, back to back (a view of `data.buffer` from byte 0 when taken here). */
  data: Uint8Array;
  /** Everything else. */
  state: ImageState;
}

/** A model that can say what it holds beyond its training state (ParallelTrainer). */
interface RecoverableModel {
  recoveryState(): TrainerRecoveryState;
  loadRecoveryState(s: TrainerRecoveryState): void;
  checkpointHoldings(): TrainerHoldings<{ lr: number }>;
}

const recoverable = (items: CheckpointItems): RecoverableModel | null => {
  const m = items.model as Partial<RecoverableModel>;
  return typeof m.recoveryState === 'function' && typeof m.loadRecoveryState === 'function' ? (m as RecoverableModel) : null;
};

/** Every optimizer of the items, each once, in a fixed order (a trainer's dense and expert optimizers, or the Module's). */
function optimizersOf(items: CheckpointItems, state: RankState): Optimizer<{ lr: number }>[] {
  const m = recoverable(items) ?? (items.model as Partial<RecoverableModel>);
  const found: (Optimizer<{ lr: number }> | null | undefined)[] = [state.optimizer, items.optimizer];
  if (typeof m.checkpointHoldings === 'function') {
    const h = m.checkpointHoldings();
    found.push(h.optimizer, h.zero?.inner, h.experts?.optimizer, h.experts?.zero?.inner);
  }
  return [...new Set(found.filter((o): o is Optimizer<{ lr: number }> => !!o))];
}

const json = <T>(v: T): T => (v === undefined ? v : JSON.parse(JSON.stringify(v)) as T);

/**
 * Copies this rank's whole state (see the file's comment) after `step` completed steps into an image.
 * `reuse`: an earlier image whose buffer is reused when large enough (double-buffering: a fresh
 * buffer every step would cost page faults); it must not be in use any more (being sent, restored).
 */
export function takeImage(items: CheckpointItems, step: number, reuse?: RankImage): RankImage {
  const state = rankState(items, true);
  const parts = state.parts.filter((p) => p.count > 0);
  const length = parts.reduce((s, p) => s + p.count * dtypeSize(p.tensor.dtype), 0);
  const old = reuse?.data;
  const data = old && old.byteOffset === 0 && old.buffer.byteLength >= length && !(old.buffer instanceof SharedArrayBuffer)
    ? new Uint8Array(old.buffer, 0, length) : new Uint8Array(new ArrayBuffer(Math.max(length, 8)), 0, length);
  const out: ImagePart[] = [];
  traceSpan('recovery image', () => {
    let at = 0;
    for (const p of parts) {
      const size = dtypeSize(p.tensor.dtype), bytes = p.count * size;
      p.tensor.backend.read(p.tensor.storage, p.offset * size, data.subarray(at, at + bytes));
      out.push({ key: p.key, start: p.start, count: p.count, offset: p.offset, dtype: p.tensor.dtype, at });
      at += bytes;
    }
  }, 'checkpoint', { step, bytes: length });
  const trainer = recoverable(items);
  return {
    step,
    parts: out,
    data,
    state: {
      steps: state.steps.map((s) => [s.name, s.get()]),
      optimizers: optimizersOf(items, state).map((o) => {
        const gradScale = (o as unknown as { gradScale?: unknown }).gradScale;
        return { groups: o.paramGroups.map((g) => json({ ...(g.options as unknown as Record<string, unknown>) })), ...(typeof gradScale === 'number' ? { gradScale } : {}) };
      }),
      rng: Object.fromEntries(Object.entries(items.rng ?? {}).map(([k, g]) => [k, g.state()])),
      ...(items.loader ? { loader: json(items.loader.state()) } : {}),
      ...(items.scheduler ? { scheduler: json(items.scheduler.state()) } : {}),
      ...(items.scaler ? { scaler: json(items.scaler.stateDict()) } : {}),
      ...(trainer ? { trainer: json(trainer.recoveryState()) } : {}),
    },
  };
}

/**
 * Puts `image` back into `items`: the tensors' bytes, step counts, optimizer options, generators,
 * loader/schedule/scaler positions, the trainer's bucket order; then the bf16/f16 compute copies are
 * refreshed. Everything is checked first (the same parts: keys, counts, offsets, dtypes; the same
 * optimizers, step counters and generators); an image of another layout or model is a StateError
 * and leaves the run as it was. Between steps (after a failed one: ParallelTrainer.abandonStep first).
 */
export function restoreImage(items: CheckpointItems, image: RankImage): void {
  const state = rankState(items, true);
  const parts = state.parts.filter((p) => p.count > 0);
  const differs = (what: string): StateError => new StateError(`restoreImage: the image (step ${image.step}) was taken under another layout or model: ${what}`);
  if (!image || !Array.isArray(image.parts) || !(image.data instanceof Uint8Array) || !image.state) throw new StateError('restoreImage: not an image (takeImage or decodeImage makes one)');
  if (image.parts.length !== parts.length) throw differs(`it has ${image.parts.length} parts, this rank ${parts.length}`);
  let at = 0;
  parts.forEach((p, i) => {
    const q = image.parts[i]!;
    if (q.key !== p.key || q.start !== p.start || q.count !== p.count || q.offset !== p.offset || q.dtype !== p.tensor.dtype || q.at !== at) {
      throw differs(`part ${i} is '${q.key}' [${q.start}, +${q.count}) ${q.dtype} at ${q.offset}, here '${p.key}' [${p.start}, +${p.count}) ${p.tensor.dtype} at ${p.offset}`);
    }
    at += p.count * dtypeSize(p.tensor.dtype);
  });
  if (image.data.byteLength !== at) throw differs(`it holds ${image.data.byteLength} bytes, this rank's parts ${at}`);
  const s = image.state;
  if (s.steps.length !== state.steps.length || s.steps.some(([n], i) => n !== state.steps[i]!.name)) throw differs('its optimizer step counters are of other parameters');
  const optimizers = optimizersOf(items, state);
  if (s.optimizers.length !== optimizers.length || s.optimizers.some((o, i) => o.groups.length !== optimizers[i]!.paramGroups.length)) throw differs('its optimizers have other parameter groups');
  const rng = Object.entries(items.rng ?? {});
  for (const [name] of rng) if (!s.rng[name]) throw differs(`it has no random generator '${name}'`);
  const trainer = recoverable(items);
  if (trainer && !s.trainer) throw differs('it has no trainer state');
  const buckets = trainer?.recoveryState().buckets;
  if (trainer && (s.trainer!.buckets.length !== buckets!.length || s.trainer!.buckets.some((b, i) => (b === null) !== (buckets![i] === null) || (b && b.order.length !== buckets![i]!.order.length)))) {
    throw differs('its gradient buckets are of other parameters');
  }

  // What may still refuse first (the trainer's buckets while a step is in flight: call abandonStep;
  // a loader or schedule that rejects its position), then the tensors.
  if (trainer) trainer.loadRecoveryState(json(s.trainer!));
  if (items.loader && s.loader !== undefined) items.loader.loadState(json(s.loader) as never);
  if (items.scheduler && s.scheduler !== undefined) items.scheduler.loadState(json(s.scheduler) as never);
  if (items.scaler && s.scaler) items.scaler.loadStateDict(s.scaler);
  traceSpan('recovery restore', () => {
    parts.forEach((p, i) => {
      const q = image.parts[i]!, size = dtypeSize(p.tensor.dtype);
      p.tensor.markModified();
      p.tensor.backend.write(p.tensor.storage, p.offset * size, image.data.subarray(q.at, q.at + p.count * size));
    });
  }, 'checkpoint', { step: image.step, bytes: at });
  s.steps.forEach(([, n], i) => { if (n !== null) state.steps[i]!.set(n); });
  optimizers.forEach((o, i) => {
    const saved = s.optimizers[i]!;
    o.paramGroups.forEach((g, k) => Object.assign(g.options as object, json(saved.groups[k])));
    if (saved.gradScale !== undefined) (o as unknown as { gradScale: number }).gradScale = saved.gradScale;
  });
  for (const [name, g] of rng) g.loadState(s.rng[name]!);
  items.masterWeights?.refresh();
}

const MAGIC = 0x494d544e; // 'NTMI' little-endian: a nodetron image

/**
 * An image as bytes: [magic u32][header length u32][JSON header][padding to 8][tensor bytes]. Two
 * pieces (the small head, and the image's own data, not copied): write them one after the other.
 */
export function encodeImage(image: RankImage): Uint8Array[] {
  const header = new TextEncoder().encode(JSON.stringify({ step: image.step, parts: image.parts, state: image.state, bytes: image.data.byteLength }));
  const headLength = Math.ceil((8 + header.byteLength) / 8) * 8;
  const head = new Uint8Array(headLength).fill(0x20, 8 + header.byteLength);
  const view = new DataView(head.buffer);
  view.setUint32(0, MAGIC, true);
  view.setUint32(4, header.byteLength, true);
  head.set(header, 8);
  return [head, image.data];
}

/**
 * The header of encodeImage's bytes without the tensor bytes: its step, part table and state (what
 * restoreFromImages plans from), from the image's first bytes. `need` is set instead when `bytes`
 * ends before the header does: fetch that many. A StateError for bytes that are not an image's start.
 */
export function decodeImageHead(bytes: Uint8Array): { head: { step: number; parts: ImagePart[]; state: ImageState } } | { need: number } {
  const bad = (why: string) => new StateError(`decodeImageHead: not a rank image (${why})`);
  if (!(bytes instanceof Uint8Array) || bytes.byteLength < 8) return { need: 8 };
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== MAGIC) throw bad('wrong magic');
  const n = view.getUint32(4, true);
  if (8 + n > bytes.byteLength) return { need: 8 + n };
  let h: { step: number; parts: ImagePart[]; state: ImageState };
  try { h = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as typeof h; } catch (e) { throw bad(`header: ${(e as Error).message}`); }
  if (!h || !Number.isInteger(h.step) || !Array.isArray(h.parts) || !h.state) throw bad('header without step, parts and state');
  return { head: { step: h.step, parts: h.parts, state: h.state } };
}

/** The image encodeImage's bytes hold; its data is a view of `bytes` (not copied). A StateError for bytes that are not one. */
export function decodeImage(bytes: Uint8Array): RankImage {
  const bad = (why: string) => new StateError(`decodeImage: not a rank image (${why})`);
  if (!(bytes instanceof Uint8Array) || bytes.byteLength < 8) throw bad('fewer than 8 bytes');
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (view.getUint32(0, true) !== MAGIC) throw bad('wrong magic');
  const n = view.getUint32(4, true);
  if (8 + n > bytes.byteLength) throw bad('truncated header');
  let h: { step: number; parts: ImagePart[]; state: ImageState; bytes: number };
  try { h = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as typeof h; } catch (e) { throw bad(`header: ${(e as Error).message}`); }
  const start = Math.ceil((8 + n) / 8) * 8;
  if (!h || !Number.isInteger(h.step) || !Array.isArray(h.parts) || !h.state || typeof h.bytes !== 'number') throw bad('header without step, parts, state and bytes');
  if (start + h.bytes !== bytes.byteLength) throw bad(`${bytes.byteLength - start} bytes of tensors where the header says ${h.bytes}`);
  return { step: h.step, parts: h.parts, state: h.state, data: bytes.subarray(start, start + h.bytes) };
}
