// The op surface: functions (re-exported by lib/index.ts) and the Tensor methods that call them.
import '../autograd/engine.js';
import { Tensor } from '../tensor.js';
import { add, div, exp, log, mul, neg, type Operand, pow, scale, sqrt, sub, tanh } from './elementwise.js';
import { linear, matmul, type MatmulOptions } from './matmul.js';
import { max, mean, type ReduceOptions, sum } from './reduce.js';

export { add, sub, mul, div, neg, exp, log, sqrt, tanh, pow, scale, type Operand } from './elementwise.js';
export { sum, mean, max, type ReduceOptions } from './reduce.js';
export { matmul, linear, planMatmul, gemmInto, matmulForward, type MatmulOptions, type GemmPlan } from './matmul.js';

declare module '../tensor.js' {
  interface Tensor {
    add(other: Operand): Tensor;
    sub(other: Operand): Tensor;
    mul(other: Operand): Tensor;
    div(other: Operand): Tensor;
    neg(): Tensor;
    exp(): Tensor;
    log(): Tensor;
    sqrt(): Tensor;
    tanh(): Tensor;
    pow(p: number): Tensor;
    scale(s: number): Tensor;
    matmul(other: Tensor, opts?: MatmulOptions): Tensor;
    linear(weight: Tensor, bias?: Tensor | null): Tensor;
    sum(dim?: number, opts?: ReduceOptions): Tensor;
    mean(dim?: number, opts?: ReduceOptions): Tensor;
    max(dim?: number, opts?: ReduceOptions): Tensor;
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
