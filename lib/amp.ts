// Mixed precision: the autocast policy (which ops compute in bf16/f16, which stay in f32), f32 master
// weights with low-precision compute copies, and GradScaler's dynamic loss scaling for f16. All of it
// is device-agnostic; ops consult autocastDtypeFor(op) to pick their compute dtype.
import { AsyncLocalStorage } from 'node:async_hooks';
import { tensor } from './creation.js';
import { type DType, dtypeCode } from './dtype.js';
import { ArgumentError, DTypeError } from './errors.js';
import { keep } from './memory.js';
import { checkTensorList, emptyOn, type Tensor } from './tensor.js';

/** Ops that run in the autocast dtype: their cost is in tensor-core GEMMs that accumulate in f32. */
export const AUTOCAST_LOW_PRECISION_OPS: ReadonlySet<string> = new Set(['matmul', 'linear', 'bmm', 'attention', 'gemmEpilogue', 'linearCrossEntropy', 'vocabParallelLinearCrossEntropy']);
/** Ops kept in f32 under autocast: reductions and exponentials whose range or sums a 16-bit type loses. */
export const AUTOCAST_F32_OPS: ReadonlySet<string> = new Set([
  'softmax', 'logSoftmax', 'crossEntropy', 'layerNorm', 'rmsNorm', 'sum', 'mean', 'norm', 'exp', 'log', 'pow',
]);

/**
 * Norm ops that, with a low-precision residual stream (autocast's `lowPrecisionResidual`), compute in
 * the autocast dtype when their input is in it (the residual stream), instead of in f32: the norm's
 * statistics still accumulate in f32 inside the kernel, and its output comes out in 16 bits, ready
 * for the next GEMM (the add + norm + cast in one pass).
 */
export const AUTOCAST_RESIDUAL_NORM_OPS: ReadonlySet<string> = new Set(['layerNorm', 'rmsNorm']);

/** The 16-bit float dtypes autocast and master weights compute in. */
export type LowPrecision = 'bf16' | 'f16';

/** One cached low-precision copy of a weight: valid while the weight's storage version is unchanged. */
interface CastEntry { version: number; out: Tensor }
/**
 * The weight-cast cache of the outermost autocast region (shared by the regions nested in it): leaf
 * tensors that require grad (parameters) are cast once per dtype and reused by every op of the region;
 * the copies are freed when the outermost region ends.
 */
class CastCache {
  readonly entries = new Map<Tensor, Map<DType, CastEntry>>();
  lookup(t: Tensor, dtype: DType, usable: (c: Tensor) => boolean): Tensor | undefined {
    const e = this.entries.get(t)?.get(dtype);
    if (e === undefined) return undefined;
    if (e.version === t.version && !e.out.disposed && usable(e.out)) return e.out;
    // The weight was rewritten in place (an optimizer step inside the region), or the copy cannot
    // carry this op's gradient (made under noGrad, or its graph freed by a backward): drop it.
    this.entries.get(t)!.delete(dtype);
    e.out.dispose();
    return undefined;
  }
  store(t: Tensor, dtype: DType, out: Tensor): void {
    let m = this.entries.get(t);
    if (!m) { m = new Map(); this.entries.set(t, m); }
    m.set(dtype, { version: t.version, out });
  }
  clear(): void {
    for (const m of this.entries.values()) for (const e of m.values()) e.out.dispose();
    this.entries.clear();
  }
}

interface AutocastState { dtype: LowPrecision; enabled: boolean; residual: boolean; cache: CastCache }
const autocastStore = new AsyncLocalStorage<AutocastState>();

/** Counts of autocast's casts since the process started (or the last {@link resetAutocastStats}). */
export interface AutocastStats {
  /** Casts of cacheable weights (leaf tensors that require grad) made under autocast. */
  weightCasts: number;
  /** Uses of a weight served by the region's cache instead of a new cast. */
  weightCacheHits: number;
  /** Casts of other tensors (activations), which are never cached. */
  activationCasts: number;
}
const stats: AutocastStats = { weightCasts: 0, weightCacheHits: 0, activationCasts: 0 };
/** A copy of autocast's cast counters (what tests and profiling read to see the cache work). */
export function autocastStats(): AutocastStats { return { ...stats }; }
/** Zeroes autocast's cast counters. */
export function resetAutocastStats(): void { stats.weightCasts = 0; stats.weightCacheHits = 0; stats.activationCasts = 0; }

