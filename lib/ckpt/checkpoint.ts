// Sharded checkpoints of a training run under any layout, loadable under any other: the entry points
// (Checkpointer, save, load). The rooms of lib/ckpt/, one job each:
//   format.ts    the on-disk layout (docs/checkpoint-format.md): names, manifest, records, file checks
//   items.ts     what a checkpoint holds (CheckpointItems) and this rank's part of it
//   parts.ts     a rank's training state as parts of global tensors; intervals.ts: resharding arithmetic
//   save.ts      the save pipeline: stage 1 snapshot to host memory, stage 2 the rank's file and record
//   writer.ts    the writer and checksum threads of stage 2
//   commit.ts    rank 0's commit, pruning, and recovery from interrupted saves
//   load.ts      loading and resharding
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
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { ArgumentError, StateError } from '../errors.js';
import { tensor } from '../creation.js';
import { agree, agreeAll, agreementDevice, formatRanks } from '../distributed/agree.js';
import { FileWriter } from './writer.js';
import { DamagedCheckpointError, listCheckpoints, MANIFEST, rankRecordName, stepDirName, tmpDirName } from './format.js';
import { checkItems, worldOf, type CheckpointItems } from './items.js';
import { encodeRankHeader, saveIdDraws, takeSnapshot, writeRankFiles } from './save.js';
import { commit, prune, recoverAsideCopies } from './commit.js';
import { loadCheckpoint, type LoadResult } from './load.js';

/** One abandonInFlight: why, the newest step whose save it keeps, the ranks that will never write. */
interface Abandonment { why: string; through: number; lost: readonly number[] }

/** Whether rank `r`'s record of save `saveId` is in `tmp` (written last by that rank, atomically). */
function hasRecord(tmp: string, r: number, saveId: string): boolean {
  try {
    return (JSON.parse(readFileSync(join(tmp, rankRecordName(r)), 'utf8')) as { saveId?: unknown }).saveId === saveId;
  } catch {
    return false;
  }
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
  /** Host memory holding this rank's last snapshot while the writer thread writes it (stage 2). */
  #staging: SharedArrayBuffer | null = null;
  /**
   * Every abandonInFlight so far, in order: a save started after k of them is judged by those from k
   * on (the epoch of a save is how many had happened when it started).
   */
  readonly #abandons: Abandonment[] = [];
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
      const world = worldOf(items);
      const { max: [a, b] } = await agreeAll(world, failure, {
        failedElsewhere: (ranks) => new StateError(`checkpoint save of step ${step}: the previous save failed on ${ranks} (see the error there); every rank stops`),
        values: saveIdDraws(world),
      });
      // The same on every rank: the step and rank 0's random draws (not a per-process count of saves,
      // which a rank that joined the job later, in-job recovery, would count differently).
      saveId = `${step}-${a!.toString(36)}${b!.toString(36)}`;
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
    const snap = takeSnapshot(items, step, rank, this.#staging);
    this.#staging = snap.staging;
    const stallMs = performance.now() - t0;
    this.stalls.push(stallMs);

    const dir = join(this.root, stepDirName(step));
    const tmp = join(this.root, tmpDirName(step));
    const epoch = this.#abandons.length;
    const abandoned = () => this.#abandonedSince(epoch, step, tmp, saveId);
    mkdirSync(tmp, { recursive: true });
    const header = encodeRankHeader(snap, step, rank);

    // Stage 2: the file, this rank's record, and on rank 0 the commit.
    const done = (async () => {
      await writeRankFiles(this.#writer, tmp, header, snap, { step, rank, saveId });
      if (rank === 0) {
        await traceSpan('checkpoint commit', () => commit(this.root, tmp, dir, { step, saveId, worldSize, common: snap.common!, timeoutMs: this.commitTimeoutMs, abandoned }), 'checkpoint', { step });
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
    void failed.then((e) => { if (e && this.async && !abandoned()) this.#failure = e; }).finally(unlock);
    if (!this.async) { const e = await failed; if (e) throw e; }
    return { step, dir, stallMs, waitMs, copyMs: stallMs - waitMs, done };
  }

  /**
   * Gives up the save in flight, if any (in-job recovery: a lost rank will never write its file, and
   * every rank has rolled back past it): rank 0 stops waiting for the other ranks' files, the
   * checkpoint stays incomplete (loads skip it), and its failure is not reported by the next save.
   *
   * With `keep`, a save of a step <= `keep.through` (the step every rank rolled back to: its state is
   * the one the run goes on from, so the save is valid) goes on: rank 0 commits it once every rank's
   * file is there, and gives it up quietly, as above, only if a rank of `keep.lost` (the ranks the
   * recovery replaced, which will never write their part of it) has not written its file. A save of a
   * later step is given up.
   */
  abandonInFlight(reason: string, keep?: { through: number; lost: readonly number[] }): void {
    if (typeof reason !== 'string' || reason === '') throw new ArgumentError('Checkpointer.abandonInFlight: reason must be a non-empty string');
    if (keep !== undefined) {
      if (!Number.isSafeInteger(keep.through)) throw new ArgumentError(`Checkpointer.abandonInFlight: keep.through must be an integer step, got ${String(keep.through)}`);
      if (!Array.isArray(keep.lost) || !keep.lost.every((r) => Number.isSafeInteger(r) && r >= 0)) {
        throw new ArgumentError('Checkpointer.abandonInFlight: keep.lost must list the lost ranks (integers >= 0)');
      }
    }
    this.#abandons.push({ why: reason, through: keep?.through ?? -Infinity, lost: [...(keep?.lost ?? [])] });
  }

  // Why the save of `step` (saveId, in `tmp`) started at `epoch` is given up, or null while it goes on.
  #abandonedSince(epoch: number, step: number, tmp: string, saveId: string): string | null {
    for (let k = epoch; k < this.#abandons.length; k++) {
      const a = this.#abandons[k]!;
      if (step > a.through) return a.why;
      const missing = a.lost.filter((r) => !hasRecord(tmp, r, saveId));
      if (missing.length > 0) return `${a.why}; lost rank${missing.length > 1 ? 's' : ''} ${missing.join(', ')} never wrote ${missing.length > 1 ? 'their' : 'its'} part of step ${step}`;
    }
    return null;
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
