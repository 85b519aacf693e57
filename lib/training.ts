// One optimization step of a language model (forward, backward, optional clipping, update), shared by the
// example, `nodetron bench train` and the tests, so all three measure and check the same thing.
import { noGrad } from './autograd/index.js';
import { ArgumentError, StateError } from './errors.js';
import { scope } from './memory.js';
import type { Module } from './nn/module.js';
import { clipGradNorm } from './optim/clip.js';
import type { Optimizer } from './optim/optimizer.js';
import { checkTensor, type Tensor } from './tensor.js';

/** A model that maps (inputs, targets) to a scalar loss. */
export interface LossModel extends Module {
  /** Runs the model on a batch and returns the scalar loss against `targets`. */
  forward(inputs: Tensor, targets: Tensor): {
    /** The scalar loss; null when the model computes none (trainStep then throws StateError). */
    loss: Tensor | null;
  };
}

/** Options of {@link trainStep}. */
export interface TrainStepOptions {
  /** Clip the global gradient norm to this value (off when undefined). */
  maxGradNorm?: number;
  /** Learning rate for this step (a schedule's value); unchanged when undefined. */
  lr?: number;
}

/** What {@link trainStep} returns. */
export interface TrainStepResult {
  /** The step's loss, read back to the host. */
  loss: number;
  /** The gradient norm before clipping, when clipping is on. */
  gradNorm?: number;
}

/**
 * Forward, backward, clip, update, zeroGrad; every intermediate tensor is released before it returns.
 * Inside nt.autocast({ dtype: 'bf16' }, ...) the forward and backward follow the autocast policy
 * (parameters, gradients and the update stay f32).
 */
export function trainStep(model: LossModel, optimizer: Optimizer<{ lr: number }>, inputs: Tensor, targets: Tensor, opts: TrainStepOptions = {}): TrainStepResult {
  if (model === null || typeof model !== 'object' || typeof model.forward !== 'function' || typeof model.parameters !== 'function') {
    throw new ArgumentError('trainStep: model must have forward(inputs, targets) returning { loss } and parameters() (a GPT or another nn.Module)');
  }
  if (optimizer === null || typeof optimizer !== 'object' || typeof optimizer.step !== 'function' || typeof optimizer.zeroGrad !== 'function') {
    throw new ArgumentError('trainStep: optimizer must be an nt.optim optimizer (AdamW, SGD, Lamb) with step() and zeroGrad()');
  }
  checkTensor(inputs, 'trainStep', 'inputs');
  checkTensor(targets, 'trainStep', 'targets');
  if (opts === null || typeof opts !== 'object') throw new ArgumentError('trainStep: options must be an object like { maxGradNorm, lr }');
  return scope(() => {
    const { loss } = model.forward(inputs, targets);
    if (!loss) throw new StateError('trainStep: the model returned no loss (were targets passed?)');
    loss.backward();
    const value = loss.item();
    const params = model.parameters();
    const gradNorm = opts.maxGradNorm !== undefined ? clipGradNorm(params, opts.maxGradNorm) : undefined;
    if (opts.lr !== undefined) optimizer.setLr(opts.lr);
    optimizer.step();
    optimizer.zeroGrad();
    return gradNorm === undefined ? { loss: value } : { loss: value, gradNorm };
  });
}

/** Mean loss over batches without gradients (model in eval mode for the duration). */
export function evaluate(model: LossModel, batches: Iterable<{ inputs: Tensor; targets: Tensor }>): number {
  if (model === null || typeof model !== 'object' || typeof model.forward !== 'function' || typeof model.eval !== 'function') {
    throw new ArgumentError('evaluate: model must have forward(inputs, targets) returning { loss } and eval() (a GPT or another nn.Module)');
  }
  if (batches === null || typeof batches !== 'object' || typeof (batches as Iterable<unknown>)[Symbol.iterator] !== 'function') {
    throw new ArgumentError('evaluate: batches must be an iterable of { inputs, targets }');
  }
  const wasTraining = model.training;
  model.eval();
  let total = 0, n = 0;
  try {
    for (const { inputs, targets } of batches) {
      total += scope(() => noGrad(() => model.forward(inputs, targets).loss!.item()));
      n++;
    }
  } finally {
    model.train(wasTraining);
  }
  return total / n;
}
