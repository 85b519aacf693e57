// One optimization step of a language model in one process (`nt.trainStep`: forward, backward, optional
// clipping, update) and `nt.evaluate`, shared by the example, `nodetron bench train` and the tests, so
// all three measure and check the same thing. (The step of any parallel layout is ParallelTrainer's,
// lib/parallel/trainer.ts; a whole training run from flags is `nt.train`, lib/train/.)
import { noGrad } from './autograd/index.js';
import { graph, type CudaGraph } from './cuda/graph.js';
import { parseDevice, type DeviceLike } from './device.js';
import { ArgumentError, GraphCaptureError, StateError } from './errors.js';
import { keep, scope } from './memory.js';
import { Dropout } from './nn/layers.js';
import { Module } from './nn/module.js';
import { AdamW } from './optim/adamw.js';
import { clipGradNorm, clipGradNormOnDevice } from './optim/clip.js';
import type { Optimizer } from './optim/optimizer.js';
import { checkTensor, emptyOn, type Tensor } from './tensor.js';

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

// nt.captureTrainStep: a whole training step (forward, backward, gradient clipping, AdamW and zeroing
// the gradients) captured once into a CUDA graph and replayed each step with one launch (issue #35's
// "whole training step as one CUDA graph"). What a captured step may not do, it does on the device: the
// clipping factor is computed and applied there (clipGradNormOnDevice: no norm read on the host), AdamW
// reads lr and step from its device metadata (advanceDeviceMeta before each replay), the fused head
// counts its targets there (under a capture), and the loss and the norm land in tensors the host reads
// after the replay. On the cpu backend the same step runs eagerly every time (graph()'s cpu form).

/** A model the captured step trains: forward(inputs, targets) → { loss } and its parameters. */
export interface CapturableModel {
  /** Runs the model on a batch and returns the scalar loss against `targets`. */
  forward(inputs: Tensor, targets: Tensor): {
    /** The scalar loss (the step throws StateError without one). */
    loss?: Tensor | null;
  };
  /** The parameters the optimizer updates (their gradients are clipped together). */
  parameters(): Tensor[];
}

/** Options of {@link captureTrainStep}. */
export interface CaptureTrainStepOptions {
  /** Clip the gradients' global L2 norm to this (PyTorch's clip_grad_norm_ factor), on the device. */
  maxGradNorm?: number;
  /** Eager steps before the capture (default 1): they make AdamW's state and metadata, cuBLASLt's plans. */
  warmup?: number;
  /**
   * When the capture fails (GraphCaptureError: an op of the step cannot be captured), go on with eager
   * steps instead of throwing (default true); `fallbackReason` then says why.
   */
  fallback?: boolean;
  /** The device the step runs on (default: the first parameter's). */
  device?: DeviceLike;
}

/** What one step returns: its loss, and the gradients' norm before clipping when maxGradNorm is set. */
export interface CapturedStepResult {
  /** The step's loss, read after the replay. */
  loss: number;
  /** The gradients' global L2 norm before clipping, when maxGradNorm is set. */
  gradNorm?: number;
}

/** Throws ArgumentError when the model holds a Dropout with p > 0 in training mode (a replay would draw the same mask). */
function checkNoDropout(model: CapturableModel): void {
  if (!(model instanceof Module)) return;
  for (const [name, m] of model.namedModules()) {
    if (m instanceof Dropout && m.p > 0 && m.training) throw new ArgumentError(`captureTrainStep: ${name || 'the model'} is a Dropout with p ${m.p} in training mode; a replay would draw the same mask every step (set dropout to 0)`);
  }
}

