// The on-disk layout of a checkpoint (docs/checkpoint-format.md writes it down): the names of its
// directories and files, the manifest and the ranks' records, and what a reader checks before it
// trusts a checkpoint (a manifest of this format and version, files of the size and CRC-32 it names).
import { closeSync, existsSync, openSync, readdirSync, readFileSync, readSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { ArgumentError, StateError } from '../errors.js';
import type { DType } from '../dtype.js';
import { DTYPE_OF_SAFETENSORS, type SafetensorsDType } from '../io/safetensors.js';
import type { TensorSplit } from '../nn/module.js';

/** One saved part of a global tensor: where it is stored and which elements it holds. */
export interface ManifestPart {
  /** The rank file (safetensors) holding it. */
  file: string;
  /** Its tensor name in that file (`<key>@<first element>`). */
  name: string;
  /** The tensor-parallel split it is a slice of, or null for the whole tensor. */
  split: TensorSplit | null;
  /** First element of the (split) tensor held. */
  start: number;
  /** Number of elements held. */
  count: number;
}
/** A saved global tensor: its shape, dtype and the parts that tile it. */
export interface ManifestTensor {
  /** Shape of the whole tensor. */
  shape: number[];
  /** The dtype it is stored in. */
  dtype: SafetensorsDType;
  /** The parts, which together hold every element exactly once. */
  parts: ManifestPart[];
}
/** The manifest.json of a complete checkpoint. */
export interface Manifest {
  /** Format marker. */
  format: 'nodetron-checkpoint';
  /** Format version. */
  version: 1;
  /** The training step saved. */
  step: number;
  /** Random id shared by every rank's files of one save. */
  saveId: string;
  /** Number of ranks that saved. */
  worldSize: number;
  /** When the checkpoint was committed (ISO 8601). */
  createdAt: string;
  /** The saving run's layout, as given in CheckpointItems.layout. */
  layout: unknown;
  /** The rank files, with their sizes (bytes) and CRC-32s. */
  files: Array<{
    /** File name within the checkpoint directory. */
    file: string;
    /** Size in bytes. */
    size: number;
    /** CRC-32 of the whole file. */
    crc32: number;
  }>;
  /** Every saved global tensor by key (`model/<name>`, `optim/<state>/<name>`). */
  tensors: Record<string, ManifestTensor>;
  /** Optimizer hyperparameters and step counts. */
  optimizer: {
    /** Each parameter group's hyperparameters (null: no optimizer saved). */
    groups: Array<Record<string, unknown>> | null;
    /** Step count of each parameter's optimizer state, by parameter name. */
    steps: Record<string, number>;
  };
  /** The JSON state of the loader, schedule, scaler and `extra`. */
  state: {
    /** The data loader's state(). */
    loader?: unknown;
    /** The schedule's state(). */
    scheduler?: unknown;
    /** The GradScaler's stateDict(). */
    scaler?: unknown;
    /** CheckpointItems.extra. */
    extra?: unknown;
  };
  /** Per rank: its random generators. */
  ranks: Array<{
    /** Generator states (Generator.state()) by name. */
    rng: Record<string, {
      /** The seed, as a decimal string. */
      seed: string;
      /** Philox blocks consumed. */
      offsetBlocks: number;
    }>;
  }>;
}

/**
 * A rank's record of one save (`rank-<r>.json` in the save's temporary directory): rank 0's commit
 * reads every rank's and builds the manifest from them. It is not kept in a committed checkpoint's
 * meaning: a reader goes by manifest.json only.
 */
export interface RankRecord {
  /** The id of the save it belongs to (a record with another id is a leftover and is not used). */
  saveId: string;
  /** The rank that wrote it. */
  rank: number;
  /** The rank's safetensors file. */
  file: string;
  /** That file's size in bytes. */
  size: number;
  /** That file's CRC-32. */
  crc32: number;
  /** The parts the file holds. */
  parts: Array<{
    /** The global tensor's key (`model/<name>`, `optim/<state>/<name>`). */
    key: string;
    /** The tensor name in the file (`<key>@<start>`). */
    name: string;
    /** The global tensor's shape. */
    shape: number[];
    /** The dtype stored. */
    dtype: SafetensorsDType;
    /** The tensor-parallel split it is a slice of, or null. */
    split: TensorSplit | null;
    /** First element of the (split) tensor held. */
    start: number;
    /** Number of elements held. */
    count: number;
  }>;
  /** Step count of each parameter's optimizer state that this rank holds, by parameter name. */
  steps: Record<string, number>;
  /** This rank's random generators, by name. */
  rng: Record<string, { seed: string; offsetBlocks: number }>;
}

/** A checkpoint whose files are missing, truncated or corrupt: loadLatest skips it for an older one. */
export class DamagedCheckpointError extends StateError {}

const STEP_DIR = /^step-(\d+)$/;
/** The file whose presence makes a step directory a checkpoint. */
export const MANIFEST = 'manifest.json';
/** The directory name of a step's checkpoint: `step-` and the step zero-padded to 8 digits. */
export const stepDirName = (step: number): string => {
  if (!Number.isSafeInteger(step) || step < 0) throw new ArgumentError(`checkpoint: step must be an integer >= 0, got ${String(step)}`);
  return `step-${String(step).padStart(8, '0')}`;
};

/** The dtype a stored safetensors dtype loads as (lib/io/safetensors.ts's one table). */
export const NT_DTYPE_OF = DTYPE_OF_SAFETENSORS;

/** The directory a save of `step` is written in before its commit renames it to stepDirName(step). */
export const tmpDirName = (step: number): string => `.tmp-${stepDirName(step)}`;
/** Rank `rank`'s safetensors file: `rank-` and the rank zero-padded to 5 digits. */
export const rankFileName = (rank: number): string => `rank-${String(rank).padStart(5, '0')}.safetensors`;
/** Rank `rank`'s record of a save (in the temporary directory only). */
export const rankRecordName = (rank: number): string => `rank-${String(rank).padStart(5, '0')}.json`;

/** The complete checkpoints under `root`, newest first. */
export function listCheckpoints(root: string): Array<{
  /** The checkpoint's step. */
  step: number;
  /** Its directory. */
  dir: string;
}> {
  if (typeof root !== 'string' || root === '') throw new ArgumentError(`checkpoint: root must be a directory path, got ${typeof root}`);
  if (!existsSync(root)) return [];
  return readdirSync(root)
    .map((name) => ({ m: STEP_DIR.exec(name), name }))
    .filter(({ m, name }) => m && existsSync(join(root, name, MANIFEST)))
    .map(({ m, name }) => ({ step: Number(m![1]), dir: join(root, name) }))
    .sort((a, b) => b.step - a.step);
}

/** The newest complete checkpoint under `root` (its manifest present), or null. */
export function latest(root: string): {
  /** The checkpoint's step. */
  step: number;
  /** Its directory. */
  dir: string;
} | null {
  return listCheckpoints(root)[0] ?? null;
}

/** Reads and checks a checkpoint's manifest. */
export function readManifest(dir: string): Manifest {
  const path = join(dir, MANIFEST);
  let m: Manifest;
  try { m = JSON.parse(readFileSync(path, 'utf8')) as Manifest; } catch (e) { throw new DamagedCheckpointError(`checkpoint: cannot read ${path}: ${(e as Error).message}`); }
  if (m?.format !== 'nodetron-checkpoint' || m.version !== 1 || typeof m.tensors !== 'object' || !Array.isArray(m.files)) {
    throw new DamagedCheckpointError(`checkpoint: ${path} is not a nodetron checkpoint manifest (version 1)`);
  }
  return m;
}

/** Checks a rank file against its manifest entry: present, its size, and (with `checksum`) its CRC-32. */
export function verifyFile(dir: string, entry: Manifest['files'][number], checksum: boolean): void {
  const path = join(dir, entry.file);
  let size: number;
  try { size = statSync(path).size; } catch { throw new DamagedCheckpointError(`checkpoint ${dir}: ${entry.file} is missing`); }
  if (size !== entry.size) throw new DamagedCheckpointError(`checkpoint ${dir}: ${entry.file} has ${size} bytes, the manifest says ${entry.size} (truncated or overwritten)`);
  if (!checksum) return;
  const fd = openSync(path, 'r');
  try {
    const buf = Buffer.allocUnsafe(8 << 20);
    let crc = 0, at = 0;
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, at);
      if (n === 0) break;
      crc = crc32(buf.subarray(0, n), crc);
      at += n;
    }
    if (crc >>> 0 !== entry.crc32) throw new DamagedCheckpointError(`checkpoint ${dir}: ${entry.file} fails its checksum (CRC-32 ${(crc >>> 0).toString(16)}, the manifest says ${entry.crc32.toString(16)})`);
  } finally {
    closeSync(fd);
  }
}
