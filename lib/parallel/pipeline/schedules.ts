// Pipeline schedules (GPipe, 1F1B, interleaved 1F1B, zero-bubble ZB-H1) as tables of actions — a
// micro-batch's forward (F), backward (B; with ZB-H1 only its input gradient) or weight gradient (W)
// on one of the rank's model chunks — that one runner executes: activations go forward and their
// gradients backward by tagged point-to-point send/recv in the pipeline group.
import { backward, deferWeightGrads, detach, noGrad, type DeferredWeightGrads } from '../../autograd/index.js';
import { ArgumentError, StateError } from '../../errors.js';
import { scope } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import { parseDevice, type Device } from '../../device.js';
import type { CollectiveGroup, CollectiveWork } from '../../distributed/group.js';

/** Layers [start, end) of each of `stages` stages, as even as possible (earlier stages take the remainder). */
export function partitionLayers(numLayers: number, stages: number): [number, number][] {
  if (!Number.isInteger(stages) || stages < 1) throw new ArgumentError(`partitionLayers: stages must be an integer >= 1, got ${stages}`);
  if (!Number.isInteger(numLayers) || numLayers < stages) throw new ArgumentError(`partitionLayers: ${numLayers} layers cannot fill ${stages} pipeline stages (pp must be <= the number of layers)`);
  const base = Math.floor(numLayers / stages), extra = numLayers % stages;
  const out: [number, number][] = [];
  let start = 0;
  for (let s = 0; s < stages; s++) { const n = base + (s < extra ? 1 : 0); out.push([start, start + n]); start += n; }
  return out;
}

/**
 * The layers of each model chunk of pipeline rank `stage` when `stages` ranks hold `chunks` chunks
 * each (interleaved 1F1B's virtual stages): chunk k of rank r is virtual stage k·stages + r of
 * partitionLayers(numLayers, stages·chunks), so a rank holds non-adjacent slices of the model.
 */
export function chunkLayers(numLayers: number, stages: number, stage: number, chunks = 1, placement: ChunkPlacement = 'loop'): [number, number][] {
  if (!Number.isInteger(chunks) || chunks < 1) throw new ArgumentError(`chunkLayers: virtual stages (chunks per rank) must be an integer >= 1, got ${chunks}`);
  if (!Number.isInteger(stage) || stage < 0 || stage >= stages) throw new ArgumentError(`chunkLayers: stage ${stage} is outside [0, ${stages})`);
  if (chunks > 1 && Number.isInteger(numLayers) && numLayers < stages * chunks) {
    throw new ArgumentError(`chunkLayers: ${numLayers} layers cannot fill ${stages} stages × ${chunks} virtual stages = ${stages * chunks} chunks of at least one layer (--virtual-stages must be <= layers / pp)`);
  }
  if (placement === 'v' && chunks !== 2) throw new ArgumentError(`chunkLayers: the V placement (zb-v) holds exactly 2 chunks per rank, got ${chunks}`);
  const all = partitionLayers(numLayers, stages * chunks);
  return Array.from({ length: chunks }, (_, k) => all[virtualStageOf(stage, k, stages, placement)]!);
}

/**
 * How a rank's model chunks map to virtual stages: 'loop' (interleaved 1F1B: chunk k of rank r is
 * virtual stage k·p + r, so the activations go around the ring v times) or 'v' (ZB-V: rank r holds
 * virtual stages r and 2p − 1 − r, so the first chunk goes down the pipeline and the second comes
 * back; the last rank hands its first chunk's output to its own second chunk, and the first rank
 * holds both the embeddings and the head).
 */
export type ChunkPlacement = 'loop' | 'v';

/** The chunk placement a schedule runs on: 'v' for zb-v, 'loop' for the others. */
export function schedulePlacement(kind: string): ChunkPlacement { return kind === 'zb-v' ? 'v' : 'loop'; }

/** The virtual stage of chunk `chunk` of rank `rank` among `stages` ranks. */
export function virtualStageOf(rank: number, chunk: number, stages: number, placement: ChunkPlacement = 'loop'): number {
  if (placement === 'v') return chunk === 0 ? rank : 2 * stages - 1 - rank;
  return chunk * stages + rank;
}

