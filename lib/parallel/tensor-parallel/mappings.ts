// Communication as autograd functions (Megatron's mappings): conjugate pairs whose forward and
// backward swap identity ⇄ allReduce and split ⇄ allGather, so tensor-parallel layers are
// ordinary compositions of ops.
//
// How backward waits for communication: nodetron's autograd is synchronous (a BackwardFn returns
// tensors), while collectives return Work. These functions finish each collective with
// Work.waitSync() before returning (finishSync, lib/distributed/finish-sync.ts). A group that cannot
// block (no waitSync) is refused with a StateError at its first collective, on every rank alike; on
// CUDA a stream wait makes waitSync free, on CPU the communicator thread does the work while the JS
// thread blocks.
import { needsGrad, record } from '../../autograd/engine.js';
import { dtypeCode } from '../../dtype.js';
import { ShapeError } from '../../errors.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup, CollectiveWork } from '../../distributed/group.js';
import { finishSync } from '../../distributed/finish-sync.js';
import type { ReduceOp } from '../../distributed/collectives.js';

/** Finishes `work` (or starts it, then finishes it) before returning: finishSync, which on failure releases `buffers` once it has settled. */
function finish(work: CollectiveWork | (() => CollectiveWork), call: string, group: CollectiveGroup, buffers: Tensor[] = []): void {
  finishSync(work, { call, group, buffers });
}

/** In-place allReduce of t, finished before returning (usable inside forward and backward). */
export function allReduceSync(t: Tensor, group: CollectiveGroup, call: string, op: ReduceOp = 'sum'): void {
  finish(group.allReduce(t, { op }), call, group);
}

/** The dimension sequence parallelism splits: T of [B, T, C] activations. */
export const SEQUENCE_DIM = 1;

/** x's shape viewed as [outer, extent, inner] around dimension `dim`. */
function around(x: Tensor, dim: number, call: string): { outer: number; extent: number; inner: number } {
  if (x.ndim <= dim) throw new ShapeError(`${call}: expected a tensor with at least ${dim + 1} dimension(s), got ${x.describe()}`);
  const extent = x.shape[dim]!;
  const inner = x.shape.slice(dim + 1).reduce((a, b) => a * b, 1);
  return { outer: x.shape.slice(0, dim).reduce((a, b) => a * b, 1), extent, inner };
}

/** The chunk length of dimension `dim` split `parts` ways, or a ShapeError naming what does not divide. */
function chunkOf(x: Tensor, dim: number, parts: number, call: string): { outer: number; extent: number; inner: number; chunk: number } {
  const v = around(x, dim, call);
  if (v.extent % parts !== 0) {
    const what = dim === x.ndim - 1 ? 'last dimension' : dim === SEQUENCE_DIM ? 'sequence length (dimension 1)' : `dimension ${dim}`;
    throw new ShapeError(`${call}: ${what} ${v.extent} of ${x.describe()} is not divisible by the group size ${parts}`);
  }
  return { ...v, chunk: v.extent / parts };
}

function withDim(shape: readonly number[], dim: number, size: number): number[] {
  const s = [...shape];
  s[dim] = size;
  return s;
}

/** Chunk `index` of `parts` equal chunks of x along `dim` (a new contiguous tensor). */
function splitDim(x: Tensor, dim: number, parts: number, index: number, call: string): Tensor {
  const { outer, extent, inner, chunk } = chunkOf(x, dim, parts, call);
  const out = emptyOn(withDim(x.shape, dim, chunk), x.dtype, x.deviceInfo);
  x.backend.copy_strided(x.storage, out.storage, dtypeCode(x.dtype), new Int32Array([outer, chunk * inner]), new Int32Array([extent * inner, 1]),
    index * chunk * inner, new Int32Array([chunk * inner, 1]), 0);
  return out;
}

/** x with its `parts` chunks along `dim` made contiguous one after the other (the layout reduceScatter splits by rank). */
function chunksFirst(x: Tensor, dim: number, parts: number, call: string): Tensor {
  const { outer, extent, inner, chunk } = chunkOf(x, dim, parts, call);
  const out = emptyOn([x.size], x.dtype, x.deviceInfo);
  // x is [outer, parts, chunk·inner]; out is [parts, outer, chunk·inner].
  x.backend.copy_strided(x.storage, out.storage, dtypeCode(x.dtype), new Int32Array([outer, parts, chunk * inner]), new Int32Array([extent * inner, chunk * inner, 1]), 0,
    new Int32Array([chunk * inner, outer * chunk * inner, 1]), 0);
  return out;
}

/** Every rank's x concatenated along `dim`, in group-rank order. */
function gatherDim(x: Tensor, dim: number, group: CollectiveGroup, call: string): Tensor {
  const { outer, extent, inner } = around(x, dim, call);
  const n = group.size, width = extent * inner;
  const flat = emptyOn([n * x.size], x.dtype, x.deviceInfo);
  finish(() => group.allGather(flat, x), call, group, [flat]);
  // flat is [rank, outer, extent·inner]; the result is [outer, rank, extent·inner].
  const out = emptyOn(withDim(x.shape, dim, n * extent), x.dtype, x.deviceInfo);
  x.backend.copy_strided(flat.storage, out.storage, dtypeCode(x.dtype), new Int32Array([outer, n, width]), new Int32Array([width, outer * width, 1]), 0,
    new Int32Array([n * width, width, 1]), 0);
  flat.dispose();
  return out;
}

