// The states a pipeline stage passes through under its schedule (read from the schedule's own
// table), and the micro-batches whose activations it holds at once: what the memory estimate
// (stage-memory.ts) counts per state.
import { checkSchedule, rankOfVirtualStage, schedulePlacement, scheduleTables, splitsBackward, virtualStageOf } from '../parallel/pipeline/schedules.js';
import type { PlanLayout } from './memory.js';

/** What a stage holds at one point of its schedule, in micro-batches of the whole stage (a chunk counts 1/v). */
export interface ScheduleState {
  /** Forward done, backward not (all of its saved tensors). */
  held: number;
  /** ZB-H1: input gradient done, weight gradient not (the linear layers' inputs and output gradients). */
  deferred: number;
  /** Interleaved: receives posted at the step's start and not yet taken (boundary-sized buffers). */
  posted: number;
  /** Micro-batches in flight on the rank's last chunk (on the last stage: those whose head gradients wait for their backward). */
  lastChunk: number;
  /** Whether a backward ran before (the gradients exist). */
  afterBackward: boolean;
  /** Whether the forward that led here ran the rank's last chunk (on the last stage: the head). */
  onLastChunk: boolean;
}

/**
 * The states a pipeline stage passes through under the layout's schedule, read from the schedule's
 * own table (lib/parallel/pipeline/schedules.ts), one right after each forward (where memory peaks);
 * one micro-batch without a pipeline.
 */
export function scheduleStates(layout: PlanLayout, stage: number): ScheduleState[] {
  const v = layout.virtualStages ?? 1, p = layout.pp, m = layout.microBatches;
  if (p === 1) return [{ held: 1, deferred: 0, posted: 0, lastChunk: 1, afterBackward: m > 1, onLastChunk: true }];
  checkSchedule(layout.schedule, { stages: p, microBatches: m, chunks: v }, 'plan');
  // The planner asks for the same few schedules over and over (every candidate, every stage).
  const key = `${layout.schedule}/${p}/${m}/${v}/${stage}`;
  let states = statesCache.get(key);
  if (!states) {
    states = computeStates(layout, stage);
    if (statesCache.size > 4096) statesCache.clear();
    statesCache.set(key, states);
  }
  return states;
}

const statesCache = new Map<string, ScheduleState[]>();

function computeStates(layout: PlanLayout, stage: number): ScheduleState[] {
  const v = layout.virtualStages ?? 1, p = layout.pp, m = layout.microBatches;
  const table = scheduleTables(layout.schedule, { stages: p, microBatches: m, chunks: v })[stage]!;
  // Interleaving posts every receive first: activations for chunks after the first virtual stage,
  // gradients for chunks before the last.
  // ZB-V too, but for the last rank's hand-offs between its own two chunks.
  const placement = schedulePlacement(layout.schedule), postsFirst = layout.schedule === 'interleaved' || layout.schedule === 'zb-v';
  const remote = (vs: number) => vs >= 0 && vs < p * v && rankOfVirtualStage(vs, p, placement).rank !== stage;
  const postsInput = (c: number) => remote(virtualStageOf(stage, c, p, placement) - 1);
  const postsGrad = (c: number) => remote(virtualStageOf(stage, c, p, placement) + 1);
  let posted = 0;
  if (postsFirst) for (let c = 0; c < v; c++) posted += m * ((postsInput(c) ? 1 : 0) + (postsGrad(c) ? 1 : 0));
  const out: ScheduleState[] = [];
  let held = 0, deferred = 0, lastChunk = 0, afterBackward = false;
  const split = splitsBackward(layout.schedule);
  for (const a of table) {
    const last = a.chunk === v - 1 ? 1 : 0;
    if (a.op === 'F') { held++; lastChunk += last; if (postsFirst && postsInput(a.chunk)) posted--; }
    else if (a.op === 'B') { held--; lastChunk -= last; if (split) deferred++; if (postsFirst && postsGrad(a.chunk)) posted--; }
    else deferred--;
    if (a.op === 'B') afterBackward = true;
    // Memory peaks in forwards (a backward frees more than it makes): the states right after each.
    if (a.op === 'F') out.push({ held: held / v, deferred: deferred / v, posted, lastChunk, afterBackward, onLastChunk: last === 1 });
  }
  return out;
}

/**
 * Micro-batches whose activations stage `stage` holds at once: 1F1B min(pp − stage, m), GPipe all m;
 * interleaved its table's peak of chunks in flight over v (Megatron: (1 + (p − 1)/(p·v))·p on the first
 * stage); ZB-H1 the peak of forwards whose backward has not run; one at a time without a pipeline.
 */
export function inFlightMicroBatches(layout: PlanLayout, stage: number): number {
  if (layout.pp === 1) return 1;
  if (layout.schedule === 'gpipe') return layout.microBatches;
  if (layout.schedule === '1f1b') return Math.min(layout.pp - stage, layout.microBatches);
  return Math.max(...scheduleStates(layout, stage).map((s) => s.held));
}
