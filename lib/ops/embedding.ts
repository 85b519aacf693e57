// Embedding lookup with autograd: rows of weight [V, C] gathered by i32 ids; backward scatter-adds.
import { needsGrad, record, save } from '../autograd/engine.js';
import { ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import { checkSameDevice, type Tensor } from '../tensor.js';
import { checkFloats, checkIndices, code, emptyLike, gradOut } from './common.js';

/** weight[ids]: ids i32 of any shape, weight [V, C] → [...ids.shape, C]. Out-of-range ids throw ArgumentError. */
export function embedding(ids: Tensor, weight: Tensor): Tensor {
  checkIndices('embedding', 'ids', ids);
  checkFloats('embedding', { weight });
  checkSameDevice('embedding', ids, weight);
  if (weight.ndim !== 2) throw new ShapeError(`embedding: weight must be [V, C], got ${fmtShape(weight.shape)}`);
  const [V, C] = weight.shape as [number, number];
  const out = emptyLike(weight, [...ids.shape, C]);
  weight.backend.embedding_forward(ids.storage, weight.storage, out.storage, ids.size, V, C, code(weight));
  if (!needsGrad(weight)) return out;
  const is = save(ids);
  return record('embedding', out, [ids, weight], (g, target) => {
    // The scatter zeroes dw first: it may be the weight's gradient home (a bucket's view).
    const dw = gradOut(target(1), g, [V, C]);
    g.backend.embedding_backward(is.storage, g.storage, dw.storage, is.size, V, C, code(g));
    return [null, dw];
  }, [is]);
}
