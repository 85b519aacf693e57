// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, one fused native call per group.
import { emptyOn, type Tensor } from '../tensor.js';
import { ArgumentError, StateError } from '../errors.js';
import { keep } from '../memory.js';
import { isCapturing } from '../cuda/graph.js';
import { Optimizer, type ParamsInput, withDefaults } from './optimizer.js';

/**
 * Whether AdamW reads lr and step from a device tensor (NODETRON_ADAMW_DEVICE_META=1; 0 or unset:
 * the host scalars). Anything else is an ArgumentError. Read when an AdamW is constructed.
 */
export function adamwDeviceMetaFromEnv(): boolean {
  const raw = process.env.NODETRON_ADAMW_DEVICE_META;
  if (raw === undefined || raw === '' || raw === '0') return false;
  if (raw === '1') return true;
  throw new ArgumentError(`NODETRON_ADAMW_DEVICE_META must be 0 or 1, got '${raw}'`);
}

/** The 16 bytes of AdamW's device metadata: lr as a little-endian f64 at 0, the step as an i32 at 8, 4 zero bytes. */
export function adamwMetaBytes(lr: number, step: number): Uint8Array {
  const b = new Uint8Array(16), v = new DataView(b.buffer);
  v.setFloat64(0, lr, true);
  v.setInt32(8, step, true);
  return b;
}

/** Hyperparameters of {@link AdamW}. */
export interface AdamWOptions {
  /** Learning rate (default 1e-3). */
  lr: number;
  /** Decay rates of the first and second moment estimates (default [0.9, 0.999]). */
  betas: [number, number];
  /** Added to the denominator for numerical stability (default 1e-8). */
  eps: number;
  /** Decoupled weight decay coefficient (default 0.01). */
  weightDecay: number;
}

/** AdamW with PyTorch's defaults (betas 0.9/0.999, eps 1e-8, weightDecay 0.01). State: expAvg, expAvgSq (f32). */
export class AdamW extends Optimizer<AdamWOptions> {
  /** The state tensors: first and second moment estimates. */
  protected readonly stateNames = ['expAvg', 'expAvgSq'] as const;
  /** Multiplies every gradient inside the fused step (clipping or loss-scale unscaling at no extra pass). */
  gradScale = 1;
  /**
   * Read lr and step from a 16-byte tensor on the parameters' device when the kernel runs
   * (adamw_step_meta) instead of passing them as host scalars: a captured CUDA graph of the step then
   * replays with the values written before each replay ({@link advanceDeviceMeta}). Outside a capture
   * each step writes them first, and the update equals the host-scalar path's bit for bit on the cpu
   * backend. Default: NODETRON_ADAMW_DEVICE_META=1.
   */
  deviceMeta = adamwDeviceMetaFromEnv();
  /** The metadata tensors: per parameter group, one per bucket of parameters at the same step. */
  private readonly metas = new Map<AdamWOptions, Tensor[]>();

  constructor(params: ParamsInput<AdamWOptions>, options: Partial<AdamWOptions> = {}) {
    super(params, withDefaults<AdamWOptions>('AdamW', { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 }, options), 'AdamW');
  }

  /** One fused native AdamW call per group of parameters at the same step. */
  protected stepGroup(params: Tensor[], o: AdamWOptions): void {
    if (this.deviceMeta) { this.stepGroupMeta(params, o); return; }
    // Parameters are grouped by step count so one call covers each (all share it in ordinary training).
    for (const [step, ps] of byNextStep(params, (p) => this.stateOf(p))) {
      const b = this.batch(ps);
      const states = ps.map((p) => this.stateOf(p).tensors);
      ps[0]!.backend.adamw_step(b.storages.params, b.storages.grads, states.map((s) => s.expAvg!.storage), states.map((s) => s.expAvgSq!.storage),
        b.counts, b.paramDtypes, b.gradDtypes, o.lr, o.betas[0], o.betas[1], o.eps, o.weightDecay, step, this.gradScale);
    }
  }

