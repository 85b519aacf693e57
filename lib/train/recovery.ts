// In-job recovery from peers' memory for a TrainingRun (`recover: 'memory'`, `--recover memory`, under
// `nodetron launch --spares N`). After every completed step each rank copies its whole training state
// (an image: lib/ckpt/image.ts) into a local buffer and sends it, in the background, to the holder (the
// launcher's agent of the next node, lib/distributed/holder.ts). When a rank is lost, the launcher
// starts a new generation; the survivors' communicators fail, their step throws, and this module:
// abandons the step, meets the replacement in the new generation's groups (dist.regroup), agrees on the
// newest step every rank can restore, and restores it. The replacement restores the lost rank's image
// from the holder. No checkpoint file is read. docs/recovery.md describes the protocol and its limits.
import { appendFileSync } from 'node:fs';
import * as dist from '../distributed/init.js';
import { recoveryEnv } from '../distributed/recovery-env.js';
import { HolderClient } from '../distributed/holder.js';
import { CommError, StateError, TimeoutError } from '../errors.js';
import type { Store } from '../distributed/store.js';
import { decodeImage, encodeImage, restoreImage, takeImage, type RankImage } from '../ckpt/image.js';
import type { CheckpointItems } from '../ckpt/items.js';

/** How long a rank whose collective failed waits for the launcher to announce the next generation. */
const GENERATION_WAIT_MS = 60_000;
/** How long the ranks wait for each other's restorable steps in a recovery. */
const AGREE_WAIT_MS = 300_000;

/** What the recovery needs of the run. */
export interface RecoveryTarget {
  /** This rank's training state (the same items a checkpoint saves). */
  items: CheckpointItems;
  /** Drops what a failed step left behind (pending collectives, gradients, gathered parameters). */
  abandonStep(): void;
  /** Progress lines (rank 0). */
  log(line: string): void;
  /** Copy the state every this many steps (1: after every step). */
  every: number;
}

interface LocalImage { step: number; image: RankImage; put: Promise<void> }

/** A rank's in-memory recovery: its images, the holder, the generations. */
export class MemoryRecovery {
  readonly #target: RecoveryTarget;
  readonly #rank: number;
  readonly #worldSize: number;
  readonly #store: Store;
  readonly #holder: HolderClient | null;
  readonly #events: string | undefined;
  #generation: number;
  // The images of the newest two completed steps (double-buffered: a put reads one while the next is taken).
  #images: LocalImage[] = [];
  #putFailed = false;
  #afterRecovery: { generation: number } | null = null;
  /** Whether this process joined a running job from the holder's copy (it then skips a checkpoint resume). */
  joined = false;

  private constructor(target: RecoveryTarget, holder: HolderClient | null) {
    this.#target = target;
    this.#rank = dist.rank();
    this.#worldSize = dist.worldSize();
    this.#store = dist.jobStore();
    this.#holder = holder;
    this.#generation = dist.generation();
    this.#events = process.env.NODETRON_RECOVERY_EVENTS?.trim() || undefined;
  }

  /**
   * Turns recovery on for a run (after setup, on every rank). Throws StateError when the launcher is
   * not in recovery mode (no `--spares`).
   */
  static async start(target: RecoveryTarget): Promise<MemoryRecovery> {
    const env = recoveryEnv();
    if (!env.enabled || !dist.isInitialized()) {
      throw new StateError("recover 'memory' needs the launcher's in-job recovery: start the job with `nodetron launch --spares N` (N >= 0)");
    }
    let holder: HolderClient | null = null;
    if (env.holder) {
      const token = process.env.NODETRON_HOLDER_TOKEN?.trim() || process.env.NODETRON_STORE_TOKEN?.trim() || undefined;
      holder = await HolderClient.connect(env.holder, { ...(token ? { token } : {}), timeoutMs: 60_000 });
    }
    const r = new MemoryRecovery(target, holder);
    if (env.joining) await r.#join();
    await r.#store.set(`recover/ready/${r.#rank}`, '1');
    return r;
  }

