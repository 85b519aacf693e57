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
import { agreeMax } from '../distributed/agree.js';
import { untilAborted } from '../distributed/abort.js';
import { lostRanks, recoveryEnv } from '../distributed/recovery-env.js';
import { HolderClient, imageEpoch, imageKey } from '../distributed/holder.js';
import { CommError, StateError, TimeoutError } from '../errors.js';
import type { Store } from '../distributed/store.js';
import { decodeImage, decodeImageHead, encodeImage, restoreImage, type RankImage } from '../ckpt/image.js';
import { restoreFromImages, takeLayoutImage } from '../ckpt/reshard-image.js';
import type { CheckpointItems } from '../ckpt/items.js';
import type { ReshapePlan, ShrinkMemory } from './shrink.js';
import type { MeasuredMemory } from './shrink-memory.js';
import { GenerationRecords, type GenerationRecord, type ImageWorld } from './generations.js';

export type { ImageWorld } from './generations.js';

/** How long the ranks wait for each other's restorable steps in a recovery. */
const AGREE_WAIT_MS = 300_000;

/** What the recovery needs of the run. */
export interface RecoveryTarget {
  /** This rank's training state (the same items a checkpoint saves; new ones after a reshape). */
  readonly items: CheckpointItems;
  /** Drops what a failed step left behind (pending collectives, gradients, gathered parameters). */
  abandonStep(): void;
  /** Progress lines (rank 0). */
  log(line: string): void;
  /** Copy the state every this many steps (1: after every step). */
  every: number;
  /**
   * The shrunk world after losing world ranks `lost` of the world whose job ranks are `members`
   * (shrink.ts's planShrink), avoiding a world a member of which would pass its device's limit (`memory`: what each survivor said).
   */
  planShrink(members: readonly number[], lost: readonly number[], memory: ReadonlyMap<number, ShrinkMemory>): ReshapePlan | { refused: string };
  /** What this rank says of its memory for a shrink (shrink-memory.ts's shrinkMemoryOf), from what it measured at its last step boundary (null: none yet). */
  shrinkMemory(measured: MeasuredMemory | null): ShrinkMemory;
  /** This rank's peak so far and what it holds now, on its training device (read after each completed step). */
  memoryNow(): MeasuredMemory;
  /** The job's own world: every job rank, under the layout the run started with (the grow back). */
  jobPlan(): ReshapePlan;
  /** Releases the parts, joins the next world as `rank` in `generation` and builds the plan's layout there (unconnected). */
  reshape(plan: ReshapePlan, generation: number, rank: number): Promise<void>;
}

/** The token the holders want (the one-node holder's own, else the job's). */
function holderToken(): string | undefined {
  return process.env.NODETRON_HOLDER_TOKEN?.trim() || process.env.NODETRON_STORE_TOKEN?.trim() || undefined;
}

interface LocalImage { step: number; key: number; image: RankImage; put: Promise<void> }

/** A rank's in-memory recovery: its images, the holder, the generations. */
export class MemoryRecovery {
  readonly #target: RecoveryTarget;
  /** This process's job rank (its RANK slot in the launcher), whatever its rank in a reshaped world. */
  readonly #jobRank: number;
  /** The job ranks of the current world, by world rank (the identity until a shrink). */
  #members: number[];
  /** The reshape generation that made the current world (0: the job's first), which keys its images. */
  #epoch = 0;
  #holderAddress: string | undefined;
  readonly #clients = new Map<string, Promise<HolderClient>>();
  readonly #store: Store;
  readonly #generations: GenerationRecords;
  #holder: HolderClient | null;
  readonly #events: string | undefined;
  #generation: number;
  // The images of the newest two completed steps (double-buffered: a put reads one while the next is taken).
  #images: LocalImage[] = [];
  #putFailed = false;
  #afterRecovery: { generation: number } | null = null;
  // Whether the next step boundary agrees that every copy is held whatever its step: the run's first,
  // and the first after a recovery, a join or a reshape (set at the same point on every rank; cleared
  // by that agreement, so the ranks that redo steps and a joiner that does not stay in step).
  #agreeNext = true;
  // This rank's memory at its last completed step's end (a shrink's estimate starts from it).
  #measured: MeasuredMemory | null = null;
  /** Whether this process joined a running job from the holder's copy (it then skips a checkpoint resume). */
  joined = false;
  // A replacement that has not restored its rank's state yet: the steps it can restore are at the holder.
  #restoring = false;
  /** The job ranks the last in-memory rollback replaced (null after a reshape or a fallback): a save in flight that they never joined is given up. */
  lastLost: number[] | null = null;

