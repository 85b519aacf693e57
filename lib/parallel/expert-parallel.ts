// Expert parallelism: the MoE experts split over the ranks of an expert-parallel group (carved out of
// the data-parallel ranks, lib/parallel/mesh.ts). Each rank routes its own tokens; the rows go to the
// ranks holding their experts with an all-to-all of variable counts (the counts exchanged first),
// run there as one GEMM loop over the rows grouped by local expert, and come back the same way. The
// all-to-all is an autograd function whose backward is the reverse all-to-all. The router's counts
// are summed over the data-parallel group so the load-balancing loss is that of the whole batch.
// The counts' small tensors go on each group's agreement device (lib/distributed/agree.ts): cpu when
// the group communicates there, else its first device (an NCCL-only group takes only cuda tensors).
import { needsGrad, record } from '../autograd/engine.js';
import { tensor } from '../creation.js';
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { embedding } from '../ops/index.js';
import type { MoEParallel } from '../nn/moe.js';
import { emptyOn, type Tensor } from '../tensor.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { finishSync } from '../distributed/finish-sync.js';
import { agreementDevice } from '../distributed/agree.js';

function allToAllOf(group: CollectiveGroup, call: string): NonNullable<CollectiveGroup['allToAll']> {
  if (typeof group.allToAll !== 'function') throw new StateError(`${call}: group '${group.name}' has no allToAll (expert parallelism needs a process group)`);
  return group.allToAll.bind(group);
}

/**
 * Rows of x [S, C] exchanged over the group: sendRows[i] consecutive rows go to member i, and
 * recvRows[j] rows arrive from member j, in member order ([Σ recvRows, C]). Backward sends the
 * gradient's rows back the reverse way. Finished before returning.
 */
export function allToAllRows(x: Tensor, group: CollectiveGroup, sendRows: readonly number[], recvRows: readonly number[]): Tensor {
  const call = 'allToAllRows';
  if (x.ndim !== 2) throw new ShapeError(`${call}: x must be [rows, C], got ${x.describe()}`);
  if (sendRows.length !== group.size || recvRows.length !== group.size) throw new ArgumentError(`${call}: sendRows and recvRows need one count per member of the group (${group.size})`);
  const c = x.shape[1]!;
  if (sendRows.reduce((a, b) => a + b, 0) !== x.shape[0]) throw new ShapeError(`${call}: sendRows ${JSON.stringify(sendRows)} do not add up to the ${x.shape[0]} rows of x`);
  const exchange = (t: Tensor, send: readonly number[], recv: readonly number[]): Tensor => {
    const out = emptyOn([recv.reduce((a, b) => a + b, 0), c], t.dtype, t.deviceInfo);
    finishSync(() => allToAllOf(group, call)(out, t, { sendCounts: send.map((r) => r * c), recvCounts: recv.map((r) => r * c) }), { call, group, buffers: [out] });
    return out;
  };
  const out = exchange(x, sendRows, recvRows);
  if (!needsGrad(x)) return out;
  const send = [...sendRows], recv = [...recvRows];
  return record('allToAllRows', out, [x], (g) => [exchange(g, recv, send)]);
}

/** Integer counts exchanged over the group: counts holds group.size blocks of `block` values, block i for member i; returns the blocks received, member order. */
export function exchangeCounts(counts: readonly number[], block: number, group: CollectiveGroup): number[] {
  const call = 'exchangeCounts';
  if (counts.length !== block * group.size) throw new ArgumentError(`${call}: ${counts.length} counts are not ${group.size} blocks of ${block}`);
  const allToAll = allToAllOf(group, call);
  const device = agreementDevice(group);
  const send = tensor(Int32Array.from(counts), [counts.length], { dtype: 'i32', device });
  let recv: Tensor;
  try {
    recv = tensor(new Int32Array(counts.length), [counts.length], { dtype: 'i32', device });
  } catch (e) {
    send.dispose();
    throw e;
  }
  // On failure finishSync frees the buffers once the exchange has settled.
  finishSync(() => allToAll(recv, send), { call, group, buffers: [send, recv] });
  try {
    return Array.from(recv.toArraySync());
  } finally {
    send.dispose();
    recv.dispose();
  }
}

