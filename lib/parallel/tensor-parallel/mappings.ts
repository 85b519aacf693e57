// Communication as autograd functions (Megatron's mappings): conjugate pairs whose forward and
// backward swap identity ⇄ allReduce and split ⇄ allGather, so tensor-parallel layers are
// ordinary compositions of ops.
//
// How backward waits for communication: nodetron's autograd is synchronous (a BackwardFn returns
// tensors), while collectives return Work. These functions finish each collective with
// Work.waitSync() before returning. A group that cannot block (no waitSync) is refused with a
// StateError at its first collective, on every rank alike; on CUDA a stream wait would make waitSync
// free, on CPU the communicator thread does the work while the JS thread blocks.
import { needsGrad, record } from '../../autograd/engine.js';
import { dtypeCode } from '../../dtype.js';
import { ShapeError, StateError } from '../../errors.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { ProcessGroup, ReduceOp, Work } from '../group.js';

function finish(work: Work, call: string, group: ProcessGroup): void {
  if (!work.waitSync) {
    throw new StateError(`${call}: group '${group.name}' cannot complete a collective synchronously (its Work has no waitSync), ` +
      'which autograd needs inside forward and backward; use a backend that offers it (the file-backed group on CPU)');
  }
  work.waitSync();
}

/** In-place allReduce of t, finished before returning (usable inside forward and backward). */
export function allReduceSync(t: Tensor, group: ProcessGroup, call: string, op: ReduceOp = 'sum'): void {
  finish(group.allReduce(t, { op }), call, group);
}

function lastDim(x: Tensor, call: string): { rows: number; width: number } {
  if (x.ndim === 0) throw new ShapeError(`${call}: expected a tensor with at least one dimension`);
  const width = x.shape[x.ndim - 1]!;
  return { rows: x.size / Math.max(width, 1), width };
}

/** Chunk `index` of `parts` equal chunks of x's last dimension (a new contiguous tensor). */
function splitLast(x: Tensor, parts: number, index: number, call: string): Tensor {
  const { rows, width } = lastDim(x, call);
  if (width % parts !== 0) throw new ShapeError(`${call}: last dimension ${width} of ${x.describe()} is not divisible by the group size ${parts}`);
  const w = width / parts;
  const out = emptyOn([...x.shape.slice(0, -1), w], x.dtype, x.deviceInfo);
  x.backend.copy_strided(x.storage, out.storage, dtypeCode(x.dtype), new Int32Array([rows, w]), new Int32Array([width, 1]), index * w, new Int32Array([w, 1]), 0);
  return out;
}

/** Every rank's x concatenated along the last dimension, in group-rank order. */
function gatherLast(x: Tensor, group: ProcessGroup, call: string): Tensor {
  const { rows, width } = lastDim(x, call);
  const n = group.size;
  using flat = emptyOn([n * x.size], x.dtype, x.deviceInfo);
  finish(group.allGather(flat, x), call, group);
  // flat is [rank, rows, width]; the result is [rows, rank, width].
  const out = emptyOn([...x.shape.slice(0, -1), n * width], x.dtype, x.deviceInfo);
  x.backend.copy_strided(flat.storage, out.storage, dtypeCode(x.dtype), new Int32Array([rows, n, width]), new Int32Array([width, rows * width, 1]), 0,
    new Int32Array([n * width, width, 1]), 0);
  return out;
}

/** Identity forward, allReduce(sum) of the gradient backward: the input of a column-parallel region. */
export function copyToRegion(x: Tensor, group: ProcessGroup): Tensor {
  const out = x.reshape(x.shape);
  if (!needsGrad(x)) return out;
  return record('copyToRegion', out, [x], (g) => {
    const r = g.clone();
    allReduceSync(r, group, 'copyToRegion backward');
    return [r];
  });
}

/** allReduce(sum) forward, identity backward: the output of a row-parallel region. */
export function reduceFromRegion(x: Tensor, group: ProcessGroup): Tensor {
  const out = x.clone();
  allReduceSync(out, group, 'reduceFromRegion');
  if (!needsGrad(x)) return out;
  return record('reduceFromRegion', out, [x], (g) => [g]);
}

/** Keeps this rank's chunk of the last dimension forward; allGathers the gradient backward. */
export function scatterToRegion(x: Tensor, group: ProcessGroup): Tensor {
  const out = splitLast(x, group.size, group.rank, 'scatterToRegion');
  if (!needsGrad(x)) return out;
  return record('scatterToRegion', out, [x], (g) => [gatherLast(g, group, 'scatterToRegion backward')]);
}

/** allGathers along the last dimension forward; keeps this rank's chunk of the gradient backward. */
export function gatherFromRegion(x: Tensor, group: ProcessGroup): Tensor {
  const out = gatherLast(x, group, 'gatherFromRegion');
  if (!needsGrad(x)) return out;
  return record('gatherFromRegion', out, [x], (g) => [splitLast(g, group.size, group.rank, 'gatherFromRegion backward')]);
}
