// The op surface: functions and the Tensor methods that call them.
import { Tensor } from '../tensor.js';
import { type MatmulOptions, matmulForward } from './matmul.js';

export type { MatmulOptions };

/** Matrix product a @ b (2-D or batched, optional transposes). */
export function matmul(a: Tensor, b: Tensor, opts?: MatmulOptions): Tensor {
  return matmulForward(a, b, opts);
}

declare module '../tensor.js' {
  interface Tensor {
    matmul(other: Tensor, opts?: MatmulOptions): Tensor;
  }
}
Tensor.prototype.matmul = function (this: Tensor, other: Tensor, opts?: MatmulOptions) { return matmul(this, other, opts); };
