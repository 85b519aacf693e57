// Pipeline schedules as tables of actions: for each rank, the order of its micro-batches' forwards
// (F), backwards (B; under ZB-H1 and ZB-V only the input gradient) and weight gradients (W) on its
// model chunks. GPipe, 1F1B and interleaved 1F1B by formula, ZB-H1 by formula, ZB-V from a list
// scheduler whose candidate tables simulation.ts scores. The schedules' names and shape checks too.
import { ArgumentError, StateError } from '../../errors.js';
import { virtualStageOf } from './placement.js';
import { simulateSchedule, type ActionCosts } from './simulation.js';

/** The schedules' names. */
export type ScheduleKind = 'gpipe' | '1f1b' | 'interleaved' | 'zb-h1' | 'zb-v';
/** Every schedule, in the order the docs and the benchmark list them. */
export const SCHEDULE_KINDS: readonly ScheduleKind[] = ['gpipe', '1f1b', 'interleaved', 'zb-h1', 'zb-v'];

/** Whether a schedule splits each backward into B (input gradient) and W (weight gradient): the zero-bubble ones. */
export function splitsBackward(kind: string): boolean { return kind === 'zb-h1' || kind === 'zb-v'; }

/** One step of a rank's schedule: F (forward), B (backward; ZB-H1: the input gradient only) or W (ZB-H1's weight gradient). */
export interface PipelineAction {
  /** F: forward; B: backward (under ZB-H1 its input gradient only); W: ZB-H1's weight gradient. */
  readonly op: 'F' | 'B' | 'W';
  /** The micro-batch. */
  readonly micro: number;
  /** The rank's model chunk (0 unless interleaved or zb-v); its virtual stage is virtualStageOf(rank, chunk). */
  readonly chunk: number;
}

/** What a schedule table is built for. */
export interface ScheduleShape {
  /** Pipeline ranks p. */
  stages: number;
  /** Micro-batches m per step. */
  microBatches: number;
  /** Model chunks per rank v (interleaved: v >= 2; zb-v: 2; default 1). */
  chunks?: number;
}

/** Checks a schedule's name and shape; throws an ArgumentError naming the problem. */
export function checkSchedule(kind: string, shape: ScheduleShape, call = 'pipeline'): asserts kind is ScheduleKind {
  const { stages: p, microBatches: m } = shape, v = shape.chunks ?? 1;
  if (!(SCHEDULE_KINDS as readonly string[]).includes(kind)) throw new ArgumentError(`${call}: unknown schedule '${kind}' (expected ${SCHEDULE_KINDS.join(', ')})`);
  if (!Number.isInteger(p) || p < 1) throw new ArgumentError(`${call}: stages must be an integer >= 1, got ${p}`);
  if (!Number.isInteger(m) || m < 1) throw new ArgumentError(`${call}: numMicroBatches must be an integer >= 1, got ${m}`);
  if (!Number.isInteger(v) || v < 1) throw new ArgumentError(`${call}: virtual stages must be an integer >= 1, got ${v}`);
  if (kind === 'interleaved') {
    if (v < 2) throw new ArgumentError(`${call}: the interleaved schedule needs --virtual-stages >= 2 (with 1 chunk per rank it is 1f1b), got ${v}`);
    if (p < 2) throw new ArgumentError(`${call}: the interleaved schedule needs at least 2 pipeline stages, got ${p}`);
    if (m % p !== 0) throw new ArgumentError(`${call}: the interleaved schedule needs the micro-batches to be a multiple of the pipeline stages (as Megatron-LM requires): ${m} micro-batches over ${p} stages`);
  } else if (kind === 'zb-v') {
    if (v !== 2) throw new ArgumentError(`${call}: the zb-v schedule holds exactly 2 model chunks per rank (the V: one down the pipeline, one back), got ${v}`);
    if (p < 2) throw new ArgumentError(`${call}: the zb-v schedule needs at least 2 pipeline stages, got ${p}`);
  } else if (v !== 1) {
    throw new ArgumentError(`${call}: ${v} virtual stages need the interleaved schedule (or 2 with zb-v), not '${kind}'`);
  }
}

/**
 * Every rank's table of a schedule (index = pipeline rank). GPipe: all forwards, then all
 * backwards. 1F1B: (p − r − 1) warm-up forwards, then one forward one backward, then the rest of the
 * backwards. Interleaved 1F1B (Megatron-LM's order): forwards go through the chunks in groups of p
 * micro-batches, backwards through them in reverse, with 2(p − r − 1) + (v − 1)p warm-up forwards.
 * ZB-H1 (Qi et al. 2024): 1F1B's forwards and input-gradient backwards, rank r's weight gradients
 * W lagging r backwards behind and filling the time it would wait; at most p micro-batches hold
 * activations on any rank (1F1B's first rank's peak). ZB-V: each rank holds virtual stages r and
 * 2p − 1 − r, its table built by a list scheduler (zeroBubbleVTables below); at most 2p chunks (p
 * whole-stage micro-batches) hold activations on any rank.
 */
