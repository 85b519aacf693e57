// Matrix products with autograd: 2-D and batched, with transposes, on the device's GEMM (OpenBLAS /
// cuBLASLt), and linear(x, W, b) = x·Wᵀ + b in PyTorch's weight layout.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { dtypeCode } from '../dtype.js';
import { DTypeError, ShapeError } from '../errors.js';
import { fmtShape, numel } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { autocastRun } from './autocast.js';
import { checkFloats, checkOptions, code, emptyLike } from './common.js';
import { sumTo } from './elementwise.js';

/** Options of {@link matmul}. */
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
  /** Shape of the product. */
  outShape: number[];
  /** Number of GEMMs (1 when unbatched or when the batch folds into m). */
  batch: number;
  /** Rows of each GEMM (batch × M when the batch folds into m). */
  m: number;
  /** Columns of the product. */
  n: number;
  /** The contracted dimension. */
  k: number;
  /** Elements between consecutive batch entries of a (0 when a has no batch dimensions or the batch is folded). */
  strideA: number;
  /** Elements between consecutive batch entries of b (0 when b has no batch dimensions). */
  strideB: number;
}

/**
 * Plans a[..., M, K] @ b[..., K, N] -> [..., M, N]. Batch dimensions must match, or one side may
 * have none (its matrix is shared across the batch). A 1-D operand is a row (a) or column (b) vector.
 * When b is shared and a is not transposed, the batch folds into M: one large GEMM instead of many.
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
  const batch = numel(batchShape);
  if (aBatch.length && !bBatch.length && !transA) return { outShape, batch: 1, m: batch * m, n, k: ka, strideA: 0, strideB: 0 };
  return { outShape, batch, m, n, k: ka, strideA: aBatch.length ? m * ka : 0, strideB: bBatch.length ? ka * n : 0 };
}

/** One native GEMM: C[b] = alpha·op(A[b])·op(B[b]) + beta·C[b] with element batch strides. */
function gemm(c: Tensor, a: Tensor, b: Tensor, batch: number, m: number, n: number, k: number, transA: boolean, transB: boolean,
  strideA: number, strideB: number, strideC: number, alpha = 1, beta = 0): void {
  // The kernel reads all three storages as one dtype: a mix (an op's backward handed a gradient of
  // another dtype than its saved inputs) would be read as garbage, so it is an error here.
  if (a.dtype !== b.dtype || a.dtype !== c.dtype) throw new DTypeError(`matmul: GEMM operands of different dtypes (${a.dtype}, ${b.dtype} into ${c.dtype})`);
  a.backend.gemm(a.storage, b.storage, c.storage, dtypeCode(a.dtype), batch, m, n, k, transA, transB, alpha, beta, strideA, strideB, strideC);
}

/** Runs a planned GEMM into `out` (beta = 0 overwrites, 1 accumulates). */
export function gemmInto(out: Tensor, a: Tensor, b: Tensor, plan: GemmPlan, transA: boolean, transB: boolean, alpha = 1, beta = 0): void {
  gemm(out, a, b, plan.batch, plan.m, plan.n, plan.k, transA, transB, plan.strideA, plan.strideB, plan.m * plan.n, alpha, beta);
}

/** Matrix product without autograd: checks, plans and runs the GEMM. */
export function matmulForward(a: Tensor, b: Tensor, opts: MatmulOptions = {}): Tensor {
  checkFloats('matmul', { a, b });
  checkOptions('matmul', opts, MATMUL_OPTIONS);
  const transA = !!opts.transA, transB = !!opts.transB;
  const plan = planMatmul(a.shape, b.shape, transA, transB);
  const out = emptyLike(a, plan.outShape);
  gemmInto(out, a, b, plan, transA, transB, opts.alpha ?? 1, 0);
  return out;
}

/**
 * Gradients of out = alpha·op(A)·op(B) from g, per the plan. A shared operand (batch stride 0)
 * gets the sum over the batch: GEMMs accumulate into one matrix with beta = 1.
 */
function matmulBackward(g: Tensor, a: Tensor | null, b: Tensor | null, aLike: Tensor, bLike: Tensor, p: GemmPlan,
  transA: boolean, transB: boolean, alpha: number, needA: boolean, needB: boolean): [Tensor | null, Tensor | null] {
  const { batch, m, n, k } = p;
  const sG = m * n;
  let dA: Tensor | null = null, dB: Tensor | null = null;
  if (needA) {
    const shared = p.strideA === 0 && batch > 1;
    dA = emptyOn0(aLike, shared);
    const sC = shared ? 0 : m * k, beta = shared ? 1 : 0;
    if (!transA) gemm(dA, g, b!, batch, m, k, n, false, !transB, sG, p.strideB, sC, alpha, beta);
    else gemm(dA, b!, g, batch, k, m, n, transB, true, p.strideB, sG, sC, alpha, beta);
  }
  if (needB) {
    const shared = p.strideB === 0 && batch > 1;
    dB = emptyOn0(bLike, shared);
    const sC = shared ? 0 : k * n, beta = shared ? 1 : 0;
    if (!transB) gemm(dB, a!, g, batch, k, n, m, !transA, false, p.strideA, sG, sC, alpha, beta);
    else gemm(dB, g, a!, batch, n, k, m, true, transA, sG, p.strideA, sC, alpha, beta);
  }
  return [dA, dB];
}

