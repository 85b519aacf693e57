// Check mode: before each collective every rank publishes what it is about to run and verifies that
// all ranks of the group agree, so a mismatched call order fails loudly instead of hanging.
import { CommError } from '../errors.js';
import type { Store } from './store.js';

/** What a rank is about to run; every field must match across the group. */
export interface CollectiveDescription {
  /** The group's sequence number of the collective. */
  seq: number;
  /** The collective's name (allReduce, broadcast, ...). */
  op: string;
  /** The tensor's dtype. */
  dtype: string;
  /** Elements. */
  count: number;
  /** The root rank, for rooted collectives. */
  root?: number;
}

/** One-line description of a collective for error messages, e.g. '#3 allReduce dtype=f32 count=1024'. */
export function describeCollective(d: CollectiveDescription): string {
  return `#${d.seq} ${d.op} dtype=${d.dtype} count=${d.count}${d.root === undefined ? '' : ` root=${d.root}`}`;
}

/**
 * Publishes `d` under the group's key for `seq` (in `generation`: in-job recovery restarts sequence
 * numbers at 0 in each generation, so an older generation's keys must never be read as this one's) and
 * compares it with every other rank's; throws CommError naming both descriptions at the first mismatch,
 * TimeoutError when a rank never publishes.
 */
export async function verifyCollective(store: Store, group: string, rank: number, size: number, d: CollectiveDescription,
  timeoutMs: number, generation = 0): Promise<void> {
  const mine = describeCollective(d);
  const gen = generation > 0 ? `gen${generation}/` : '';
  const key = (r: number): string => `check/${gen}${group}/${d.seq}/${r}`;
  await store.set(key(rank), mine);
  for (let r = 0; r < size; r++) {
    if (r === rank) continue;
    const theirs = await store.getString(key(r), { timeoutMs });
    if (theirs !== mine) {
      throw new CommError(`collective mismatch in group '${group}': rank ${rank} runs ${mine} but rank ${r} runs ${theirs}`, 'checkCollective');
    }
  }
}