export function scheduleTables(kind: ScheduleKind, shape: ScheduleShape): PipelineAction[][] {
  checkSchedule(kind, shape, 'scheduleTables');
  const { stages: p, microBatches: m } = shape, v = shape.chunks ?? 1;
  if (kind === 'zb-h1') return zeroBubbleH1Tables(p, m);
  if (kind === 'zb-v') return zeroBubbleVTables(p, m);
  const tables: PipelineAction[][] = [];
  for (let r = 0; r < p; r++) {
    const t: PipelineAction[] = [];
    const F = (micro: number, chunk = 0) => t.push({ op: 'F', micro, chunk });
    const B = (micro: number, chunk = 0) => t.push({ op: 'B', micro, chunk });
    if (kind === 'gpipe') {
      for (let i = 0; i < m; i++) F(i);
      for (let i = m - 1; i >= 0; i--) B(i);
    } else if (kind === '1f1b') {
      const warmup = Math.min(p - r - 1, m);
      for (let i = 0; i < warmup; i++) F(i);
      for (let i = 0; i < m - warmup; i++) { F(warmup + i); B(i); }
      for (let i = m - warmup; i < m; i++) B(i);
    } else {
      const total = m * v, group = p * v;
      const fwd = (k: number) => ({ micro: Math.floor(k / group) * p + (k % p), chunk: Math.floor((k % group) / p) });
      const bwd = (k: number) => ({ micro: Math.floor(k / group) * p + (k % p), chunk: v - 1 - Math.floor((k % group) / p) });
      const warmup = m === p ? total : Math.min((p - r - 1) * 2 + (v - 1) * p, total);
      for (let k = 0; k < warmup; k++) { const a = fwd(k); F(a.micro, a.chunk); }
      for (let k = 0; k < total - warmup; k++) { const f = fwd(warmup + k), b = bwd(k); F(f.micro, f.chunk); B(b.micro, b.chunk); }
      for (let k = total - warmup; k < total; k++) { const b = bwd(k); B(b.micro, b.chunk); }
    }
    tables.push(t);
  }
  return tables;
}

// ZB-H1: 1F1B's order of forwards and (input-gradient) backwards, rank r's weight gradients lagging
// r backwards behind (W(j) right after B(j + r)), the rest after the last backward. With F = B = W
// and m >= p every rank is busy but for p − 1 units: the step takes 3m + p − 1, and at most p
// micro-batches hold activations on any rank (1F1B's first rank's peak).
function zeroBubbleH1Tables(p: number, m: number): PipelineAction[][] {
  return Array.from({ length: p }, (_, r) => {
    const t: PipelineAction[] = [];
    const warmup = Math.min(p - r - 1, m);
    let nW = 0;
    const afterB = (j: number) => { while (nW <= j - r) t.push({ op: 'W', micro: nW++, chunk: 0 }); };
    for (let i = 0; i < warmup; i++) t.push({ op: 'F', micro: i, chunk: 0 });
    for (let i = 0; i < m - warmup; i++) { t.push({ op: 'F', micro: warmup + i, chunk: 0 }); t.push({ op: 'B', micro: i, chunk: 0 }); afterB(i); }
    for (let i = m - warmup; i < m; i++) { t.push({ op: 'B', micro: i, chunk: 0 }); afterB(i); }
    while (nW < m) t.push({ op: 'W', micro: nW++, chunk: 0 });
    return t;
  });
}

// ZB-V (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory"): rank r holds virtual stages r
// and 2p − 1 − r, B and W split as in ZB-H1. The tables come from a list scheduler, as the paper builds
// its schedules: at each moment every idle rank takes, among the actions whose inputs are there, a
// backward B first (the earlier rank waits for it), else a forward F (the second chunk's first, nearer
// the loss) while fewer than 2p chunk activations are held (1F1B's first-rank peak of p whole-stage
// micro-batches), else its oldest pending W (or, in the eager variant, a W as soon as more than p
// wait). Each rank's order is that of a timeline that respects every dependency, so the runner cannot
// deadlock on it whatever the real costs. Which timeline: the scheduler runs with a few planning costs
// (F = B = W; B a little dearer and W half of it, as measured on the CPU; B twice F) and both W
// policies, and keeps the table whose mean bubble over ZBV_PROFILES is smallest (then the one best at
// F = B = W): a table planned for equal costs alone idles far more when B and W are not equal (PP4,
// 8 micro-batches: 31% with B = 2F against 13.5% for the table kept, which is as good at F = B = W).
const ZBV_PLANNING: readonly ActionCosts[] = [{ F: 10, B: 10, W: 10 }, { F: 10, B: 12, W: 6 }, { F: 10, B: 20, W: 10 }];
/** The cost ratios a ZB-V table must do well on (F, B, W per chunk). */
export const ZBV_PROFILES: readonly ActionCosts[] = [{ F: 1, B: 1, W: 1 }, { F: 1, B: 1.15, W: 0.55 }, { F: 1, B: 2, W: 1 }, { F: 1, B: 1, W: 0.5 }, { F: 1, B: 1.5, W: 0.5 }];
const zbvCache = new Map<string, PipelineAction[][]>();