/** The sum over the group of x, of which this rank keeps its chunk along `dim`. */
function reduceScatterDim(x: Tensor, dim: number, group: CollectiveGroup, call: string): Tensor {
  const { chunk } = chunkOf(x, dim, group.size, call);
  const staged = chunksFirst(x, dim, group.size, call);
  const out = emptyOn(withDim(x.shape, dim, chunk), x.dtype, x.deviceInfo);
  finish(() => group.reduceScatter(out, staged, { op: 'sum' }), call, group, [staged, out]);
  staged.dispose();
  return out;
}

const lastDim = (x: Tensor, call: string): number => {
  if (x.ndim === 0) throw new ShapeError(`${call}: expected a tensor with at least one dimension`);
  return x.ndim - 1;
};

/** Identity forward, allReduce(sum) of the gradient backward: the input of a column-parallel region. */
export function copyToRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = x.reshape(x.shape);
  if (!needsGrad(x)) return out;
  return record('copyToRegion', out, [x], (g) => {
    const r = g.clone();
    allReduceSync(r, group, 'copyToRegion backward');
    return [r];
  });
}

/** allReduce(sum) forward, identity backward: the output of a row-parallel region. */
export function reduceFromRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = x.clone();
  allReduceSync(out, group, 'reduceFromRegion');
  if (!needsGrad(x)) return out;
  return record('reduceFromRegion', out, [x], (g) => [g]);
}

/** Keeps this rank's chunk of the last dimension forward; allGathers the gradient backward. */
export function scatterToRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = splitDim(x, lastDim(x, 'scatterToRegion'), group.size, group.rank, 'scatterToRegion');
  if (!needsGrad(x)) return out;
  return record('scatterToRegion', out, [x], (g) => [gatherDim(g, g.ndim - 1, group, 'scatterToRegion backward')]);
}

/** allGathers along the last dimension forward; keeps this rank's chunk of the gradient backward. */
export function gatherFromRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = gatherDim(x, lastDim(x, 'gatherFromRegion'), group, 'gatherFromRegion');
  if (!needsGrad(x)) return out;
  return record('gatherFromRegion', out, [x], (g) => [splitDim(g, g.ndim - 1, group.size, group.rank, 'gatherFromRegion backward')]);
}

// Sequence parallelism (Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
// Models"): outside the tensor-parallel layers each rank holds 1/size of the sequence (dimension 1
// of [B, T, C]); T must divide by the group size (a ShapeError before any communication otherwise).

/** Every rank's chunk x [B, T/size, ...] side by side along the sequence, outside autograd (for ops with their own backward). */
export function allGatherSequence(x: Tensor, group: CollectiveGroup, call: string): Tensor {
  return gatherDim(x, SEQUENCE_DIM, group, call);
}

/** This rank's sequence chunk of the sum over the group of x [B, T, ...], outside autograd. */
export function reduceScatterSequence(x: Tensor, group: CollectiveGroup, call: string): Tensor {
  return reduceScatterDim(x, SEQUENCE_DIM, group, call);
}

/** Keeps this rank's chunk of the sequence forward; allGathers the gradient's chunks backward. */
export function scatterToSequenceRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = splitDim(x, SEQUENCE_DIM, group.size, group.rank, 'scatterToSequenceRegion');
  if (!needsGrad(x)) return out;
  return record('scatterToSequenceRegion', out, [x], (g) => [gatherDim(g, SEQUENCE_DIM, group, 'scatterToSequenceRegion backward')]);
}

/**
 * allGathers the sequence forward; reduceScatters the gradient backward: the input of a
 * column-parallel region, whose ranks each hold a partial gradient of the whole sequence.
 */
export function gatherFromSequenceRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = gatherDim(x, SEQUENCE_DIM, group, 'gatherFromSequenceRegion');
  if (!needsGrad(x)) return out;
  return record('gatherFromSequenceRegion', out, [x], (g) => [reduceScatterDim(g, SEQUENCE_DIM, group, 'gatherFromSequenceRegion backward')]);
}

/**
 * reduceScatters along the sequence forward (the sum of the ranks' partial results, of which this
 * rank keeps its chunk); allGathers the gradient backward: the output of a row-parallel region.
 */
export function reduceScatterToSequenceRegion(x: Tensor, group: CollectiveGroup): Tensor {
  const out = reduceScatterDim(x, SEQUENCE_DIM, group, 'reduceScatterToSequenceRegion');
  if (!needsGrad(x)) return out;
  return record('reduceScatterToSequenceRegion', out, [x], (g) => [gatherDim(g, SEQUENCE_DIM, group, 'reduceScatterToSequenceRegion backward')]);
}
