// The op surface: functions (re-exported by lib/index.ts) and the Tensor methods that call them.
import '../autograd/engine.js';
import { Tensor } from '../tensor.js';
import { dropout, type DropoutOptions, gelu, logSoftmax, softmax } from './activation.js';
import { add, div, exp, log, mul, neg, type Operand, pow, scale, sqrt, sub, tanh } from './elementwise.js';
import { linear, matmul, type MatmulOptions } from './matmul.js';
import { max, mean, type ReduceOptions, sum } from './reduce.js';
import { chunk, permute, slice, split, squeeze, transpose, unsqueeze, view } from './shape.js';

export { add, sub, mul, div, neg, exp, log, sqrt, tanh, pow, scale, type Operand } from './elementwise.js';
export { sum, mean, max, type ReduceOptions } from './reduce.js';
export { matmul, linear, linearGelu, type MatmulOptions } from './matmul.js';
export { gelu, silu, swiglu, softmax, logSoftmax, dropout, type DropoutOptions } from './activation.js';
export { rope, type RopeOptions } from './rope.js';
export { layerNorm, rmsNorm, addLayerNorm, type AddLayerNormResult } from './norm.js';
export { attention, attentionPacked, groupedQueryAttention, type AttentionOptions } from './attention.js';
export { embedding } from './embedding.js';
export { cast } from './autocast.js';
export { crossEntropy, type CrossEntropyOptions } from './loss.js';
export { linearCrossEntropy, linearCrossEntropyChunkRows, LINEAR_CE_CHUNK_BYTES, type LinearCrossEntropyOptions } from './linear-cross-entropy.js';
export { reshape, view, squeeze, unsqueeze, permute, transpose, slice, split, chunk, cat } from './shape.js';