/**
 * A training step captured into a CUDA graph: `step(inputs, targets)` copies the batch into the graph's
 * input tensors and replays forward, backward, clipping, AdamW and zeroGrad with one launch, then reads
 * the loss (one host read after the replay). The first `warmup` calls run eagerly (real steps), the
 * next one captures and replays. Requires an nt.optim.AdamW (its deviceMeta is turned on for good: lr and step
 * come from device memory, written before each replay; a learning-rate schedule that sets the group's
 * lr applies), a model without active dropout (a replay would draw the same masks), and inputs of one
 * shape and dtype on the step's device. Run it inside `nt.autocast(...)` for mixed precision. On the cpu
 * backend every step runs eagerly through the same code (the numbers of trainStep without clipping, bit
 * for bit).
 */
export class CapturedTrainStep {
  /** The device the step runs on ('cpu' or 'cuda:N'; default: the first parameter's). */
  readonly device: string;
  #graph: CudaGraph | null = null;
  #inputs: Tensor | null = null;
  #targets: Tensor | null = null;
  #loss: Tensor | null = null;
  #norm: Tensor | null = null;
  #steps = 0;
  #disposed = false;
  /** Why the step runs eagerly after a failed capture (fallback), or null. */
  fallbackReason: string | null = null;
  /** The model trained. */
  readonly model: CapturableModel;
  /** Its AdamW. */
  readonly optimizer: AdamW;
  /** The options given. */
  readonly options: CaptureTrainStepOptions;

  /**
   * @param model The model trained (forward(inputs, targets) → { loss }).
   * @param optimizer Its AdamW (deviceMeta is turned on).
   * @param options Clipping, warm-up steps, fallback, and the device.
   */
  constructor(model: CapturableModel, optimizer: AdamW, options: CaptureTrainStepOptions = {}) {
    this.model = model;
    this.optimizer = optimizer;
    this.options = options;
    if (model === null || typeof model !== 'object' || typeof model.forward !== 'function' || typeof model.parameters !== 'function') {
      throw new ArgumentError('captureTrainStep: model must have forward(inputs, targets) returning { loss } and parameters()');
    }
    if (!(optimizer instanceof AdamW)) throw new ArgumentError('captureTrainStep: the optimizer must be an nt.optim.AdamW (its lr and step can live on the device; other optimizers read host scalars a replay would freeze)');
    const { maxGradNorm, warmup = 1, fallback = true } = options;
    if (maxGradNorm !== undefined && (typeof maxGradNorm !== 'number' || !(maxGradNorm > 0) || maxGradNorm === Infinity)) {
      throw new ArgumentError(`captureTrainStep: maxGradNorm must be a finite number > 0, got ${String(maxGradNorm)}`);
    }
    if (!Number.isInteger(warmup) || warmup < 1) throw new ArgumentError(`captureTrainStep: warmup must be an integer >= 1 (an eager step makes AdamW's state), got ${String(warmup)}`);
    if (typeof fallback !== 'boolean') throw new ArgumentError(`captureTrainStep: fallback must be a boolean, got ${typeof fallback}`);
    checkNoDropout(model);
    this.device = parseDevice(options.device ?? model.parameters()[0]?.device ?? 'cpu', 'captureTrainStep').name;
    // For good: the optimizer's later steps read lr and step from its device metadata too (the same values).
    optimizer.deviceMeta = true;
  }