/** Options of {@link autocast}. */
export interface AutocastOptions {
  /** The 16-bit dtype of the low-precision ops (default 'bf16'). */
  dtype?: LowPrecision;
  /** false: the region runs its ops as without autocast (default true). */
  enabled?: boolean;
  /**
   * Keep the models' residual stream in `dtype` too (llm.c's bf16 activations): nt.nn's decoders cast
   * the embeddings' output to `dtype` as their blocks start, the residual adds run in it, and the norms
   * (AUTOCAST_RESIDUAL_NORM_OPS) read it and write their output in it (add + norm + cast fused), with
   * f32 statistics. Less memory traffic and no per-GEMM activation casts, at the cost of a residual
   * stream rounded to 8 mantissa bits (bf16). Default false (f32 residual, norms in f32), or
   * NODETRON_LOW_PRECISION_RESIDUAL=1; a nested region inherits its outer region's choice.
   */
  lowPrecisionResidual?: boolean;
}

/** NODETRON_LOW_PRECISION_RESIDUAL: '1' turns the low-precision residual stream on by default. */
function lowPrecisionResidualDefault(): boolean {
  const v = process.env.NODETRON_LOW_PRECISION_RESIDUAL;
  if (v === undefined || v === '' || v === '0') return false;
  if (v === '1') return true;
  throw new ArgumentError(`NODETRON_LOW_PRECISION_RESIDUAL must be 0 or 1, got ${JSON.stringify(v)}`);
}

/**
 * Runs fn with autocast on: ops in AUTOCAST_LOW_PRECISION_OPS compute in `dtype`, ops in
 * AUTOCAST_F32_OPS in f32, the rest in their inputs' dtype. Nests; works across await (an async fn's
 * region ends when its promise settles). Casts of weights (leaf tensors that require grad) are cached
 * for the outermost region and freed when it ends; a weight rewritten in place inside the region (an
 * optimizer step: its {@link Tensor.version} moves) is cast again.
 */
export function autocast<T>(opts: AutocastOptions, fn: () => T): T {
  if (opts === null || typeof opts !== 'object') throw new ArgumentError(`autocast: options must be an object like { dtype: 'bf16' }, got ${opts === null ? 'null' : typeof opts}`);
  const dtype = opts.dtype ?? 'bf16';
  if (dtype !== 'bf16' && dtype !== 'f16') throw new DTypeError(`autocast: dtype must be 'bf16' or 'f16', got ${String(dtype)}`);
  if (opts.enabled !== undefined && typeof opts.enabled !== 'boolean') throw new ArgumentError(`autocast: enabled must be a boolean, got ${typeof opts.enabled}`);
  if (opts.lowPrecisionResidual !== undefined && typeof opts.lowPrecisionResidual !== 'boolean') {
    throw new ArgumentError(`autocast: lowPrecisionResidual must be a boolean, got ${typeof opts.lowPrecisionResidual}`);
  }
  if (typeof fn !== 'function') throw new ArgumentError(`autocast: fn must be a function, got ${fn === null ? 'null' : typeof fn}`);
  const outer = autocastStore.getStore();
  const cache = outer?.cache ?? new CastCache();
  const residual = opts.lowPrecisionResidual ?? outer?.residual ?? lowPrecisionResidualDefault();
  const run = () => autocastStore.run({ dtype, enabled: opts.enabled ?? true, residual, cache }, fn);
  if (outer) return run();
  let result: T;
  try {
    result = run();
  } catch (e) {
    cache.clear();
    throw e;
  }
  if (result !== null && typeof result === 'object' && typeof (result as { then?: unknown }).then === 'function') {
    return (result as unknown as Promise<unknown>).finally(() => cache.clear()) as T;
  }
  cache.clear();
  return result;
}

/** The dtype an op should compute in under the current autocast, or undefined for "as its inputs". */
export function autocastDtypeFor(op: string): DType | undefined {
  if (typeof op !== 'string') throw new ArgumentError(`autocastDtypeFor: the op name must be a string, got ${typeof op}`);
  const s = autocastStore.getStore();
  if (!s || !s.enabled) return undefined;
  if (AUTOCAST_LOW_PRECISION_OPS.has(op)) return s.dtype;
  if (AUTOCAST_F32_OPS.has(op)) return 'f32';
  return undefined;
}

/**
 * Internal (the ops' autocast casts): the dtype `op` computes in when its first floating input is in
 * `inputDtype`: under a low-precision residual stream a norm over a 16-bit input stays in 16 bits;
 * otherwise {@link autocastDtypeFor}.
 */
export function autocastDtypeForInput(op: string, inputDtype: DType | undefined): DType | undefined {
  const s = autocastStore.getStore();
  if (s?.enabled && s.residual && inputDtype === s.dtype && AUTOCAST_RESIDUAL_NORM_OPS.has(op)) return s.dtype;
  return autocastDtypeFor(op);
}

