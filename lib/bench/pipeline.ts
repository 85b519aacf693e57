// `nodetron bench pipeline`: the pipeline schedules measured. For each pipeline size and schedule
// (GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V) it launches one job that trains the same GPT a few steps with
// NODETRON_TRACE on, reads every rank's trace (lib/observe/trace.ts: the trainer's `forward`,
// `backward` and `weight grad` spans inside each step's `forward+backward`), and reports per schedule
// the measured bubble — the ranks' idle share of the step's pipeline phase, 1 − Σ busy / (p · span) —
// beside the papers' formula, the planner's prediction (lib/plan: the schedule's table simulated) and
// the table simulated with this run's own measured forward, backward and weight-gradient times,
// the step time, and each stage's peak memory beside the planner's estimate. Prints a table, writes
// JSON with --json.
//
// The wall-clock bubble counts as idle whatever a rank waits for, a core included: on a machine with
// fewer free cores than ranks, or shared with other work, it says more about the load than about the
// schedule. So each rank's trace also records the main thread's CPU time of every F, B and W (the
// trainer's compute spans' `cpuUs`), and the bench replays each step's table with those per-action
// costs (simulateSchedule: the dependencies of the schedule, no communication time): the CPU-replayed
// bubble, which waiting for a core cannot inflate.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { tensor } from '../creation.js';
import { destroy } from '../distributed/init.js';
import { ArgumentError, StateError } from '../errors.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { cpu } from '../native.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { AdamW } from '../optim/adamw.js';
import { initParallelTraining } from '../parallel/layout.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { formulaBubble, SCHEDULE_KINDS, schedulePlacement, scheduleTables, simulateSchedule, splitsBackward, type ActionCosts, type ChunkPlacement, type PipelineAction, type ScheduleKind } from '../parallel/pipeline/schedules.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import { estimateStageMemory, predictBubble, type PlanLayout, type PlanModel } from '../plan/index.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { parseOptions } from '../cmdline/args.js';
import { median } from './util.js';

const usage = `usage: nodetron bench pipeline [--stages 2,4] [--schedules gpipe,1f1b,interleaved,zb-h1,zb-v] [--micro-batches M (2·stages)]
  [--virtual-stages V (2)] [--layers L (8)] [--width W (128)] [--heads H (4)] [--ctx T (64)] [--rows R (2 per micro-batch)]
  [--vocab V (256)] [--steps N (3)] [--warmup N (1)] [--json F]
  trains the same GPT under each schedule on each pipeline size (one process per stage, NODETRON_TRACE on) and reports the
  measured bubble (the ranks' idle share of the forward+backward phase, wall clock) and the CPU-replayed bubble (each step's
  table replayed with every action's own CPU time: what load cannot spoil) beside the formula and the planner, the step time,
  and the peak memory per stage beside the planner's estimate`;

/** The bench's model and batch. */
export interface PipelineBenchShape { layers: number; width: number; heads: number; ctx: number; rows: number; vocab: number }

/** A trace event as lib/observe/trace.ts writes it (the fields read here). */
export interface BenchTraceEvent { name: string; ph: string; ts: number; dur?: number; tid?: number; args?: Record<string, unknown> }

/** The compute spans the trainer records around each micro-batch's work (the rest of a step's pipeline phase is waiting). */
export const PIPELINE_COMPUTE_SPANS: readonly string[] = ['forward', 'backward', 'weight grad'];

/** One step's measured pipeline phase. */
export interface MeasuredStep {
  /** From the first rank's start of `forward+backward` to the last rank's end (µs). */
  spanUs: number;
  /** Per rank, the µs of compute spans inside its `forward+backward`. */
  busyUs: number[];
  /** 1 − Σ busy / (ranks · span). */
  bubble: number;
}

/**
 * The measured bubble of each traced step: per rank (one event list each, the same clock), the k-th
 * `forward+backward` span is step k; the compute spans inside it are the rank's busy time.
 */