  /** Whether the step replays a captured graph (false before the capture, on cpu, and after a fallback). */
  get captured(): boolean { return this.#graph?.captured ?? false; }

  /** One training step on (inputs, targets). */
  step(inputs: Tensor, targets: Tensor): CapturedStepResult {
    if (this.#disposed) throw new StateError('CapturedTrainStep.step: disposed');
    checkTensor(inputs, 'CapturedTrainStep.step', 'inputs');
    checkTensor(targets, 'CapturedTrainStep.step', 'targets');
    for (const [name, t] of [['inputs', inputs], ['targets', targets]] as const) {
      if (t.device !== this.device) throw new ArgumentError(`CapturedTrainStep.step: ${name} are on ${t.device}, the step on ${this.device}`);
    }
    if (this.#inputs === null) {
      this.#inputs = keep(emptyOn(inputs.shape, inputs.dtype, inputs.deviceInfo));
      this.#targets = keep(emptyOn(targets.shape, targets.dtype, targets.deviceInfo));
      this.#loss = keep(emptyOn([1], 'f32', inputs.deviceInfo));
      if (this.options.maxGradNorm !== undefined) this.#norm = keep(emptyOn([1], 'f32', inputs.deviceInfo));
    }
    for (const [name, t, into] of [['inputs', inputs, this.#inputs], ['targets', targets, this.#targets!]] as const) {
      if (t.dtype !== into.dtype || t.shape.length !== into.shape.length || t.shape.some((d, i) => d !== into.shape[i])) {
        throw new ArgumentError(`CapturedTrainStep.step: ${name} ${t.describe()} differ from the captured ${into.describe()} (one shape and dtype for every step)`);
      }
      into.backend.copy(into.storage, 0, t.storage, 0, into.nbytes);
    }
    const warmup = this.options.warmup ?? 1;
    if (this.#steps < warmup || (this.#graph === null && this.fallbackReason !== null)) this.#body();
    else {
      if (this.#graph === null) this.#capture();
      if (this.#graph !== null) {
        // A captured replay advances nothing on the host: the steps and [lr, step] of every parameter
        // the body updates (all that have state; their gradients are already dropped) are written first.
        if (this.#graph.captured) this.optimizer.advanceDeviceMeta({ all: true });
        this.#graph.replay();
      } else this.#body();
    }
    this.#steps++;
    const loss = this.#loss!.item();
    return this.#norm ? { loss, gradNorm: this.#norm.item() } : { loss };
  }

  // The captured work: forward and backward on the graph's inputs, clipping, AdamW, zeroGrad; the loss
  // (and norm) copied into the tensors the host reads.
  #body(): void {
    scope(() => {
      const { loss } = this.model.forward(this.#inputs!, this.#targets!);
      if (!loss) throw new StateError('captureTrainStep: the model returned no loss (were targets passed?)');
      loss.backward();
      const params = this.model.parameters();
      if (this.#norm) {
        const norm = clipGradNormOnDevice(params, this.options.maxGradNorm!);
        this.#norm.backend.copy(this.#norm.storage, 0, norm.storage, 0, 4);
      }
      const l32 = loss.dtype === 'f32' ? loss : loss.to('f32');
      this.#loss!.backend.copy(this.#loss!.storage, 0, l32.storage, 0, 4);
      this.optimizer.step();
      this.optimizer.zeroGrad();
    });
  }

  // Captures the body (no warm-up: the eager steps were it). (Dropout is checked again: the model may
  // have been switched to training mode since construction.) AdamW's step under the capture records its
  // kernels reading the metadata and advances nothing: the replay that follows does the step.
  #capture(): void {
    checkNoDropout(this.model);
    try {
      this.#graph = graph(() => this.#body(), { warmup: 0, device: this.device });
    } catch (e) {
      // The aborted capture ran the body's JavaScript: gradients it made and autocast's cached weight
      // casts point at memory it never wrote. Drop the gradients, and bump the weights' versions so no
      // cached cast is served to the eager steps that follow.
      for (const p of this.model.parameters()) { p.grad?.dispose(); p.grad = null; p.markModified(); }
      if (!(e instanceof GraphCaptureError) || this.options.fallback === false) throw e;
      this.fallbackReason = e.message;
    }
  }

  /** Frees the graph and the step's tensors (the model and optimizer are the caller's). */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    this.#graph?.dispose();
    for (const t of [this.#inputs, this.#targets, this.#loss, this.#norm]) t?.dispose();
  }

  /** dispose(), for `using step = nt.captureTrainStep(...)`. */
  [Symbol.dispose](): void { this.dispose(); }
}

/** A training step captured into a CUDA graph ({@link CapturedTrainStep}). */
export function captureTrainStep(model: CapturableModel, optimizer: AdamW, options: CaptureTrainStepOptions = {}): CapturedTrainStep {
  return new CapturedTrainStep(model, optimizer, options);
}