function zeroBubbleVTables(p: number, m: number): PipelineAction[][] {
  const key = `${p}/${m}`;
  let best = zbvCache.get(key);
  if (!best) {
    let score: [number, number] = [Infinity, Infinity];
    const candidates: [ActionCosts, number, number][] = [];
    for (const costs of ZBV_PLANNING) for (const eagerW of [Infinity, p]) candidates.push([costs, eagerW, 2 * p]);
    // Without the memory cap the scheduler always finishes (every forward can run): the last resort.
    candidates.push([ZBV_PLANNING[0]!, Infinity, Infinity]);
    for (const [costs, eagerW, cap] of candidates) {
      if (cap === Infinity && best) break;
      {
        let t: PipelineAction[][];
        try { t = listScheduleV(p, m, costs, eagerW, cap); } catch (e) {
          if (e instanceof StateError) continue; // this variant fills every rank's memory and stalls
          throw e;
        }
        const bubbles = ZBV_PROFILES.map((c) => simulateSchedule(t, 2, c, 'v').bubble);
        const s: [number, number] = [bubbles.reduce((x, y) => x + y, 0) / bubbles.length, bubbles[0]!];
        if (s[0] < score[0] - 1e-12 || (Math.abs(s[0] - score[0]) <= 1e-12 && s[1] < score[1] - 1e-12)) { score = s; best = t; }
      }
    }
    if (zbvCache.size > 256) zbvCache.clear();
    zbvCache.set(key, best!);
  }
  // A copy: callers may not share the cached tables.
  return best!.map((t) => t.map((a) => ({ ...a })));
}

// The list scheduler on integer costs (each action takes costs[op] time steps, no communication time).
function listScheduleV(p: number, m: number, costs: ActionCosts, eagerW: number, cap: number): PipelineAction[][] {
  const V = 2 * p;
  // When each (op, micro-batch, virtual stage) finishes; NaN until scheduled (NaN <= t is false).
  const done = new Float64Array(3 * m * V).fill(NaN);
  const key = (op: string, micro: number, vs: number) => ((op === 'F' ? 0 : op === 'B' ? 1 : 2) * m + micro) * V + vs;
  const tables: PipelineAction[][] = Array.from({ length: p }, () => []);
  const nextF = Array.from({ length: p }, () => [0, 0]), nextB = Array.from({ length: p }, () => [0, 0]);
  const pendingW: { micro: number; chunk: number }[][] = Array.from({ length: p }, () => []);
  const held = new Array<number>(p).fill(0), free = new Array<number>(p).fill(0);
  let remaining = p * 2 * 3 * m;
  const ready = (k: number, t: number) => done[k]! <= t;
  // Time jumps from event to event: nothing becomes ready but when some rank's action ends.
  for (let t = 0; remaining > 0;) {
    for (let r = 0; r < p; r++) {
      if (free[r]! > t) continue;
      let pick: PipelineAction | null = null;
      if (pendingW[r]!.length > eagerW) pick = { op: 'W', ...pendingW[r]!.shift()! };
      // B: the lowest micro-batch, the second chunk (earlier in the backward chain) first.
      if (!pick) {
        for (const c of [1, 0]) {
          const i = nextB[r]![c]!, vs = virtualStageOf(r, c, p, 'v');
          if (i >= m || !ready(key('F', i, vs), t) || (vs < V - 1 && !ready(key('B', i, vs + 1), t))) continue;
          if (!pick || i < pick.micro) pick = { op: 'B', micro: i, chunk: c };
        }
      }
      if (!pick && held[r]! < cap) {
        for (const c of [1, 0]) {
          const i = nextF[r]![c]!, vs = virtualStageOf(r, c, p, 'v');
          if (i >= m || (vs > 0 && !ready(key('F', i, vs - 1), t))) continue;
          pick = { op: 'F', micro: i, chunk: c };
          break;
        }
      }
      if (!pick && pendingW[r]!.length > 0) pick = { op: 'W', ...pendingW[r]!.shift()! };
      if (!pick) continue;
      const vs = virtualStageOf(r, pick.chunk, p, 'v');
      if (pick.op === 'F') { nextF[r]![pick.chunk]!++; held[r]!++; }
      else if (pick.op === 'B') { nextB[r]![pick.chunk]!++; pendingW[r]!.push({ micro: pick.micro, chunk: pick.chunk }); }
      else held[r]!--;
      tables[r]!.push(pick);
      free[r] = t + costs[pick.op];
      done[key(pick.op, pick.micro, vs)] = t + costs[pick.op];
      remaining--;
    }
    const next = Math.min(...free.filter((f) => f > t));
    if (!Number.isFinite(next)) {
      if (remaining > 0) throw new StateError(`scheduleTables: the zb-v list scheduler stalled (p ${p}, m ${m}: every rank holds its cap of activations)`);
      break;
    }
    t = next;
  }
  return tables;
}