/** The dtype of the residual stream under the current autocast: its 16-bit dtype with lowPrecisionResidual, else undefined (as computed). */
export function autocastResidualDtype(): LowPrecision | undefined {
  const s = autocastStore.getStore();
  return s?.enabled && s.residual ? s.dtype : undefined;
}

/**
 * Internal (the ops' autocast casts): the cached `dtype` copy of weight `t` in the current region when
 * `usable` accepts it; otherwise `cast()` makes one, which the cache keeps until the region ends.
 */
export function autocastWeightCast(t: Tensor, dtype: DType, cast: () => Tensor, usable: (c: Tensor) => boolean): Tensor {
  const s = autocastStore.getStore();
  if (!s) return cast();
  const hit = s.cache.lookup(t, dtype, usable);
  if (hit) { stats.weightCacheHits++; return hit; }
  const out = keep(cast());
  stats.weightCasts++;
  s.cache.store(t, dtype, out);
  return out;
}

/** Whether autocast is on here, and with which dtype. */
export function autocastState(): {
  /** Whether autocast is on in the current async context. */
  enabled: boolean;
  /** The autocast dtype, or undefined when autocast is off. */
  dtype: LowPrecision | undefined;
  /** Whether the residual stream is kept in the autocast dtype (false when autocast is off). */
  lowPrecisionResidual: boolean;
} {
  const s = autocastStore.getStore();
  return { enabled: !!s?.enabled, dtype: s?.enabled ? s.dtype : undefined, lowPrecisionResidual: !!s?.enabled && s.residual };
}

/** Internal: counts an activation cast (see {@link autocastStats}). */
export function countActivationCast(): void { stats.activationCasts++; }

/**
 * f32 master weights with low-precision copies for compute: the optimizer updates `master`,
 * refresh() re-casts them into `compute` (same storage reused, no allocation per step).
 */
export class MasterWeights {
  /** The low-precision copies, one per master tensor, in `dtype`; refresh() rewrites them. */
  readonly compute: Tensor[];
  /**
   * Copies `master` (f32 tensors; DTypeError otherwise) into new `dtype` tensors on the same devices.
   * @param master The f32 weights the optimizer updates.
   * @param dtype The compute dtype (default 'bf16').
   */
  constructor(readonly master: Tensor[], readonly dtype: LowPrecision = 'bf16') {
    checkTensorList(master, 'MasterWeights', 'master');
    if (dtype !== 'bf16' && dtype !== 'f16') throw new DTypeError(`MasterWeights: the compute dtype must be 'bf16' or 'f16', got ${String(dtype)}`);
    for (const m of master) if (m.dtype !== 'f32') throw new DTypeError(`MasterWeights: master weights must be f32, got ${m.describe()}`);
    this.compute = master.map((m) => emptyOn(m.shape, dtype, m.deviceInfo));
    this.refresh();
  }
  /** Re-casts every master tensor into its compute copy (call after each optimizer step). */
  refresh(): void {
    this.master.forEach((m, i) => {
      const c = this.compute[i]!;
      m.backend.cast(m.storage, dtypeCode('f32'), c.storage, dtypeCode(this.dtype), m.size);
    });
  }
  /** Frees the compute copies (the master tensors stay with their owner). */
  dispose(): void { for (const c of this.compute) c.dispose(); }
}

/** Options of {@link GradScaler}. */
export interface GradScalerOptions {
  /** Starting loss scale (default 2^16). */
  initScale?: number;
  /** Scale multiplier after growthInterval steps without overflow (default 2). */
  growthFactor?: number;
  /** Scale multiplier after an overflow (default 0.5). */
  backoffFactor?: number;
  /** Overflow-free steps before the scale grows (default 2000). */
  growthInterval?: number;
  /** false: scale 1, no checks, every step taken (same code path for f32/bf16 runs). */
  enabled?: boolean;
}

/**
 * Dynamic loss scaling for f16 training (PyTorch's GradScaler): multiply the loss by `scale` before
 * backward, then step() unscales the gradients, skips the optimizer step when any is inf/NaN, and
 * update() lowers the scale after an overflow or raises it after a run of clean steps.
 */
export class GradScaler {
  #scale: number;
  #growthTracker = 0;
  #foundInf: boolean | undefined;
  /** Scale multiplier after growthInterval clean steps (default 2). */
  readonly growthFactor: number;
  /** Scale multiplier after an overflow (default 0.5). */
  readonly backoffFactor: number;
  /** Overflow-free steps before the scale grows (default 2000). */
  readonly growthInterval: number;
  /** false: the scaler is a no-op with scale 1. */
  readonly enabled: boolean;