function emptyOn0(like: Tensor, zero: boolean): Tensor {
  const t = emptyLike(like);
  if (zero) t.backend.fill(t.storage, dtypeCode(t.dtype), t.size, 0);
  return t;
}

const MATMUL_OPTIONS = { transA: 'boolean', transB: 'boolean', alpha: 'number' } as const;

/** Matrix product a @ b (2-D, batched, or with a shared operand; optional transposes and scale). */
export function matmul(a: Tensor, b: Tensor, opts: MatmulOptions = {}): Tensor {
  const cast = autocastRun('matmul', [a, b] as const, (a2, b2) => matmul(a2, b2, opts));
  if (cast) return cast;
  const out = matmulForward(a, b, opts);
  if (!needsGrad(a, b)) return out;
  const transA = !!opts.transA, transB = !!opts.transB, alpha = opts.alpha ?? 1;
  const plan = planMatmul(a.shape, b.shape, transA, transB);
  const needA = a.requiresGrad || a.gradFn !== null, needB = b.requiresGrad || b.gradFn !== null;
  // dA needs B and dB needs A: save only what the required gradients read.
  const as = save(a), bs = save(b);
  return record('matmul', out, [a, b], (g) => matmulBackward(g, needB ? as : null, needA ? bs : null, as, bs, plan, transA, transB, alpha, needA, needB), [as, bs]);
}

/** The argument checks of linear and linearGelu (`call` names the op); returns the out-features. */
function checkLinear(call: string, x: Tensor, weight: Tensor, bias: Tensor | null | undefined): number {
  checkFloats(call, { x, weight }, { bias });
  if (weight.ndim !== 2) throw new ShapeError(`${call}: weight must be [out, in], got ${fmtShape(weight.shape)}`);
  const outF = weight.shape[0]!;
  if (bias && (bias.ndim !== 1 || bias.shape[0] !== outF)) throw new ShapeError(`${call}: bias must be [${outF}], got ${fmtShape(bias.shape)}`);
  if (x.ndim === 0 || x.shape[x.ndim - 1] !== weight.shape[1]) {
    throw new ShapeError(`${call}: input ${fmtShape(x.shape)} does not end in weight's in-features ${weight.shape[1]}`);
  }
  return outF;
}

/** x·Wᵀ + b with weight [out, in] (PyTorch's layout) and optional bias [out]; x is [..., in]. */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null): Tensor {
  const cast = autocastRun('linear', [x, weight, bias] as const, (x2, w2, b2) => linear(x2, w2, b2));
  if (cast) return cast;
  const outF = checkLinear('linear', x, weight, bias);
  const plan = planMatmul(x.shape, weight.shape, false, true, 'linear');
  const out = emptyLike(x, plan.outShape);
  if (bias && x.deviceInfo.type === 'cuda' && plan.k > 0 && plan.m > 0 && plan.n > 0) {
    // cuBLASLt adds the bias in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS): no broadcast pass.
    x.backend.gemm_epilogue(x.storage, weight.storage, out.storage, dtypeCode(x.dtype), plan.batch, plan.m, plan.n, plan.k,
      false, true, 1, 0, plan.strideA, plan.strideB, plan.m * plan.n, bias.storage, 1, null);
  } else if (bias) {
    // Start from the bias in every row, then let the GEMM accumulate (beta = 1): no second pass.
    const rows = out.size / Math.max(outF, 1);
    out.backend.copy_strided(bias.storage, out.storage, dtypeCode(bias.dtype), new Int32Array([rows, outF]), new Int32Array([0, 1]), 0, new Int32Array([outF, 1]), 0);
    gemmInto(out, x, weight, plan, false, true, 1, 1);
  } else {
    gemmInto(out, x, weight, plan, false, true, 1, 0);
  }
  if (!needsGrad(x, weight, bias)) return out;
  const { needX, needW, needBias } = linearNeeds(x, weight, bias);
  const xs = save(x), ws = save(weight);
  return record('linear', out, bias ? [x, weight, bias] : [x, weight], (g) => linearBackward(g, xs, ws, needX, needW, needBias), [xs, ws], {
    // Zero-bubble pipelines (deferWeightGrads): dx now, dW and the bias gradient later; the same calls as linearBackward.
    weights: bias ? [1, 2] : [1],
    inputs: (g) => ({
      grads: [linearBackward(g, xs, ws, needX, false, false)[0], null, null],
      weightGrads: () => { const [, dw, db] = linearBackward(g, xs, ws, false, needW, needBias); return [null, dw, db]; },
    }),
  });
}

