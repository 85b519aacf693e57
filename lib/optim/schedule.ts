// Learning-rate schedules as pure functions of the step.
import { ArgumentError } from '../errors.js';

/** Options of {@link cosineWithWarmup}. */
export interface CosineWithWarmupOptions {
  /** Steps of linear warm-up from maxLr/warmup to maxLr. */
  warmup: number;
  /** Step at which the cosine reaches minLr; later steps stay at minLr. */
  maxSteps: number;
  /** Peak learning rate, reached at the end of warm-up. */
  maxLr: number;
  /** Final learning rate (>= 0, <= maxLr). */
  minLr: number;
}

/** Linear warm-up, then cosine decay to minLr (nanoGPT's schedule). `step` counts from 0. */
export function cosineWithWarmup(step: number, options: CosineWithWarmupOptions): number {
  if (options === null || typeof options !== 'object') throw new ArgumentError(`cosineWithWarmup: options must be an object { warmup, maxSteps, maxLr, minLr }, got ${options === null ? 'null' : typeof options}`);
  const { warmup, maxSteps, maxLr, minLr } = options;
  if (!Number.isInteger(step) || step < 0) throw new ArgumentError(`cosineWithWarmup: step must be an integer >= 0, got ${step}`);
  if (!Number.isInteger(warmup) || warmup < 0 || !Number.isInteger(maxSteps) || maxSteps < warmup) {
    throw new ArgumentError(`cosineWithWarmup: need integers 0 <= warmup (${warmup}) <= maxSteps (${maxSteps})`);
  }
  if (typeof maxLr !== 'number' || typeof minLr !== 'number' || !Number.isFinite(maxLr) || !Number.isFinite(minLr)) throw new ArgumentError(`cosineWithWarmup: maxLr and minLr must be finite numbers, got ${String(maxLr)} and ${String(minLr)}`);
  if (!(maxLr >= minLr && minLr >= 0)) throw new ArgumentError(`cosineWithWarmup: need maxLr (${maxLr}) >= minLr (${minLr}) >= 0`);
  if (step < warmup) return (maxLr * (step + 1)) / warmup;
  if (step >= maxSteps) return minLr;
  const progress = (step - warmup) / (maxSteps - warmup);
  return minLr + 0.5 * (1 + Math.cos(Math.PI * progress)) * (maxLr - minLr);
}
