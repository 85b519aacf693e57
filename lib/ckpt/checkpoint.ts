// Sharded checkpoints of a training run under any layout, loadable under any other.
//
// A save is collective: every rank writes one safetensors file of the global-tensor parts it holds
// (each tensor part named `<key>@<first element>`), then a small rank-<r>.json (its parts, the file's
// size and CRC-32, its random generators). Rank 0 waits for all of them, checks that the parts tile
// every tensor exactly once, writes manifest.json and renames the directory from .tmp-step-N to
// step-N: a directory without a manifest is never taken for a checkpoint, so a crash mid-save leaves
// nothing that looks whole. Saves are two-stage (MegaScale, PyTorch DCP's async save): stage 1
// copies this rank's parts into host buffers (the only stall), stage 2 writes them from a worker
// thread while training goes on. One save is in flight at a time.
//
// A load reads the manifest, verifies the files it needs (size, CRC-32) before touching any tensor,
// and fills each local part from whichever saved parts cover its elements (lib/ckpt/intervals.ts),
// so TP × PP × DP × ZeRO layouts convert into one another and into a single process.
import { traceSpan } from '../observe/trace.js';
import { existsSync, fsyncSync, openSync, closeSync, readdirSync, readFileSync, readSync, renameSync, rmSync, statSync, mkdirSync, writeFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { crc32 } from 'node:zlib';
import { ArgumentError, ShapeError, StateError, TimeoutError } from '../errors.js';
import { dtypeSize, type DType } from '../dtype.js';
import { tensor } from '../creation.js';
import { copyElements } from '../parallel/flat.js';
import { valuesOf } from '../io/tensor-bytes.js';
import type { Module } from '../nn/module.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Generator } from '../random.js';
import type { GradScaler, MasterWeights } from '../amp.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { agree, agreeAll, agreementDevice, formatRanks } from '../distributed/agree.js';
import { encodeHeader, SafetensorsFile, SAFETENSORS_DTYPE_OF, type SafetensorsDType } from '../io/safetensors.js';
import { checkSplit, cover, coverageProblem, partIntervals, type Interval, type Source } from './intervals.js';
import { plainState, trainerState, type RankState, type StatePart } from './parts.js';
import type { TrainerHoldings } from '../parallel/trainer.js';
import { FileWriter } from './writer.js';
import type { TensorSplit } from '../nn/module.js';

/** Anything whose position a checkpoint keeps: a data loader, a learning-rate schedule. */
export interface Stateful {
  /** The position to save (JSON-serializable). */
  state(): unknown;
  /** Restores a position that state() returned. */
  loadState(state: never): void;
}

/** A model that knows its own layout: ParallelTrainer (any TP × PP × DP × ZeRO layout). */
export interface ShardedTrainingState {
  /** What this rank holds of the training state (its model, optimizer or ZeRO shards, replicas): parts.ts's trainerState reads it. */
  checkpointHoldings(): TrainerHoldings<{ lr: number }>;
  /** The group of all ranks taking part in the checkpoint (null in one process). */
  readonly world: CollectiveGroup | null;
}

/** What a checkpoint holds. Everything but `model` is optional. */
export interface CheckpointItems {
  /** A ParallelTrainer (its model and optimizer, as this rank holds them), or a Module in one process. */
  model: Module | ShardedTrainingState;
  /** The optimizer of a Module (a trainer brings its own). */
  optimizer?: Optimizer<{ lr: number }>;
  /** A data loader whose position is saved (e.g. a TokenLoader). */
  loader?: Stateful;
  /** A learning-rate schedule whose position is saved. */
  scheduler?: Stateful;
  /** A loss scaler whose scale is saved. */
  scaler?: GradScaler;
  /** Random generators by name (the model's dropout generator, nt.defaultGenerator...): each rank's own are saved. */
  rng?: Record<string, Generator>;
  /** bf16/f16 compute copies, refreshed from the loaded f32 masters after a load. */
  masterWeights?: MasterWeights;
  /** Anything JSON-serializable (saved from rank 0, returned by load). */
  extra?: unknown;
  /** The layout, for the record (`nodetron` reads it back in messages). */
  layout?: unknown;
}

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

interface RankRecord {
  saveId: string;
  rank: number;
  file: string;
  size: number;
  crc32: number;
  parts: Array<{ key: string; name: string; shape: number[]; dtype: SafetensorsDType; split: TensorSplit | null; start: number; count: number }>;
  steps: Record<string, number>;
  rng: Record<string, { seed: string; offsetBlocks: number }>;
}

/** What {@link Checkpointer.save} returns. */
export interface SaveResult {
  /** The step saved. */
  step: number;
  /** Where the checkpoint will be once complete. */
  dir: string;
  /** Milliseconds training was held: waitMs + copyMs. */
  stallMs: number;
  /** Of the stall: waiting for the previous save to finish (one save in flight at a time). */
  waitMs: number;
  /** Of the stall: copying this rank's state into host memory (stage 1). */
  copyMs: number;
  /** Resolves when the checkpoint is complete on disk (on rank 0: committed; elsewhere: this rank's part written). */
  done: Promise<void>;
}

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

/** Options of {@link Checkpointer}. */
export interface CheckpointerOptions {
  /** Complete checkpoints kept (older ones are deleted after each commit); default: all. */
  keep?: number;
  /** Write in the background (default true); false makes save() return after the commit. */
  async?: boolean;
  /** How long rank 0 waits for the other ranks' files before giving the save up (default 10 minutes). */
  commitTimeoutMs?: number;
  /** Verify files' CRC-32 on load (default true); false checks sizes only. */
  verify?: boolean;
}

/** A checkpoint whose files are missing, truncated or corrupt: loadLatest skips it for an older one. */
export class DamagedCheckpointError extends StateError {}

const STEP_DIR = /^step-(\d+)$/;
const MANIFEST = 'manifest.json';
/** The directory name of a step's checkpoint: `step-` and the step zero-padded to 8 digits. */
export const stepDirName = (step: number): string => {
  if (!Number.isSafeInteger(step) || step < 0) throw new ArgumentError(`checkpoint: step must be an integer >= 0, got ${String(step)}`);
  return `step-${String(step).padStart(8, '0')}`;
};

const NT_DTYPE_OF: Partial<Record<SafetensorsDType, DType>> = { F32: 'f32', BF16: 'bf16', F16: 'f16', I32: 'i32', U8: 'u8' };

/**
 * Saves and loads the checkpoints of one run under a root directory (`root/step-00000042/`).
 * Every rank creates one with the same root and calls save()/load() at the same points.
 */
export class Checkpointer {
  /** The directory holding the checkpoints. */
  readonly root: string;
  /** Complete checkpoints kept (Infinity: all). */
  readonly keep: number;
  /** Whether saves write in the background. */
  readonly async: boolean;
  /** How long rank 0 waits for the other ranks' files at commit (ms; default 600 000). */
  readonly commitTimeoutMs: number;
  /** Whether loads verify the files' CRC-32. */
  readonly verify: boolean;
  readonly #writer = new FileWriter();
  /** Settles when the last save (both stages) is over: one save in flight at a time. */
  #lock: Promise<void> = Promise.resolve();
  /** Deletion of pruned checkpoints, off the save's path (close() waits for it). */
  #deleting: Promise<void> = Promise.resolve();
  #failure: Error | null = null;
  #saves = 0;
  /** Host memory holding this rank's last snapshot while the writer thread writes it (stage 2). */
  #staging: SharedArrayBuffer | null = null;
  /** Stall of each save so far (ms). */
  readonly stalls: number[] = [];

  constructor(root: string, opts: CheckpointerOptions = {}) {
    if (typeof root !== 'string' || root === '') throw new ArgumentError('Checkpointer: root must be a directory path');
    if (opts.keep !== undefined && !(Number.isInteger(opts.keep) && opts.keep >= 1)) throw new ArgumentError(`Checkpointer: keep must be an integer >= 1, got ${opts.keep}`);
    this.root = root;
    this.keep = opts.keep ?? Infinity;
    this.async = opts.async ?? true;
    this.commitTimeoutMs = opts.commitTimeoutMs ?? 600_000;
    this.verify = opts.verify ?? true;
  }

  /**
   * Saves `items` as the checkpoint of `step`. Collective: every rank calls it. Returns once this
   * rank's state is copied to host memory (stage 1); the write goes on in the background (stage 2)
   * unless `async` is false. A failed background save is thrown by the next save() or wait().
   */
  async save(step: number, items: CheckpointItems): Promise<SaveResult> {
    if (!Number.isSafeInteger(step) || step < 0) throw new ArgumentError(`checkpoint save: step must be an integer >= 0, got ${step}`);
    checkItems(items);
    const t0 = performance.now();
    // Taken before anything else, so saves called without awaiting each other queue up.
    const previous = this.#lock;
    let unlock!: () => void;
    this.#lock = new Promise<void>((r) => { unlock = r; });
    try { await previous; } catch { /* reported through #failure */ }
    let failure = this.#failure;
    this.#failure = null;
    // A previous save that failed on one rank stops every rank here, before any other collective of
    // this one; the same collective agrees on the save's id.
    let saveId = '';
    try {
      const world = worldOf(items), count = ++this.#saves;
      const { max: [a, b] } = await agreeAll(world, failure, {
        failedElsewhere: (ranks) => new StateError(`checkpoint save of step ${step}: the previous save failed on ${ranks} (see the error there); every rank stops`),
        values: saveIdDraws(world),
      });
      saveId = `${count}-${a!.toString(36)}${b!.toString(36)}`;
    } catch (e) { failure ??= e as Error; }
    if (failure) { unlock(); throw failure; }
    const waitMs = performance.now() - t0;
    try {
      return await this.#save(step, items, saveId, t0, waitMs, unlock);
    } catch (e) {
      unlock();
      throw e;
    }
  }

  async #save(step: number, items: CheckpointItems, saveId: string, t0: number, waitMs: number, unlock: () => void): Promise<SaveResult> {
    const world = worldOf(items);
    const rank = world?.rank ?? 0, worldSize = world?.size ?? 1;
    const state = rankState(items, false);

    // Stage 1: this rank's parts into the host staging buffer (kept from save to save: a fresh buffer's
    // first touch costs page faults that would stall training far longer than the copy itself).
    const saved = state.parts.filter((p) => p.save && p.count > 0);
    for (const p of saved) if (!SAFETENSORS_DTYPE_OF[p.tensor.dtype]) throw new ArgumentError(`checkpoint save: ${p.key} is ${p.tensor.dtype}, which checkpoints do not store`);
    const length = saved.reduce((s, p) => s + p.count * dtypeSize(p.tensor.dtype), 0);
    if (!this.#staging || this.#staging.byteLength < length) this.#staging = new SharedArrayBuffer(Math.max(length, 8));
    const staging = this.#staging;
    const parts: RankRecord['parts'] = [];
    let at = 0;
    traceSpan('checkpoint snapshot', () => {
      for (const p of saved) {
        const size = dtypeSize(p.tensor.dtype);
        p.tensor.backend.read(p.tensor.storage, p.offset * size, new Uint8Array(staging, at, p.count * size));
        at += p.count * size;
        parts.push({ key: p.key, name: `${p.key}@${p.start}`, shape: p.fullShape, dtype: SAFETENSORS_DTYPE_OF[p.tensor.dtype]!, split: p.split, start: p.start, count: p.count });
      }
    }, 'checkpoint', { step, bytes: length });
    const steps: Record<string, number> = {};
    for (const s of state.steps) { const n = s.get(); if (n !== null) steps[s.name] = n; }
    const rng = Object.fromEntries(Object.entries(items.rng ?? {}).map(([k, g]) => [k, g.state()]));
    const common = rank === 0 ? sharedState(items, state) : null;
    const stallMs = performance.now() - t0;
    this.stalls.push(stallMs);

    const dir = join(this.root, stepDirName(step));
    const tmp = join(this.root, `.tmp-${stepDirName(step)}`);
    mkdirSync(tmp, { recursive: true });
    const file = `rank-${String(rank).padStart(5, '0')}.safetensors`;
    const { header } = encodeHeader(parts.map((p) => ({ name: p.name, dtype: p.dtype, shape: [p.count] })),
      parts.map((p) => p.count * dtypeSize(NT_DTYPE_OF[p.dtype]!)), { format: 'nodetron', step: String(step), rank: String(rank) });

    // Stage 2: the file, this rank's record, and on rank 0 the commit.
    const done = (async () => {
      const written = await traceSpan('checkpoint write', () => this.#writer.write(join(tmp, file), header, staging, length), 'checkpoint', { step, bytes: length });
      const record: RankRecord = { saveId, rank, file, size: written.size, crc32: written.crc32, parts, steps, rng };
      writeJsonDurably(join(tmp, `rank-${String(rank).padStart(5, '0')}.json`), record);
      if (rank === 0) {
        await traceSpan('checkpoint commit', () => commit(this.root, tmp, dir, { step, saveId, worldSize, common: common!, timeoutMs: this.commitTimeoutMs }), 'checkpoint', { step });
        if (Number.isFinite(this.keep)) {
          // Pruned steps stop being checkpoints at once (manifest removed, directory renamed aside);
          // their bytes are deleted in the background, so a save does not wait for hundreds of MB of unlinks.
          const doomed = prune(this.root, this.keep, step);
          if (doomed.length) this.#deleting = this.#deleting.then(() => Promise.all(doomed.map((d) => rm(d, { recursive: true, force: true }))).then(() => undefined, () => undefined));
        }
      }
    })();
    // A background save's failure is thrown by the next save() or wait(); a synchronous save throws it here.
    const failed = done.then(() => null, (e: Error) => e);
    void failed.then((e) => { if (e && this.async) this.#failure = e; }).finally(unlock);
    if (!this.async) { const e = await failed; if (e) throw e; }
    return { step, dir, stallMs, waitMs, copyMs: stallMs - waitMs, done };
  }

  /** Waits for the save in flight; throws if a background save failed (once). */
  async wait(): Promise<void> {
    await this.#lock;
    const failure = this.#failure;
    this.#failure = null;
    if (failure) throw failure;
  }

  /** The complete checkpoints under the root, newest first (those with a manifest; load() verifies their files). */
  list(): Array<{
    /** The checkpoint's step. */
    step: number;
    /** Its directory. */
    dir: string;
  }> { return listCheckpoints(this.root); }

  /**
   * Loads the newest complete checkpoint that every rank can read (a truncated or corrupt one is
   * skipped, and the one before it used). Collective. Returns null when there is none.
   */
  async loadLatest(items: CheckpointItems): Promise<LoadResult | null> {
    const world = worldOf(items);
    const multi = world !== null && world.size > 1;
    // A background save that failed on this rank is reported through the same agreement as a bad
    // load, so no rank waits in a collective the others skip.
    let failure: Error | null = null;
    try { await this.wait(); } catch (e) { failure = e as Error; }
    await this.#deleting; // recoverAsideCopies below removes .deleted-* directories this checkpointer may still be deleting
    await agreeAll(world, failure, {
      failedElsewhere: (ranks) => new StateError(`checkpoint loadLatest: the last save failed on ${ranks} (see the error there); every rank stops`),
    });
    // Rank 0 chooses each candidate, newest first (its save has committed; another rank may list
    // before the last commit lands), so every rank tries the same step.
    const candidates = !multi || world.rank === 0 ? (recoverAsideCopies(this.root), this.list()) : [];
    for (let i = 0; ; i++) {
      let step = i < candidates.length ? candidates[i]!.step : -1;
      if (multi) {
        using t = tensor(new Int32Array([step]), [1], { dtype: 'i32', device: agreementDevice(world) });
        await world.broadcast(t, { root: 0 });
        step = t.item();
      }
      if (step < 0) return null;
      const dir = join(this.root, stepDirName(step));
      // 0: loaded; 1: damaged here (try an older one); 2: anything else (incompatible model, bad
      // state): every rank stops, so no rank waits on a collective the others never reach.
      let problem: Error | null = null, code = 0;
      let result: LoadResult | null = null;
      try { result = loadCheckpoint(dir, items, { verify: this.verify }); } catch (e) {
        problem = e as Error;
        code = e instanceof DamagedCheckpointError ? 1 : 2;
      }
      if (multi) {
        // Ranks that cannot load it fail; a rank that found it damaged says so in the same collective.
        const { failed, max: [damaged] } = await agree(world, code === 2, { values: [code === 1 ? 1 : 0] });
        if (failed.length > 0 && code !== 2) throw new StateError(`checkpoint ${dir}: ${formatRanks(failed)} could not load it (see the error there); every rank stops`);
        if (damaged === 1 && code === 0) { problem = new DamagedCheckpointError(`${dir}: another rank found it damaged`); code = 1; }
      }
      if (code === 0) return result;
      if (code === 2) throw problem!;
      process.stderr.write(`[nodetron checkpoint] skipping ${dir}: ${problem!.message}\n`);
    }
  }

  /** Loads the checkpoint in `dir` (a step directory). Every rank calls it; nothing is exchanged. */
  async load(dir: string, items: CheckpointItems): Promise<LoadResult> {
    await this.wait();
    return loadCheckpoint(dir, items, { verify: this.verify });
  }

  /** Finishes the save in flight and stops the writer thread. */
  async close(): Promise<void> {
    try { await this.wait(); } finally {
      this.#staging = null;
      await this.#writer.close();
      await this.#deleting;
    }
  }
}

/** Saves one checkpoint into `root` and waits until it is complete. */
export async function save(root: string, step: number, items: CheckpointItems, opts: Omit<CheckpointerOptions, 'async'> = {}): Promise<SaveResult> {
  const c = new Checkpointer(root, { ...opts, async: false });
  try { return await c.save(step, items); } finally { await c.close(); }
}

/** Loads the checkpoint in `dir` (a step directory, or a root: its newest complete checkpoint). */
export async function load(dir: string, items: CheckpointItems, opts: { verify?: boolean } = {}): Promise<LoadResult> {
  if (existsSync(join(dir, MANIFEST))) return loadCheckpoint(dir, items, opts);
  const c = new Checkpointer(dir, opts);
  const r = await c.loadLatest(items);
  if (!r) throw new StateError(`checkpoint load: ${dir} holds no complete checkpoint (no step-N directory with a manifest)`);
  return r;
}

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

// ---- saving --------------------------------------------------------------------------------------

/** The items must name a model: a Module, or a trainer's sharded state. */
function checkItems(items: CheckpointItems): void {
  if (items === null || typeof items !== 'object') throw new ArgumentError(`checkpoint: items must be an object like { model, optimizer, ... }, got ${items === null ? 'null' : typeof items}`);
  const m = items.model as unknown;
  if (m === null || typeof m !== 'object' || (typeof (m as Partial<ShardedTrainingState>).checkpointHoldings !== 'function' && typeof (m as Partial<Module>).namedParameters !== 'function')) {
    throw new ArgumentError('checkpoint: items.model must be a Module (e.g. a GPT) or a ParallelTrainer');
  }
}

function worldOf(items: CheckpointItems): CollectiveGroup | null {
  checkItems(items);
  const m = items.model as Partial<ShardedTrainingState>;
  return typeof m.checkpointHoldings === 'function' ? (m.world ?? null) : null;
}

function rankState(items: CheckpointItems, forLoad: boolean): RankState {
  checkItems(items);
  const m = items.model as Partial<ShardedTrainingState>;
  if (typeof m.checkpointHoldings === 'function') {
    if (items.optimizer) throw new ArgumentError('checkpoint: a trainer brings its own optimizer; pass optimizer only with a Module');
    return trainerState(m.checkpointHoldings!(), { forLoad });
  }
  return plainState(items.model as Module, items.optimizer ?? null, { forLoad });
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
function saveIdDraws(world: CollectiveGroup | null): number[] {
  const draw = () => (world && world.rank !== 0 ? 0 : Math.floor(Math.random() * 2 ** 24));
  return [draw(), draw()];
}

/**
 * Puts back a step's previous copy that a save moved aside (`.old-step-N-*`) when a crash came before
 * the new copy was renamed into place, so the step is not lost. Run by one rank only.
 */
function recoverAsideCopies(root: string): void {
  if (!existsSync(root)) return;
  for (const name of readdirSync(root)) {
    // A pruned step whose deletion a crash interrupted.
    if (name.startsWith('.deleted-step-')) { rmSync(join(root, name), { recursive: true, force: true }); continue; }
    const m = /^\.old-(step-\d+)-/.exec(name);
    if (!m || existsSync(join(root, m[1]!)) || !existsSync(join(root, name, MANIFEST))) continue;
    try { renameSync(join(root, name), join(root, m[1]!)); } catch { /* another process got there first */ }
  }
}

function writeJsonDurably(path: string, value: unknown): void {
  const tmp = `${path}.tmp`;
  writeFileSync(tmp, JSON.stringify(value));
  const fd = openSync(tmp, 'r');
  try { fsyncSync(fd); } finally { closeSync(fd); }
  renameSync(tmp, path);
}

function fsyncDir(path: string): void {
  try {
    const fd = openSync(path, 'r');
    try { fsyncSync(fd); } finally { closeSync(fd); }
  } catch { /* some filesystems refuse fsync on directories */ }
}

/** Rank 0: waits for every rank's record of this save, checks coverage, writes the manifest last, renames. */
async function commit(root: string, tmp: string, dir: string,
  o: { step: number; saveId: string; worldSize: number; common: Pick<Manifest, 'optimizer' | 'state' | 'layout'>; timeoutMs: number }): Promise<void> {
  const records: RankRecord[] = [];
  const deadline = Date.now() + o.timeoutMs;
  for (let r = 0; r < o.worldSize; r++) {
    const path = join(tmp, `rank-${String(r).padStart(5, '0')}.json`);
    for (;;) {
      let rec: RankRecord | null = null;
      try { rec = JSON.parse(readFileSync(path, 'utf8')) as RankRecord; } catch { rec = null; }
      if (rec && rec.saveId === o.saveId) { records.push(rec); break; }
      if (Date.now() > deadline) throw new TimeoutError(`checkpoint save of step ${o.step}: rank ${r} did not finish writing within ${o.timeoutMs} ms; the checkpoint stays incomplete in ${tmp}`, 'checkpoint');
      await new Promise((res) => setTimeout(res, 20));
    }
  }
  const tensors: Record<string, ManifestTensor> = {};
  const steps: Record<string, number> = {};
  for (const rec of records) {
    Object.assign(steps, rec.steps);
    for (const p of rec.parts) {
      const t = (tensors[p.key] ??= { shape: p.shape, dtype: p.dtype, parts: [] });
      if (t.shape.join() !== p.shape.join() || t.dtype !== p.dtype) {
        throw new StateError(`checkpoint save of step ${o.step}: ranks disagree on '${p.key}' ([${t.shape}] ${t.dtype} vs [${p.shape}] ${p.dtype})`);
      }
      t.parts.push({ file: rec.file, name: p.name, split: p.split, start: p.start, count: p.count });
    }
  }
  for (const [key, t] of Object.entries(tensors)) {
    const size = t.shape.reduce((a, b) => a * b, 1);
    const problem = coverageProblem(size, t.parts.flatMap((p) => partIntervals(t.shape, p)));
    if (problem) throw new StateError(`checkpoint save of step ${o.step}: the ranks' parts of '${key}' do not tile it: ${problem}`);
  }
  const manifest: Manifest = {
    format: 'nodetron-checkpoint', version: 1, step: o.step, saveId: o.saveId, worldSize: o.worldSize, createdAt: new Date().toISOString(),
    layout: o.common.layout,
    files: records.map((r) => ({ file: r.file, size: r.size, crc32: r.crc32 })),
    tensors,
    optimizer: { groups: o.common.optimizer.groups, steps },
    state: o.common.state,
    ranks: records.map((r) => ({ rng: r.rng })),
  };
  writeJsonDurably(join(tmp, MANIFEST), manifest);
  fsyncDir(tmp);
  // Saving a step again: the old copy goes aside first, so a crash never leaves the step without one.
  const old = existsSync(dir) ? join(root, `.old-${stepDirName(o.step)}-${o.saveId}`) : null;
  if (old) renameSync(dir, old);
  renameSync(tmp, dir);
  fsyncDir(root);
  if (old) rmSync(old, { recursive: true, force: true });
  // Leftovers of earlier saves that never completed (a crash mid-save) go once a later one is whole.
  for (const name of readdirSync(root)) {
    const m = /^\.(tmp|old)-step-(\d+)/.exec(name);
    if (m && Number(m[2]) <= o.step && join(root, name) !== tmp) rmSync(join(root, name), { recursive: true, force: true });
  }
}

/**
 * Keeps the checkpoint just committed and the keep - 1 newest before it. Newer steps (from a run
 * that was resumed from an older checkpoint) are left alone. The manifest goes first, so a pruned
 * directory never looks complete half-way; the directory is then renamed to `.deleted-step-N-*` and
 * returned for the caller to delete (a crash before that leaves it for recoverAsideCopies to remove).
 */
function prune(root: string, keep: number, committed: number): string[] {
  const doomed: string[] = [];
  for (const { dir, step } of listCheckpoints(root).filter((c) => c.step < committed).slice(keep - 1)) {
    rmSync(join(dir, MANIFEST), { force: true });
    const aside = join(root, `.deleted-${stepDirName(step)}-${process.pid}-${Date.now().toString(36)}`);
    try { renameSync(dir, aside); doomed.push(aside); } catch { rmSync(dir, { recursive: true, force: true }); }
  }
  return doomed;
}

// ---- loading -------------------------------------------------------------------------------------

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

function verifyFile(dir: string, entry: Manifest['files'][number], checksum: boolean): void {
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

function loadCheckpoint(dir: string, items: CheckpointItems, opts: { verify?: boolean }): LoadResult {
  return traceSpan('checkpoint load', () => readCheckpoint(dir, items, opts), 'checkpoint', { dir });
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
    if (!t) throw new StateError(`checkpoint ${dir}: it has no '${part.key}' (saved from another model?)`);
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
