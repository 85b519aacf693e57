// Pipeline schedules (GPipe and 1F1B) as plain functions over a stage description: activations go
// forward and their gradients backward by point-to-point send/recv in the pipeline group.
import { backward, noGrad } from '../../autograd/index.js';
import { ArgumentError, StateError } from '../../errors.js';
import { scope } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import { parseDevice, type Device } from '../../device.js';
import type { CollectiveGroup, CollectiveWork } from '../../distributed/group.js';

/** Layers [start, end) of each of `stages` stages, as even as possible (earlier stages take the remainder). */
export function partitionLayers(numLayers: number, stages: number): [number, number][] {
  if (!Number.isInteger(stages) || stages < 1) throw new ArgumentError(`partitionLayers: stages must be an integer >= 1, got ${stages}`);
  if (!Number.isInteger(numLayers) || numLayers < stages) throw new ArgumentError(`partitionLayers: ${numLayers} layers cannot fill ${stages} pipeline stages (pp must be <= the number of layers)`);
  const base = Math.floor(numLayers / stages), extra = numLayers % stages;
  const out: [number, number][] = [];
  let start = 0;
  for (let s = 0; s < stages; s++) { const n = base + (s < extra ? 1 : 0); out.push([start, start + n]); start += n; }
  return out;
}

/** One rank's stage as the pipeline schedules run it. */
export interface PipelineStage {
  /** The pipeline group; its rank is the stage index. Absent: a single stage (no communication). */
  group?: CollectiveGroup;
  /**
   * Runs this stage on micro-batch `m`. `input` is null on the first stage (it reads its own data)
   * and the received activation (a leaf that requires grad) elsewhere. The last stage returns the
   * micro-batch's scalar loss, already divided by the number of micro-batches if a mean is wanted.
   */
  forwardStep(m: number, input: Tensor | null): Tensor;
  /** Shape of the activation this stage receives (not called on the first stage). */
  inputShape(m: number): readonly number[];
  /** Dtype of the activations received (default f32). */
  dtype?: Tensor['dtype'];
  /** Device of the activations received (default cpu). */
  device?: Device;
  /**
   * Runs one micro-batch's backward (`run`); `final` is true for the last backward of the schedule
   * on this stage. Default: just run it. A data-parallel gradient buffer runs all but the final one
   * with its communication off (GradBuffer.noSync), so gradients accumulate locally.
   */
  runBackward?(m: number, final: boolean, run: () => void): void | Promise<void>;
}

interface InFlight { input: Tensor | null; output: Tensor }

/** Drives one stage: holds micro-batches between forward and backward and the sends not yet completed. */
class StageRunner {
  readonly inFlight = new Map<number, InFlight>();
  readonly sends: CollectiveWork[] = [];
  readonly losses: number[] = [];
  readonly first: boolean;
  readonly last: boolean;
  #backwardsLeft: number;
  constructor(readonly stage: PipelineStage, numMicroBatches: number) {
    const rank = stage.group?.rank ?? 0, size = stage.group?.size ?? 1;
    this.first = rank === 0; this.last = rank === size - 1;
    this.#backwardsLeft = numMicroBatches;
  }

  get group(): CollectiveGroup { return this.stage.group!; }

  /** Forward of micro-batch m; with keepForBackward false (evaluation) nothing is held afterwards. */
  async forward(m: number, keepForBackward = true): Promise<void> {
    let input: Tensor | null = null;
    if (!this.first) {
      const g = this.group;
      input = emptyOn([...this.stage.inputShape(m)], this.stage.dtype ?? 'f32', this.stage.device ?? parseDevice('cpu'));
      await g.recv(input, g.rank - 1);
      input.requiresGrad = keepForBackward;
    }
    // The micro-batch's intermediate tensors go when its forward ends: what backward needs the graph
    // holds (saved aliases), and the rest would otherwise live until the step's scope closes, so every
    // micro-batch's activations would pile up and 1F1B would hold as much as GPipe.
    const output = scope(() => this.stage.forwardStep(m, input));
    if (this.last) {
      if (output.size !== 1) throw new StateError(`pipeline: the last stage must return a scalar loss, got ${output.describe()}`);
      this.losses[m] = output.item();
    } else {
      // A send pins its tensor's storage until it completes; sends are awaited at the end of the schedule.
      this.sends.push(this.group.send(output, this.group.rank + 1));
    }
    if (keepForBackward) this.inFlight.set(m, { input, output });
    else { output.dispose(); input?.dispose(); }
  }

