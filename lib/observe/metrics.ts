// Per-step metrics and straggler scores. With NODETRON_METRICS=dir (or NODETRON_TRACE=dir, which
// implies it) every rank appends one JSON line per training step to dir/rank-R.metrics.jsonl: step,
// step time, compute time (forward, backward and optimizer, without waits in collectives), loss,
// tokens/s, device memory and process RSS. stragglerScores() reads them back and scores each rank by
// the median over steps of its compute time against the step's (lower) median rank — the idea of
// Megatron-LM's straggler detector and of MegaScale's per-rank timing: in a synchronous job every
// rank's step time is that of the slowest, so only the time a rank spends computing tells which rank
// is slow. The dashboard
// (lib/cli/dashboard.ts) and `nodetron trace stragglers` both use it.
// On cpu devices the score uses the main thread's CPU time in those phases: wall time there mostly
// measures how the OS shares the cores (a loaded machine would hide or invent stragglers), and the
// process's CPU time counts the communicator thread's work on overlapped gradient buckets; on GPUs, wall time.
// NODETRON_DEBUG_SLOW_RANK=R[:F] makes rank R compute (1 + F) times as long (default F 0.3) by a busy
// wait after each backward: the test hook for the straggler detector (and, as a delay of its sends, for the self-check).
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { ArgumentError } from '../errors.js';
import { TRACE_DIR } from './trace.js';

/** Where per-step metrics go (NODETRON_METRICS, else NODETRON_TRACE); undefined when off. */
export const METRICS_DIR: string | undefined = process.env.NODETRON_METRICS || TRACE_DIR;
/** Whether per-step metrics are recorded. */
export const metricsEnabled = METRICS_DIR !== undefined;

/** One training step of one rank (a line of rank-R.metrics.jsonl). */
export interface StepMetrics {
  /** The rank's step counter (1-based: the step just finished). */
  step: number;
  /** Global rank. */
  rank: number;
  /** When the step ended (ms since the epoch). */
  time: number;
  /** Wall time of the whole step (ms). */
  stepMs: number;
  /** Time computing: forward, backward and the optimizer, without waits in collectives (wall ms). */
  computeMs: number;
  /** CPU time of the main thread (where the kernels run on cpu) over the same phases (ms): what the score uses on cpu devices. */
  cpuMs: number;
  /** The global batch's loss. */
  loss: number;
  /** Tokens of the global batch. */
  tokens: number;
  /** Global tokens per second of this step (tokens / stepMs). */
  tokensPerSec: number;
  /** Device memory allocated at the end of the step (bytes). */
  allocatedBytes: number;
  /** Peak device memory so far (bytes). */
  peakBytes: number;
  /** Resident set size of the process (bytes). */
  rssBytes: number;
  /** The device the rank trains on. */
  device: string;
  /**
   * Mixture-of-experts routing of the step (models with MoE layers): rows routed to each expert summed
   * over the layers (and the data-parallel ranks), the share of routed rows dropped by a capacity
   * factor, the auxiliary losses added to the objective (coefficients applied, summed over layers and
   * micro-batches), and the mean load-balancing and z-loss values per layer and micro-batch.
   */
  moe?: MoEStepMetrics;
}

/** A step's mixture-of-experts routing in the metrics file. */
export interface MoEStepMetrics {
  /** Rows routed to each expert, summed over the MoE layers and micro-batches (and the data-parallel ranks). */
  tokensPerExpert: number[];
  /** Share of the routed rows dropped by a capacity factor (0 when dropless). */
  droppedShare: number;
  /** The auxiliary losses added to the objective (coefficients applied), summed over layers and micro-batches. */
  auxLoss: number;
  /** The load-balancing loss's mean value per layer and micro-batch (1 when perfectly balanced). */
  loadBalanceLoss: number;
  /** The router z-loss's mean value per layer and micro-batch. */
  zLoss: number;
}

const RANK = Number(process.env.RANK ?? 0);
let fd: number | undefined;

/**
 * Appends one step's metrics to this rank's file (no-op when metrics are off). The file is started
 * afresh by a job's first attempt and appended to by restarts (NODETRON_RESTART_COUNT > 0).
 */
export function recordStepMetrics(m: StepMetrics): void {
  if (!metricsEnabled) return;
  try {
    if (fd === undefined) {
      const fresh = (process.env.NODETRON_RESTART_COUNT ?? '0') === '0';
      mkdirSync(METRICS_DIR!, { recursive: true });
      fd = openSync(join(METRICS_DIR!, `rank-${RANK}.metrics.jsonl`), fresh ? 'w' : 'a');
      process.on('exit', () => { if (fd !== undefined) closeSync(fd); fd = undefined; });
    }
    writeSync(fd, `${JSON.stringify(m)}\n`);
  } catch (e) {
    process.stderr.write(`nodetron metrics: could not write step metrics: ${(e as Error).message}\n`);
  }
}