  /**
   * The step with lr and step from device metadata. Outside a capture: advance the steps, write each
   * bucket's [lr, step] into its metadata (a 16-byte host-to-device write), run adamw_step_meta. Under
   * a CUDA graph capture nothing is written and no step advances (a capture does not run the step):
   * the kernels are recorded reading the metadata, and {@link advanceDeviceMeta} before each replay
   * does the rest. The state and metadata must exist before a capture (one eager step makes them).
   */
  private stepGroupMeta(params: Tensor[], o: AdamWOptions): void {
    const capturing = isCapturing(params[0]!.device);
    if (capturing) {
      const missing = params.find((p) => !this.state.has(p));
      if (missing || !this.metas.has(o)) {
        throw new StateError(`AdamW (deviceMeta): its state and metadata must exist before a CUDA graph capture (run one step eagerly first)${missing ? `; ${missing.describe()} has no state` : ''}`);
      }
    }
    const buckets = capturing ? byStep(params, (p) => this.stateOf(p), 1) : byNextStep(params, (p) => this.stateOf(p));
    const metas = this.metas.get(o) ?? [];
    this.metas.set(o, metas);
    let i = 0;
    for (const [step, ps] of buckets) {
      if (capturing && i >= metas.length) throw new StateError('AdamW (deviceMeta): the parameters fall into more step buckets than when the metadata was made');
      // Kept: the metadata outlives the scope of the step that makes it.
      const meta = metas[i] ??= keep(emptyOn([16], 'u8', ps[0]!.deviceInfo));
      i++;
      if (!capturing) meta.backend.write(meta.storage, 0, adamwMetaBytes(o.lr, step));
      const b = this.batch(ps);
      const states = ps.map((p) => this.stateOf(p).tensors);
      ps[0]!.backend.adamw_step_meta(b.storages.params, b.storages.grads, states.map((s) => s.expAvg!.storage), states.map((s) => s.expAvgSq!.storage),
        b.counts, b.paramDtypes, b.gradDtypes, meta.storage, o.betas[0], o.betas[1], o.eps, o.weightDecay, this.gradScale);
    }
  }

  /**
   * Before replaying a captured step (deviceMeta): advances the step of every parameter that has a
   * gradient, as step() would, and writes each group's [lr, step] (its current options.lr, so a
   * schedule that sets the group's lr applies) into the metadata the captured kernels read. Not
   * during a capture (a host write); a StateError when no eager step made the metadata. `all`: every
   * parameter that has state instead (a captured whole step makes and drops its gradients inside the
   * graph, so none is there before the replay).
   */
  advanceDeviceMeta(opts: { all?: boolean } = {}): void {
    if (!this.deviceMeta) throw new StateError('AdamW.advanceDeviceMeta: deviceMeta is off');
    for (const g of this.paramGroups) {
      const ready = g.params.filter((p) => (opts.all ? this.state.has(p) : p.grad !== null));
      if (ready.length === 0) continue;
      const metas = this.metas.get(g.options);
      if (!metas) throw new StateError('AdamW.advanceDeviceMeta: no metadata yet (run one step eagerly first)');
      let i = 0;
      for (const [step] of byNextStep(ready, (p) => this.stateOf(p))) {
        const meta = metas[i++];
        if (!meta) throw new StateError('AdamW.advanceDeviceMeta: the parameters fall into more step buckets than when the metadata was made');
        meta.backend.write(meta.storage, 0, adamwMetaBytes(g.options.lr, step));
      }
      for (const p of ready) p.markModified();
    }
  }

  /** Frees the state tensors and the device metadata. */
  override dispose(): void {
    super.dispose();
    for (const ms of this.metas.values()) for (const m of ms) m.dispose();
    this.metas.clear();
  }

  /** The metadata tensors of a parameter group (for tests and graph drivers; empty before its first step). */
  deviceMetaOf(group = 0): readonly Tensor[] {
    const g = this.paramGroups[group];
    if (!g) throw new ArgumentError(`AdamW.deviceMetaOf: no parameter group ${group}`);
    return this.metas.get(g.options) ?? [];
  }
}

/** Buckets the parameters by their step plus `ahead`, without advancing it. */
function byStep(params: Tensor[], stateOf: (p: Tensor) => { step: number }, ahead: number): Map<number, Tensor[]> {
  const out = new Map<number, Tensor[]>();
  for (const p of params) {
    const k = stateOf(p).step + ahead;
    const list = out.get(k);
    if (list) list.push(p); else out.set(k, [p]);
  }
  return out;
}

/** Advances each parameter's step and buckets the parameters by their new step. */
export function byNextStep(params: Tensor[], stateOf: (p: Tensor) => { step: number }): Map<number, Tensor[]> {
  const out = new Map<number, Tensor[]>();
  for (const p of params) {
    const s = stateOf(p);
    s.step++;
    const list = out.get(s.step);
    if (list) list.push(p); else out.set(s.step, [p]);
  }
  return out;
}
