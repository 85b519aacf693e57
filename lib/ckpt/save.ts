// The save pipeline of one rank. Stage 1 (training waits for it): this rank's parts of the global
// tensors copied into a host staging buffer, with the step counts, random generators and, on rank 0,
// what every rank holds the same (optimizer hyperparameters, loader/schedule/scaler positions).
// Stage 2 (in the background): the writer thread writes the rank's safetensors file from that buffer,
// then the rank's record goes next to it for rank 0's commit (lib/ckpt/commit.ts).
import { traceSpan } from '../observe/trace.js';
import { join } from 'node:path';
import { ArgumentError } from '../errors.js';
import { dtypeSize } from '../dtype.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { encodeHeader, SAFETENSORS_DTYPE_OF } from '../io/safetensors.js';
import type { RankState } from './parts.js';
import { rankState, type CheckpointItems } from './items.js';
import { NT_DTYPE_OF, rankFileName, rankRecordName, type Manifest, type RankRecord } from './format.js';
import { writeJsonDurably } from './commit.js';
import type { FileWriter } from './writer.js';

/** Stage 1's result: this rank's state in host memory, ready to be written. */
export interface Snapshot {
  /** The parts copied, in the staging buffer's order. */
  parts: RankRecord['parts'];
  /** The host buffer holding them (reused from save to save; the caller keeps it). */
  staging: SharedArrayBuffer;
  /** Bytes of the staging buffer in use. */
  length: number;
  /** Step count of this rank's optimizer states, by parameter name. */
  steps: Record<string, number>;
  /** This rank's random generators. */
  rng: RankRecord['rng'];
  /** On rank 0: its part of the manifest (null elsewhere). */
  common: Pick<Manifest, 'optimizer' | 'state' | 'layout'> | null;
}

/**
 * Stage 1: copies this rank's parts of `items` into the host staging buffer, `staging` when it is
 * large enough (a fresh buffer's first touch costs page faults that would stall training far longer
 * than the copy itself).
 */
export function takeSnapshot(items: CheckpointItems, step: number, rank: number, staging: SharedArrayBuffer | null): Snapshot {
  const state = rankState(items, false);
  const saved = state.parts.filter((p) => p.save && p.count > 0);
  for (const p of saved) if (!SAFETENSORS_DTYPE_OF[p.tensor.dtype]) throw new ArgumentError(`checkpoint save: ${p.key} is ${p.tensor.dtype}, which checkpoints do not store`);
  const length = saved.reduce((s, p) => s + p.count * dtypeSize(p.tensor.dtype), 0);
  const buffer = staging && staging.byteLength >= length ? staging : new SharedArrayBuffer(Math.max(length, 8));
  const parts: RankRecord['parts'] = [];
  let at = 0;
  traceSpan('checkpoint snapshot', () => {
    for (const p of saved) {
      const size = dtypeSize(p.tensor.dtype);
      p.tensor.backend.read(p.tensor.storage, p.offset * size, new Uint8Array(buffer, at, p.count * size));
      at += p.count * size;
      parts.push({ key: p.key, name: `${p.key}@${p.start}`, shape: p.fullShape, dtype: SAFETENSORS_DTYPE_OF[p.tensor.dtype]!, split: p.split, start: p.start, count: p.count });
    }
  }, 'checkpoint', { step, bytes: length });
  const steps: Record<string, number> = {};
  for (const s of state.steps) { const n = s.get(); if (n !== null) steps[s.name] = n; }
  const rng = Object.fromEntries(Object.entries(items.rng ?? {}).map(([k, g]) => [k, g.state()]));
  const common = rank === 0 ? sharedState(items, state) : null;
  return { parts, staging: buffer, length, steps, rng, common };
}

/** The safetensors header of a rank's file: one flat tensor per part, the step and rank in its metadata. */
export function encodeRankHeader(snap: Snapshot, step: number, rank: number): Uint8Array {
  const { header } = encodeHeader(snap.parts.map((p) => ({ name: p.name, dtype: p.dtype, shape: [p.count] })),
    snap.parts.map((p) => p.count * dtypeSize(NT_DTYPE_OF[p.dtype]!)), { format: 'nodetron', step: String(step), rank: String(rank) });
  return header;
}

/** Stage 2: writes the rank's file (header, then the staging buffer) and then its record, both into `tmp`. */
export async function writeRankFiles(writer: FileWriter, tmp: string, header: Uint8Array, snap: Snapshot,
  o: { step: number; rank: number; saveId: string }): Promise<void> {
  const file = rankFileName(o.rank);
  const written = await traceSpan('checkpoint write', () => writer.write(join(tmp, file), header, snap.staging, snap.length), 'checkpoint', { step: o.step, bytes: snap.length });
  const record: RankRecord = { saveId: o.saveId, rank: o.rank, file, size: written.size, crc32: written.crc32, parts: snap.parts, steps: snap.steps, rng: snap.rng };
  writeJsonDurably(join(tmp, rankRecordName(o.rank)), record);
}

/** Rank 0's part of the manifest: what every rank holds the same. */
function sharedState(items: CheckpointItems, state: RankState): Pick<Manifest, 'optimizer' | 'state' | 'layout'> {
  const groups = state.optimizer ? state.optimizer.paramGroups.map((g) => ({ ...(g.options as unknown as Record<string, unknown>) })) : null;
  const json = (v: unknown) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)) as unknown);
  return {
    optimizer: { groups, steps: {} },
    state: { loader: json(items.loader?.state()), scheduler: json(items.scheduler?.state()), scaler: json(items.scaler?.stateDict()), extra: json(items.extra) },
    layout: json(items.layout) ?? null,
  };
}

/**
 * A save's id, the same on every rank: rank 0's two random 24-bit draws (the others pass 0) are
 * max-reduced in the agreement that starts the save, so the id keeps all 48 random bits at any world
 * size and a rank's leftovers from a crashed save are never mistaken for this one's.
 */
export function saveIdDraws(world: CollectiveGroup | null): number[] {
  const draw = () => (world && world.rank !== 0 ? 0 : Math.floor(Math.random() * 2 ** 24));
  return [draw(), draw()];
}