/** Options of {@link expertParallel}. */
export interface ExpertParallelOptions {
  /** Routed experts of the model's MoE layers. */
  experts: number;
  /** The expert-parallel group (null or size 1: every expert here). */
  epGroup: CollectiveGroup | null;
  /** The group over which the router's counts are summed (the data-parallel group); null: local counts. */
  countGroup: CollectiveGroup | null;
}

/**
 * What an MoE layer needs under expert and data parallelism: the experts this rank holds (a
 * contiguous 1/ep of them), the all-to-all dispatch, the router counts summed over the data-parallel
 * group, and the expert weights' gradient scale 1/ep (each expert's gradient sums ep ranks' tokens,
 * each rank's loss a mean over its own; with the expert-data-parallel average that makes the
 * gradient of the mean over the data-parallel group).
 */
export function expertParallel({ experts, epGroup, countGroup }: ExpertParallelOptions): MoEParallel {
  const ep = epGroup?.size ?? 1;
  if (!Number.isInteger(experts) || experts < 1) throw new ArgumentError(`expertParallel: experts must be a positive integer, got ${experts}`);
  if (experts % ep !== 0) throw new ArgumentError(`expertParallel: the expert-parallel size ${ep} must divide the ${experts} experts`);
  const local = experts / ep, r = epGroup?.rank ?? 0;
  const par: MoEParallel = {
    expertStart: r * local,
    expertEnd: (r + 1) * local,
    expertGradScale: 1 / ep,
  };
  if (countGroup && countGroup.size > 1) {
    par.sumCounts = (counts) => {
      const t = tensor(Float32Array.from(counts), [counts.length], { device: agreementDevice(countGroup) });
      finishSync(() => countGroup.allReduce(t, { op: 'sum' }), { call: 'MoE router counts', group: countGroup, buffers: [t] });
      try {
        return Array.from(t.toArraySync());
      } finally {
        t.dispose();
      }
    };
  }
  if (epGroup && ep > 1) {
    par.dispatch = (xs, counts, runLocal) => {
      if (counts.length !== experts) throw new ShapeError(`expertParallel: ${counts.length} expert counts for ${experts} experts`);
      // What each member sends me, per local expert: recv[s·local + l].
      const recv = exchangeCounts(counts, local, epGroup);
      const sendRows = Array.from({ length: ep }, (_, i) => counts.slice(i * local, (i + 1) * local).reduce((a, b) => a + b, 0));
      const recvRows = Array.from({ length: ep }, (_, s) => recv.slice(s * local, (s + 1) * local).reduce((a, b) => a + b, 0));
      const arrived = allToAllRows(xs, epGroup, sendRows, recvRows);
      // Arrived rows are grouped (source, local expert); the experts want (local expert, source).
      const start: number[] = [];
      let at = 0;
      for (const v of recv) { start.push(at); at += v; }
      const order: number[] = [];
      const localCounts: number[] = [];
      for (let l = 0; l < local; l++) {
        let n = 0;
        for (let s = 0; s < ep; s++) {
          const b = s * local + l;
          for (let i = 0; i < recv[b]!; i++) order.push(start[b]! + i);
          n += recv[b]!;
        }
        localCounts.push(n);
      }
      const inverse = new Int32Array(order.length);
      order.forEach((src, i) => { inverse[src] = i; });
      const dev = { device: xs.device, dtype: 'i32' as const };
      const byExpert = embedding(tensor(Int32Array.from(order), [order.length], dev), arrived);
      const done = runLocal(byExpert, localCounts);
      const bySource = embedding(tensor(inverse, [inverse.length], dev), done);
      return allToAllRows(bySource, epGroup, recvRows, sendRows);
    };
  }
  return par;
}
