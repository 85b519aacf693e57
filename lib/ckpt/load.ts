// Loading a checkpoint under this run's layout, whatever the saving run's was: the manifest and the
// files a rank needs are checked before any tensor is touched, then each local part is filled from
// whichever saved parts cover its elements (lib/ckpt/intervals.ts), converting bf16/f16 as needed.
import { traceSpan } from '../observe/trace.js';
import { join } from 'node:path';
import { ShapeError, StateError } from '../errors.js';
import { dtypeSize } from '../dtype.js';
import { tensor } from '../creation.js';
import { copyElements } from '../parallel/flat.js';
import { valuesOf } from '../io/tensor-bytes.js';
import { SafetensorsFile, type SafetensorsDType } from '../io/safetensors.js';
import { checkSplit, cover, partIntervals, type Interval, type Source } from './intervals.js';
import type { StatePart } from './parts.js';
import { DamagedCheckpointError, NT_DTYPE_OF, readManifest, verifyFile, type ManifestPart, type ManifestTensor } from './format.js';
import { rankState, worldOf, type CheckpointItems } from './items.js';

/** What a load returns. */
export interface LoadResult {
  /** The step of the checkpoint loaded. */
  step: number;
  /** The checkpoint's directory. */
  dir: string;
  /** The `extra` saved with it. */
  extra: unknown;
  /** Whether the optimizer state was loaded (false when the checkpoint has none: the optimizer starts fresh). */
  optimizerLoaded: boolean;
}

/**
 * One global tensor of a checkpoint, whole, as a Float32Array (f32/bf16/f16 saved) — for tools and
 * tests; training loads through load().
 */
export function readTensor(dir: string, key: string): {
  /** Shape of the whole tensor. */
  shape: number[];
  /** Its elements, row-major, widened to f32. */
  data: Float32Array;
} {
  const m = readManifest(dir);
  const t = m.tensors[key];
  if (!t) throw new StateError(`checkpoint ${dir}: no tensor '${key}'`);
  const size = t.shape.reduce((a, b) => a * b, 1);
  const out = new Float32Array(size);
  const wanted: Interval[] = [{ global: 0, local: 0, length: size }];
  const files = new Map<string, SafetensorsFile>();
  try {
    for (const piece of cover(wanted, sourcesOf(t, key), `checkpoint ${dir}: '${key}'`)) {
      const f = files.get(piece.item.file) ?? SafetensorsFile.open(join(dir, piece.item.file));
      files.set(piece.item.file, f);
      const raw = readElements(f, piece.item.name, t.dtype, piece.from - piece.item.start, piece.length);
      out.set(decodeToF32(raw, t.dtype, `'${key}'`), piece.to);
    }
  } finally {
    for (const f of files.values()) f.close();
  }
  return { shape: t.shape, data: out };
}

function sourcesOf(t: ManifestTensor, key: string): Source<ManifestPart>[] {
  return t.parts.map((p) => {
    checkSplit(t.shape, p.split, `checkpoint tensor '${key}'`);
    return { item: p, intervals: partIntervals(t.shape, p) };
  });
}

function readElements(f: SafetensorsFile, name: string, dtype: SafetensorsDType, from: number, count: number): Uint8Array {
  const size = dtypeSize(NT_DTYPE_OF[dtype]!);
  return f.readBytes(name, from * size, count * size);
}

function decodeToF32(raw: Uint8Array, dtype: SafetensorsDType, what: string): Float32Array {
  if (dtype === 'F32') {
    const aligned = raw.byteOffset % 4 === 0 ? raw : raw.slice();
    return new Float32Array(aligned.buffer, aligned.byteOffset, aligned.byteLength / 4);
  }
  // bf16 and f16 widen through the cpu backend's cast (native/core/half.h), as model imports do.
  if (dtype === 'BF16' || dtype === 'F16') return valuesOf(raw, [raw.byteLength / 2], NT_DTYPE_OF[dtype]!);
  throw new StateError(`checkpoint: ${what} is saved as ${dtype}, which cannot be converted here`);
}

/** Loads the checkpoint in `dir` into `items` (this rank's part of them); nothing is exchanged. */
export function loadCheckpoint(dir: string, items: CheckpointItems, opts: { verify?: boolean }): LoadResult {
  return traceSpan('checkpoint load', () => readCheckpoint(dir, items, opts), 'checkpoint', { dir });
}