  /** Appends an event line for `nodetron bench chaos` (NODETRON_RECOVERY_EVENTS). */
  #event(event: string, fields: Record<string, unknown>): void {
    if (!this.#events) return;
    const line = JSON.stringify({ t: Date.now(), src: 'rank', rank: this.#rank, generation: this.#generation, event, ...fields });
    try { appendFileSync(this.#events, `${line}\n`); } catch { /* the record is best effort */ }
  }

  /** Whether an error thrown by a step is a lost peer's doing (a failed or aborted collective). */
  recoverable(e: unknown): boolean {
    return e instanceof CommError || e instanceof TimeoutError || (e instanceof StateError && /not connected yet/.test(e.message));
  }

  /** The steps whose image this rank holds. */
  get steps(): number[] { return this.#images.map((i) => i.step); }

  /**
   * Before a step: the state of `step` completed steps is held here (taken now if it is not) and its
   * copy has reached the holder, so a rank lost during the step costs that step only. (Sending
   * overlaps nothing else of the rank's work between steps; what it costs is in docs/recovery.md.)
   */
  async beforeStep(step: number): Promise<void> {
    await this.snapshot(step, false);
    await this.#images.find((i) => i.step === step)?.put;
  }

  /**
   * Copies the state after `step` completed steps into a local image and sends it to the holder in
   * the background. The older of the two buffers is reused once its own send has finished.
   */
  async snapshot(step: number, completed = true): Promise<void> {
    if (this.#afterRecovery && completed) {
      this.#event('first-step', { step });
      this.#afterRecovery = null;
    }
    if (this.#images.some((i) => i.step === step)) return;
    // Every N steps (and always a first one: the start, a resume or a join).
    if (this.#images.length > 0 && step % this.#target.every !== 0) return;
    let reuse: LocalImage | undefined;
    if (this.#images.length >= 2) {
      reuse = this.#images.shift()!;
      await reuse.put;
    }
    const image = takeImage(this.#target.items, step, reuse?.image);
    const entry: LocalImage = { step, image, put: Promise.resolve() };
    entry.put = this.#send(entry);
    this.#images.push(entry);
  }

  async #send(entry: LocalImage): Promise<void> {
    if (!this.#holder) return;
    try {
      await this.#holder.put(this.#rank, entry.step, this.#generation, encodeImage(entry.image));
    } catch (e) {
      // Training goes on without a remote copy; a loss of this rank then falls back to a checkpoint.
      if (!this.#putFailed) process.stderr.write(`nodetron: rank ${this.#rank}: could not send its in-memory copy to the holder (${(e as Error).message}); training goes on without one\n`);
      this.#putFailed = true;
    }
  }

  /**
   * After a step threw `error` with `stepsDone` completed steps: waits for the launcher's next
   * generation, regroups, agrees on the newest step every rank holds, and restores it. Returns that
   * step, or null when no step is held by every rank (both copies of a rank lost: the caller falls
   * back to a checkpoint, collectively). Rethrows `error` when no new generation comes (the failure
   * was not a lost rank).
   */
  async recover(error: unknown, stepsDone: number): Promise<number | null> {
    const t0 = Date.now();
    this.#target.abandonStep();
    let next = this.#generation + 1;
    for (;;) {
      const g = await this.#awaitGeneration(next, error);
      try {
        await dist.regroup(g);
        this.#generation = g;
        const step = await this.#agree(g, this.steps);
        if (step === null) {
          this.#images = [];
          this.#afterRecovery = { generation: g };
          return null;
        }
        const local = this.#images.find((i) => i.step === step)!;
        restoreImage(this.#target.items, local.image);
        this.#images = this.#images.filter((i) => i.step <= step);
        const lost = stepsDone + 1 - step;
        this.#event('recovered', { step, stepsLost: lost, ms: Date.now() - t0 });
        this.#target.log(`generation ${g}: a rank was lost; regrouped and rolled back to step ${step} from memory in ${Date.now() - t0} ms (${lost} step(s) to redo)`);
        this.#afterRecovery = { generation: g };
        return step;
      } catch (e) {
        // Another rank was lost while regrouping: the launcher announces the generation after.
        if (!this.recoverable(e)) throw e;
        this.#target.abandonStep();
        next = g + 1;
      }
    }
  }

  // A replacement: meets the running ranks in its generation and restores the lost rank's image from the
  // holder. Another rank lost meanwhile (the survivors move on to a later generation): it follows them there.
  async #join(): Promise<void> {
    const t0 = Date.now();
    if (!this.#holder) throw new StateError(`rank ${this.#rank} joins a running job but has no holder to restore from (NODETRON_HOLDER is unset)`);
    let g = this.#generation;
    for (;;) {
      try {
        await dist.regroup(g);
        this.#generation = g;
        const have = await this.#holder.list(this.#rank);
        const step = await this.#agree(g, have);
        this.joined = true;
        this.#afterRecovery = { generation: g };
        if (step === null) { this.#joinedStep = null; return; }
        const image = decodeImage(await this.#holder.get(this.#rank, step));
        restoreImage(this.#target.items, image);
        this.#images = [{ step, image, put: Promise.resolve() }];
        this.#joinedStep = step;
        this.#event('recovered', { step, stepsLost: 0, ms: Date.now() - t0, joined: true });
        return;
      } catch (e) {
        if (!this.recoverable(e)) throw e;
        g = await this.#awaitGeneration(g + 1, e);
      }
    }
  }

  #joinedStep: number | null = 0;
  /** The step a replacement restored (0 for other ranks; null when no rank held a common step: the run falls back to a checkpoint). */
  get joinedStep(): number | null { return this.#joinedStep; }

  /** Records a fall-back to the newest checkpoint on disk. */
  fellBack(dir: string | null): void { this.#event('fallback-disk', { dir }); }

  async #awaitGeneration(g: number, error: unknown): Promise<number> {
    const deadline = Date.now() + GENERATION_WAIT_MS;
    for (;;) {
      // A later generation may already be out (two faults close together): take the newest.
      let newest = 0;
      for (let k = g; ; k++) {
        if (!(await this.#store.tryGet(`recover/gen/${k}`))) break;
        newest = k;
      }
      if (newest > 0) {
        // A rank the launcher declared lost (frozen, then woken) was replaced: it must leave, not compete.
        for (let k = g; k <= newest; k++) {
          const rec = JSON.parse(new TextDecoder().decode((await this.#store.tryGet(`recover/gen/${k}`))!)) as { lost?: number[] };
          if (rec.lost?.includes(this.#rank)) throw new StateError(`rank ${this.#rank} was declared lost in generation ${k} and replaced; this process leaves the job`);
        }
        return newest;
      }
      if (Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  // Every rank publishes the steps it can restore; the answer is the newest step all of them have.
  async #agree(g: number, have: number[]): Promise<number | null> {
    await this.#store.set(`recover/gen/${g}/have/${this.#rank}`, JSON.stringify(have));
    const keys = Array.from({ length: this.#worldSize }, (_, r) => `recover/gen/${g}/have/${r}`);
    // In short waits: a rank lost before it published (the launcher then starts generation g + 1) must
    // not hold the others here, since the abort file does not reach a store wait.
    const deadline = Date.now() + AGREE_WAIT_MS;
    while (!(await this.#store.check(keys))) {
      if (await this.#store.tryGet(`recover/gen/${g + 1}`)) throw new CommError(`generation ${g + 1} started while the ranks of generation ${g} agreed on a step`, 'recovery');
      if (Date.now() > deadline) throw new TimeoutError(`generation ${g}: not every rank said which steps it holds within ${AGREE_WAIT_MS} ms`, 'recovery');
      await new Promise((r) => setTimeout(r, 20));
    }
    let common: Set<number> | null = null;
    for (const k of keys) {
      const steps = JSON.parse(await this.#store.getString(k)) as number[];
      common = common === null ? new Set(steps) : new Set(steps.filter((s) => common!.has(s)));
    }
    const best = Math.max(-1, ...(common ?? []));
    return best < 0 ? null : best;
  }

  /** Closes the holder connection. */
  async close(): Promise<void> {
    await Promise.allSettled(this.#images.map((i) => i.put));
    await this.#holder?.close();
  }
}
