// `nodetron plan --calibrate`: runs a few training steps of small layouts of the GPT example's
// model on this machine (CPU, f32) through the launcher and sets each rank's measured peak
// (memoryStats().peak) beside the planner's f32 prediction for its pipeline stage.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ArgumentError, errorFromCode, StateError, type NodetronError } from '../errors.js';
import { resolveTrainingLayout } from '../parallel/layout.js';
import { SCHEDULE_KINDS } from '../parallel/pipeline/schedules.js';
import { estimateStageMemory, type PlanDType, type PlanLayout } from './memory.js';
import type { PlanModel } from './models.js';
import type { CalibrationRankError, CalibrationRankResult } from './calibrate-rank.js';

/** The small model calibration trains: the GPT example's block and padded GPT-2 vocabulary at 4 layers, width 128, 4 heads. */
export interface CalibrationShape {
  /** Transformer layers. */
  layers: number;
  /** Attention heads. */
  heads: number;
  /** Embedding width. */
  width: number;
  /** Context (sequence) length. */
  ctx: number;
  /** Sequences per batch. */
  batch: number;
  /** Vocabulary size. */
  vocab: number;
}

/** The calibration model: 4 layers, 4 heads, width 128, context 64, batch 8, vocabulary 50 304. */
export const CALIBRATION_SHAPE: Readonly<CalibrationShape> = { layers: 4, heads: 4, width: 128, ctx: 64, batch: 8, vocab: 50304 };

/** The layouts `--calibrate` runs by default: DP, ZeRO 1-3, TP, TP+SP, PP with 1F1B and GPipe, recomputation. */
export const DEFAULT_CALIBRATION_LAYOUTS = ['dp2', 'dp2,zero1', 'dp2,zero2', 'dp2,zero3', 'tp2', 'tp2,sp', 'pp2,mb4,1f1b', 'pp2,mb4,gpipe', 'dp1,recompute'];

/**
 * Reads a layout spec: comma-separated `dpN`, `tpN`, `ppN`, `zeroS`, `sp`, `recompute` (full),
 * `mbN` (micro-batches), `gpipe` or `1f1b`, `cpN` (context parallelism, ring attention) and
 * `ulysses` (its other mode). Unset: 1, no ZeRO, 1F1B, one micro-batch.
 */
export function parseLayoutSpec(spec: string): PlanLayout {
  const l: PlanLayout = { dp: 1, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };
  let scheduleGiven = false;
  for (const part of spec.split(',').map((x) => x.trim()).filter(Boolean)) {
    const m = /^(dp|tp|pp|zero|mb|cp|v)(\d+)$/.exec(part);
    if (m) {
      const v = Number(m[2]);
      if (m[1] === 'zero') { if (v > 3) throw new ArgumentError(`layout ${spec}: zero must be 0..3`); l.zero = v as 0 | 1 | 2 | 3; }
      else if (v < 1) throw new ArgumentError(`layout ${spec}: ${m[1]} must be >= 1`);
      else if (m[1] === 'mb') l.microBatches = v;
      else if (m[1] === 'cp') { if (v > 1) { l.cp = v; l.cpMode ??= 'ring'; } }
      else if (m[1] === 'v') l.virtualStages = v;
      else l[m[1] as 'dp' | 'tp' | 'pp'] = v;
    } else if (part === 'sp') l.sequenceParallel = true;
    else if (part === 'recompute') l.recompute = 'full';
    else if (part === 'offload') l.offload = true;
    else if (part === 'ulysses') l.cpMode = 'ulysses';
    else if ((SCHEDULE_KINDS as readonly string[]).includes(part)) { l.schedule = part as PlanLayout['schedule']; scheduleGiven = true; }
    else throw new ArgumentError(`layout ${spec}: cannot read ${JSON.stringify(part)} (dpN, tpN, ppN, zeroS, mbN, vN, cpN, ulysses, sp, recompute, offload, ${SCHEDULE_KINDS.join(', ')})`);
  }
  if (l.cpMode && !l.cp) throw new ArgumentError(`layout ${spec}: ulysses is a context-parallel mode: give cpN with N > 1`);
  // vN (virtual stages) > 1 means the interleaved schedule unless another is named (which the checks then reject).
  if (!scheduleGiven && (l.virtualStages ?? 1) > 1) l.schedule = 'interleaved';
  // zb-v always holds 2 chunks per rank (its V).
  if (l.schedule === 'zb-v' && (l.virtualStages ?? 1) === 1) l.virtualStages = 2;
  return l;
}