/** The model family that tensor names (checkpoint keys) belong to: the GPT's wte/h.N, Llama's embedTokens/layers.N (with MoE blocks: a router); null for neither. */
function modelFamily(keys: readonly string[]): string | null {
  const named = (re: RegExp) => keys.some((k) => re.test(k.replace(/^[a-z]+\//, '')));
  if (named(/^(wte\.weight|h\.\d+\.)/)) return 'GPT';
  if (named(/^(embedTokens\.weight|layers\.\d+\.selfAttn\.)/)) return named(/^layers\.\d+\.mlp\.router$/) ? 'Llama with mixture-of-experts blocks (Mixtral, Qwen2-MoE)' : 'Llama';
  return null;
}

function readCheckpoint(dir: string, items: CheckpointItems, opts: { verify?: boolean }): LoadResult {
  const m = readManifest(dir);
  const state = rankState(items, true);
  const hasOptimizerState = Object.keys(m.tensors).some((k) => k.startsWith('optim/'));
  const parts = state.parts.filter((p) => hasOptimizerState || !p.key.startsWith('optim/'));

  // Everything checked before any tensor is written: a failed load leaves the run as it was.
  const plans: Array<{ part: StatePart; t: ManifestTensor; pieces: ReturnType<typeof cover<ManifestPart>> }> = [];
  const sources = new Map<string, Source<ManifestPart>[]>();
  for (const part of parts) {
    const t = m.tensors[part.key];
    // A parameter the optimizer had not updated yet when the checkpoint was saved starts fresh.
    if (!t && part.key.startsWith('optim/')) continue;
    if (!t) {
      const saved = modelFamily(Object.keys(m.tensors)), loading = modelFamily(parts.map((p) => p.key));
      if (saved && loading && saved !== loading) throw new StateError(`checkpoint ${dir}: it holds a ${saved} model, and the model loading it is a ${loading}; load it into a model of the family it was saved from`);
      throw new StateError(`checkpoint ${dir}: it has no '${part.key}' (saved from another model?)`);
    }
    if (!NT_DTYPE_OF[t.dtype] || (t.dtype !== 'F32' && t.dtype !== 'BF16' && t.dtype !== 'F16' && NT_DTYPE_OF[t.dtype] !== part.tensor.dtype)) {
      throw new StateError(`checkpoint ${dir}: '${part.key}' is saved as ${t.dtype}, which cannot be loaded into ${part.tensor.dtype}`);
    }
    if (t.shape.join() !== part.fullShape.join()) {
      throw new ShapeError(`checkpoint ${dir}: '${part.key}' was saved with shape [${t.shape.join(', ')}], this model's is [${part.fullShape.join(', ')}]`);
    }
    if (!sources.has(part.key)) sources.set(part.key, sourcesOf(t, part.key));
    const wanted = partIntervals(part.fullShape, part);
    plans.push({ part, t, pieces: cover(wanted, sources.get(part.key)!, `checkpoint ${dir}: '${part.key}'`) });
  }
  const needed = new Set(plans.flatMap((p) => p.pieces.map((x) => x.item.file)));
  const byFile = new Map(m.files.map((f) => [f.file, f]));
  for (const file of needed) {
    const entry = byFile.get(file);
    if (!entry) throw new StateError(`checkpoint ${dir}: the manifest names ${file} among the parts but not among the files`);
    verifyFile(dir, entry, opts.verify ?? true);
  }
  // The non-tensor state next: a loader or schedule that refuses its state fails before any tensor changes.
  if (items.loader && m.state.loader !== undefined) items.loader.loadState(m.state.loader as never);
  if (items.scheduler && m.state.scheduler !== undefined) items.scheduler.loadState(m.state.scheduler as never);
  if (items.scaler && m.state.scaler !== undefined) items.scaler.loadStateDict(m.state.scaler as { scale: number; growthTracker: number });

  const files = new Map<string, SafetensorsFile>();
  // One scratch buffer for every part (fresh buffers would page-fault on every load).
  const scratch = new Uint8Array(Math.max(8, ...plans.map(({ part, t }) => part.count * dtypeSize(NT_DTYPE_OF[t.dtype] ?? 'f32'))));
  try {
    for (const { part, t, pieces } of plans) {
      const size = dtypeSize(NT_DTYPE_OF[t.dtype] ?? 'f32');
      const host = scratch.subarray(0, part.count * size);
      for (const piece of pieces) {
        let f = files.get(piece.item.file);
        if (!f) {
          try { f = SafetensorsFile.open(join(dir, piece.item.file)); } catch (e) { throw new DamagedCheckpointError((e as Error).message); }
          files.set(piece.item.file, f);
        }
        f.readBytes(piece.item.name, (piece.from - piece.item.start) * size, piece.length * size, host.subarray(piece.to * size - part.start * size, (piece.to - part.start + piece.length) * size));
      }
      writePart(part, host, t.dtype, dir);
    }
  } finally {
    for (const f of files.values()) f.close();
  }

  if (hasOptimizerState) {
    for (const s of state.steps) { const n = m.optimizer.steps[s.name]; if (n !== undefined) s.set(n); }
    const groups = m.optimizer.groups;
    if (state.optimizer && groups && groups.length === state.optimizer.paramGroups.length) {
      state.optimizer.paramGroups.forEach((g, i) => Object.assign(g.options as object, groups[i]));
    }
  }
  if (items.rng) {
    const world = worldOf(items);
    const rank = world?.rank ?? 0;
    // The same layout: each rank its own generators; another layout: rank 0's (draws then differ from an uninterrupted run).
    const sameLayout = m.worldSize === (world?.size ?? 1) && JSON.stringify(m.layout ?? null) === JSON.stringify(items.layout ?? null);
    const saved = m.ranks[sameLayout ? rank : 0]?.rng ?? {};
    for (const [name, g] of Object.entries(items.rng)) if (saved[name]) g.loadState(saved[name]);
  }
  items.masterWeights?.refresh();
  return { step: m.step, dir, extra: m.state.extra, optimizerLoaded: hasOptimizerState };
}

/** Writes a part's bytes (saved as `dtype`) into its tensor, converting when the dtypes differ. */
function writePart(part: StatePart, host: Uint8Array, dtype: SafetensorsDType, dir: string): void {
  const t = part.tensor;
  t.markModified();
  if (NT_DTYPE_OF[dtype] === t.dtype) {
    t.backend.write(t.storage, part.offset * dtypeSize(t.dtype), host);
    return;
  }
  const f32 = decodeToF32(host, dtype, `checkpoint ${dir}: '${part.key}'`);
  using wide = tensor(f32, [part.count]);
  using conv = wide.to({ dtype: t.dtype, device: t.device });
  if (conv.dtype !== t.dtype) throw new StateError(`checkpoint ${dir}: cannot convert '${part.key}' to ${t.dtype}`);
  copyElements(t, part.offset, conv, 0, part.count);
}
