// Decisions every rank of a group takes together, so that all ranks succeed or all fail at the same
// point and none waits in a collective the others never reach: which ranks failed, whether the ranks
// were started with the same settings (compared by digest), and the elementwise largest of a few
// integers. One max all-reduce of 32-bit integers per decision, on a tensor of the group's own device:
// cpu when the group communicates there (Gloo, the in-process test groups), else its first device (an
// NCCL-only group takes only cuda tensors). Training set-up (lib/train/setup.ts), the layout check
// (lib/parallel/layout.ts), ParallelTrainer.create and checkpoints (lib/ckpt/checkpoint.ts) decide here.
import { tensor } from '../creation.js';
import { ArgumentError } from '../errors.js';
import type { CollectiveGroup } from './group.js';

const I32_MAX = 0x7fffffff;

/**
 * The device a group's agreement tensors go on: cpu when the group communicates on cpu or says
 * nothing of its devices (host groups), else its first device (an NCCL-only group: 'cuda:N').
 */
export function agreementDevice(group: CollectiveGroup): string {
  const devices = group.devices;
  return !devices || devices.length === 0 || devices.includes('cpu') ? 'cpu' : devices[0]!;
}

/** FNV-1a of a string, folded to 31 bits (so it and its negation are 32-bit integers): a digest ranks compare instead of the text. */
export function settingsDigest(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) { h ^= text.charCodeAt(i); h = Math.imul(h, 0x01000193); }
  return h >>> 1;
}

function checkValues(call: string, values: readonly number[]): void {
  if (values.some((v) => !Number.isInteger(v) || Math.abs(v) > I32_MAX)) {
    throw new ArgumentError(`${call}: values must be 32-bit integers, got [${values.join(',')}]`);
  }
}

/**
 * The elementwise largest of every member's `values` (one max all-reduce of i32 on the group's device).
 * Every member must pass as many values. In one process (no group, or a group of one): the values.
 */
export async function agreeMax(group: CollectiveGroup | null, values: readonly number[]): Promise<number[]> {
  checkValues('agreeMax', values);
  // A group a joining process has not connected yet (in-job recovery): the running ranks agreed on
  // these settings when they started, and the joiner runs the same command, so it answers alone.
  if (!group || group.size <= 1 || values.length === 0 || (group as { connected?: boolean }).connected === false) return [...values];
  using t = tensor(new Int32Array(values), [values.length], { dtype: 'i32', device: agreementDevice(group) });
  await group.allReduce(t, { op: 'max' });
  return Array.from(t.toArraySync());
}

/**
 * Compares integer values across every member of `group`: null when every member passed the same
 * values, else their elementwise minimum and maximum. Every member must pass as many values, and
 * every member learns the outcome, so all of them can fail together.
 */
export async function rangeAcrossRanks(group: CollectiveGroup, values: readonly number[]): Promise<{
  /** Elementwise minimum over the members. */
  min: number[];
  /** Elementwise maximum over the members. */
  max: number[];
} | null> {
  checkValues('rangeAcrossRanks', values);
  const both = await agreeMax(group, [...values, ...values.map((v) => -v)]);
  const max = both.slice(0, values.length), min = both.slice(values.length).map((v) => 0 - v);
  return max.some((v, i) => v !== min[i]) ? { min, max } : null;
}

/** What the members of a group learned together. */
export interface Agreement {
  /** The members that reported a failure, as world ranks (`group.ranks`), ascending; empty when none did. */
  failed: number[];
  /** Whether the members passed different settings (false when no settings were given). */
  settingsDiffer: boolean;
  /** The elementwise largest of the members' `values`. */
  max: number[];
}

/**
 * One collective decision: whether this rank failed, its settings (compared by digest) and extra
 * 32-bit integers (max-reduced). Every member learns which members failed, whether their settings
 * differ, and the largest values. In one process: this rank's own outcome.
 */
export async function agree(group: CollectiveGroup | null, failed: boolean, opts: { settings?: string; values?: readonly number[] } = {}): Promise<Agreement> {
  const values = opts.values ?? [];
  checkValues('agree', values);
  const size = group && group.size > 1 ? group.size : 1, rank = size > 1 ? group!.rank : 0;
  const worldRank = (i: number) => (group && group.ranks.length === group.size ? group.ranks[i]! : i);
  const digest = opts.settings === undefined ? 0 : settingsDigest(opts.settings);
  // [one flag per member][digest, -digest][values]: the max of -digest is minus the smallest digest.
  const mine = [...Array.from({ length: size }, (_, i) => (i === rank && failed ? 1 : 0)), digest, -digest, ...values];
  const all = size > 1 ? await agreeMax(group, mine) : mine;
  return {
    failed: all.slice(0, size).flatMap((f, i) => (f ? [worldRank(i)] : [])),
    settingsDiffer: all[size]! !== -all[size + 1]!,
    max: all.slice(size + 2),
  };
}

/** Ranks for a message: "rank 3", "ranks 1 and 3", "ranks 0, 2 and 5". */
export function formatRanks(ranks: readonly number[]): string {
  if (ranks.length === 1) return `rank ${ranks[0]}`;
  return `ranks ${ranks.slice(0, -1).join(', ')} and ${ranks[ranks.length - 1]}`;
}

/** How {@link agreeAll} words the errors of ranks that did not fail themselves. */
export interface AgreeAllOptions {
  /**
   * The error a rank throws when it did not fail but others did, given them ("rank 1", "ranks 1 and 3"):
   * a typed error, the same on every such rank.
   */
  failedElsewhere: (ranks: string) => Error;
  /** This rank's settings: the ranks compare them (by digest) and all fail when they differ. */
  settings?: string;
  /** The error every rank throws when the settings differ and no rank failed (needed with `settings`). */
  mismatch?: () => Error;
  /** Extra 32-bit integers max-reduced in the same collective (returned in `max`). */
  values?: readonly number[];
}

/**
 * All ranks succeed or all throw. `problem` is this rank's failure (null when it has none): every
 * member learns which members failed; a rank that failed throws its own `problem`, every other one
 * throws `failedElsewhere` naming the failed ranks; with `settings`, when no rank failed but the
 * settings differ, every rank throws `mismatch()`. Otherwise returns the agreement (its `max`).
 * In one process: throws `problem` if any.
 */
export async function agreeAll(group: CollectiveGroup | null, problem: Error | null, opts: AgreeAllOptions): Promise<Agreement> {
  if (opts.settings !== undefined && !opts.mismatch) throw new ArgumentError('agreeAll: settings need a mismatch error');
  const a = await agree(group, problem !== null, { ...(opts.settings !== undefined ? { settings: opts.settings } : {}), ...(opts.values ? { values: opts.values } : {}) });
  if (problem) throw problem;
  if (a.failed.length > 0) throw opts.failedElsewhere(formatRanks(a.failed));
  if (a.settingsDiffer) throw opts.mismatch!();
  return a;
}