/** Where a virtual stage runs. */
export interface VirtualStagePlace {
  /** The pipeline rank. */
  rank: number;
  /** The rank's model chunk. */
  chunk: number;
}

/** The rank and chunk that run virtual stage `vs` (the inverse of {@link virtualStageOf}). */
export function rankOfVirtualStage(vs: number, stages: number, placement: ChunkPlacement = 'loop'): VirtualStagePlace {
  if (placement === 'v') return vs < stages ? { rank: vs, chunk: 0 } : { rank: 2 * stages - 1 - vs, chunk: 1 };
  return { rank: vs % stages, chunk: Math.floor(vs / stages) };
}

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

/** One rank's stage as the pipeline schedules run it. */
export interface PipelineStage {
  /** The pipeline group; its rank is the stage index. Absent: a single stage (no communication). */
  group?: CollectiveGroup;
  /** Model chunks this rank holds (interleaved 1F1B's virtual stages, zb-v's 2; default 1). */
  chunks?: number;
  /** How the chunks map to virtual stages (default 'loop'; zb-v's 'v'): forwardOnly follows it, runSchedule checks it against the schedule's. */
  placement?: ChunkPlacement;
  /**
   * Runs this stage's chunk `chunk` on micro-batch `m`. `input` is null on the first virtual stage
   * (it reads its own data) and the received activation (a leaf that requires grad) elsewhere. The
   * last virtual stage returns the micro-batch's scalar loss, already divided by the number of
   * micro-batches if a mean is wanted.
   */
  forwardStep(m: number, input: Tensor | null, chunk: number): Tensor;
  /** Shape of the activation chunk `chunk` receives (not called on the first virtual stage). */
  inputShape(m: number, chunk: number): readonly number[];
  /** Dtype of the activations received (default f32). */
  dtype?: Tensor['dtype'];
  /** Device of the activations received (default cpu). */
  device?: Device;
  /**
   * Runs one micro-batch's backward on one chunk (`run`; under ZB-H1 its input-gradient part B, or
   * its weight-gradient part W: `phase`); `final` is true for the schedule's last backward on this
   * stage (under ZB-H1 the last B and the last W). Default: just run it. A data-parallel gradient
   * buffer runs all but the final ones with communication off (GradBuffer.noSync), so gradients
   * accumulate locally.
   */
  runBackward?(m: number, final: boolean, run: () => void, info: { chunk: number; phase: 'backward' | 'input' | 'weight' }): void | Promise<void>;
}

interface InFlight { input: Tensor | null; output: Tensor }

const TAG_LIMIT = 1 << 24;

/** Drives one rank through its table: holds micro-batches between forward and backward, pre-posts receives, keeps the sends. */
class StageRunner {
  readonly inFlight = new Map<string, InFlight>();
  readonly deferred = new Map<string, DeferredWeightGrads>();
  readonly sends: CollectiveWork[] = [];
  readonly losses: number[] = [];
  readonly rank: number;
  readonly size: number;
  readonly chunks: number;
  readonly #posted = new Map<string, { buf: Tensor; work: CollectiveWork }>();
  /** Hand-offs between two chunks of this rank (zb-v's turn of the V on the last rank): activations ('F…') and gradients ('B…') by receiving action. */
  readonly #local = new Map<string, Tensor>();
  constructor(readonly stage: PipelineStage, readonly numMicroBatches: number, readonly placement: ChunkPlacement = 'loop') {
    this.rank = stage.group?.rank ?? 0; this.size = stage.group?.size ?? 1;
    this.chunks = stage.chunks ?? 1;
    if (this.chunks > 1 && this.size < 2) throw new ArgumentError(`pipeline: ${this.chunks} model chunks need a pipeline group of at least 2 stages`);
    const tags = 2 * numMicroBatches * this.size * this.chunks;
    if (tags > TAG_LIMIT) throw new ArgumentError(`pipeline: ${numMicroBatches} micro-batches × ${this.size * this.chunks} virtual stages exceed the ${TAG_LIMIT} message tags`);
  }

