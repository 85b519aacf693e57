// `nodetron bench chaos`'s analysis (lib/bench/chaos.ts runs the faults): the faults and events it
// records, each fault matched to the recovery events (detection, full strength, steps lost), today's
// restart path's faults from its log, the losses against the failure-free run, and goodput.
import { ArgumentError } from '../errors.js';
import { median } from './util.js';

export type FaultKind = 'kill' | 'stop' | 'node' | 'link';
/** Faults that take out a whole node (its ranks all lost at once; never node 0; skipped by the baseline). */
export const isNodeFault = (how: FaultKind): boolean => how === 'node' || how === 'link';

/** One line of NODETRON_RECOVERY_EVENTS. */
export interface ChaosEvent { t: number; src: 'agent' | 'rank'; node?: number; rank?: number; generation?: number; event: string; [k: string]: unknown }

/** A fault the benchmark caused. `at`: epoch ms just before the signal. */
export interface Injected {
  i: number; at: number; how: FaultKind; rank: number | null; node: number; pid: number; ranks: number[];
  /** A link fault: ms from the fault until the cut-off node's launcher exited on its own (null: it had not, and the bench killed it). */
  cutLauncherExitMs?: number | null;
}

export interface ChaosFaultRow {
  i: number; how: FaultKind; rank: number | null; node: number; ranks: number[];
  generation: number | null; detectMs: number | null; fullStrengthMs: number | null; stepsLost: number | null;
  recoveredToStep: number | null; diskFallback: boolean; fallbackRestart: boolean; status: 'recovered' | 'undetected' | 'incomplete' | 'fallback-restart';
  /** --shrink: the job went on with fewer replicas (then grew back); training again: the first step after the fault, by any rank. */
  shrunk?: boolean; trainingAgainMs?: number | null;
}

export interface BaselineFaultRow { i: number; how: FaultKind; rank: number | null; nextStepMs: number | null; stepsLost: number | null; lastStepBefore: number | null; resumedAt: number | null; status: 'recovered' | 'not-recovered' | 'skipped' }

export interface StepLine { t: number; step: number }


/** What analyzeBaseline reads of a run. */
interface BaselineRun {
  steps: StepLine[]; restarts: number[]; resumes: Array<{ t: number; step: number }>; skipped: Array<{ i: number; how: FaultKind; reason: string }>;
}

/** Each fault of the chaos run, matched to the agent's `fault` event and the generation's rank events. */
export function analyzeFaults(injected: readonly Injected[], events: readonly ChaosEvent[], worldSize: number): ChaosFaultRow[] {
  const faults = events.filter((e) => e.src === 'agent' && e.event === 'fault');
  const used = new Set<ChaosEvent>();
  return injected.map((f) => {
    const lostOf = (e: ChaosEvent) => (Array.isArray(e.lost) ? (e.lost as number[]) : []);
    const ev = faults.find((e) => e.t >= f.at && !used.has(e) && lostOf(e).some((r) => f.ranks.includes(r)))
      ?? faults.find((e) => e.t >= f.at && lostOf(e).some((r) => f.ranks.includes(r)));
    const row: ChaosFaultRow = { i: f.i, how: f.how, rank: f.rank, node: f.node, ranks: f.ranks, generation: null, detectMs: null, fullStrengthMs: null,
      stepsLost: null, recoveredToStep: null, diskFallback: false, fallbackRestart: false, status: 'undetected' };
    const restart = events.find((e) => e.src === 'agent' && e.event === 'fallback-restart' && e.t >= f.at);
    if (!ev || typeof ev.generation !== 'number') {
      if (restart) { row.fallbackRestart = true; row.status = 'fallback-restart'; }
      return row;
    }
    used.add(ev);
    const g = ev.generation;
    row.generation = g;
    row.detectMs = ev.t - f.at;
    // Full strength: the first generation >= g in which every rank completed a first step (a fault during
    // this one's recovery folds it into the next); its time is the last rank's.
    const gens = [...new Set(events.filter((e) => e.event === 'first-step' && typeof e.generation === 'number' && e.generation >= g).map((e) => e.generation!))].sort((a, b) => a - b);
    let fullAt: number | null = null, fullGen = g;
    for (const h of gens) {
      const first = new Map<number, number>();
      for (const e of events) if (e.event === 'first-step' && e.generation === h && typeof e.rank === 'number' && !first.has(e.rank)) first.set(e.rank, e.t);
      if (first.size >= worldSize) { fullAt = Math.max(...first.values()); fullGen = h; break; }
    }
    // Steps lost: each generation up to full strength rolls back (a shrink and its grow back: two).
    for (let h = g; h <= fullGen; h++) {
      const rec = events.filter((e) => e.event === 'recovered' && e.generation === h);
      if (!rec.length) continue;
      row.stepsLost = (row.stepsLost ?? 0) + Math.max(...rec.map((e) => Number(e.stepsLost ?? 0)));
      if (h === g) row.recoveredToStep = Math.min(...rec.map((e) => Number(e.step ?? 0)));
    }
    if (events.some((e) => e.src === 'agent' && e.event === 'shrink' && e.generation === g)) {
      row.shrunk = true;
      const again = events.filter((e) => e.event === 'first-step' && e.generation === g).map((e) => e.t);
      row.trainingAgainMs = again.length ? Math.min(...again) - f.at : null;
    }
    row.diskFallback = events.some((e) => e.event === 'fallback-disk' && typeof e.generation === 'number' && e.generation >= g && e.generation <= fullGen);
    row.fallbackRestart = !!restart && (fullAt === null || restart.t <= fullAt);
    if (fullAt !== null) row.fullStrengthMs = fullAt - f.at;
    row.status = row.fallbackRestart ? 'fallback-restart' : fullAt === null ? 'incomplete' : 'recovered';
    return row;
  });
}