/** Every rank's step metrics in `dir` (rank → steps in file order); a torn last line is skipped. */
export function readMetrics(dir: string): Map<number, StepMetrics[]> {
  if (!existsSync(dir)) throw new ArgumentError(`no directory ${dir} (run the job with NODETRON_METRICS=${dir} or NODETRON_TRACE=${dir})`);
  const out = new Map<number, StepMetrics[]>();
  for (const f of readdirSync(dir)) {
    const m = /^rank-(\d+)\.metrics\.jsonl$/.exec(f);
    if (!m) continue;
    const rows: StepMetrics[] = [];
    for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
      if (!line.trim()) continue;
      try { rows.push(JSON.parse(line) as StepMetrics); } catch { /* a line being written */ }
    }
    out.set(Number(m[1]), rows);
  }
  return new Map([...out].sort((a, b) => a[0] - b[0]));
}

/** Options of {@link stragglerScores}. */
export interface StragglerOptions {
  /** Steps left out at the start of each rank's record (warm-up: allocation, first-touch); default 1. */
  skip?: number;
  /** A rank whose score is at least this is named a straggler (default 1.15: 15% slower than the typical rank). */
  threshold?: number;
  /**
   * Which time is scored: 'cpuMs' (CPU time of the compute phases), 'computeMs' (their wall time), or
   * 'stepMs' (the same on every rank of a synchronous job). Default 'auto': cpuMs when every record
   * is from a cpu device, computeMs otherwise.
   */
  metric?: StragglerMetric | 'auto';
}

/** A time per step that straggler scores can use. */
export type StragglerMetric = 'computeMs' | 'cpuMs' | 'stepMs';

/** The score of one rank. */
export interface RankScore {
  /** Global rank. */
  rank: number;
  /** Steps scored. */
  steps: number;
  /** Median of the scored metric (ms). */
  medianMs: number;
  /** Median step time (ms). */
  medianStepMs: number;
  /** Median over steps of the rank's time / the step's lower median over ranks: 1 is typical, 1.3 is 30% slower. */
  score: number;
  /** Whether score >= threshold. */
  straggler: boolean;
}

/** What {@link stragglerScores} finds. */
export interface StragglerReport {
  /** Per rank, by rank. */
  ranks: RankScore[];
  /** The ranks' typical time: the lower median over ranks of their medians (ms; the table's reference line). */
  referenceMs: number;
  /** Ranks scored as stragglers, slowest first. */
  stragglers: number[];
  /** The threshold used. */
  threshold: number;
  /** The metric scored. */
  metric: StragglerMetric;
}

/** The median of a list (the lower middle element for an even count); NaN for none. */
export function lowerMedian(xs: readonly number[]): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[(s.length - 1) >> 1]!;
}

/**
 * Straggler score per rank: the median over steps (after `skip`) of its time in that step (compute
 * time by default) divided by the step's reference, the lower median of that step's times over the
 * ranks. The lower median is the reference so that with two ranks the faster one is it, and with more
 * a minority of slow ranks cannot move it; a rank at or above `threshold` is named. Scoring each step
 * against the same step's ranks cancels what changes with time on every rank at once (warm-up,
 * another job's burst on a shared machine), which a ratio of whole-run medians keeps. Steps are
 * matched by their step number (a rank's last record of a number counts, as after a restart), and
 * one counts when more than half of the ranks recorded it; a rank with no such step is scored by
 * its median against `referenceMs`.
 */
export function stragglerScores(metrics: Map<number, StepMetrics[]> | Record<number, StepMetrics[]>, opts: StragglerOptions = {}): StragglerReport {
  const skip = opts.skip ?? 1, threshold = opts.threshold ?? 1.15, asked = opts.metric ?? 'auto';
  if (!Number.isInteger(skip) || skip < 0) throw new ArgumentError(`stragglerScores: skip must be an integer >= 0, got ${skip}`);
  if (!(threshold > 0)) throw new ArgumentError(`stragglerScores: threshold must be > 0, got ${threshold}`);
  if (!['auto', 'computeMs', 'cpuMs', 'stepMs'].includes(asked)) throw new ArgumentError(`stragglerScores: metric must be 'auto', 'cpuMs', 'computeMs' or 'stepMs', got ${String(asked)}`);
  const entries = metrics instanceof Map ? [...metrics] : Object.entries(metrics).map(([r, m]) => [Number(r), m] as [number, StepMetrics[]]);
  const all = entries.flatMap(([, rows]) => rows);
  const metric: StragglerMetric = asked !== 'auto' ? asked
    : all.length > 0 && all.every((r) => r.device.startsWith('cpu') && typeof r.cpuMs === 'number') ? 'cpuMs' : 'computeMs';
  const per = entries.map(([rank, rows]) => {
    // A rank with fewer steps than skip + 1 is scored on what it has.
    const used = rows.length > skip ? rows.slice(skip) : rows;
    const byStep = new Map(used.map((r) => [r.step, r[metric]] as const));
    return { rank, steps: used.length, byStep, medianMs: lowerMedian(used.map((r) => r[metric])), medianStepMs: lowerMedian(used.map((r) => r.stepMs)) };
  }).filter((r) => r.steps > 0).sort((a, b) => a.rank - b.rank);
  const referenceMs = lowerMedian(per.map((r) => r.medianMs));
  // Each step's reference: the lower median of its times over the ranks that recorded it (a majority).
  const stepRef = new Map<number, number>();
  for (const step of new Set(per.flatMap((r) => [...r.byStep.keys()]))) {
    const times = per.flatMap((r) => (r.byStep.has(step) ? [r.byStep.get(step)!] : []));
    if (times.length * 2 > per.length) stepRef.set(step, lowerMedian(times));
  }
  const ranks = per.map(({ byStep, ...r }) => {
    const ratios = [...byStep].flatMap(([step, ms]) => {
      const ref = stepRef.get(step);
      return ref === undefined ? [] : [ref > 0 ? ms / ref : 1];
    });
    const score = ratios.length > 0 ? lowerMedian(ratios) : referenceMs > 0 ? r.medianMs / referenceMs : 1;
    return { ...r, score, straggler: score >= threshold };
  });
  const stragglers = ranks.filter((r) => r.straggler).sort((a, b) => b.score - a.score).map((r) => r.rank);
  return { ranks, referenceMs, stragglers, threshold, metric };
}