export function measureBubbles(ranks: readonly (readonly BenchTraceEvent[])[]): MeasuredStep[] {
  if (ranks.length === 0) throw new ArgumentError('measureBubbles: no ranks');
  const phases = ranks.map((events) => events.filter((e) => e.ph === 'X' && e.name === 'forward+backward').sort((a, b) => a.ts - b.ts));
  const steps = Math.min(...phases.map((p) => p.length));
  const out: MeasuredStep[] = [];
  for (let k = 0; k < steps; k++) {
    const start = Math.min(...phases.map((p) => p[k]!.ts)), end = Math.max(...phases.map((p) => p[k]!.ts + (p[k]!.dur ?? 0)));
    const busyUs = ranks.map((events, r) => {
      const ph = phases[r]![k]!, lo = ph.ts, hi = ph.ts + (ph.dur ?? 0);
      return events.filter((e) => e.ph === 'X' && PIPELINE_COMPUTE_SPANS.includes(e.name) && e.ts >= lo && e.ts < hi).reduce((s, e) => s + (e.dur ?? 0), 0);
    });
    const spanUs = end - start;
    out.push({ spanUs, busyUs, bubble: spanUs > 0 ? 1 - busyUs.reduce((a, b) => a + b, 0) / (ranks.length * spanUs) : 0 });
  }
  return out;
}

/** As {@link measureCosts}, from the spans' CPU time (args.cpuUs) instead of their wall time. */
export function measureCpuCosts(ranks: readonly (readonly BenchTraceEvent[])[], fromStep = 0): ActionCosts {
  return measureCosts(ranks.map((events) => events.map((e) => (OP_OF_SPAN[e.name] !== undefined && typeof e.args?.cpuUs === 'number' ? { ...e, dur: e.args.cpuUs } : e))), fromStep);
}

/**
 * The mean µs of one action of each kind in the given steps' pipeline phases, over every rank: F the
 * `forward` spans, B the `backward` spans (the whole backward, or under ZB-H1 its input part), W the
 * `weight grad` spans (0 when there are none).
 */
export function measureCosts(ranks: readonly (readonly BenchTraceEvent[])[], fromStep = 0): ActionCosts {
  const sums = { F: [0, 0], B: [0, 0], W: [0, 0] } as Record<'F' | 'B' | 'W', [number, number]>;
  const kind: Record<string, 'F' | 'B' | 'W'> = { forward: 'F', backward: 'B', 'weight grad': 'W' };
  for (const events of ranks) {
    const phases = events.filter((e) => e.ph === 'X' && e.name === 'forward+backward').sort((a, b) => a.ts - b.ts).slice(fromStep);
    for (const e of events) {
      const k = kind[e.name];
      if (e.ph !== 'X' || !k || !phases.some((ph) => e.ts >= ph.ts && e.ts < ph.ts + (ph.dur ?? 0))) continue;
      sums[k][0] += e.dur ?? 0; sums[k][1]++;
    }
  }
  const mean = (k: 'F' | 'B' | 'W') => (sums[k][1] > 0 ? sums[k][0] / sums[k][1] : 0);
  return { F: mean('F'), B: mean('B'), W: mean('W') };
}

/** One step's table replayed with its actions' measured CPU times. */
export interface ReplayedStep {
  /** The replayed step's length (µs of CPU time on the busiest rank's critical path). */
  makespanUs: number;
  /** Per rank, the CPU µs of its actions. */
  cpuUs: number[];
  /** 1 − Σ CPU / (ranks · makespan): the bubble of the schedule itself, free of waiting for a core. */
  bubble: number;
}

const OP_OF_SPAN: Record<string, PipelineAction['op']> = { forward: 'F', backward: 'B', 'weight grad': 'W' };

