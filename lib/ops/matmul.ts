// Matrix products with autograd: 2-D and batched, with transposes, on the device's GEMM (OpenBLAS /
// cuBLASLt), and linear(x, W, b) = x·Wᵀ + b in PyTorch's weight layout.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { dtypeCode } from '../dtype.js';
import { DTypeError, ShapeError } from '../errors.js';
import { fmtShape, numel } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { autocastRun } from './autocast.js';
import { checkFloats, checkOptions, code, emptyLike, gradOut } from './common.js';
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

/** Where a backward may write an input's gradient: the engine's GradTarget at that input's position. */
type Into = () => Tensor | null;

/**
 * Gradients of out = alpha·op(A)·op(B) from g, per the plan. A shared operand (batch stride 0)
 * gets the sum over the batch: GEMMs accumulate into one matrix with beta = 1. `intoA`/`intoB`:
 * where the engine lets dA/dB be written (a leaf's gradient home; see gradOut).
 */
function matmulBackward(g: Tensor, a: Tensor | null, b: Tensor | null, aLike: Tensor, bLike: Tensor, p: GemmPlan,
  transA: boolean, transB: boolean, alpha: number, needA: boolean, needB: boolean, intoA?: Into, intoB?: Into): [Tensor | null, Tensor | null] {
  const { batch, m, n, k } = p;
  const sG = m * n;
  let dA: Tensor | null = null, dB: Tensor | null = null;
  if (needA) {
    const shared = p.strideA === 0 && batch > 1;
    dA = emptyOn0(aLike, shared, intoA);
    const sC = shared ? 0 : m * k, beta = shared ? 1 : 0;
    if (!transA) gemm(dA, g, b!, batch, m, k, n, false, !transB, sG, p.strideB, sC, alpha, beta);
    else gemm(dA, b!, g, batch, k, m, n, transB, true, p.strideB, sG, sC, alpha, beta);
  }
  if (needB) {
    const shared = p.strideB === 0 && batch > 1;
    dB = emptyOn0(bLike, shared, intoB);
    const sC = shared ? 0 : k * n, beta = shared ? 1 : 0;
    if (!transB) gemm(dB, a!, g, batch, k, n, m, !transA, false, p.strideA, sG, sC, alpha, beta);
    else gemm(dB, g, a!, batch, n, k, m, true, transA, sG, p.strideA, sC, alpha, beta);
  }
  return [dA, dB];
}

