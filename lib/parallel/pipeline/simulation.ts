// Pipeline schedules simulated: a table run on an ideal machine (given costs per action, no
// communication time) gives its makespan, bubble and activations in flight, or a deadlock; and the
// papers' bubble formulas beside it.
import { StateError } from '../../errors.js';
import { virtualStageOf, type ChunkPlacement } from './placement.js';
import type { PipelineAction, ScheduleKind } from './tables.js';

/** Costs of one micro-batch's work on one chunk for {@link simulateSchedule}, in any time unit. */
export interface ActionCosts {
  /** Forward. */
  F: number;
  /** Backward (input and weight gradient) where not split; the input gradient where W is separate. */
  B: number;
  /** The weight gradient, when the schedule runs it as W. */
  W: number;
}

/** What {@link simulateSchedule} finds. */
export interface ScheduleSimulation {
  /** Time from the first action's start to the last one's end (every rank starts at 0). */
  makespan: number;
  /** Idle fraction of the ranks' time over the makespan: 1 − Σ busy / (p · makespan). */
  bubble: number;
  /** Per rank, the most micro-batch chunks holding activations at once (forward done, backward — or W where split — not yet). */
  peakInFlight: number[];
}

/**
 * Runs the tables on an ideal machine (no communication time, the given costs per action) and
 * returns the makespan, the bubble fraction and each rank's peak of micro-batches in flight. Throws
 * a StateError when the tables deadlock (an action waits for one that can never run). Where a
 * table has no W, a B costs costs.B + costs.W (the whole backward). `costs` may instead give each
 * action's own cost (rank, action, its index in the rank's table): a replay of measured actions.
 * `placement`: how chunks map to virtual stages ('v' for zb-v's tables).
 */
export function simulateSchedule(tables: readonly (readonly PipelineAction[])[], chunks: number, costs: ActionCosts | ((rank: number, action: PipelineAction, index: number) => number), placement: ChunkPlacement = 'loop'): ScheduleSimulation {
  const p = tables.length, V = p * chunks;
  // When each (op, micro-batch, virtual stage) finished, NaN until it has: a flat array (the planner
  // simulates tables of thousands of actions for every candidate layout).
  let M = 0;
  for (const [r, t] of tables.entries()) {
    for (const [i, a] of t.entries()) {
      if (!Number.isInteger(a.micro) || a.micro < 0) throw new StateError(`simulateSchedule: rank ${r}'s action ${i} has micro-batch ${a.micro} (a non-negative integer is needed)`);
      M = Math.max(M, a.micro + 1);
    }
  }
  const done = new Float64Array(3 * M * V).fill(NaN);
  const key = (op: string, micro: number, vs: number) => ((op === 'F' ? 0 : op === 'B' ? 1 : 2) * M + micro) * V + vs;
  const split = tables.some((t) => t.some((a) => a.op === 'W'));
  const next = new Array<number>(p).fill(0), free = new Array<number>(p).fill(0), busy = new Array<number>(p).fill(0);
  const held = new Array<number>(p).fill(0), peak = new Array<number>(p).fill(0);
  let remaining = tables.reduce((n, t) => n + t.length, 0);
  while (remaining > 0) {
    let progressed = false;
    for (let r = 0; r < p; r++) {
      const a = tables[r]![next[r]!];
      if (!a) continue;
      const vs = virtualStageOf(r, a.chunk, p, placement);
      if (!(Number.isInteger(vs) && vs >= 0 && vs < V)) throw new StateError(`simulateSchedule: rank ${r}'s action ${next[r]} (${a.op} of micro-batch ${a.micro}, chunk ${a.chunk}) is outside ${p} stages of ${chunks} chunks`);
      let dep: number | null = null;
      if (a.op === 'F' && vs > 0) dep = key('F', a.micro, vs - 1);
      else if (a.op === 'B') dep = vs < V - 1 ? key('B', a.micro, vs + 1) : key('F', a.micro, vs);
      else if (a.op === 'W') dep = key('B', a.micro, vs);
      const at = dep === null ? 0 : done[dep]!;
      if (Number.isNaN(at)) continue;
      const cost = typeof costs === 'function' ? costs(r, a, next[r]!) : a.op === 'F' ? costs.F : a.op === 'W' ? costs.W : split ? costs.B : costs.B + costs.W;
      const start = Math.max(free[r]!, at);
      free[r] = start + cost; busy[r]! += cost;
      done[key(a.op, a.micro, vs)] = free[r]!;
      if (a.op === 'F') peak[r] = Math.max(peak[r]!, ++held[r]!);
      else if (a.op === (split ? 'W' : 'B')) held[r]!--;
      next[r]!++; remaining--; progressed = true;
    }
    if (!progressed) throw new StateError(`simulateSchedule: the tables deadlock (rank actions left: ${next.map((n, r) => tables[r]!.length - n).join(', ')})`);
  }
  const makespan = Math.max(...free);
  const total = busy.reduce((a, b) => a + b, 0);
  return { makespan, bubble: makespan > 0 ? 1 - total / (p * makespan) : 0, peakInFlight: peak };
}

/**
 * The papers' bubble as a fraction of the step (idle over total time; the papers' (p − 1)/m and
 * (p − 1)/(v·m) are relative to the ideal time): GPipe and 1F1B (p − 1)/(m + p − 1), interleaved
 * (p − 1)/(v·m + p − 1), ZB-H1 with F = B = W (idle (p − 1)(T_F + T_B − T_W) per rank)
 * (p − 1)/(3m + p − 1); ZB-V with F = B = W per chunk (half a stage: idle p − 1 chunk units per
 * rank against 6m of work) (p − 1)/(6m + p − 1), when m >= p.
 */
export function formulaBubble(kind: ScheduleKind, p: number, m: number, v = 1): number {
  if (kind === 'interleaved') return (p - 1) / (v * m + p - 1);
  if (kind === 'zb-v') return (p - 1) / (6 * m + p - 1);
  if (kind === 'zb-h1') return (p - 1) / (3 * m + p - 1);
  return (p - 1) / (m + p - 1);
}