/**
 * gelu(x·Wᵀ + b) as one op (the MLP's expanding projection): the GEMM writes x·Wᵀ, then one pass
 * adds the bias and applies GELU (tanh form, as {@link gelu}); backward takes GELU's gradient and
 * the bias gradient (a column sum) in one pass before the two GEMMs of {@link linear}'s backward.
 * Equals `gelu(linear(x, weight, bias))` up to rounding; weight [out, in], bias [out], x [..., in].
 */
export function linearGelu(x: Tensor, weight: Tensor, bias?: Tensor | null): Tensor {
  const cast = autocastRun('linear', [x, weight, bias] as const, (x2, w2, b2) => linearGelu(x2, w2, b2));
  if (cast) return cast;
  const outF = checkLinear('linearGelu', x, weight, bias);
  const plan = planMatmul(x.shape, weight.shape, false, true, 'linearGelu');
  const pre = emptyLike(x, plan.outShape);
  gemmInto(pre, x, weight, plan, false, true, 1, 0);
  const rows = outF === 0 ? 0 : pre.size / outF;
  const out = emptyLike(pre);
  pre.backend.bias_gelu_forward(pre.storage, bias ? bias.storage : null, out.storage, rows, outF, code(pre));
  if (!needsGrad(x, weight, bias)) { pre.dispose(); return out; }
  const { needX, needW, needBias } = linearNeeds(x, weight, bias);
  const xs = save(x), ws = save(weight);
  const geluBackward = (g: Tensor) => {
    const dPre = emptyLike(g), db = needBias ? emptyLike(bias!) : null;
    g.backend.bias_gelu_backward(pre.storage, g.storage, dPre.storage, db ? db.storage : null, rows, outF, code(g));
    return { dPre, db };
  };
  return record('linearGelu', out, bias ? [x, weight, bias] : [x, weight], (g) => {
    const { dPre, db } = geluBackward(g);
    try {
      const [dx, dw] = matmulBackward(dPre, xs, ws, xs, ws, plan, false, true, 1, needX, needW);
      return [dx, dw, db];
    } finally {
      dPre.dispose();
    }
  }, [xs, ws, own(pre)], {
    // Zero-bubble pipelines: GELU's gradient and dx now; dW later from the kept dPre (the bias gradient comes with dPre).
    weights: bias ? [1, 2] : [1],
    inputs: (g) => {
      // What the weight part reads outlives the scope backward runs in (the graph owns it until then).
      const { dPre, db } = geluBackward(g);
      own(dPre); if (db) own(db);
      let dx: Tensor | null;
      try {
        dx = matmulBackward(dPre, xs, ws, xs, ws, plan, false, true, 1, needX, false)[0];
      } catch (e) { dPre.dispose(); db?.dispose(); throw e; }
      return {
        grads: [dx, null, null],
        weightGrads: () => {
          try { return [null, matmulBackward(dPre, xs, ws, xs, ws, plan, false, true, 1, false, needW)[1], db]; } finally { dPre.dispose(); }
        },
        drop: () => { dPre.dispose(); db?.dispose(); },
      };
    },
  });
}

/** Which of a linear op's inputs want a gradient (those that require grad or come from a graph). */
export function linearNeeds(x: Tensor, weight: Tensor, bias: Tensor | null | undefined): { needX: boolean; needW: boolean; needBias: boolean } {
  const wants = (t: Tensor) => t.requiresGrad || t.gradFn !== null;
  return { needX: wants(x), needW: wants(weight), needBias: !!bias && wants(bias) };
}

/**
 * Gradients of y = x Wᵀ (+ b) from g (y's shape) with respect to x, W and b, each only when asked
 * (null otherwise). For ops that run linear's GEMMs on an input they rebuild in backward.
 */
export function linearBackward(g: Tensor, x: Tensor, weight: Tensor, needX: boolean, needW: boolean, needBias: boolean): [Tensor | null, Tensor | null, Tensor | null] {
  const plan = planMatmul(x.shape, weight.shape, false, true, 'linear backward');
  const [dx, dw] = matmulBackward(g, x, weight, x, weight, plan, false, true, 1, needX, needW);
  return [dx, dw, needBias ? sumTo(g, [weight.shape[0]!]) : null];
}