function emptyOn0(like: Tensor, zero: boolean, into?: Into): Tensor {
  const t = gradOut(into?.() ?? null, like);
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
  return record('matmul', out, [a, b], (g, target) => matmulBackward(g, needB ? as : null, needA ? bs : null, as, bs, plan, transA, transB, alpha, needA, needB,
    () => target(0), () => target(1)), [as, bs]);
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

/**
 * The gemm_epilogue codes of the cuda addon (native/cuda/kernels/gemm.cu): cuBLASLt epilogues, each
 * with a kernel fallback in the addon where cuBLASLt has no algorithm for a shape.
 */
export const EPILOGUE = { none: 0, bias: 1, gelu: 2, geluBias: 3, bgrad: 4, dgeluBgrad: 5 } as const;

/** Whether a linear layer's GEMM on `t`'s device may use cuBLASLt's epilogues: cuda, one non-empty GEMM. */
function epilogues(t: Tensor, plan: GemmPlan): boolean {
  return t.deviceInfo.type === 'cuda' && plan.batch === 1 && plan.m > 0 && plan.n > 0 && plan.k > 0;
}

/** out = x·Wᵀ (+ bias) without autograd: the BIAS epilogue on cuda, else bias rows then an accumulating GEMM. */
function linearInto(out: Tensor, x: Tensor, weight: Tensor, bias: Tensor | null | undefined, plan: GemmPlan): void {
  if (bias && epilogues(x, plan)) {
    // cuBLASLt adds the bias in the GEMM's epilogue (CUBLASLT_EPILOGUE_BIAS): no broadcast pass.
    x.backend.gemm_epilogue(x.storage, weight.storage, out.storage, dtypeCode(x.dtype), 1, plan.m, plan.n, plan.k,
      false, true, 1, 0, 0, 0, 0, bias.storage, EPILOGUE.bias, null);
  } else if (bias) {
    // Start from the bias in every row, then let the GEMM accumulate (beta = 1): no second pass.
    const outF = plan.n, rows = out.size / Math.max(outF, 1);
    out.backend.copy_strided(bias.storage, out.storage, dtypeCode(bias.dtype), new Int32Array([rows, outF]), new Int32Array([0, 1]), 0, new Int32Array([outF, 1]), 0);
    gemmInto(out, x, weight, plan, false, true, 1, 1);
  } else {
    gemmInto(out, x, weight, plan, false, true, 1, 0);
  }
}

/** x·Wᵀ + b with weight [out, in] (PyTorch's layout) and optional bias [out]; x is [..., in]. */
export function linear(x: Tensor, weight: Tensor, bias?: Tensor | null): Tensor {
  const cast = autocastRun('linear', [x, weight, bias] as const, (x2, w2, b2) => linear(x2, w2, b2));
  if (cast) return cast;
  checkLinear('linear', x, weight, bias);
  const plan = planMatmul(x.shape, weight.shape, false, true, 'linear');
  const out = emptyLike(x, plan.outShape);
  linearInto(out, x, weight, bias, plan);
  if (!needsGrad(x, weight, bias)) return out;
  const { needX, needW, needBias } = linearNeeds(x, weight, bias);
  const xs = save(x), ws = save(weight);
  return record('linear', out, bias ? [x, weight, bias] : [x, weight], (g, target) => linearBackward(g, xs, ws, needX, needW, needBias, () => target(1)), [xs, ws], {
    // Zero-bubble pipelines (deferWeightGrads): dx now, dW and the bias gradient later; the same calls as linearBackward.
    weights: bias ? [1, 2] : [1],
    inputs: (g) => ({
      grads: [linearBackward(g, xs, ws, needX, false, false)[0], null, null],
      weightGrads: (target) => { const [, dw, db] = linearBackward(g, xs, ws, false, needW, needBias, () => target(1)); return [null, dw, db]; },
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
  return record('linearGelu', out, bias ? [x, weight, bias] : [x, weight], (g, target) => {
    const { dPre, db } = geluBackward(g);
    try {
      const [dx, dw] = matmulBackward(dPre, xs, ws, xs, ws, plan, false, true, 1, needX, needW, undefined, () => target(1));
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
        weightGrads: (target) => {
          try { return [null, matmulBackward(dPre, xs, ws, xs, ws, plan, false, true, 1, false, needW, undefined, () => target(1))[1], db]; } finally { dPre.dispose(); }
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
 * (null otherwise). For ops that run linear's GEMMs on an input they rebuild in backward. `intoW`:
 * where the engine lets dW be written (the GradTarget of the weight's position).
 */
export function linearBackward(g: Tensor, x: Tensor, weight: Tensor, needX: boolean, needW: boolean, needBias: boolean, intoW?: Into): [Tensor | null, Tensor | null, Tensor | null] {
  const plan = planMatmul(x.shape, weight.shape, false, true, 'linear backward');
  if (needW && needBias) {
    const fused = weightAndBiasGrads(g, x, weight, plan);
    if (fused) return [needX ? matmulBackward(g, x, weight, x, weight, plan, false, true, 1, true, false)[0] : null, fused[0], fused[1]];
  }
  const [dx, dw] = matmulBackward(g, x, weight, x, weight, plan, false, true, 1, needX, needW, undefined, intoW);
  return [dx, dw, needBias ? sumTo(g, [weight.shape[0]!]) : null];
}

/**
 * dW = gᵀ·x and db = Σ_rows g from one GEMM on cuda (cuBLASLt's BGRADB epilogue: the weight-gradient
 * GEMM sums gᵀ over its K, the rows, into the bias gradient); null where that path does not apply
 * (cpu, a batched plan, empty sizes): the caller runs the GEMM and sumTo instead.
 */
function weightAndBiasGrads(g: Tensor, x: Tensor, weight: Tensor, plan: GemmPlan): [Tensor, Tensor] | null {
  if (!epilogues(g, plan) || g.dtype !== x.dtype || g.dtype !== weight.dtype) return null;
  const dw = emptyLike(weight), db = emptyLike(g, [plan.n]);
  try {
    g.backend.gemm_epilogue(g.storage, x.storage, dw.storage, dtypeCode(g.dtype), 1, plan.n, plan.k, plan.m, true, false, 1, 0, 0, 0, 0,
      db.storage, EPILOGUE.bgrad, null);
  } catch (e) {
    dw.dispose(); db.dispose();
    throw e;
  }
  return [dw, db];
}

/**
 * The GPT's MLP as one op: gelu(x·W1ᵀ + b1)·W2ᵀ + b2 (weights [hidden, in] and [out, hidden],
 * biases optional; GELU in tanh form, as {@link gelu}). Equals `linear(linearGelu(x, w1, b1), w2, b2)`
 * up to rounding. On cuda its GEMMs carry cuBLASLt epilogues: the first GEMM adds b1, applies GELU
 * and keeps the pre-activation (GELU_AUX_BIAS), the second adds b2 (BIAS); in backward the GEMM of
 * W2's gradient also makes b2's (BGRADB), and the GEMM of the hidden gradient applies GELU's
 * derivative and makes b1's gradient (DGELU_BGRAD), so no separate bias-gradient or GELU pass runs.
 * The addon falls back to its kernels where cuBLASLt has no algorithm (or hidden is not a multiple
 * of 8). On cpu the same steps run as GEMMs, bias_gelu_forward/backward and column sums.
 */
export function geluMlp(x: Tensor, w1: Tensor, b1: Tensor | null | undefined, w2: Tensor, b2: Tensor | null | undefined): Tensor {
  const cast = autocastRun('linear', [x, w1, b1, w2, b2] as const, (x2, w12, b12, w22, b22) => geluMlp(x2, w12, b12, w22, b22));
  if (cast) return cast;
  const hidden = checkLinear('geluMlp', x, w1, b1);
  checkFloats('geluMlp', { x, w2 }, { b1, b2 });
  if (w2.ndim !== 2 || w2.shape[1] !== hidden) throw new ShapeError(`geluMlp: w2 must be [out, ${hidden}] (the hidden size of w1), got ${fmtShape(w2.shape)}`);
  if (b2 && (b2.ndim !== 1 || b2.shape[0] !== w2.shape[0])) throw new ShapeError(`geluMlp: b2 must be [${w2.shape[0]}], got ${fmtShape(b2.shape)}`);
  const plan1 = planMatmul(x.shape, w1.shape, false, true, 'geluMlp');
  const h = emptyLike(x, plan1.outShape), pre = emptyLike(h);
  const rows = hidden === 0 ? 0 : pre.size / hidden;
  const plan2 = planMatmul(h.shape, w2.shape, false, true, 'geluMlp');
  const out = emptyLike(x, plan2.outShape);
  try {
    if (epilogues(x, plan1)) {
      x.backend.gemm_epilogue(x.storage, w1.storage, h.storage, dtypeCode(x.dtype), 1, plan1.m, plan1.n, plan1.k, false, true, 1, 0, 0, 0, 0,
        b1 ? b1.storage : null, b1 ? EPILOGUE.geluBias : EPILOGUE.gelu, pre.storage);
    } else {
      gemmInto(pre, x, w1, plan1, false, true, 1, 0);
      pre.backend.bias_gelu_forward(pre.storage, b1 ? b1.storage : null, h.storage, rows, hidden, code(pre));
    }
    linearInto(out, h, w2, b2, plan2);
  } catch (e) {
    h.dispose(); pre.dispose(); out.dispose();
    throw e;
  }
  if (!needsGrad(x, w1, b1, w2, b2)) { h.dispose(); pre.dispose(); return out; }
  const n1 = linearNeeds(x, w1, b1), n2 = linearNeeds(h, w2, b2);
  const needW2 = n2.needW, needB2 = n2.needBias, needX = n1.needX, needW1 = n1.needW, needB1 = n1.needBias;
  const needPre = needX || needW1 || needB1;
  const xs = save(x), w1s = save(w1), w2s = save(w2);
  const inputs = [x, w1, ...(b1 ? [b1] : []), w2, ...(b2 ? [b2] : [])];
  return record('geluMlp', out, inputs, (g, target) => {
    // The hidden layer first: dPre = (g·W2)·gelu'(pre), db1 = Σ_rows dPre, dx and dW1; then dW2 = gᵀh and
    // db2 = Σ_rows g, allocated after dPre is freed (the larger of the two is never held with the other).
    let dx: Tensor | null = null, dw1: Tensor | null = null, db1: Tensor | null = null;
    if (needPre) {
      const dPre = emptyLike(g, h.shape);
      // A bias gradient is always made with dPre (GELU's derivative and the sum share a pass); without b1 it is dropped.
      db1 = emptyLike(g, [hidden]);
      try {
        if (epilogues(g, plan2) && g.dtype === w2s.dtype) {
          g.backend.gemm_epilogue(g.storage, w2s.storage, dPre.storage, dtypeCode(g.dtype), 1, plan2.m, plan2.k, plan2.n, false, false, 1, 0, 0, 0, 0,
            db1.storage, EPILOGUE.dgeluBgrad, pre.storage);
        } else {
          const dh = matmulBackward(g, h, w2s, h, w2s, plan2, false, true, 1, true, false)[0]!;
          try {
            dh.backend.bias_gelu_backward(pre.storage, dh.storage, dPre.storage, db1.storage, rows, hidden, code(dh));
          } finally {
            dh.dispose();
          }
        }
        [dx, dw1] = matmulBackward(dPre, xs, w1s, xs, w1s, plan1, false, true, 1, needX, needW1, undefined, () => target(1));
      } finally {
        dPre.dispose();
      }
      if (!needB1) { db1.dispose(); db1 = null; }
    }
    let dw2: Tensor | null = null, db2: Tensor | null = null;
    if (needW2 && needB2) [dw2, db2] = weightAndBiasGrads(g, h, w2s, plan2) ?? [null, null];
    if (needW2 && !dw2) dw2 = matmulBackward(g, h, w2s, h, w2s, plan2, false, true, 1, false, true, undefined, () => target(b1 ? 3 : 2))[1];
    if (needB2 && !db2) db2 = sumTo(g, [w2s.shape[0]!]);
    return [dx, dw1, ...(b1 ? [db1] : []), dw2, ...(b2 ? [db2] : [])];
  }, [xs, w1s, w2s, own(h), own(pre)]);
}
