// Small f32 totals reduced over a chain of groups: what a training step sums or averages across its
// ranks besides gradients (a loss, counted tokens, a gradient norm's sums of squares). Each total
// goes on the group's agreement device (agree.ts): cpu when the group communicates there, else its
// first device, so an NCCL-only group (which takes only cuda tensors) reduces it like any other.
import { tensor } from '../creation.js';
import type { Tensor } from '../tensor.js';
import { agreementDevice } from './agree.js';
import type { ReduceOp } from './collectives.js';
import type { CollectiveGroup } from './group.js';

/** One reduction of a chain: a group (null, absent or of one rank: skipped) and its op (default 'sum'). */
export interface TotalStep {
  /** The group to reduce over; skipped when null or of one rank. */
  readonly group: CollectiveGroup | null | undefined;
  /** How the members' values combine (default 'sum'). */
  readonly op?: ReduceOp;
}

/**
 * `values` reduced over each step's group in turn, in one f32 tensor on the first group's agreement
 * device (moved when a later group communicates elsewhere). When no step has a group of more than one
 * rank the values come back as given (no f32 rounding); otherwise rounded to f32 once and reduced.
 */
export async function reduceTotals(values: readonly number[], steps: readonly TotalStep[]): Promise<number[]> {
  const live = steps.filter((s): s is TotalStep & { group: CollectiveGroup } => s.group !== null && s.group !== undefined && s.group.size > 1);
  if (live.length === 0 || values.length === 0) return [...values];
  let t: Tensor = tensor(Float32Array.from(values), [values.length], { device: agreementDevice(live[0]!.group) });
  try {
    for (const { group, op } of live) {
      const device = agreementDevice(group);
      if (t.device !== device) {
        const moved = t.to(device);
        t.dispose();
        t = moved;
      }
      await group.allReduce(t, { op: op ?? 'sum' });
    }
    return Array.from(t.toArraySync());
  } finally {
    t.dispose();
  }
}