/**
 * Each traced step's table replayed with its own actions' CPU time: per rank (one event list each),
 * the compute spans inside its k-th `forward+backward` are its table's actions in order (the runner
 * runs the table in order, one span per action); each span's `args.cpuUs` is that action's cost in
 * simulateSchedule. Throws a StateError when a rank's spans do not match its table (another schedule
 * or shape) and an ArgumentError when a span carries no cpuUs (a trace from before it was recorded).
 */
export function replayCpuBubbles(ranks: readonly (readonly BenchTraceEvent[])[], tables: readonly (readonly PipelineAction[])[], chunks: number, placement: ChunkPlacement = 'loop'): ReplayedStep[] {
  if (ranks.length === 0) throw new ArgumentError('replayCpuBubbles: no ranks');
  if (ranks.length !== tables.length) throw new ArgumentError(`replayCpuBubbles: ${ranks.length} ranks' traces for ${tables.length} tables`);
  const phases = ranks.map((events) => events.filter((e) => e.ph === 'X' && e.name === 'forward+backward').sort((a, b) => a.ts - b.ts));
  const steps = Math.min(...phases.map((p) => p.length));
  const out: ReplayedStep[] = [];
  for (let k = 0; k < steps; k++) {
    const costs = ranks.map((events, r) => {
      const ph = phases[r]![k]!, lo = ph.ts, hi = ph.ts + (ph.dur ?? 0);
      const ops = events.filter((e) => e.ph === 'X' && OP_OF_SPAN[e.name] !== undefined && e.ts >= lo && e.ts < hi).sort((a, b) => a.ts - b.ts);
      const table = tables[r]!;
      if (ops.length !== table.length || ops.some((e, i) => OP_OF_SPAN[e.name] !== table[i]!.op)) {
        throw new StateError(`replayCpuBubbles: rank ${r}'s step ${k} ran ${ops.map((e) => OP_OF_SPAN[e.name]).join('')}, not its table's ${table.map((a) => a.op).join('')}`);
      }
      return ops.map((e) => {
        const c = e.args?.cpuUs;
        if (typeof c !== 'number') throw new ArgumentError(`replayCpuBubbles: rank ${r}'s '${e.name}' span has no args.cpuUs (a trace without per-action CPU time)`);
        return c;
      });
    });
    const sim = simulateSchedule(tables, chunks, (r, _a, i) => costs[r]![i]!, placement);
    out.push({ makespanUs: sim.makespan, cpuUs: costs.map((c) => c.reduce((a, b) => a + b, 0)), bubble: sim.bubble });
  }
  return out;
}

/** The bench's GPT as the planner's model. */
export function benchPlanModel(s: PipelineBenchShape): PlanModel {
  return { name: 'bench pipeline', nLayer: s.layers, nHead: s.heads, nEmbd: s.width, ffn: 4 * s.width, vocabSize: s.vocab, gated: false, tied: true, bias: true, positions: s.ctx, seqLen: s.ctx };
}

function gptConfig(s: PipelineBenchShape): GPTConfig {
  return { vocabSize: s.vocab, blockSize: s.ctx, nLayer: s.layers, nHead: s.heads, nEmbd: s.width, dropout: 0, bias: true };
}

/** One launch's result: per schedule and pipeline size. */
export interface PipelineBenchRow {
  stages: number; schedule: ScheduleKind; microBatches: number; virtualStages: number;
  /** Median over the timed steps of the measured bubble. */
  measuredBubble: number;
  /** The papers' formula (formulaBubble). */
  formulaBubble: number;
  /** The planner's prediction (predictBubble: the schedule's table simulated with F = B = W). */
  plannerBubble: number;
  /** The mean µs of an F, a B (the whole backward, or ZB-H1's input part) and a W in this run. */
  costsUs: ActionCosts;
  /** The schedule's table simulated with this run's measured F, B and W (mean wall µs; no communication time). */
  simulatedBubble: number;
  /** Median over the timed steps of the table replayed with each action's own CPU time (replayCpuBubbles). */
  cpuReplayedBubble: number;
  /** The mean CPU µs of an F, a B and a W in this run. */
  cpuCostsUs: ActionCosts;
  /** Per timed step, the replay. */
  replayed: ReplayedStep[];
  /** Median over the timed steps of the slowest rank's whole step (ms). */
  stepMs: number;
  /** Median of the pipeline phase's span (ms). */
  pipelineMs: number;
  /** Per stage: measured peak bytes (after the first step) and the planner's estimate. */
  memory: { stage: number; peak: number; predicted: number }[];
  steps: MeasuredStep[];
}

