// Tensor-parallel linear layers (Megatron's ColumnParallelLinear / RowParallelLinear); gpt.ts uses
// them to split a GPT block's attention heads and MLP across the tensor-parallel group.
// Weights are initialized at full size from the shared generator and then sliced, so a TP run starts
// from exactly the weights of the single-process model.
import { ArgumentError } from '../../errors.js';
import { needsGrad, record, save } from '../../autograd/engine.js';
import { noGrad } from '../../autograd/index.js';
import { add, linear } from '../../ops/index.js';
import { linearBackward, linearNeeds } from '../../ops/matmul.js';
import { autocastRun } from '../../ops/autocast.js';
import { defaultGenerator, type Generator } from '../../random.js';
import { uniform } from '../../nn/init.js';
import { Module, Parameter } from '../../nn/module.js';
import { emptyOn, resolveOptions, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { copyElements } from '../flat.js';
import { dtypeCode } from '../../dtype.js';
import { allGatherSequence, copyToRegion, gatherFromRegion, reduceFromRegion, reduceScatterSequence, reduceScatterToSequenceRegion, scatterToRegion } from './mappings.js';

/** Options of the tensor-parallel linear layers. */
export interface ParallelLinearOptions {
  /** The tensor-parallel group the layer is split over. */
  group: CollectiveGroup;
  /** Whether the layer has a bias (default true). */
  bias?: boolean;
  /** Device (default cpu). */
  device?: string;
  /** Parameter dtype (default f32). */
  dtype?: string;
  /** Generator of the initialization (default: the global one). */
  generator?: Generator;
  /** Fills the full-size weight [out, in] before it is split (default: U(±1/√in), as Linear). */
  initWeight?: (full: Tensor, generator: Generator) => void;
  /** Fills the full-size bias [out] (default: U(±1/√in), as Linear). */
  initBias?: (full: Tensor, generator: Generator) => void;
  /**
   * Sequence parallelism: outside the layer each rank holds a chunk of the sequence (dimension 1 of
   * [B, T, C]). A column-parallel layer gathers its input's sequence (gatherFromSequenceRegion in
   * place of copyToRegion); a row-parallel one reduce-scatters its output to the chunks
   * (reduceScatterToSequenceRegion in place of reduceFromRegion). Default false.
   */
  sequenceParallel?: boolean;
}

function defaultInit(inFeatures: number) {
  const bound = 1 / Math.sqrt(inFeatures);
  return (t: Tensor, g: Generator): void => { uniform(t, -bound, bound, g); };
}

/**
 * y = gather(x) Wᵀ (+ b): linear over the whole sequence, gathered from every rank's chunk x
 * [B, T/size, in] (the input of a column-parallel layer under sequence parallelism). The same
 * numbers as linear(gatherFromSequenceRegion(x)), but the gathered input is freed after the GEMM
 * and gathered again in backward (Megatron's sequence-parallel linear), so only the chunk is held
 * for backward; x's gradient is the reduce-scatter of the whole input's.
 */
export function sequenceGatheredLinear(x: Tensor, weight: Tensor, bias: Tensor | null, group: CollectiveGroup): Tensor {
  const call = 'sequenceGatheredLinear';
  // Under autocast the inputs are cast here, before the gather (the chunk travels in bf16/f16), so the
  // linear below and this op's backward see one dtype.
  const cast = autocastRun('linear', [x, weight, bias] as const, (x2, w2, b2) => sequenceGatheredLinear(x2, w2, b2, group));
  if (cast) return cast;
  const total = allGatherSequence(x, group, call);
  let y: Tensor;
  try { y = noGrad(() => linear(total, weight, bias)); } finally { total.dispose(); }
  if (!needsGrad(x, weight, bias)) return y;
  const { needX, needW, needBias } = linearNeeds(x, weight, bias);
  const xs = save(x), ws = save(weight);
  return record(call, y, bias ? [x, weight, bias] : [x, weight], (g) => {
    using again = allGatherSequence(xs, group, `${call} backward`);
    const [dTotal, dw, db] = linearBackward(g, again, ws, needX, needW, needBias);
    if (dTotal === null) return [null, dw, db];
    try { return [reduceScatterSequence(dTotal, group, `${call} backward`), dw, db]; } finally { dTotal.dispose(); }
  }, [xs, ws]);
}

/** value / parts, or an ArgumentError naming `what` when the tensor-parallel size does not divide it. */
export function divisible(what: string, value: number, parts: number, call: string): number {
  if (!Number.isInteger(value) || value <= 0 || value % parts !== 0) {
    throw new ArgumentError(`${call}: ${what} (${value}) must be a positive multiple of the tensor-parallel size ${parts}`);
  }
  return value / parts;
}

/** Creates a full [rows, cols] tensor with init, returns this rank's rows (given as [start, count] runs). */
export function initAndTakeRows(rows: number, cols: number, runs: [number, number][], init: (t: Tensor, g: Generator) => void,
  gen: Generator, opts: { device?: string; dtype?: string }, call: string): Parameter {
  const { dtype, device } = resolveOptions(opts, call);
  using full = emptyOn(cols > 0 ? [rows, cols] : [rows], dtype, device);
  init(full, gen);
  const count = runs.reduce((s, [, c]) => s + c, 0);
  const local = emptyOn(cols > 0 ? [count, cols] : [count], dtype, device);
  const width = Math.max(cols, 1);
  let at = 0;
  for (const [start, c] of runs) { copyElements(local, at * width, full, start * width, c * width); at += c; }
  const whole = runs.length === 1 && runs[0]![0] === 0 && runs[0]![1] === rows;
  return new Parameter(local, whole ? null : { fullShape: [...full.shape], dim: 0, runs: runs.map(([s, c]) => [s, c]) });
}

/**
 * y = x Wᵀ + b with W's output rows split across the group: rank r holds rows of every one of
 * `interleave` equal blocks (interleave 3 keeps q, k and v heads together for fused QKV).
 * The input is copied into the region (its gradient is allReduced), or under sequenceParallel its
 * sequence chunks are gathered (the gradient reduce-scattered); the output stays split unless
 * gatherOutput.
 */
export class ColumnParallelLinear extends Module {
  /** This rank's rows of the weight: [outFeatures / size, inFeatures]. */
  readonly weight: Parameter;
  /** This rank's rows of the bias, or null without bias. */
  readonly bias: Parameter | null;
  /** Whether forward gathers the output's last dimension from every rank. */
  readonly gatherOutput: boolean;
  /** Whether the input holds a chunk of the sequence (gathered before the GEMM). */
  readonly sequenceParallel: boolean;
  /** The tensor-parallel group. */
  readonly group: CollectiveGroup;
  /**
   * Draws the full-size weight (and bias) and keeps this rank's rows. Throws ArgumentError when the group size (times
   * interleave) does not divide outFeatures, or for gatherOutput with interleave.
   * @param inFeatures Size of the input's last dimension.
   * @param outFeatures Size of the whole output's last dimension.
   * @param opts The group, parameter options, `gatherOutput` (default false) and `interleave` (default 1).
   */
  constructor(readonly inFeatures: number, readonly outFeatures: number, opts: ParallelLinearOptions & { gatherOutput?: boolean; interleave?: number }) {
    super();
    const call = 'ColumnParallelLinear';
    const n = opts.group.size, r = opts.group.rank;
    const interleave = opts.interleave ?? 1;
    // Gathered interleaved outputs would come out rank-major ([q0 k0 v0 q1 k1 v1]), not in the weight's order.
    if (interleave !== 1 && opts.gatherOutput) throw new ArgumentError(`${call}: gatherOutput cannot be combined with interleave ${interleave}`);
    const block = divisible('outFeatures', outFeatures, interleave, call);
    const local = divisible(`outFeatures / ${interleave}`, block, n, call);
    const runs: [number, number][] = Array.from({ length: interleave }, (_, b) => [b * block + r * local, local]);
    const gen = opts.generator ?? defaultGenerator;
    this.group = opts.group;
    this.gatherOutput = opts.gatherOutput ?? false;
    this.sequenceParallel = opts.sequenceParallel ?? false;
    this.weight = initAndTakeRows(outFeatures, inFeatures, runs, opts.initWeight ?? defaultInit(inFeatures), gen, opts, call);
    this.bias = opts.bias === false ? null : initAndTakeRows(outFeatures, 0, runs, opts.initBias ?? defaultInit(inFeatures), gen, opts, call);
  }
  /** x [..., inFeatures] → this rank's [..., outFeatures / size] (the whole [..., outFeatures] with gatherOutput). */
  forward(x: Tensor): Tensor {
    const y = this.sequenceParallel ? sequenceGatheredLinear(x, this.weight, this.bias, this.group)
      : linear(copyToRegion(x, this.group), this.weight, this.bias ?? undefined);
    return this.gatherOutput ? gatherFromRegion(y, this.group) : y;
  }
}

/**
 * y = x Wᵀ + b with W's input columns split across the group; the partial products are summed
 * (allReduce) and the bias, held whole on every rank, added after. With inputIsParallel false
 * the layer first keeps its own chunk of x's last dimension.
 */
export class RowParallelLinear extends Module {
  /** This rank's columns of the weight: [outFeatures, inFeatures / size]. */
  readonly weight: Parameter;
  /** The bias [outFeatures], held whole on every rank, or null without bias. */
  readonly bias: Parameter | null;
  /**
   * Whether the input is already split along its last dimension (default true); false: the layer takes its own chunk.
   */
  readonly inputIsParallel: boolean;
  /** Whether the output is reduce-scattered to sequence chunks instead of allReduced. */
  readonly sequenceParallel: boolean;
  /** The tensor-parallel group. */
  readonly group: CollectiveGroup;
  /**
   * Draws the full-size weight and keeps this rank's columns. Throws ArgumentError when the group size does not divide
   * inFeatures.
   * @param inFeatures Size of the whole input's last dimension.
   * @param outFeatures Size of the output's last dimension.
   * @param opts The group, parameter options and `inputIsParallel` (default true).
   */
  constructor(readonly inFeatures: number, readonly outFeatures: number, opts: ParallelLinearOptions & { inputIsParallel?: boolean }) {
    super();
    const call = 'RowParallelLinear';
    const n = opts.group.size, r = opts.group.rank;
    const local = divisible('inFeatures', inFeatures, n, call);
    const gen = opts.generator ?? defaultGenerator;
    const { dtype, device } = resolveOptions(opts, call);
    this.group = opts.group;
    this.inputIsParallel = opts.inputIsParallel ?? true;
    this.sequenceParallel = opts.sequenceParallel ?? false;
    using full = emptyOn([outFeatures, inFeatures], dtype, device);
    (opts.initWeight ?? defaultInit(inFeatures))(full, gen);
    const w = emptyOn([outFeatures, local], dtype, device);
    full.backend.copy_strided(full.storage, w.storage, dtypeCode(dtype), new Int32Array([outFeatures, local]), new Int32Array([inFeatures, 1]), r * local,
      new Int32Array([local, 1]), 0);
    this.weight = new Parameter(w, n === 1 ? null : { fullShape: [outFeatures, inFeatures], dim: 1, runs: [[r * local, local]] });
    this.bias = opts.bias === false ? null : initAndTakeRows(outFeatures, 0, [[0, outFeatures]], opts.initBias ?? defaultInit(inFeatures), gen, opts, call);
  }
  /**
   * x [..., inFeatures / size] (or the whole input when not inputIsParallel) → [..., outFeatures], summed over the
   * group.
   */
  forward(x: Tensor): Tensor {
    const xLocal = this.inputIsParallel ? x : scatterToRegion(x, this.group);
    const partial = linear(xLocal, this.weight);
    if (!this.sequenceParallel) {
      const y = reduceFromRegion(partial, this.group);
      return this.bias ? add(y, this.bias) : y;
    }
    const y = reduceScatterToSequenceRegion(partial, this.group);
    return this.bias ? add(y, copyToRegion(this.bias, this.group)) : y;
  }
}
