// Matrix products: 2-D and batched, with transposes, on the device's GEMM (OpenBLAS / cuBLASLt).
import { dtypeCode, isFloating } from '../dtype.js';
import { DTypeError, ShapeError } from '../errors.js';
import { fmtShape, numel } from '../shape.js';
import { checkSameDevice, checkTensor, emptyOn, type Tensor } from '../tensor.js';

export interface MatmulOptions {
  /** Use the transpose of a's last two dimensions. */
  transA?: boolean;
  /** Use the transpose of b's last two dimensions. */
  transB?: boolean;
  /** Scale of the product (default 1). */
  alpha?: number;
}

/** The shape of a product and the GEMM parameters that compute it. */
export interface GemmPlan {
  outShape: number[];
  batch: number;
  m: number;
  n: number;
  k: number;
  strideA: number;
  strideB: number;
}

/**
 * Plans a[..., M, K] @ b[..., K, N] -> [..., M, N]. Batch dimensions must match, or one side may
 * have none (its matrix is shared across the batch). A 1-D operand is a row (a) or column (b) vector.
 */
export function planMatmul(aShape: readonly number[], bShape: readonly number[], transA = false, transB = false, call = 'matmul'): GemmPlan {
  if (aShape.length === 0 || bShape.length === 0) throw new ShapeError(`${call}: operands must have at least one dimension, got ${fmtShape(aShape)} and ${fmtShape(bShape)}`);
  const aVec = aShape.length === 1, bVec = bShape.length === 1;
  const a2 = aVec ? [1, aShape[0]!] : aShape;
  const b2 = bVec ? [bShape[0]!, 1] : bShape;
  const ar = a2.length, br = b2.length;
  const m = transA ? a2[ar - 1]! : a2[ar - 2]!;
  const ka = transA ? a2[ar - 2]! : a2[ar - 1]!;
  const kb = transB ? b2[br - 1]! : b2[br - 2]!;
  const n = transB ? b2[br - 2]! : b2[br - 1]!;
  if (ka !== kb) {
    throw new ShapeError(`${call}: inner dimensions differ: ${fmtShape(aShape)}${transA ? 'ᵀ' : ''} @ ${fmtShape(bShape)}${transB ? 'ᵀ' : ''} (${ka} vs ${kb})`);
  }
  const aBatch = a2.slice(0, ar - 2), bBatch = b2.slice(0, br - 2);
  let batchShape: number[];
  if (aBatch.length && bBatch.length) {
    if (aBatch.length !== bBatch.length || aBatch.some((d, i) => d !== bBatch[i])) {
      throw new ShapeError(`${call}: batch dimensions differ: ${fmtShape(aShape)} @ ${fmtShape(bShape)}`);
    }
    batchShape = aBatch;
  } else {
    batchShape = aBatch.length ? aBatch : bBatch;
  }
  const outShape = [...batchShape, ...(aVec ? [] : [m]), ...(bVec ? [] : [n])];
  return {
    outShape,
    batch: numel(batchShape),
    m, n, k: ka,
    strideA: aBatch.length ? m * ka : 0,
    strideB: bBatch.length ? ka * n : 0,
  };
}

/** Runs a planned GEMM into `out` (beta = 0 overwrites, 1 accumulates). */
export function gemmInto(out: Tensor, a: Tensor, b: Tensor, plan: GemmPlan, transA: boolean, transB: boolean, alpha = 1, beta = 0): void {
  a.backend.gemm(a.storage, b.storage, out.storage, dtypeCode(a.dtype), plan.batch, plan.m, plan.n, plan.k,
    transA, transB, alpha, beta, plan.strideA, plan.strideB, plan.m * plan.n);
}

/** Matrix product without autograd: checks, plans and runs the GEMM. */
export function matmulForward(a: Tensor, b: Tensor, opts: MatmulOptions = {}): Tensor {
  checkTensor(a, 'matmul', 'a');
  checkTensor(b, 'matmul', 'b');
  checkSameDevice('matmul', a, b);
  if (a.dtype !== b.dtype) throw new DTypeError(`matmul: dtypes differ (${a.dtype} and ${b.dtype})`);
  if (!isFloating(a.dtype)) throw new DTypeError(`matmul: ${a.dtype} is not supported (f32, bf16, f16)`);
  const transA = !!opts.transA, transB = !!opts.transB;
  const plan = planMatmul(a.shape, b.shape, transA, transB);
  const out = emptyOn(plan.outShape, a.dtype, a.deviceInfo);
  gemmInto(out, a, b, plan, transA, transB, opts.alpha ?? 1, 0);
  return out;
}