/** One rank's part (run under the launcher): warm-up and timed steps, its step times and peak memory to <out>/rank-R.json. */
async function rankMain(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    layers: 'number', width: 'number', heads: 'number', ctx: 'number', rows: 'number', vocab: 'number',
    pp: 'number', 'micro-batches': 'number', 'virtual-stages': 'number', schedule: 'string', steps: 'number', warmup: 'number', out: 'string',
  });
  const shape: PipelineBenchShape = { layers: o.layers as number, width: o.width as number, heads: o.heads as number, ctx: o.ctx as number, rows: o.rows as number, vocab: o.vocab as number };
  const pp = o.pp as number, m = o['micro-batches'] as number, v = o['virtual-stages'] as number, steps = o.steps as number, warmup = o.warmup as number;
  const batch = shape.rows * m;
  const { rank, mesh, layout } = await initParallelTraining({ pp, microBatches: m, schedule: o.schedule as string, virtualStages: v }, gptConfig(shape), batch);
  cpu().setBlasThreads(Math.max(1, Math.floor(cpus().length / Number(process.env.LOCAL_WORLD_SIZE ?? pp))));
  const stage = new GPTStage(new GPT(gptConfig(shape), { seed: 0 }), mesh?.ppRank ?? 0, layout.pp, layout.virtualStages, schedulePlacement(layout.schedule));
  const trainer = await ParallelTrainer.create(stage, [{ params: stage.parameters() }], {
    mesh, microBatches: m, schedule: layout.schedule, createOptimizer: (groups) => new AdamW(groups, { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 }),
  });
  let x = 12345;
  const ids = () => Int32Array.from({ length: batch * shape.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % shape.vocab; });
  using inputs = tensor(ids(), [batch, shape.ctx], { dtype: 'i32' });
  using targets = tensor(ids(), [batch, shape.ctx], { dtype: 'i32' });
  const times: number[] = [];
  for (let i = 0; i < warmup + steps; i++) {
    if (i === 1) resetPeakMemory();
    const t0 = performance.now();
    await trainer.step(inputs, targets);
    if (i >= warmup) times.push(performance.now() - t0);
  }
  const peak = memoryStats().peak;
  trainer.dispose();
  stage.dispose();
  writeFileSync(join(o.out as string, `rank-${rank}.json`), JSON.stringify({ rank, stage: mesh?.ppRank ?? 0, times, peak }));
  await destroy();
  return 0;
}

function list(text: string | undefined, fallback: string, what: string): string[] {
  const items = (text ?? fallback).split(',').map((s) => s.trim()).filter(Boolean);
  if (items.length === 0) throw new ArgumentError(`bench pipeline: --${what} lists nothing`);
  return items;
}