/** The calibration shape as a PlanModel (the example's GPT-2 block). */
export function calibrationModel(c: CalibrationShape = CALIBRATION_SHAPE): PlanModel {
  return { name: 'calibration', nLayer: c.layers, nHead: c.heads, nEmbd: c.width, ffn: 4 * c.width, vocabSize: c.vocab, gated: false, tied: true, bias: true, positions: c.ctx, seqLen: c.ctx };
}

/** One rank's measured and predicted peak. */
export interface CalibrationRank extends CalibrationRankResult {
  /** The planner's predicted peak (bytes). */
  predicted: number;
  /** (predicted − measured) / measured. */
  error: number;
}

/** One calibrated layout: every rank's measured and predicted peak. */
export interface CalibrationRow {
  /** The layout spec (parseLayoutSpec's format). */
  layout: string;
  /** Each rank's measured and predicted peak. */
  ranks: CalibrationRank[];
  /** The largest |predicted − measured| / measured over the ranks. */
  maxError: number;
}

/**
 * Reads a layout spec and checks that the calibration model can train it, before any process
 * starts: the checks every rank makes (resolveTrainingLayout: heads, width and vocabulary by tp,
 * the sequence by tp under sp, stages by layers, the batch by dp × micro-batches, ZeRO needs dp > 1)
 * and what calibration does not run (offload). Throws one ArgumentError naming the layout and every
 * problem.
 */
export function checkCalibrationLayout(spec: string, shape: CalibrationShape = CALIBRATION_SHAPE): PlanLayout {
  const layout = parseLayoutSpec(spec);
  const problems: string[] = [];
  if (layout.offload) problems.push('offload is not calibrated (the ranks measure one allocator, host and device alike)');
  const world = layout.dp * layout.tp * layout.pp * (layout.cp ?? 1);
  try {
    resolveTrainingLayout({ tp: layout.tp, pp: layout.pp, dp: layout.dp, zero: layout.zero, sequenceParallel: layout.sequenceParallel, microBatches: layout.microBatches, schedule: layout.schedule, virtualStages: layout.virtualStages ?? 1,
      ...(layout.cp ? { cp: layout.cp, cpMode: layout.cpMode } : {}) },
      { nLayer: shape.layers, nHead: shape.heads, nEmbd: shape.width, vocabSize: shape.vocab, blockSize: shape.ctx }, world, shape.batch);
  } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    problems.push(e.message.replace(/^training layout: /, ''));
  }
  if (problems.length) {
    throw new ArgumentError(`plan --calibrate: layout ${JSON.stringify(spec)} cannot train the calibration model (${shape.layers} layers, ${shape.heads} heads, width ${shape.width}, ctx ${shape.ctx}, batch ${shape.batch}, vocab ${shape.vocab}): ${problems.join('; ')}`);
  }
  return layout;
}

/** The launcher's --hang-timeout-ms for a calibration job: no rank completed a collective for this long. */
const CALIBRATION_HANG_TIMEOUT_MS = 120_000;

/** Options of {@link calibrateLayout}. */
export interface CalibrateOptions {
  /** Training steps per rank (default 3; the peak is taken over the steps after the first). */
  steps?: number;
  /** The training precision measured (default 'f32'): 'bf16' trains under bf16 autocast (the trainer's precision) and compares with the planner's bf16 figures. */
  dtype?: PlanDType;
  /** Fault injection for tests: world rank `rank` throws at the start of step `step`. */
  failAt?: {
    /** The world rank that throws. */
    rank: number;
    /** The step (0-based) at whose start it throws. */
    step: number;
  };
}

/**
 * The error of a failed calibration job: the first rank's own error (its class, and a message naming
 * the layout and the rank) when ranks wrote one, else the launcher's exit code. The first failure
 * is the earliest; of equal times a communication error (a peer's lost connection) comes last.
 */
