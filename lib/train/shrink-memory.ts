// In-job recovery's shrink (docs/recovery.md "Shrink without a spare"): what a rank says of its memory
// before the survivors choose the smaller world, so that none is chosen whose members would pass their
// device's limit. Each survivor predicts its own peak under each smaller data-parallel size from what
// it measured (its peak and what it holds between steps) and the exact sizes of its sharded state, and
// publishes it with its limit; every survivor then plans from the same facts (shrink.ts's planShrink).
import { parseMemoryLimit } from '../native.js';
import { memoryStats } from '../memory.js';
import { ArgumentError } from '../errors.js';
import { zeroMemoryFormula } from '../parallel/zero/optimizer.js';
import { inFlightMicroBatches, type PlanLayout } from '../plan/memory.js';
import type { TrainingLayout } from '../parallel/layout.js';
import type { ParallelTrainer } from '../parallel/trainer.js';
import type { ShrinkMemory } from './shrink.js';

/** One ZeRO optimizer of a rank, as predictShrunkPeak needs it. */
export interface ShardedState {
  /** The sizes (elements) of the parameters it shards. */
  sizes: readonly number[];
  /** Its stage. */
  stage: 1 | 2 | 3;
  /** The ranks it shards over now (its data-parallel group; the expert-data-parallel one for experts). */
  ranks: number;
  /** Optimizer state bytes per parameter element (Adam: 8). */
  stateBytesPerParam: number;
  /** Whether its shards live in host memory (--offload): then only parameters and gradients count on the device. */
  offload: boolean;
}

/**
 * A rank's peak on its device with `d` of the `dp` data-parallel replicas: what it holds between
 * steps, changed by what sharding over fewer ranks adds (zeroMemoryFormula, per sharded optimizer;
 * with one replica ZeRO becomes stage 0 and --offload is dropped, so the whole state comes to the
 * device), plus the activations above it (peak − held), scaled by the micro-batches in flight
 * (`inFlight`: the schedule's count for a number of micro-batches; they grow by dp/d). An estimate
 * from measured peaks and the state's exact sizes; transient buffers of a step other than
 * activations are taken to stay as they were.
 */
export function predictShrunkPeak(o: {
  peak: number; held: number; dp: number; d: number; microBatches: number;
  sharded: readonly ShardedState[]; inFlight: (microBatches: number) => number;
}): number {
  if (!Number.isInteger(o.d) || o.d < 1 || o.d >= o.dp) throw new ArgumentError(`predictShrunkPeak: d must be an integer in [1, ${o.dp - 1}], got ${o.d}`);
  let delta = 0;
  for (const z of o.sharded) {
    const after = o.d === 1 ? 1 : z.ranks * o.d / o.dp;
    const before = zeroMemoryFormula(z.sizes, z.ranks, z.stage, z.stateBytesPerParam);
    const now = zeroMemoryFormula(z.sizes, Math.max(1, Math.round(after)), o.d === 1 ? 0 : z.stage, z.stateBytesPerParam);
    const onDevice = (m: typeof now, offload: boolean) => offload ? m.params + m.grads : m.total;
    delta += onDevice(now, z.offload && o.d > 1) - onDevice(before, z.offload);
  }
  const activations = Math.max(0, o.peak - o.held);
  const ratio = o.inFlight(o.microBatches * o.dp / o.d) / Math.max(1, o.inFlight(o.microBatches));
  return o.held + delta + activations * ratio;
}

/** A rank's memory at a step boundary, on its training device (bytes). */
export interface MeasuredMemory {
  /** The highest allocated so far (since setup). */
  peak: number;
  /** Allocated at the boundary: what it holds between steps. */
  held: number;
}

/**
 * This rank's ShrinkMemory: its predicted peak for every smaller data-parallel size of `layout` that
 * splits the global batch's micro-batches evenly (none when `measured` is null: no step completed
 * yet, so its memory is not checked), and the most it may hold: NODETRON_SHRINK_MEMORY_LIMIT when set,
 * else on the cpu NODETRON_MEMORY_LIMIT (0 otherwise, and on a GPU: not checked).
 */
export function shrinkMemoryOf(o: { device: string; trainer: ParallelTrainer<{ lr: number }>; layout: TrainingLayout; stage: number; measured: MeasuredMemory | null }): ShrinkMemory {
  const limit = deviceLimit(o.device);
  const peaks: Record<string, number> = {};
  if (!o.measured) return { limit, peaks };
  const h = o.trainer.checkpointHoldings();
  const sharded: ShardedState[] = [];
  for (const z of [h.zero, h.experts?.zero]) {
    if (!z) continue;
    const elements = z.masters.reduce((n, m) => n + m.size, 0);
    const state = z.memoryBytes().optimizerState;
    sharded.push({ sizes: z.params.map((p) => p.size), stage: z.stage, ranks: z.group.size, offload: z.offload,
      stateBytesPerParam: elements > 0 && state > 0 ? state / elements : 8 });
  }
  const plan = { ...o.layout, recompute: 'none' } as unknown as PlanLayout;
  const inFlight = (m: number) => inFlightMicroBatches({ ...plan, microBatches: m }, o.stage);
  const total = o.layout.microBatches * o.layout.dp;
  for (let d = 1; d < o.layout.dp; d++) {
    if (total % d !== 0) continue;  // (no such world: planShrink passes over it)
    try {
      peaks[String(d)] = Math.ceil(predictShrunkPeak({ ...o.measured, dp: o.layout.dp, d, microBatches: o.layout.microBatches, sharded, inFlight }));
    } catch {
      // A schedule that cannot run this count of micro-batches: the rule book refuses that world too.
    }
  }
  return { limit, peaks };
}

/** NODETRON_SHRINK_MEMORY_LIMIT in bytes (K, M, G, T suffixes), or undefined when unset; an ArgumentError naming it when it is not a size. */
export function shrinkMemoryLimit(): number | undefined {
  const own = process.env.NODETRON_SHRINK_MEMORY_LIMIT;
  if (own === undefined || own.trim() === '') return undefined;
  try {
    return parseMemoryLimit(own);
  } catch (e) {
    throw new ArgumentError(`NODETRON_SHRINK_MEMORY_LIMIT=${own}: ${(e as Error).message}`, 'shrinkMemoryLimit');
  }
}

// NODETRON_SHRINK_MEMORY_LIMIT when set; else on the cpu NODETRON_MEMORY_LIMIT (0 without it: not
// checked). On a GPU only the variable sets it: the addon's deviceInfo() would make a context on every
// GPU of the node from every rank, and the allocator's counts leave out the CUDA context, the libraries'
// workspaces and other processes, so the headroom is the user's to say.
function deviceLimit(device: string): number {
  const own = shrinkMemoryLimit();
  if (own !== undefined) return own;
  if (device.startsWith('cuda')) return 0;
  const env = process.env.NODETRON_MEMORY_LIMIT;
  return env && env.trim() !== '' ? parseMemoryLimit(env) : 0;
}