  private constructor(target: RecoveryTarget, holder: HolderClient | null, holderAddress: string | undefined) {
    this.#target = target;
    this.#jobRank = dist.rank();
    this.#members = Array.from({ length: dist.worldSize() }, (_, r) => r);
    this.#holderAddress = holderAddress;
    this.#store = dist.jobStore();
    this.#generations = new GenerationRecords(this.#store);
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
      const token = holderToken();
      holder = await HolderClient.connect(env.holder, { ...(token ? { token } : {}), timeoutMs: 60_000 });
    }
    const r = new MemoryRecovery(target, holder, env.holder);
    const grow = process.env.NODETRON_GROW?.trim();
    if (grow) await r.#growJoin(Number(grow));
    else if (env.joining) await r.#join();
    await r.#publishWhere();
    await r.#store.set(`recover/ready/${r.#jobRank}`, '1');
    return r;
  }

  /** Appends an event line for `nodetron bench chaos` (NODETRON_RECOVERY_EVENTS). */
  #event(event: string, fields: Record<string, unknown>): void {
    if (!this.#events) return;
    const line = JSON.stringify({ t: Date.now(), src: 'rank', rank: this.#jobRank, generation: this.#generation, event, ...fields });
    try { appendFileSync(this.#events, `${line}\n`); } catch { /* the record is best effort */ }
  }

  /** Whether an error thrown by a step is a lost peer's doing (a failed or aborted collective). */
  recoverable(e: unknown): boolean {
    // (A group a joining process has not connected yet throws NotConnectedError, a CommError.)
    return e instanceof CommError || e instanceof TimeoutError;
  }

  /** The steps whose image this rank holds. */
  get steps(): number[] { return this.#images.map((i) => i.step); }

  /**
   * Before a step: the state of `step` completed steps is held here (taken now if it is not) and its
   * copy has reached the holder, on every rank (a one-number collective over the world, on the steps
   * a copy is taken), so a rank lost during the step, or while its copy is on its way, costs one step
   * only: no rank starts step `step` + 1 before every copy of `step` is held. (Sending overlaps
   * nothing else of the rank's work between steps; what it costs is in docs/recovery.md.)
   */
  async beforeStep(step: number): Promise<number | null | undefined> {
    await this.snapshot(step, false);
    const put = this.#images.find((i) => i.step === step)?.put;
    // A later generation ends the wait (its copy may be on its way to a node cut off from the network,
    // which no communicator abort reaches): the step's recovery follows, and re-homes the copies.
    const file = dist.abortFile();
    if (put) await (file ? untilAborted(put, file, this.#generation, `rank ${this.#jobRank}: sending its copy of step ${step} to the holder`) : put);
    return this.#growHere(step);
  }

  /**
   * At a step boundary where a copy was taken, the agreement that every rank's copy is held. While the
   * job is shrunk, at every step boundary: when every rank outside is ready again, the whole world grows back here, with no
   * step lost (rank 0 writes the grow generation; the ranks outside wait for it). Returns the step to go
   * on from (null: no complete step in memory, the run falls back to a checkpoint), or undefined when
   * nothing happened. A collective over the shrunk world (one number).
   */
  async #growHere(step: number): Promise<number | null | undefined> {
    const job = this.#target.jobPlan();
    const shrunk = this.#epoch !== 0 && this.#members.length !== job.members.length;
    // (The same on every rank: the step, the run's copy period, whether the job is shrunk, and whether
    // this is the first boundary of the run or since a recovery, where every rank took or holds a copy
    // of a step that need not be a multiple of the period.)
    if (!shrunk && step % this.#target.every !== 0 && !this.#agreeNext) return undefined;
    this.#agreeNext = false;
    const out = job.members.filter((r) => !this.#members.includes(r));
    const ready = shrunk && dist.rank() === 0 && (await this.#store.check(out.map((r) => `recover/grow/${this.#epoch}/ready/${r}`))) ? 1 : 0;
    // Every rank's copy of `step` is at its holder once this returns (and, shrunk, whether to grow back).
    const [go] = await agreeMax(dist.world(), [ready]);
    if (!go) return undefined;
    const t0 = Date.now(), g = this.#generation + 1;
    if (dist.rank() === 0) {
      const record = { generation: g, lost: [], reason: `grow back at step ${step}: ranks ${out.join(',')} are ready`, at: t0, node: -1, by: -1, how: 'grow',
        from: { epoch: this.#epoch, worldSize: this.#members.length } };
      await this.#store.compareSet(`recover/gen/${g}`, '', JSON.stringify(record));
    }
    // Rank 0's grow, or a fault's generation that took g first (then the fault's recovery follows).
    const rec = await this.#generations.record(g, AGREE_WAIT_MS);
    if (rec.how !== 'grow' || !rec.from) throw new CommError(`generation ${g} (a fault) started before the grow back`, 'recovery');
    this.#target.abandonStep();
    return this.#reshapeTo(g, job, rec.from, t0, step, 'grow');
  }

  /**
   * Copies the state after `step` completed steps into a local image and sends it to the holder in
   * the background. The older of the two buffers is reused once its own send has finished.
   */
  async snapshot(step: number, completed = true): Promise<void> {
    if (completed) this.#measured = this.#target.memoryNow();
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
    const image = takeLayoutImage(this.#target.items, step, reuse?.image);
    const entry: LocalImage = { step, key: imageKey(this.#epoch, dist.rank()), image, put: Promise.resolve() };
    entry.put = this.#send(entry);
    this.#images.push(entry);
  }

  async #send(entry: LocalImage): Promise<void> {
    if (!this.#holder) return;
    try {
      await this.#holder.put(entry.key, entry.step, this.#generation, encodeImage(entry.image));
    } catch (e) {
      // Training goes on; the client reconnects for the next copy. A loss of this rank before one arrives falls back to a checkpoint.
      if (!this.#putFailed) process.stderr.write(`nodetron: rank ${this.#jobRank}: could not send its in-memory copy to the holder (${(e as Error).message}); training goes on, and the next copy is sent again (a loss before one arrives falls back to a checkpoint)\n`);
      this.#putFailed = true;
    }
  }

  /**
   * After a step threw `error` (`reached`: the steps done, plus the one in progress when the error came
   * from inside a step; the steps lost are counted from it; NaN for a replacement still joining): waits for the launcher's next
   * generation, regroups, agrees on the newest step every rank holds, and restores it. Returns that
   * step, or null when no step is held by every rank (both copies of a rank lost: the caller falls
   * back to a checkpoint, collectively). Rethrows `error` when no new generation comes (the failure
   * was not a lost rank).
   */
  async recover(error: unknown, reached: number): Promise<number | null> {
    const t0 = Date.now();
    this.#target.abandonStep();
    let next = this.#generation + 1;
    const firstGeneration = next;
    this.lastLost = null;
    let rehomed = false;
    for (;;) {
      const g = await this.#generations.awaitFrom(next, this.#jobRank, error);
      try {
        const rec = await this.#generations.record(g);
        if (await this.#rehome(rec, g)) rehomed = true;
        if (rec.how === 'grow' && rec.from) return await this.#reshapeTo(g, this.#target.jobPlan(), rec.from, t0, reached, 'grow');
        if (rec.shrink) {
          // (The lost ranks in this world's numbering.)
          const lostWorld = (rec.lost ?? []).map((j) => this.#members.indexOf(j)).filter((w) => w >= 0);
          const plan = this.#shrinkPlan(lostWorld, await this.#survivorsMemory(g, rec.lost ?? []));
          // The lowest surviving rank tells the launcher (which starts replacements on a refusal, else the lost replicas' processes anew).
          const lowest = this.#members.findIndex((_, w) => !lostWorld.includes(w));
          if (dist.rank() === lowest) await this.#store.set(`recover/gen/${g}/plan`, JSON.stringify('refused' in plan ? plan : { members: plan.members, layout: plan.layout }));
          if (!('refused' in plan)) {
            if (!plan.members.includes(this.#jobRank)) return await this.#retire(g);
            return await this.#reshapeTo(g, plan, { epoch: this.#epoch, worldSize: this.#members.length }, t0, reached, 'shrink');
          }
          this.#target.log(`generation ${g}: no shrink (${plan.refused}); waiting for the lost rank's replacement`);
        }
        await dist.regroup(g);
        this.#generation = g;
        const step = await this.#agree(g, await this.#restorable());
        if (step === null) {
          this.#images = [];
          this.#restoring = false;
          this.#regrouped(g);
          return null;
        }
        const local = await this.#restoreOwn(step);
        // Its copies went to the lost node: the step the job goes on from is sent to the new holder now
        // (the next step waits for it), so a loss before the next copy does not fall back to disk.
        if (rehomed) local.put = this.#send(local);
        const lost = this.#lostSince(reached, step);
        this.#event('recovered', { step, ...lost, ms: Date.now() - t0 });
        this.#target.log(`generation ${g}: a rank was lost; regrouped and rolled back to step ${step} from memory in ${Date.now() - t0} ms (${lost.stepsLost} step(s) to redo)`);
        this.#regrouped(g);
        this.lastLost = await lostRanks(this.#store, firstGeneration, g);
        return step;
      } catch (e) {
        // Another rank was lost while regrouping: the launcher announces the generation after.
        if (!this.recoverable(e)) throw e;
        this.#target.abandonStep();
        next = g + 1;
      }
    }
  }

  /** The shrunk world for a loss without a spare (the same plan on every survivor: a pure function of the same facts). */
  #shrinkPlan(lost: number[], memory: ReadonlyMap<number, ShrinkMemory>): ReshapePlan | { refused: string } {
    if (this.#members.length !== this.#target.jobPlan().members.length) return { refused: 'the job is shrunk already (one loss at a time)' };
    return this.#target.planShrink(this.#members, lost, memory);
  }

  /**
   * Generation g's shrink: every survivor publishes what it says of its memory, and reads every other
   * survivor's (in short waits: a survivor lost meanwhile makes generation g + 1, which ends this).
   */
  async #survivorsMemory(g: number, lostJobRanks: readonly number[]): Promise<Map<number, ShrinkMemory>> {
    let mine: ShrinkMemory;
    try {
      mine = this.#target.shrinkMemory(this.#measured);
    } catch (e) {
      // An estimate that fails must not end the recovery: this rank's memory is then not checked.
      process.stderr.write(`nodetron: rank ${this.#jobRank}: no memory estimate for the shrink (${(e as Error).message}); its memory is not checked\n`);
      mine = { limit: 0, peaks: {} };
    }
    await this.#store.set(`recover/gen/${g}/memory/${this.#jobRank}`, JSON.stringify(mine));
    const survivors = this.#members.filter((j) => !lostJobRanks.includes(j));
    const keys = survivors.map((j) => `recover/gen/${g}/memory/${j}`);
    await this.#awaitKeys(g, keys, `the survivors of generation ${g} said what memory they have`, 'not every survivor said what memory it has');
    const out = new Map<number, ShrinkMemory>();
    for (let i = 0; i < survivors.length; i++) out.set(survivors[i]!, JSON.parse(await this.#store.getString(keys[i]!)) as ShrinkMemory);
    return out;
  }

  /**
   * A reshape (shrink or grow back) in generation g: this process joins the plan's world, builds its
   * layout there, meets the others, agrees on the newest step whose images the world `from` holds
   * complete, and restores this rank's new state from them (lib/ckpt/reshard-image.ts).
   */
  async #reshapeTo(g: number, plan: ReshapePlan, from: ImageWorld, t0: number, reached: number, kind: 'shrink' | 'grow'): Promise<number | null> {
    const rank = plan.members.indexOf(this.#jobRank);
    await this.#target.reshape(plan, g, rank);
    await dist.regroup(g);
    this.#generation = g;
    const step = await this.#restoreFrom(g, from, plan);
    if (step === null) return null;
    const lost = this.#lostSince(reached, step);
    this.#event('recovered', { step, ...lost, ms: Date.now() - t0, reshape: kind, worldSize: plan.members.length });
    this.#target.log(`generation ${g}: ${kind === 'shrink' ? 'no spare was free; the intact data-parallel replicas go on' : 'the job grew back'} under ${plan.layout.dp} replica(s), ` +
      `from step ${step} of the images in memory, in ${Date.now() - t0} ms (${lost.stepsLost} step(s) to redo)`);
    return step;
  }

  // After a reshape's regroup: the step, the restore, this world's bookkeeping.
  async #restoreFrom(g: number, from: ImageWorld, plan: ReshapePlan): Promise<number | null> {
    const step = await this.#agree(g, await this.#completeSteps(from));
    this.#members = [...plan.members];
    this.#epoch = g;
    this.#regrouped(g);
    const mine = this.#images;
    this.#images = [];
    this.#restoring = false; // (a replacement's part comes from the images too)
    if (step === null) return null;
    // Planned from the images' headers (a few kilobytes each): only the images holding this rank's new
    // parts are fetched whole, this process's own first (from its memory when it has it).
    const local = (r: number) => mine.find((i) => i.step === step && i.key === imageKey(from.epoch, r));
    const heads = async (r: number) => {
      const own = local(r);
      if (own) return { step: own.image.step, parts: own.image.parts, state: own.image.state };
      const c = await this.#client(from.epoch, r);
      let got = decodeImageHead(await c.get(imageKey(from.epoch, r), step, 16 << 10));
      if ('need' in got) got = decodeImageHead(await c.get(imageKey(from.epoch, r), step, got.need));
      if ('need' in got) throw new StateError(`the header of old rank ${r}'s image of step ${step} is cut short at its holder`);
      return got.head;
    };
    const ownKey = mine.find((i) => imageEpoch(i.key) === from.epoch)?.key;
    const oldRank = ownKey === undefined ? -1 : ownKey - imageKey(from.epoch, 0);
    await restoreFromImages(this.#target.items, async (r) => {
      const own = local(r);
      return own ? own.image : decodeImage(await (await this.#client(from.epoch, r)).get(imageKey(from.epoch, r), step));
    }, from.worldSize, { heads, ...(oldRank >= 0 ? { prefer: [oldRank] } : {}) });
    await this.#publishWhere();
    return step;
  }

  /** The steps for which every rank of world `from` has an image at its holder. */
  async #completeSteps(from: ImageWorld): Promise<number[]> {
    let common: Set<number> | null = null;
    for (let r = 0; r < from.worldSize; r++) {
      const steps = await (await this.#client(from.epoch, r)).list(imageKey(from.epoch, r));
      common = common === null ? new Set(steps) : new Set(steps.filter((x) => common!.has(x)));
    }
    return [...(common ?? [])].sort((x, y) => x - y);
  }

  /**
   * After a lost node: when the launcher moved this rank's copies to another holder (its own was on that
   * node), connect to it, give up the copies still on their way to the lost one (their node is gone; a
   * put there would wait out its timeout), and say where the images go now. The next copy goes there.
   */
  async #rehome(rec: GenerationRecord, g: number): Promise<boolean> {
    const next = rec.holders?.[this.#jobRank];
    if (!next || next === this.#holderAddress || !this.#holder) return false;
    const token = holderToken();
    const client = await HolderClient.connect(next, { ...(token ? { token } : {}), timeoutMs: 60_000 });
    const old = this.#holder;
    this.#putFailed = true; // the given-up puts fail quietly
    await old.close().catch(() => undefined);
    await Promise.all(this.#images.map((i) => i.put));
    this.#clients.delete(this.#holderAddress!);
    this.#holder = client;
    this.#holderAddress = next;
    this.#putFailed = false;
    await this.#publishWhere();
    this.#event('rehomed', { holder: next });
    this.#target.log(`generation ${g}: rank ${this.#jobRank}'s holder was on the lost node; its copies go to ${next} from now on`);
    return true;
  }

  /** Says where this rank's images go (its holder), for a reshape's readers. */
  async #publishWhere(): Promise<void> {
    if (this.#holderAddress) await this.#store.set(`recover/where/${imageKey(this.#epoch, dist.rank())}`, this.#holderAddress);
  }

  /** A connection to the holder of world `epoch`'s rank r's images. */
  async #client(epoch: number, r: number): Promise<HolderClient> {
    const address = await this.#store.getString(`recover/where/${imageKey(epoch, r)}`, { timeoutMs: AGREE_WAIT_MS });
    let c = this.#clients.get(address);
    if (!c) {
      const token = holderToken();
      c = this.#holderAddress === address && this.#holder ? Promise.resolve(this.#holder) : HolderClient.connect(address, { ...(token ? { token } : {}), timeoutMs: 60_000 });
      this.#clients.set(address, c);
    }
    return c;
  }

  // A survivor the shrink leaves out (its replica lost a rank): it waits for the launcher, which stops
  // this process and starts the rank anew for the grow back.
  async #retire(g: number): Promise<never> {
    this.#event('retired', {});
    this.#target.log(`generation ${g}: rank ${this.#jobRank}'s replica lost a rank; this process leaves the shrunk job`);
    await this.#store.getString(`recover/gen/${g}/released/${this.#jobRank}`, { timeoutMs: AGREE_WAIT_MS }).catch(() => undefined);
    throw new StateError(`rank ${this.#jobRank} left the job in generation ${g} (a shrink), and the launcher did not stop this process`);
  }

  // A replacement: meets the running ranks in its generation and restores the lost rank's image from the
  // holder. Another rank lost meanwhile (the survivors move on to a later generation): it follows them
  // there as one of them (recover: a shrink's memory and plan included), its state still at the holder.
  async #join(): Promise<void> {
    const t0 = Date.now();
    if (!this.#holder) throw new StateError(`rank ${this.#jobRank} joins a running job but has no holder to restore from (NODETRON_HOLDER is unset)`);
    this.#restoring = true;
    this.joined = true;
    const g = this.#generation;
    let step: number | null;
    try {
      this.#epoch = await this.#generations.epochAt(g);
      await dist.regroup(g);
      step = await this.#agree(g, await this.#restorable());
      if (step !== null) {
        await this.#restoreOwn(step);
        this.#event('recovered', { step, stepsLost: 0, ms: Date.now() - t0, joined: true });
      } else this.#images = [];
      this.#restoring = false;
      this.#regrouped(g);
    } catch (e) {
      if (!this.recoverable(e)) throw e;
      this.#epoch = await this.#generations.epochAt(g); // (again: the first read may be what failed)
      step = await this.recover(e, Number.NaN);
    }
    this.#joinedStep = step;
  }

  /** The steps this rank can restore: its own images, or a replacement's at the holder (the lost rank's copies). */
  async #restorable(): Promise<number[]> {
    return this.#restoring ? this.#holder!.list(imageKey(this.#epoch, dist.rank())) : this.steps;
  }

  /** Restores this rank's image of `step` (a replacement's from the holder) and drops its images of later steps. */
  async #restoreOwn(step: number): Promise<LocalImage> {
    if (this.#restoring) {
      const key = imageKey(this.#epoch, dist.rank());
      this.#images = [{ step, key, image: decodeImage(await this.#holder!.get(key, step)), put: Promise.resolve() }];
      this.#restoring = false;
    } else this.#images = this.#images.filter((i) => i.step <= step);
    const local = this.#images.find((i) => i.step === step)!;
    restoreImage(this.#target.items, local.image);
    return local;
  }

  // Generation g's world has met: its first completed step is reported, and its first step boundary
  // agrees that every copy is held (both set at the same point on every rank of g).
  #regrouped(g: number): void {
    this.#afterRecovery = { generation: g };
    this.#agreeNext = true;
  }

  /** What a recovery's event and log say of the steps lost (`reached`: NaN for a replacement, which lost none). */
  #lostSince(reached: number, step: number): { stepsLost: number; joined?: true } {
    return Number.isNaN(reached) ? { stepsLost: 0, joined: true } : { stepsLost: reached - step };
  }

  // A process the launcher started for the grow back (NODETRON_GROW: the shrink's generation): set up
  // under the job's layout with unconnected groups, it says it is ready and waits for the grow
  // generation, then meets every rank there and restores its state from the shrunk world's images.
  async #growJoin(shrinkGeneration: number): Promise<void> {
    const t0 = Date.now();
    if (!Number.isSafeInteger(shrinkGeneration) || shrinkGeneration < 1) throw new StateError(`NODETRON_GROW=${shrinkGeneration} is not a generation`);
    await this.#store.set(`recover/grow/${shrinkGeneration}/ready/${this.#jobRank}`, '1');
    let next = shrinkGeneration + 1;
    for (;;) {
      const rec = await this.#generations.record(next, 24 * 3600_000);
      if (rec.how === 'grow' && rec.from) {
        await dist.regroup(next);
        this.#generation = next;
        const step = await this.#restoreFrom(next, rec.from, this.#target.jobPlan());
        this.joined = true;
        this.#joinedStep = step;
        if (step !== null) this.#event('recovered', { step, stepsLost: 0, ms: Date.now() - t0, joined: true, reshape: 'grow' });
        return;
      }
      next++;
    }
  }

  #joinedStep: number | null = 0;
  /** The step a replacement restored (0 for other ranks; null when no rank held a common step: the run falls back to a checkpoint). */
  get joinedStep(): number | null { return this.#joinedStep; }

  /** Records a fall-back to the newest checkpoint on disk. */
  fellBack(dir: string | null): void { this.#event('fallback-disk', { dir }); }

  // Every rank of the current world publishes the steps it can restore; the answer is the newest step all of them have.
  async #agree(g: number, have: number[]): Promise<number | null> {
    const me = dist.rank(), size = dist.worldSize();
    await this.#store.set(`recover/gen/${g}/have/${me}`, JSON.stringify(have));
    const keys = Array.from({ length: size }, (_, r) => `recover/gen/${g}/have/${r}`);
    await this.#awaitKeys(g, keys, `the ranks of generation ${g} agreed on a step`, 'not every rank said which steps it holds');
    let common: Set<number> | null = null;
    for (const k of keys) {
      const steps = JSON.parse(await this.#store.getString(k)) as number[];
      common = common === null ? new Set(steps) : new Set(steps.filter((s) => common!.has(s)));
    }
    const best = Math.max(-1, ...(common ?? []));
    return best < 0 ? null : best;
  }

  /**
   * Waits until every key of generation g's `keys` is in the store, in short waits: a rank lost before
   * it published (the launcher then starts generation g + 1) must not hold the others here, since the
   * abort file does not reach a store wait. CommError when g + 1 starts (`doing`: what the ranks were
   * doing), TimeoutError after AGREE_WAIT_MS (`missing`: what did not come).
   */
  async #awaitKeys(g: number, keys: string[], doing: string, missing: string): Promise<void> {
    const deadline = Date.now() + AGREE_WAIT_MS;
    while (!(await this.#store.check(keys))) {
      if (await this.#store.tryGet(`recover/gen/${g + 1}`)) throw new CommError(`generation ${g + 1} started while ${doing}`, 'recovery');
      if (Date.now() > deadline) throw new TimeoutError(`generation ${g}: ${missing} within ${AGREE_WAIT_MS} ms`, 'recovery');
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  /** Closes the holder connections. */
  async close(): Promise<void> {
    await Promise.allSettled(this.#images.map((i) => i.put));
    await this.#holder?.close();
    for (const c of this.#clients.values()) await c.then((x: HolderClient) => (x === this.#holder ? undefined : x.close())).catch(() => undefined);
  }
}
