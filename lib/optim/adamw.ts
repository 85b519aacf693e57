// AdamW (Loshchilov & Hutter): Adam with decoupled weight decay, one fused native call per group.
import type { Tensor } from '../tensor.js';
import { Optimizer, type ParamsInput, withDefaults } from './optimizer.js';

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

  constructor(params: ParamsInput<AdamWOptions>, options: Partial<AdamWOptions> = {}) {
    super(params, withDefaults<AdamWOptions>('AdamW', { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-8, weightDecay: 0.01 }, options), 'AdamW');
  }

  /** One fused native AdamW call per group of parameters at the same step. */
  protected stepGroup(params: Tensor[], o: AdamWOptions): void {
    // Parameters are grouped by step count so one call covers each (all share it in ordinary training).
    for (const [step, ps] of byNextStep(params, (p) => this.stateOf(p))) {
      const b = this.batch(ps);
      const states = ps.map((p) => this.stateOf(p).tensors);
      ps[0]!.backend.adamw_step(b.storages.params, b.storages.grads, states.map((s) => s.expAvg!.storage), states.map((s) => s.expAvgSq!.storage),
        b.counts, b.paramDtypes, b.gradDtypes, o.lr, o.betas[0], o.betas[1], o.eps, o.weightDecay, step, this.gradScale);
    }
  }
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
