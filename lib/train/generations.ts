// In-job recovery's generation records (`recover/gen/<g>`, written by the launcher: lib/launch/recovery.ts),
// as the ranks read them from the job's store.
import { recoveryEnv } from '../distributed/recovery-env.js';
import type { Store } from '../distributed/store.js';
import { StateError } from '../errors.js';

/** The world whose images a reshape restores from: the reshape generation that made it (0: the first) and its size. */
export interface ImageWorld { epoch: number; worldSize: number }

/** `recover/gen/<g>` as the launcher writes it (the fields the ranks read). */
export interface GenerationRecord {
  lost?: number[];
  how?: string;
  /** No hot spare was free for the loss: the data-parallel survivors may go on without the lost replicas. */
  shrink?: boolean;
  /** The grow back: every job rank in the job's own layout, from the images of the shrunk world `from`. */
  from?: ImageWorld;
  /** A lost node: every job rank's holder from now on (the launcher's choice). */
  holders?: string[];
}

/** The generation records of one job, read through its store. */
export class GenerationRecords {
  constructor(private readonly store: Store) {}

  /** The record of generation g (waiting for it up to `timeoutMs`; the store's default wait without). */
  async record(g: number, timeoutMs?: number): Promise<GenerationRecord> {
    return JSON.parse(await this.store.getString(`recover/gen/${g}`, timeoutMs === undefined ? undefined : { timeoutMs })) as GenerationRecord;
  }

  /** The record of generation g, or undefined when it is not out yet. */
  async tryRecord(g: number): Promise<GenerationRecord | undefined> {
    const v = await this.store.tryGet(`recover/gen/${g}`);
    return v ? JSON.parse(new TextDecoder().decode(v)) as GenerationRecord : undefined;
  }

  /** The reshape generation that made the world of generation g (0 when none did). */
  async epochAt(g: number): Promise<number> {
    let epoch = 0;
    for (let k = 1; k <= g; k++) {
      const rec = await this.tryRecord(k);
      if (!rec) continue;
      if (rec.how === 'grow') epoch = k;
      else if (rec.shrink) {
        const plan = await this.store.tryGet(`recover/gen/${k}/plan`);
        if (plan && !('refused' in (JSON.parse(new TextDecoder().decode(plan)) as object))) epoch = k;
      }
    }
    return epoch;
  }

  /**
   * The newest generation from g on, once g is out (two faults close together: the later one). Throws
   * `error` when none comes within the recovery's generation wait (the failure was not a lost rank), and
   * StateError when a record declares `jobRank` lost (frozen, then woken: it was replaced and must leave).
   */
  async awaitFrom(g: number, jobRank: number, error: unknown): Promise<number> {
    // How long a rank whose collective failed waits for the next generation: longer than the launcher's worst detection.
    const deadline = Date.now() + recoveryEnv().generationWaitMs;
    for (;;) {
      let newest = 0;
      for (let k = g; ; k++) {
        const rec = await this.tryRecord(k);
        if (!rec) break;
        if (rec.lost?.includes(jobRank)) throw new StateError(`rank ${jobRank} was declared lost in generation ${k} and replaced; this process leaves the job`);
        newest = k;
      }
      if (newest > 0) return newest;
      if (Date.now() > deadline) throw error;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}