  async backward(m: number): Promise<void> {
    const f = this.inFlight.get(m);
    if (!f) throw new StateError(`pipeline: backward of micro-batch ${m} before its forward`);
    this.inFlight.delete(m);
    const final = --this.#backwardsLeft === 0;
    const run = this.stage.runBackward?.bind(this.stage) ?? ((_m: number, _final: boolean, go: () => void) => go());
    if (this.last) {
      await run(m, final, () => backward(f.output));
    } else {
      const g = this.group;
      using grad = emptyOn(f.output.shape, f.output.dtype, f.output.deviceInfo);
      await g.recv(grad, g.rank + 1);
      await run(m, final, () => backward(f.output, grad));
    }
    f.output.dispose();
    if (f.input) {
      if (!f.input.grad) throw new StateError(`pipeline: micro-batch ${m}'s input received no gradient (does the stage's output depend on its input?)`);
      this.sends.push(this.group.send(f.input.grad, this.group.rank - 1));
      f.input.dispose();
    }
  }

  async finish(): Promise<number[]> {
    for (const w of this.sends) await w;
    return this.losses;
  }
}

function checkMicroBatches(n: number, call: string): void {
  if (!Number.isInteger(n) || n < 1) throw new ArgumentError(`${call}: numMicroBatches must be an integer >= 1, got ${n}`);
}

/**
 * GPipe: every micro-batch forward, then every micro-batch backward (in reverse). Peak memory holds
 * all micro-batches' activations. Gradients accumulate in the stage's parameters. Returns the
 * last stage's per-micro-batch losses (empty elsewhere).
 */
export async function gpipe(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, 'gpipe');
  const run = new StageRunner(stage, numMicroBatches);
  for (let m = 0; m < numMicroBatches; m++) await run.forward(m);
  for (let m = numMicroBatches - 1; m >= 0; m--) await run.backward(m);
  return run.finish();
}

/**
 * 1F1B (PipeDream-Flush): at most (stages - stage index) micro-batches in flight, so activation
 * memory no longer grows with the number of micro-batches. Same results as GPipe.
 */
export async function oneForwardOneBackward(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, 'oneForwardOneBackward');
  const run = new StageRunner(stage, numMicroBatches);
  const rank = stage.group?.rank ?? 0, size = stage.group?.size ?? 1;
  // Warm-up: earlier stages run ahead so that the last stage can start backward at once.
  const warmup = Math.min(size - rank - 1, numMicroBatches);
  for (let m = 0; m < warmup; m++) await run.forward(m);
  // Steady state: one forward, then the backward of the oldest micro-batch in flight.
  for (let i = 0; i < numMicroBatches - warmup; i++) {
    await run.forward(warmup + i);
    await run.backward(i);
  }
  // Cool-down: drain the backwards of the warm-up micro-batches.
  for (let m = numMicroBatches - warmup; m < numMicroBatches; m++) await run.backward(m);
  return run.finish();
}

/**
 * Evaluation: every micro-batch forward without autograd, each stage passing its activation on and
 * keeping nothing. Returns the last stage's per-micro-batch losses (empty elsewhere).
 */
export async function forwardOnly(stage: PipelineStage, numMicroBatches: number): Promise<number[]> {
  checkMicroBatches(numMicroBatches, 'forwardOnly');
  const run = new StageRunner(stage, numMicroBatches);
  for (let m = 0; m < numMicroBatches; m++) await noGrad(() => run.forward(m, false));
  return run.finish();
}
