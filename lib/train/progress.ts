// Training progress: the model FLOPs per token a model counts itself (CausalLM.flopsPerToken: 6N +
// attention, as nanoGPT and PaLM count them), the peak FLOP/s MFU is measured against (given, or detected for a few GPUs), and the compact line a run
// prints every N steps on rank 0: loss, learning rate, tokens/s, MFU, peak memory, ETA.
import { info } from '../info.js';
import { getFloat32MatmulPrecision } from '../cuda/index.js';
import { parseDevice } from '../device.js';
import type { CausalLM } from '../nn/causal-lm.js';
// The families' counts live beside them (lib/nn/gpt.ts, lib/nn/llama.ts); nt.train has always offered them.
export { gptParameterCount, gptActiveParameterCount, gptFlopsPerToken } from '../nn/gpt.js';
export { llamaParameterCount, llamaFlopsPerToken, type LlamaCountConfig } from '../nn/llama.js';

/** Progress output of a training run (rank 0 only). */
export interface ProgressOptions {
  /** Print a progress line after the first step and every `every` steps after it, and after the last (default 10). */
  every?: number;
  /**
   * Peak FLOP/s of one process's device, for MFU (model FLOPs utilization). Default: the
   * NODETRON_PEAK_FLOPS environment variable, else detected for known GPUs ({@link detectPeakFlops});
   * on cpu nothing is detected and MFU is left out of the line.
   */
  peakFlops?: number;
  /** Where lines go (default console.log). */
  log?: (line: string) => void;
}

/** Model FLOPs per trained token of a built model: its own count (CausalLM.flopsPerToken). */
export function modelFlopsPerToken(model: CausalLM, seqLen: number): number {
  return model.flopsPerToken(seqLen);
}

// Dense peaks by GPU name: [fp32, tf32] FLOP/s (SXM parts; vendors' data sheets).
const GPU_PEAKS: Array<[RegExp, number, number]> = [
  [/H200/i, 67e12, 494.7e12],
  [/H100/i, 67e12, 494.7e12],
  [/A100/i, 19.5e12, 156e12],
  [/L40S/i, 91.6e12, 183e12],
  [/A10G?\b/i, 31.2e12, 62.5e12],
];

/**
 * The peak FLOP/s of `device` for float32 training: NODETRON_PEAK_FLOPS when set; for a known cuda
 * GPU (H100, H200, A100, L40S, A10) its dense fp32 peak, or its TF32 peak when
 * nt.cuda.setFloat32MatmulPrecision('high') lets GEMMs use TF32; undefined otherwise (cpu: no
 * estimate, so MFU is left out unless {@link ProgressOptions.peakFlops} is given).
 */
export function detectPeakFlops(device: string): number | undefined {
  const env = Number(process.env.NODETRON_PEAK_FLOPS);
  if (Number.isFinite(env) && env > 0) return env;
  const d = parseDevice(device, 'detectPeakFlops');
  if (d.type !== 'cuda') return undefined;
  try {
    const devices = (info().backends.cuda.devices ?? []) as Array<{ name?: string }>;
    const name = devices[d.index ?? 0]?.name ?? '';
    const peak = GPU_PEAKS.find(([re]) => re.test(name));
    if (!peak) return undefined;
    return getFloat32MatmulPrecision() === 'high' ? peak[2] : peak[1];
  } catch {
    return undefined;
  }
}

/** Seconds as `42s`, `3m05s` or `1h02m`. */
export function formatDuration(s: number): string {
  if (!Number.isFinite(s)) return '?';
  const t = Math.max(0, Math.round(s));
  if (t < 60) return `${t}s`;
  if (t < 3600) return `${Math.floor(t / 60)}m${String(t % 60).padStart(2, '0')}s`;
  return `${Math.floor(t / 3600)}h${String(Math.floor((t % 3600) / 60)).padStart(2, '0')}m`;
}

/** What one progress line reports. */
export interface ProgressSample {
  /** Steps done (1-based: the step just finished). */
  step: number;
  /** Total steps, when known (ETA needs it). */
  steps?: number;
  /** The step's loss (global batch). */
  loss: number;
  /** Exponential moving average of the loss (0.9). */
  avgLoss: number;
  /** The gradient norm before clipping. */
  gradNorm?: number;
  /** The step's learning rate. */
  lr?: number;
  /** Trained tokens per second over the whole job, since timing started. */
  tokensPerSecond: number;
  /** Model FLOPs utilization (0..1), when a peak is known. */
  mfu?: number;
  /** Peak memory of this rank's device in bytes. */
  peakBytes: number;
  /** Seconds left, when the total is known. */
  etaSeconds?: number;
  /** MoE routing of the step: the auxiliary loss added, the share of routed rows dropped, the busiest expert's rows over the mean. */
  moe?: MoEProgress;
}

/** The MoE part of a progress line. */
export interface MoEProgress {
  /** The auxiliary losses added to the objective in the step. */
  auxLoss: number;
  /** Share of routed rows dropped by a capacity factor. */
  droppedShare: number;
  /** Rows of the busiest expert over the mean rows per expert (1: balanced). */
  imbalance: number;
}

/** `step   10/150  loss 5.1234 (avg 5.3012)  norm 1.23  lr 3.00e-03  | 12345 tok/s  MFU 41.2%  mem 123.4 MiB  ETA 1m05s` (with MoE, `| moe aux 0.0102 drop 0.0% max/mean 1.31` before ETA) */
export function formatProgress(p: ProgressSample): string {
  const width = p.steps !== undefined ? String(p.steps).length : 4;
  const at = `step ${String(p.step).padStart(Math.max(4, width))}${p.steps !== undefined ? `/${p.steps}` : ''}`;
  const parts = [at, `loss ${p.loss.toFixed(4)} (avg ${p.avgLoss.toFixed(4)})`];
  if (p.gradNorm !== undefined) parts.push(`norm ${p.gradNorm.toFixed(2)}`);
  if (p.lr !== undefined) parts.push(`lr ${p.lr.toExponential(2)}`);
  parts.push(`| ${Math.round(p.tokensPerSecond)} tok/s`);
  if (p.mfu !== undefined) parts.push(`MFU ${(p.mfu * 100).toFixed(1)}%`);
  parts.push(`mem ${(p.peakBytes / 2 ** 20).toFixed(1)} MiB`);
  if (p.moe) parts.push(`| moe aux ${p.moe.auxLoss.toFixed(4)} drop ${(p.moe.droppedShare * 100).toFixed(1)}% max/mean ${p.moe.imbalance.toFixed(2)}`);
  if (p.etaSeconds !== undefined) parts.push(`ETA ${formatDuration(p.etaSeconds)}`);
  return parts.join('  ');
}