declare module '../tensor.js' {
  interface Tensor {
    /** this + other (broadcasting; other may be a number). See {@link add}. */
    add(other: Operand): Tensor;
    /** this − other (broadcasting; other may be a number). See {@link sub}. */
    sub(other: Operand): Tensor;
    /** this · other elementwise (broadcasting; other may be a number). See {@link mul}. */
    mul(other: Operand): Tensor;
    /** this / other elementwise (broadcasting; other may be a number). See {@link div}. */
    div(other: Operand): Tensor;
    /** −this. See {@link neg}. */
    neg(): Tensor;
    /** eˣ elementwise. See {@link exp}. */
    exp(): Tensor;
    /** Natural logarithm elementwise. See {@link log}. */
    log(): Tensor;
    /** Square root elementwise. See {@link sqrt}. */
    sqrt(): Tensor;
    /** Hyperbolic tangent elementwise. See {@link tanh}. */
    tanh(): Tensor;
    /** thisᵖ elementwise for a number p. See {@link pow}. */
    pow(p: number): Tensor;
    /** this · s for a number s. See {@link scale}. */
    scale(s: number): Tensor;
    /** Matrix product this @ other. See {@link matmul}. */
    matmul(other: Tensor, opts?: MatmulOptions): Tensor;
    /** this·Wᵀ + bias with weight [out, in] and optional bias [out]. See {@link linear}. */
    linear(weight: Tensor, bias?: Tensor | null): Tensor;
    /** Sum of all elements, or over `dim`. See {@link sum}. */
    sum(dim?: number, opts?: ReduceOptions): Tensor;
    /** Mean of all elements, or over `dim`. See {@link mean}. */
    mean(dim?: number, opts?: ReduceOptions): Tensor;
    /** Maximum of all elements, or over `dim`. See {@link max}. */
    max(dim?: number, opts?: ReduceOptions): Tensor;
    /** GELU (tanh approximation). See {@link gelu}. */
    gelu(): Tensor;
    /** Softmax over `dim` (default: the last). See {@link softmax}. */
    softmax(dim?: number): Tensor;
    /** Log-softmax over `dim` (default: the last). See {@link logSoftmax}. */
    logSoftmax(dim?: number): Tensor;
    /** Dropout with drop probability p. See {@link dropout}. */
    dropout(p: number, opts?: DropoutOptions): Tensor;
    /** Same data in a new shape (one dimension may be -1); shares storage, records autograd. See {@link view}. */
    view(shape: readonly number[]): Tensor;
    /** Removes size-1 dimensions (all, or only `dim`). See {@link squeeze}. */
    squeeze(dim?: number): Tensor;
    /** Inserts a size-1 dimension at `dim`. See {@link unsqueeze}. */
    unsqueeze(dim: number): Tensor;
    /** Reorders dimensions: out.shape[i] = this.shape[dims[i]]. Copies. See {@link permute}. */
    permute(dims: readonly number[]): Tensor;
    /** Swaps two dimensions. Copies. See {@link transpose}. */
    transpose(dim0: number, dim1: number): Tensor;
    /** Elements start..end (exclusive) along `dim`. Copies. See {@link slice}. */
    slice(dim: number, start: number, end?: number): Tensor;
    /** Splits along `dim` (default 0) into pieces of `size` or of the listed sizes. See {@link split}. */
    split(size: number | readonly number[], dim?: number): Tensor[];
    /** Splits along `dim` (default 0) into `chunks` nearly equal pieces. See {@link chunk}. */
    chunk(chunks: number, dim?: number): Tensor[];
  }
}
const proto = Tensor.prototype;
proto.add = function (this: Tensor, o: Operand) { return add(this, o); };
proto.sub = function (this: Tensor, o: Operand) { return sub(this, o); };
proto.mul = function (this: Tensor, o: Operand) { return mul(this, o); };
proto.div = function (this: Tensor, o: Operand) { return div(this, o); };
proto.neg = function (this: Tensor) { return neg(this); };
proto.exp = function (this: Tensor) { return exp(this); };
proto.log = function (this: Tensor) { return log(this); };
proto.sqrt = function (this: Tensor) { return sqrt(this); };
proto.tanh = function (this: Tensor) { return tanh(this); };
proto.pow = function (this: Tensor, p: number) { return pow(this, p); };
proto.scale = function (this: Tensor, s: number) { return scale(this, s); };
proto.matmul = function (this: Tensor, o: Tensor, opts?: MatmulOptions) { return matmul(this, o, opts); };
proto.linear = function (this: Tensor, w: Tensor, b?: Tensor | null) { return linear(this, w, b); };
proto.sum = function (this: Tensor, dim?: number, opts?: ReduceOptions) { return sum(this, dim, opts); };
proto.mean = function (this: Tensor, dim?: number, opts?: ReduceOptions) { return mean(this, dim, opts); };
proto.max = function (this: Tensor, dim?: number, opts?: ReduceOptions) { return max(this, dim, opts); };
proto.gelu = function (this: Tensor) { return gelu(this); };
proto.softmax = function (this: Tensor, dim?: number) { return softmax(this, dim); };
proto.logSoftmax = function (this: Tensor, dim?: number) { return logSoftmax(this, dim); };
proto.dropout = function (this: Tensor, p: number, opts?: DropoutOptions) { return dropout(this, p, opts); };
proto.view = function (this: Tensor, shape: readonly number[]) { return view(this, shape); };
proto.squeeze = function (this: Tensor, dim?: number) { return squeeze(this, dim); };
proto.unsqueeze = function (this: Tensor, dim: number) { return unsqueeze(this, dim); };
proto.permute = function (this: Tensor, dims: readonly number[]) { return permute(this, dims); };
proto.transpose = function (this: Tensor, d0: number, d1: number) { return transpose(this, d0, d1); };
proto.slice = function (this: Tensor, dim: number, start: number, end?: number) { return slice(this, dim, start, end); };
proto.split = function (this: Tensor, size: number | readonly number[], dim?: number) { return split(this, size, dim); };
proto.chunk = function (this: Tensor, chunks: number, dim?: number) { return chunk(this, chunks, dim); };