function jobFailure(spec: string, out: string, world: number, code: number): NodetronError {
  const errors: CalibrationRankError[] = [];
  for (let r = 0; r < world; r++) {
    const path = join(out, `rank-${r}.error.json`);
    if (!existsSync(path)) continue;
    try { errors.push(JSON.parse(readFileSync(path, 'utf8')) as CalibrationRankError); } catch { /* cut short by the stop: the others say it */ }
  }
  errors.sort((a, b) => a.time - b.time || Number(a.code === 'ERR_COMM') - Number(b.code === 'ERR_COMM'));
  const e = errors[0];
  if (!e) return new StateError(`plan --calibrate: layout ${spec} failed (the launcher exited with code ${code}; no rank reported an error, see the [rank N] lines above)`);
  const message = `plan --calibrate: layout ${spec} failed on rank ${e.rank}: ${e.name}: ${e.message}`;
  return e.code ? errorFromCode(e.code, message) : new StateError(message);
}

/**
 * Runs one layout through the launcher and compares every rank's peak with the prediction. The
 * layout is checked first (checkCalibrationLayout); a rank that fails makes the launcher stop the
 * others, and its error (same class, message naming the layout and rank) is thrown here.
 */
export async function calibrateLayout(spec: string, shape: CalibrationShape = CALIBRATION_SHAPE, options: number | CalibrateOptions = {}): Promise<CalibrationRow> {
  const o: CalibrateOptions = typeof options === 'number' ? { steps: options } : options;
  const steps = o.steps ?? 3;
  const dtype = o.dtype ?? 'f32';
  if (dtype !== 'f32' && dtype !== 'bf16') throw new ArgumentError(`calibrateLayout: dtype must be 'f32' or 'bf16', got ${JSON.stringify(dtype)}`);
  const layout = checkCalibrationLayout(spec, shape);
  const world = layout.dp * layout.tp * layout.pp * (layout.cp ?? 1);
  if (o.failAt && !(Number.isInteger(o.failAt.rank) && Number.isInteger(o.failAt.step) && o.failAt.rank >= 0 && o.failAt.step >= 0)) {
    throw new ArgumentError(`calibrateLayout: failAt needs integer rank and step >= 0, got ${JSON.stringify(o.failAt)}`);
  }
  const out = mkdtempSync(join(tmpdir(), 'nt-plan-cal-'));
  try {
    const here = fileURLToPath(import.meta.url);
    const script = join(dirname(here), `calibrate-rank${here.endsWith('.ts') ? '.ts' : '.js'}`);
    const args = ['--layers', shape.layers, '--heads', shape.heads, '--width', shape.width, '--ctx', shape.ctx, '--batch', shape.batch, '--vocab', shape.vocab,
      '--tp', layout.tp, '--pp', layout.pp, '--dp', layout.dp, '--zero', layout.zero, '--micro-batches', layout.microBatches, '--schedule', layout.schedule, '--virtual-stages', layout.virtualStages ?? 1, '--steps', steps].map(String);
    if (layout.sequenceParallel) args.push('--sp');
    if (layout.cp) args.push('--cp', String(layout.cp), '--cp-mode', layout.cpMode ?? 'ring');
    if (layout.recompute === 'full') args.push('--recompute');
    if (dtype !== 'f32') args.push('--precision', dtype);
    if (o.failAt) args.push('--fail-at', `${o.failAt.rank}:${o.failAt.step}`);
    const { main: launch } = await import('../launch/cli.js');
    // A rank that fails exits and the launcher stops the others; should ranks ever stay alive without
    // progress, the launcher's hang check ends the job after 2 minutes without a completed collective.
    const code = await launch(['--nproc-per-node', String(world), '--hang-timeout-ms', String(CALIBRATION_HANG_TIMEOUT_MS), script, ...args, '--out', out]);
    if (code !== 0) throw jobFailure(spec, out, world, code);
    const model = calibrationModel(shape);
    const opts = { seq: shape.ctx, microBatchSize: shape.batch / layout.dp / layout.microBatches, dtype, model: 'nodetron' as const, backend: 'cpu' as const };
    const ranks = Array.from({ length: world }, (_, r) => {
      const m = JSON.parse(readFileSync(join(out, `rank-${r}.json`), 'utf8')) as CalibrationRankResult;
      // The GEMM path the rank ran (the AVX512_BF16 kernel or the widening fallback) is the one predicted.
      const predicted = estimateStageMemory(model, layout, { ...opts, bf16Path: m.bf16Path }, m.ppRank).total;
      return { ...m, predicted, error: (predicted - m.peak) / m.peak };
    });
    return { layout: spec, ranks, maxError: Math.max(...ranks.map((r) => Math.abs(r.error))) };
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}