/** Each fault of the baseline run: fault → the first step completed after the restart, and the steps redone. */
export function analyzeBaseline(injected: readonly Injected[], run: BaselineRun): BaselineFaultRow[] {
  const rows: BaselineFaultRow[] = injected.map((f) => {
    const restart = run.restarts.find((t) => t >= f.at);
    const next = restart === undefined ? undefined : run.steps.find((s) => s.t >= restart);
    // The step the failed attempt had reached: its last progress line (between the restart before and this one),
    // else the step it had resumed from (no step done: a fault during the previous restart loses nothing more).
    const end = restart ?? f.at, begin = run.restarts.filter((t) => t < end).at(-1) ?? -Infinity;
    const inAttempt = (x: { t: number }) => x.t > begin && x.t < end;
    const lastStepBefore = run.steps.filter(inAttempt).at(-1)?.step ?? run.resumes.filter(inAttempt).at(-1)?.step ?? (begin === -Infinity ? null : 0);
    // Resumed from a checkpoint's step (its "resumed from" line after the restart), else from scratch.
    const resume = restart === undefined ? undefined : run.resumes.find((r) => r.t >= restart && (!next || r.t <= next.t));
    const resumedAt = next ? (resume?.step ?? 0) : null;
    return { i: f.i, how: f.how, rank: f.rank, nextStepMs: next ? next.t - f.at : null, lastStepBefore, resumedAt,
      stepsLost: next && lastStepBefore !== null ? Math.max(0, lastStepBefore - resumedAt!) : null, status: next ? 'recovered' : 'not-recovered' };
  });
  for (const s of run.skipped) rows.push({ i: s.i, how: s.how, rank: null, nextStepMs: null, stepsLost: null, lastStepBefore: null, resumedAt: null, status: 'skipped' });
  return rows.sort((a, b) => a.i - b.i);
}

/** A losses.json's training curve, one loss per step (a step done twice, as after a rollback, keeps its last loss). */
export function lossesOf(json: unknown): Map<number, number> {
  const train = (json as { train?: unknown }).train;
  if (!Array.isArray(train)) throw new ArgumentError('losses.json has no train curve ([[step, loss], ...])');
  const m = new Map<number, number>();
  for (const p of train) if (Array.isArray(p) && typeof p[0] === 'number' && typeof p[1] === 'number') m.set(p[0], p[1]);
  return m;
}

/** `equal`: every step in both runs, bit-identical; `valuesEqual`: the steps both have are (a restarted run's losses.json starts at its resume). */
export interface LossComparison { equal: boolean; valuesEqual: boolean; stepsCompared: number; firstDifferingStep: number | null; maxAbsDiff: number; missing: number[] }

/** Compares two runs' losses step by step, bit for bit (`missing`: steps one has and the other lacks). */
export function compareLosses(ref: Map<number, number>, run: Map<number, number>): LossComparison {
  const steps = [...new Set([...ref.keys(), ...run.keys()])].sort((a, b) => a - b);
  let first: number | null = null, max = 0, compared = 0;
  const missing: number[] = [];
  for (const s of steps) {
    const a = ref.get(s), b = run.get(s);
    if (a === undefined || b === undefined) { missing.push(s); continue; }
    compared++;
    if (!Object.is(a, b)) { first ??= s; max = Math.max(max, Math.abs(a - b)); }
  }
  return { equal: first === null && missing.length === 0 && compared > 0, valuesEqual: first === null && compared > 0, stepsCompared: compared, firstDifferingStep: first, maxAbsDiff: max, missing };
}

/** Seconds per step: the median over consecutive progress lines of time / steps between them (the first step's set-up excluded). */
export function stepSeconds(steps: readonly StepLine[]): number | null {
  const per: number[] = [];
  for (let i = 1; i < steps.length; i++) {
    const d = steps[i]!.step - steps[i - 1]!.step;
    if (d > 0) per.push((steps[i]!.t - steps[i - 1]!.t) / 1000 / d);
  }
  return per.length ? median(per) : null;
}

export const GOODPUT_DEFINITION = "goodput = (the final losses.json's last step × the failure-free run's median step time) / the run's wall time (launch → exit); " +
  'training goodput = the same over the training window only (steps between the first and the last progress line, over the time between them: start-up and the end left out)';

/** Goodput over the training window: from the first progress line to the last (start-up, evaluation at the ends and exit left out). */
export function trainingGoodput(steps: readonly StepLine[], stepS: number): number | null {
  if (steps.length < 2) return null;
  const first = steps[0]!, last = steps[steps.length - 1]!;
  const wall = last.t - first.t;
  return wall > 0 ? ((last.step - first.step) * stepS * 1000) / wall : null;
}

/** Goodput as {@link GOODPUT_DEFINITION} says. */
export function goodput(steps: number, stepS: number, wallMs: number): number {
  return wallMs > 0 ? (steps * stepS * 1000) / wallMs : 0;
}