  get group(): CollectiveGroup { return this.stage.group!; }
  #vs(chunk: number): number { return virtualStageOf(this.rank, chunk, this.size, this.placement); }
  /** The rank and chunk of a virtual stage. */
  #at(vs: number): VirtualStagePlace { return rankOfVirtualStage(vs, this.size, this.placement); }
  isFirst(chunk: number): boolean { return this.#vs(chunk) === 0; }
  isLast(chunk: number): boolean { return this.#vs(chunk) === this.size * this.chunks - 1; }
  #key(m: number, chunk: number): string { return `${m}:${chunk}`; }
  // One tag per message: (micro-batch, receiving virtual stage, direction), so that activations and
  // gradients between the same two ranks never match each other whatever order they are posted in.
  #tag(m: number, vs: number, grad: boolean): number { return (m * this.size * this.chunks + vs) * 2 + (grad ? 1 : 0); }

  /**
   * Posts now (a look-ahead) the receive action `a` will wait for: F(m, chunk)'s input, or B(m,
   * chunk)'s output gradient (shaped as the next virtual stage's input), so that its sender's send
   * can complete.
   */
  prepost(a: PipelineAction): void {
    if (a.op === 'W' || (a.op === 'F' && this.isFirst(a.chunk)) || (a.op === 'B' && this.isLast(a.chunk))) return;
    const k = `${a.op}${this.#key(a.micro, a.chunk)}`;
    if (this.#posted.has(k)) return;
    const g = this.group, vs = this.#vs(a.chunk);
    const from = this.#at(a.op === 'F' ? vs - 1 : vs + 1);
    if (from.rank === this.rank) return; // handed over locally
    // The gradient of this chunk's output has the shape of the next virtual stage's input.
    const shape = a.op === 'F' ? this.stage.inputShape(a.micro, a.chunk) : this.stage.inputShape(a.micro, from.chunk);
    const buf = emptyOn([...shape], this.stage.dtype ?? 'f32', this.stage.device ?? parseDevice('cpu'));
    const peer = from.rank;
    this.#posted.set(k, { buf, work: g.recv(buf, peer, { tag: this.#tag(a.micro, vs, a.op === 'B') }) });
  }

  /** The buffer of a receive posted by prepost(), once it has arrived. */
  async #received(a: PipelineAction): Promise<Tensor> {
    const k = `${a.op}${this.#key(a.micro, a.chunk)}`;
    const local = this.#local.get(k);
    if (local) { this.#local.delete(k); return local; }
    this.prepost(a);
    const posted = this.#posted.get(k);
    if (!posted) throw new StateError(`pipeline: ${a.op} of micro-batch ${a.micro} (chunk ${a.chunk}) found nothing to receive (its chunk on this rank has not run)`);
    const { buf, work } = posted;
    this.#posted.delete(k);
    try { await work; } catch (e) { buf.dispose(); throw e; }
    return buf;
  }

  /** Forward of micro-batch m on a chunk; with keepForBackward false (evaluation) nothing is held afterwards. */
  async forward(m: number, chunk: number, keepForBackward = true): Promise<void> {
    let input: Tensor | null = null;
    if (!this.isFirst(chunk)) {
      input = await this.#received({ op: 'F', micro: m, chunk });
      input.requiresGrad = keepForBackward;
    }
    // The micro-batch's intermediate tensors go when its forward ends: what backward needs the graph
    // holds (saved aliases), and the rest would otherwise live until the step's scope closes, so every
    // micro-batch's activations would pile up and 1F1B would hold as much as GPipe.
    const output = scope(() => this.stage.forwardStep(m, input, chunk));
    if (this.isLast(chunk)) {
      if (output.size !== 1) throw new StateError(`pipeline: the last stage must return a scalar loss, got ${output.describe()}`);
      this.losses[m] = output.item();
    } else {
      const to = this.#at(this.#vs(chunk) + 1);
      if (to.rank === this.rank) {
        // The next virtual stage is this rank's other chunk: it takes an alias of the output.
        this.#local.set(`F${this.#key(m, to.chunk)}`, detach(output));
      } else {
        // A send pins its tensor's storage until it completes; sends are awaited at the end of the schedule.
        const g = this.group;
        this.sends.push(g.send(output, to.rank, { tag: this.#tag(m, this.#vs(chunk) + 1, false) }));
      }
    }
    if (keepForBackward) this.inFlight.set(this.#key(m, chunk), { input, output });
    else { output.dispose(); input?.dispose(); }
  }

  /** Backward of micro-batch m on a chunk; with `split` only its input gradient (the weights' part is kept for weight()). */
  async backward(m: number, chunk: number, final: boolean, split: boolean): Promise<void> {
    const key = this.#key(m, chunk), f = this.inFlight.get(key);
    if (!f) throw new StateError(`pipeline: backward of micro-batch ${m} (chunk ${chunk}) before its forward`);
    this.inFlight.delete(key);
    const run = this.stage.runBackward?.bind(this.stage) ?? ((_m: number, _final: boolean, go: () => void) => go());
    const info = { chunk, phase: split ? 'input' as const : 'backward' as const };
    let grad: Tensor | null = null;
    if (!this.isLast(chunk)) grad = await this.#received({ op: 'B', micro: m, chunk });
    try {
      const go = () => {
        if (!split) { grad ? backward(f.output, grad) : backward(f.output); return; }
        const { weightGrads } = deferWeightGrads(() => (grad ? backward(f.output, grad) : backward(f.output)), { now: f.input ? [f.input] : [] });
        this.deferred.set(key, weightGrads);
      };
      await run(m, final, go, info);
    } finally {
      grad?.dispose();
    }
    f.output.dispose();
    if (f.input) {
      if (!f.input.grad) throw new StateError(`pipeline: micro-batch ${m}'s input received no gradient (does the stage's output depend on its input?)`);
      const to = this.#at(this.#vs(chunk) - 1);
      if (to.rank === this.rank) {
        // The previous virtual stage is this rank's other chunk: the gradient is handed over (not freed with the input).
        this.#local.set(`B${this.#key(m, to.chunk)}`, f.input.grad);
        f.input.grad = null;
      } else {
        const g = this.group;
        this.sends.push(g.send(f.input.grad, to.rank, { tag: this.#tag(m, this.#vs(chunk) - 1, true) }));
      }
      f.input.dispose();
    }
  }

  /** The weight-gradient part of micro-batch m's backward on a chunk (ZB-H1's W). */
  async weight(m: number, chunk: number, final: boolean): Promise<void> {
    const key = this.#key(m, chunk), w = this.deferred.get(key);
    if (!w) throw new StateError(`pipeline: weight gradient of micro-batch ${m} (chunk ${chunk}) before its backward`);
    this.deferred.delete(key);
    const run = this.stage.runBackward?.bind(this.stage) ?? ((_m: number, _final: boolean, go: () => void) => go());
    await run(m, final, () => w.run(), { chunk, phase: 'weight' });
  }

  /**
   * Runs a table: each action in order, the receives of the next `lookahead` actions posted ahead
   * (Infinity: the whole table's at the start).
   */
  async runTable(table: readonly PipelineAction[], lookahead: number, keepForBackward = true): Promise<number[]> {
    const lastB = table.findLastIndex((a) => a.op === 'B'), lastW = table.findLastIndex((a) => a.op === 'W');
    const split = lastW >= 0;
    try {
      for (let i = 0; i < table.length; i++) {
        if (i === 0 || lookahead !== Infinity) for (let j = i; j < Math.min(table.length, i + lookahead); j++) this.prepost(table[j]!);
        const a = table[i]!;
        if (a.op === 'F') await this.forward(a.micro, a.chunk, keepForBackward);
        else if (a.op === 'B') await this.backward(a.micro, a.chunk, i === lastB, split);
        else await this.weight(a.micro, a.chunk, i === lastW);
      }
      for (const w of this.sends) await w;
    } finally {
      for (const { buf } of this.#posted.values()) buf.dispose();
      for (const t of this.#local.values()) t.dispose();
      this.#local.clear();
      for (const w of this.deferred.values()) w.dispose();
    }
    return this.losses;
  }
}

function checkMicroBatches(n: number, call: string): void {
  if (!Number.isInteger(n) || n < 1) throw new ArgumentError(`${call}: numMicroBatches must be an integer >= 1, got ${n}`);
}

/**
 * Runs schedule `kind` on this rank's stage: its table from {@link scheduleTables}, gradients
 * accumulating in the stage's parameters. Returns the last virtual stage's per-micro-batch losses
 * (empty elsewhere). Every rank of the pipeline group must run the same kind and shape.
 */
export async function runSchedule(kind: ScheduleKind, stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, kind);
  const size = stage.group?.size ?? 1, chunks = stage.chunks ?? 1;
  checkSchedule(kind, { stages: size, microBatches: numMicroBatches, chunks }, kind);
  const placement = schedulePlacement(kind);
  if (stage.placement !== undefined && stage.placement !== placement) throw new ArgumentError(`${kind}: the stage's chunks are placed '${stage.placement}', but the schedule runs them '${placement}' (build the model for the schedule it runs)`);
  const run = new StageRunner(stage, numMicroBatches, placement);
  const table = scheduleTables(kind, { stages: size, microBatches: numMicroBatches, chunks })[run.rank]!;
  // Gloo completes a send when its receiver posts the receive, and a rank's point-to-point waits run
  // one after the other: interleaving's messages around the ring (the last rank feeds the first)
  // could leave two ranks each waiting behind a send to the other. Posting every receive of the step
  // first rules that out (2·m·v boundary-sized buffers). ZB-V's messages go both ways between the same
  // ranks (activations down and back up the V, gradients likewise): its receives are posted first too
  // (but for the last rank's local hand-offs). The other schedules' chains post each receive when its
  // action starts (no buffer allocated early: the planner's memory model counts none).
  return run.runTable(table, kind === 'interleaved' || kind === 'zb-v' ? Infinity : 1);
}

/**
 * GPipe: every micro-batch forward, then every micro-batch backward (in reverse). Peak memory holds
 * all micro-batches' activations. Gradients accumulate in the stage's parameters. Returns the
 * last stage's per-micro-batch losses (empty elsewhere).
 */
export function gpipe(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('gpipe', stage, numMicroBatches);
}

/**
 * 1F1B (PipeDream-Flush): at most (stages - stage index) micro-batches in flight, so activation
 * memory no longer grows with the number of micro-batches. Same results as GPipe.
 */
export function oneForwardOneBackward(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('1f1b', stage, numMicroBatches);
}

/**
 * Interleaved 1F1B (Megatron-LM's virtual pipeline stages): each rank holds `stage.chunks` (v >= 2)
 * non-adjacent model chunks; the bubble falls from (p − 1)/m to (p − 1)/(v·m) of the ideal time at
 * the price of p·v point-to-point messages per micro-batch and about (1 + (p − 1)/(p·v))·p
 * micro-batch chunks in flight on the first rank. Needs the micro-batches to be a multiple of p.
 */
export function interleaved1F1B(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('interleaved', stage, numMicroBatches);
}

/**
 * ZB-H1 (zero bubble, Qi et al. 2024): 1F1B with each backward split into its input gradient B,
 * which the previous stage waits for, and its weight gradient W (deferWeightGrads), which fills
 * the time a stage would wait; at most p micro-batches hold activations (1F1B's first stage's peak).
 */
export function zeroBubbleH1(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('zb-h1', stage, numMicroBatches);
}

/**
 * ZB-V (zero bubble with a V-shaped placement, Qi et al. 2024): each rank holds 2 chunks
 * (`stage.chunks` = 2), virtual stages r and 2p − 1 − r, so the first rank holds both ends of the
 * model; B and W split as in ZB-H1. With equal F, B and W per chunk the bubble is half ZB-H1's,
 * with 1F1B's first-stage activation peak on every rank.
 */
export function zeroBubbleV(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  return runSchedule('zb-v', stage, numMicroBatches);
}

/**
 * Evaluation: every micro-batch forward without autograd through every chunk, each stage passing its
 * activation on and keeping nothing. Returns the last stage's per-micro-batch losses (empty elsewhere).
 */
export async function forwardOnly(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, 'forwardOnly');
  const run = new StageRunner(stage, numMicroBatches, stage.placement ?? 'loop');
  const table: PipelineAction[] = [];
  for (let m = 0; m < numMicroBatches; m++) for (let c = 0; c < run.chunks; c++) table.push({ op: 'F', micro: m, chunk: c });
  // With chunks the activations go around the ring: every receive is posted first, as in training.
  return noGrad(() => run.runTable(table, run.chunks > 1 ? Infinity : 1, false));
}