/** Runs every (stages, schedule) job, prints the table, writes the JSON. Returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    stages: 'string', schedules: 'string', 'micro-batches': 'number', 'virtual-stages': 'number', layers: 'number', width: 'number', heads: 'number',
    ctx: 'number', rows: 'number', vocab: 'number', steps: 'number', warmup: 'number', json: 'string', help: 'boolean',
  });
  if (o.help) { console.log(usage); return 0; }
  const stagesList = list(o.stages as string | undefined, '2,4', 'stages').map((s) => {
    const n = Number(s);
    if (!Number.isInteger(n) || n < 2) throw new ArgumentError(`bench pipeline: --stages takes integers >= 2, got ${JSON.stringify(s)}`);
    return n;
  });
  const schedules = list(o.schedules as string | undefined, SCHEDULE_KINDS.join(','), 'schedules').map((s) => {
    if (!(SCHEDULE_KINDS as readonly string[]).includes(s)) throw new ArgumentError(`bench pipeline: unknown schedule '${s}' (expected ${SCHEDULE_KINDS.join(', ')})`);
    return s as ScheduleKind;
  });
  const n = (k: string, d: number, min = 1) => {
    const v = (o[k] as number | undefined) ?? d;
    if (!Number.isInteger(v) || v < min) throw new ArgumentError(`bench pipeline: --${k} must be an integer >= ${min}, got ${v}`);
    return v;
  };
  const shape: PipelineBenchShape = { layers: n('layers', 8), width: n('width', 128), heads: n('heads', 4), ctx: n('ctx', 64), rows: n('rows', 2), vocab: n('vocab', 256) };
  const v = n('virtual-stages', 2, 2), steps = n('steps', 3), warmup = n('warmup', 1);
  for (const p of stagesList) {
    if (schedules.includes('interleaved') && p * v > shape.layers) throw new ArgumentError(`bench pipeline: ${p} stages × ${v} virtual stages need at least ${p * v} layers, got --layers ${shape.layers}`);
    if (schedules.includes('zb-v') && 2 * p > shape.layers) throw new ArgumentError(`bench pipeline: zb-v on ${p} stages needs at least ${2 * p} layers (2 chunks per stage), got --layers ${shape.layers}`);
    if (p > shape.layers) throw new ArgumentError(`bench pipeline: ${p} stages need at least ${p} layers, got --layers ${shape.layers}`);
    const m = (o['micro-batches'] as number | undefined) ?? 2 * p;
    if (schedules.includes('interleaved') && m % p !== 0) throw new ArgumentError(`bench pipeline: interleaving needs --micro-batches to be a multiple of the stages: ${m} over ${p}`);
  }
  const { main: launch } = await import('../launch/cli.js');
  const here = fileURLToPath(import.meta.url);
  const loadAtStart = loadavg();
  const rows: PipelineBenchRow[] = [];
  const work = mkdtempSync(join(tmpdir(), 'nt-bench-pipeline-'));
  try {
    for (const p of stagesList) {
      const m = (o['micro-batches'] as number | undefined) ?? 2 * p;
      for (const schedule of schedules) {
        const vs = schedule === 'interleaved' ? v : schedule === 'zb-v' ? 2 : 1;
        const out = mkdtempSync(join(work, `${schedule}-pp${p}-`)), traceDir = join(out, 'trace');
        const saved = process.env.NODETRON_TRACE;
        process.env.NODETRON_TRACE = traceDir;
        let code: number;
        try {
          code = await launch(['--nproc-per-node', String(p), here, '--rank',
            '--layers', String(shape.layers), '--width', String(shape.width), '--heads', String(shape.heads), '--ctx', String(shape.ctx), '--rows', String(shape.rows), '--vocab', String(shape.vocab),
            '--pp', String(p), '--micro-batches', String(m), '--virtual-stages', String(vs), '--schedule', schedule, '--steps', String(steps), '--warmup', String(warmup), '--out', out]);
        } finally {
          if (saved === undefined) delete process.env.NODETRON_TRACE; else process.env.NODETRON_TRACE = saved;
        }
        if (code !== 0) return code;
        const ranks = Array.from({ length: p }, (_, r) => JSON.parse(readFileSync(join(out, `rank-${r}.json`), 'utf8')) as { rank: number; stage: number; times: number[]; peak: number });
        const traces = Array.from({ length: p }, (_, r) => (JSON.parse(readFileSync(join(traceDir, `rank-${r}.trace.json`), 'utf8')) as { traceEvents: BenchTraceEvent[] }).traceEvents);
        const measured = measureBubbles(traces).slice(warmup);
        const costsUs = measureCosts(traces, warmup);
        const tables = scheduleTables(schedule, { stages: p, microBatches: m, chunks: vs });
        const replayed = replayCpuBubbles(traces, tables, vs, schedulePlacement(schedule)).slice(warmup);
        const cpuCostsUs = measureCpuCosts(traces, warmup);
        const layout: PlanLayout = { dp: 1, tp: 1, pp: p, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: m, schedule, virtualStages: vs };
        const model = benchPlanModel(shape), opts = { seq: shape.ctx, microBatchSize: shape.rows, dtype: 'f32' as const };
        rows.push({
          stages: p, schedule, microBatches: m, virtualStages: vs,
          measuredBubble: median(measured.map((s) => s.bubble)), formulaBubble: formulaBubble(schedule, p, m, vs), plannerBubble: predictBubble(layout),
          costsUs, simulatedBubble: simulateSchedule(tables, vs, splitsBackward(schedule) ? costsUs : { ...costsUs, W: 0 }, schedulePlacement(schedule)).bubble,
          cpuReplayedBubble: median(replayed.map((s) => s.bubble)), cpuCostsUs, replayed,
          stepMs: median(ranks[0]!.times.map((_, i) => Math.max(...ranks.map((r) => r.times[i]!)))), pipelineMs: median(measured.map((s) => s.spanUs / 1000)),
          memory: ranks.sort((a, b) => a.stage - b.stage).map((r) => ({ stage: r.stage, peak: r.peak, predicted: estimateStageMemory(model, layout, opts, r.stage).total })),
          steps: measured,
        });
      }
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const pct = (x: number) => `${(100 * x).toFixed(1)}%`;
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  console.log(`\n# nodetron bench pipeline: GPT ${shape.layers} layers, width ${shape.width}, ${shape.heads} heads, ctx ${shape.ctx}, vocab ${shape.vocab}, ` +
    `${shape.rows} sequences per micro-batch; f32 on cpu, one process per stage; ${warmup} warm-up + ${steps} timed steps (medians)\n`);
  printTable(['pp', 'schedule', 'm', 'v', 'bubble wall', 'CPU replayed', 'formula', 'planner', 'mean F/B/W simulated', 'F/B/W ms wall', 'F/B/W ms CPU', 'step ms', 'pipeline ms', 'peak MiB per stage (measured / planner)'], rows.map((r) => [
    r.stages, r.schedule, r.microBatches, r.virtualStages, pct(r.measuredBubble), pct(r.cpuReplayedBubble), pct(r.formulaBubble), pct(r.plannerBubble), pct(r.simulatedBubble),
    [r.costsUs.F, r.costsUs.B, r.costsUs.W].map((x) => (x / 1000).toFixed(1)).join('/'), [r.cpuCostsUs.F, r.cpuCostsUs.B, r.cpuCostsUs.W].map((x) => (x / 1000).toFixed(1)).join('/'),
    r.stepMs.toFixed(1), r.pipelineMs.toFixed(1),
    r.memory.map((x) => `${mib(x.peak)}/${mib(x.predicted)}`).join(' '),
  ]));
  const load = (l: number[]) => l.map((x) => x.toFixed(1)).join(' ');
  console.log(`\n# load average (1, 5, 15 min) at start: ${load(loadAtStart)}; at end: ${load(loadavg())} on ${cpus().length} cores (more stages than cores share them: the idle time then includes waiting for a core)`);
  writeJson(o.json as string | undefined, { bench: 'pipeline', machine: machineRecord(), shape, steps, warmup, virtualStages: v, rows, loadAverage: { atStart: loadAtStart, atEnd: loadavg() } });
  return 0;
}

// Launched as a rank script by main (through the launcher).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href && process.argv[2] === '--rank') {
  rankMain(process.argv.slice(3)).then((code) => process.exit(code), (e: unknown) => { console.error(e); process.exit(1); });
}
