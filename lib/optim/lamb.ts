// LAMB (You et al., "Large Batch Optimization for Deep Learning"): Adam moments with a per-tensor
// trust ratio ||p|| / ||update||, one fused native call per group.
import type { Tensor } from '../tensor.js';
import { byNextStep } from './adamw.js';
import { Optimizer, type ParamsInput, withDefaults } from './optimizer.js';

/** Hyperparameters of {@link Lamb}. */
export interface LambOptions {
  /** Learning rate (default 1e-3). */
  lr: number;
  /** Decay rates of the first and second moment estimates (default [0.9, 0.999]). */
  betas: [number, number];
  /** Added to the denominator for numerical stability (default 1e-6). */
  eps: number;
  /** Decoupled weight decay coefficient (default 0.01). */
  weightDecay: number;
  /** Bias-correct the moment estimates (default true). */
  biasCorrection: boolean;
}

/** LAMB. State: expAvg, expAvgSq (f32). `lastTrustRatios` holds the ratios of the latest step, by parameter. */
export class Lamb extends Optimizer<LambOptions> {
  /** The state tensors: first and second moment estimates. */
  protected readonly stateNames = ['expAvg', 'expAvgSq'] as const;
  /** Multiplies every gradient inside the fused step (clipping or loss-scale unscaling at no extra pass). */
  gradScale = 1;
  /** The trust ratio ||p|| / ||update|| each parameter got in the latest step. */
  readonly lastTrustRatios = new Map<Tensor, number>();

  constructor(params: ParamsInput<LambOptions>, options: Partial<LambOptions> = {}) {
    super(params, withDefaults<LambOptions>('Lamb', { lr: 1e-3, betas: [0.9, 0.999], eps: 1e-6, weightDecay: 0.01, biasCorrection: true }, options), 'Lamb');
  }

  /** One fused native LAMB call per group of parameters at the same step; records the trust ratios. */
  protected stepGroup(params: Tensor[], o: LambOptions): void {
    for (const [step, ps] of byNextStep(params, (p) => this.stateOf(p))) {
      const b = this.batch(ps);
      const states = ps.map((p) => this.stateOf(p).tensors);
      const ratios = ps[0]!.backend.lamb_step(b.storages.params, b.storages.grads, states.map((s) => s.expAvg!.storage), states.map((s) => s.expAvgSq!.storage),
        b.counts, b.paramDtypes, b.gradDtypes, o.lr, o.betas[0], o.betas[1], o.eps, o.weightDecay, step, this.gradScale, o.biasCorrection) as Float64Array;
      ps.forEach((p, i) => this.lastTrustRatios.set(p, ratios[i]!));
    }
  }
}
