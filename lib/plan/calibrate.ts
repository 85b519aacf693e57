// `nodetron plan --calibrate`: runs a few training steps of small layouts of the GPT example's
// model on this machine (CPU, f32) through the launcher and sets each rank's measured peak
// (memoryStats().peak) beside the planner's f32 prediction for its pipeline stage.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ArgumentError } from '../errors.js';
import { estimateStageMemory, type PlanLayout } from './memory.js';
import type { PlanModel } from './models.js';
import type { CalibrationRankResult } from './calibrate-rank.js';

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
 * `mbN` (micro-batches), `gpipe` or `1f1b`. Unset: 1, no ZeRO, 1F1B, one micro-batch.
 */
export function parseLayoutSpec(spec: string): PlanLayout {
  const l: PlanLayout = { dp: 1, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };
  for (const part of spec.split(',').map((x) => x.trim()).filter(Boolean)) {
    const m = /^(dp|tp|pp|zero|mb)(\d+)$/.exec(part);
    if (m) {
      const v = Number(m[2]);
      if (m[1] === 'zero') { if (v > 3) throw new ArgumentError(`layout ${spec}: zero must be 0..3`); l.zero = v as 0 | 1 | 2 | 3; }
      else if (v < 1) throw new ArgumentError(`layout ${spec}: ${m[1]} must be >= 1`);
      else if (m[1] === 'mb') l.microBatches = v;
      else l[m[1] as 'dp' | 'tp' | 'pp'] = v;
    } else if (part === 'sp') l.sequenceParallel = true;
    else if (part === 'recompute') l.recompute = 'full';
    else if (part === 'offload') l.offload = true;
    else if (part === 'gpipe' || part === '1f1b') l.schedule = part;
    else throw new ArgumentError(`layout ${spec}: cannot read ${JSON.stringify(part)} (dpN, tpN, ppN, zeroS, mbN, sp, recompute, offload, gpipe, 1f1b)`);
  }
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

/** Runs one layout through the launcher and compares every rank's peak with the prediction. */
export async function calibrateLayout(spec: string, shape: CalibrationShape = CALIBRATION_SHAPE, steps = 3): Promise<CalibrationRow> {
  const layout = parseLayoutSpec(spec);
  const world = layout.dp * layout.tp * layout.pp;
  const out = mkdtempSync(join(tmpdir(), 'nt-plan-cal-'));
  try {
    const here = fileURLToPath(import.meta.url);
    const script = join(dirname(here), `calibrate-rank${here.endsWith('.ts') ? '.ts' : '.js'}`);
    const args = ['--layers', shape.layers, '--heads', shape.heads, '--width', shape.width, '--ctx', shape.ctx, '--batch', shape.batch, '--vocab', shape.vocab,
      '--tp', layout.tp, '--pp', layout.pp, '--dp', layout.dp, '--zero', layout.zero, '--micro-batches', layout.microBatches, '--schedule', layout.schedule, '--steps', steps].map(String);
    if (layout.sequenceParallel) args.push('--sp');
    if (layout.recompute === 'full') args.push('--recompute');
    const { main: launch } = await import('../launch/cli.js');
    const code = await launch(['--nproc-per-node', String(world), script, ...args, '--out', out]);
    if (code !== 0) throw new Error(`plan --calibrate: layout ${spec} failed (exit code ${code})`);
    const model = calibrationModel(shape);
    const opts = { seq: shape.ctx, microBatchSize: shape.batch / layout.dp / layout.microBatches, dtype: 'f32' as const };
    const ranks = Array.from({ length: world }, (_, r) => {
      const m = JSON.parse(readFileSync(join(out, `rank-${r}.json`), 'utf8')) as CalibrationRankResult;
      const predicted = estimateStageMemory(model, layout, opts, m.ppRank).total;
      return { ...m, predicted, error: (predicted - m.peak) / m.peak };
    });
    return { layout: spec, ranks, maxError: Math.max(...ranks.map((r) => Math.abs(r.error))) };
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}