  constructor(opts: GradScalerOptions = {}) {
    if (opts === null || typeof opts !== 'object') throw new ArgumentError(`GradScaler: options must be an object like { initScale, growthInterval }, got ${opts === null ? 'null' : typeof opts}`);
    if (opts.enabled !== undefined && typeof opts.enabled !== 'boolean') throw new ArgumentError(`GradScaler: enabled must be a boolean, got ${typeof opts.enabled}`);
    this.enabled = opts.enabled ?? true;
    this.#scale = this.enabled ? (opts.initScale ?? 2 ** 16) : 1;
    this.growthFactor = opts.growthFactor ?? 2;
    this.backoffFactor = opts.backoffFactor ?? 0.5;
    this.growthInterval = opts.growthInterval ?? 2000;
    if (!(this.#scale > 0) || !Number.isFinite(this.#scale)) throw new ArgumentError(`GradScaler: initScale must be a positive finite number`);
    if (!(this.growthFactor > 1)) throw new ArgumentError(`GradScaler: growthFactor must be > 1`);
    if (!(this.backoffFactor > 0 && this.backoffFactor < 1)) throw new ArgumentError(`GradScaler: backoffFactor must lie in (0, 1)`);
    if (!Number.isInteger(this.growthInterval) || this.growthInterval < 1) throw new ArgumentError(`GradScaler: growthInterval must be a positive integer`);
  }

  /** The factor to multiply the loss by (1 when disabled). */
  get scale(): number { return this.#scale; }

  /**
   * Divides the gradients by the scale in place and reports whether any is inf or NaN. Called by
   * step(); call it yourself before gradient clipping. Gradients go through host memory: on cuda,
   * optimizers that take a gradient scale (the fused AdamW/LAMB) avoid the round trip.
   */
  unscale(grads: readonly Tensor[]): boolean {
    for (const g of checkTensorList(grads, 'GradScaler.unscale', 'grads')) {
      if (g.dtype !== 'f32' && g.dtype !== 'bf16' && g.dtype !== 'f16') throw new DTypeError(`GradScaler.unscale: gradients are floating point (f32, bf16, f16), got ${g.describe()}`);
    }
    if (!this.enabled) return (this.#foundInf = false);
    if (this.#foundInf !== undefined) return this.#foundInf;  // once per step
    const inv = 1 / this.#scale;
    let foundInf = false;
    for (const g of grads) {
      const values = g.toArraySync() as Float32Array;
      const out = new Float32Array(values.length);
      for (let i = 0; i < values.length; i++) {
        const v = values[i]! * inv;
        if (!Number.isFinite(v)) foundInf = true;
        out[i] = v;
      }
      if (g.dtype === 'f32') {
        g.backend.write(g.storage, 0, out);
      } else {
        const wide = tensor(out, [...g.shape], { device: g.device });
        try { g.backend.cast(wide.storage, dtypeCode('f32'), g.storage, dtypeCode(g.dtype), g.size); } finally { wide.dispose(); }
      }
    }
    return (this.#foundInf = foundInf);
  }

  /** Unscales (unless done), then runs optimizerStep only if every gradient is finite. Returns whether it ran. */
  step(grads: readonly Tensor[], optimizerStep: () => void): boolean {
    if (typeof optimizerStep !== 'function') throw new ArgumentError(`GradScaler.step: optimizerStep must be a function (e.g. () => opt.step()), got ${typeof optimizerStep}`);
    const foundInf = this.unscale(grads);
    if (!foundInf) optimizerStep();
    return !foundInf;
  }

  /** Adjusts the scale from this step's outcome (or `foundInf` when given) and starts the next step. */
  update(foundInf?: boolean): void {
    const inf = foundInf ?? this.#foundInf;
    this.#foundInf = undefined;
    if (!this.enabled || inf === undefined) return;
    if (inf) {
      this.#scale *= this.backoffFactor;
      this.#growthTracker = 0;
    } else if (++this.#growthTracker === this.growthInterval) {
      const grown = this.#scale * this.growthFactor;
      if (Number.isFinite(grown)) this.#scale = grown;
      this.#growthTracker = 0;
    }
  }

  /** The scale and the count of clean steps since the last change, for checkpoints. */
  stateDict(): {
    /** The current loss scale. */
    scale: number;
    /** Overflow-free steps since the scale last changed. */
    growthTracker: number;
  } {
    return { scale: this.#scale, growthTracker: this.#growthTracker };
  }
  /** Restores what stateDict() returned. Throws ArgumentError for a non-positive scale or a bad tracker. */
  loadStateDict(s: { scale: number; growthTracker: number }): void {
    if (!(s.scale > 0) || !Number.isInteger(s.growthTracker) || s.growthTracker < 0) throw new ArgumentError('GradScaler.loadStateDict: bad state');
    this.#scale = s.scale;
    this.#growthTracker = s.growthTracker;
  }
}
