// SGD with momentum, dampening, Nesterov and (coupled) weight decay, as PyTorch defines them.
import { ArgumentError } from '../errors.js';
import type { Tensor } from '../tensor.js';
import { Optimizer, type ParamsInput, withDefaults } from './optimizer.js';

/** Hyperparameters of {@link SGD} (PyTorch's definitions). */
export interface SGDOptions {
  /** Learning rate (required). */
  lr: number;
  /** Momentum factor (default 0: none). */
  momentum: number;
  /** Dampening of the momentum (default 0). */
  dampening: number;
  /** Coupled (L2) weight decay (default 0). */
  weightDecay: number;
  /** Nesterov momentum (default false; needs momentum > 0 and dampening 0). */
  nesterov: boolean;
}

/** SGD. State (with momentum): momentumBuffer (f32). */
export class SGD extends Optimizer<SGDOptions> {
  /** momentumBuffer when any group has momentum, else none. */
  protected get stateNames(): readonly string[] {
    return this.paramGroups.some((g) => g.options.momentum !== 0) ? ['momentumBuffer'] : [];
  }
  /** Multiplies every gradient inside the fused step (clipping or loss-scale unscaling at no extra pass). */
  gradScale = 1;

  constructor(params: ParamsInput<SGDOptions>, options: Partial<SGDOptions> & { lr: number }) {
    super(params, withDefaults<SGDOptions>('SGD', { momentum: 0, dampening: 0, weightDecay: 0, nesterov: false }, options, ['lr']), 'SGD');
    for (const g of this.paramGroups) {
      if (g.options.momentum < 0) throw new ArgumentError('SGD: momentum must be >= 0');
      if (g.options.nesterov && (g.options.momentum <= 0 || g.options.dampening !== 0)) {
        throw new ArgumentError('SGD: nesterov needs momentum > 0 and dampening 0');
      }
    }
  }

  /** One native SGD call per group, first steps (which seed the momentum buffer) separate from later ones. */
  protected stepGroup(params: Tensor[], o: SGDOptions): void {
    // The first step of a parameter seeds its buffer with the gradient, so first and later steps are separate calls.
    const fresh = params.filter((p) => this.stateOf(p).step === 0);
    const seasoned = params.filter((p) => this.stateOf(p).step > 0);
    for (const [first, ps] of [[true, fresh], [false, seasoned]] as const) {
      if (ps.length === 0) continue;
      const b = this.batch(ps);
      const bufs = o.momentum !== 0 ? ps.map((p) => this.stateOf(p).tensors.momentumBuffer!.storage) : [];
      ps[0]!.backend.sgd_step(b.storages.params, b.storages.grads, bufs, b.counts, b.paramDtypes, b.gradDtypes,
        o.lr, o.momentum, o.dampening, o.weightDecay, o.nesterov, first, this.gradScale);
      for (const p of ps) this.stateOf(p).step++;
    }
  }
}