/** How each metric is named in tables. */
export const METRIC_LABEL: Record<StragglerMetric, string> = { cpuMs: 'median compute CPU ms', computeMs: 'median compute ms', stepMs: 'median step ms' };

/** The report as a table (one row per rank) and a closing line naming the stragglers. */
export function formatStragglers(r: StragglerReport): string {
  const head = ['rank', 'steps', METRIC_LABEL[r.metric], 'median step ms', 'score', ''];
  const rows = r.ranks.map((x) => [String(x.rank), String(x.steps), x.medianMs.toFixed(1), x.medianStepMs.toFixed(1), x.score.toFixed(2), x.straggler ? 'STRAGGLER' : '']);
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padStart(widths[i]!)).join('  ').trimEnd();
  const verdict = r.stragglers.length === 0
    ? `no straggler (every score < ${r.threshold})`
    : `straggler(s): ${r.stragglers.map((k) => `rank ${k} (score ${r.ranks.find((x) => x.rank === k)!.score.toFixed(2)})`).join(', ')}`;
  return [line(head), ...rows.map(line), `reference: ${r.referenceMs.toFixed(1)} ms (lower median over ranks); ${verdict}`].join('\n');
}

/**
 * The extra fraction of compute time NODETRON_DEBUG_SLOW_RANK=R[:F] asks of `rank` (0 for other
 * ranks or when unset). A malformed value is an ArgumentError.
 */
export function debugSlowdown(rank: number): number {
  const v = process.env.NODETRON_DEBUG_SLOW_RANK;
  if (!v) return 0;
  const m = /^(\d+)(?::(\d+(?:\.\d+)?))?$/.exec(v.trim());
  if (!m) throw new ArgumentError(`NODETRON_DEBUG_SLOW_RANK must be RANK or RANK:FRACTION (e.g. 2:0.3), got ${JSON.stringify(v)}`);
  return Number(m[1]) === rank ? Number(m[2] ?? 0.3) : 0;
}

// The main thread's CPU time: Node >= 23.9's process.threadCpuUsage; on Linux the thread's
// schedstat (ns of CPU time, read through one kept descriptor: microseconds per read); else the
// whole process's (which also counts the communicator's thread and so blurs the score).
let schedstat: number | null | undefined;
const schedBuf = Buffer.alloc(96);
/** CPU time of the main thread so far (ms; where the platform cannot tell, the whole process's). */
export function cpuNowMs(): number {
  const thread = (process as unknown as { threadCpuUsage?: () => NodeJS.CpuUsage }).threadCpuUsage;
  if (thread) { const u = thread.call(process); return (u.user + u.system) / 1000; }
  if (schedstat === undefined) {
    try { schedstat = openSync(`/proc/self/task/${process.pid}/schedstat`, 'r'); } catch { schedstat = null; }
  }
  if (schedstat !== null) {
    try {
      const n = readSync(schedstat, schedBuf, 0, schedBuf.length, 0);
      const ns = Number.parseInt(schedBuf.toString('latin1', 0, n), 10);
      if (Number.isFinite(ns)) return ns / 1e6;
    } catch { /* fall through */ }
  }
  const u = process.cpuUsage();
  return (u.user + u.system) / 1000;
}

/**
 * Keeps this thread busy until it has used `ms` more CPU time: a stand-in for slower compute (the
 * debug slowdown), visible both in wall time and in CPU time, whatever the machine's load.
 */
export function busyWaitCpu(ms: number): void {
  if (!(ms > 0)) return;
  const until = cpuNowMs() + ms;
  let x = 0;
  while (cpuNowMs() < until) for (let i = 0; i < 10_000; i++) x = (x * 1103515245 + 12345) % 2147483648;
  if (x === -1) process.stderr.write('');
}
