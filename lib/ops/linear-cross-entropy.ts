// The fused LM head: linear + cross-entropy over chunks of rows, so that the [N, V] logits and their
// gradient never exist whole. Each chunk runs a GEMM into one reused logits block, the cross-entropy
// forward kernel, the gradient kernel in place over the same block, and the GEMMs of both inputs'
// gradients; the gradients are thus complete when the forward returns (for an upstream gradient of 1,
// which backward applies). The vocabulary-parallel head (lib/parallel/tensor-parallel/vocab.ts) runs
// the same loop with its own per-chunk rule, which combines the rows' statistics across its group.
import { alias, needsGrad, own, record } from '../autograd/engine.js';
import { type DType, dtypeCode, dtypeSize, isFloating } from '../dtype.js';
import { autocastDtypeFor } from '../amp.js';
import { runCast } from './autocast.js';
import { ArgumentError, AutogradError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import { BINARY, UNARY } from '../kernel-codes.js';
import { emptyOn, Tensor } from '../tensor.js';
import { isCapturing } from '../cuda/graph.js';
import { checkFloats, checkIndices, code, emptyLike } from './common.js';
import { checkLossInputs, checkLossOptions, countTargets, type CrossEntropyOptions } from './loss.js';

/** Options of {@link linearCrossEntropy}. */
export interface LinearCrossEntropyOptions extends CrossEntropyOptions {
  /** A bias [V] added to every row's logits (linear's bias); it gets a gradient like x and weight. */
  bias?: Tensor | null;
  /**
   * Rows of x per chunk (default: as many as keep one chunk's logits within
   * {@link LINEAR_CE_CHUNK_BYTES}, split evenly). Only memory and speed depend on it, not the result
   * beyond float rounding.
   */
  chunkRows?: number;
  /**
   * Pad the vocabulary of the head's GEMMs to a multiple of this many columns (0: no padding; default
   * the environment variable NODETRON_PAD_VOCAB, or 0). The weight is copied into a [Vp, C] buffer
   * whose extra rows are zero, the GEMMs run on Vp columns (an aligned leading dimension: llm.c pads
   * GPT-2's 50257 to 50304), the extra logits are set to −inf before the cross-entropy kernels so they
   * add nothing to the log-sum-exp and get no gradient, and the weight's (and bias's) gradient is
   * sliced back to [V, C]. The loss and gradients equal the unpadded ones up to the order of the
   * kernels' sums (see test/ops/pad-vocab.test.ts).
   */
  padVocab?: number;
}

/**
 * The head's vocabulary padding from NODETRON_PAD_VOCAB: a non-negative integer (0 or unset: none);
 * anything else is an ArgumentError (read on every call, so a test or benchmark can switch it).
 */
export function padVocabFromEnv(): number {
  const raw = process.env.NODETRON_PAD_VOCAB;
  if (raw === undefined || raw === '') return 0;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0 || n > 65536) {
    throw new ArgumentError(`NODETRON_PAD_VOCAB must be an integer in [0, 65536] (0: no padding), got '${raw}'`);
  }
  return n;
}

/** V rounded up to a multiple of `multiple` (V itself for 0 or 1). */
export function paddedVocab(v: number, multiple: number): number {
  return multiple > 1 ? Math.ceil(v / multiple) * multiple : v;
}

/** dst[offset, offset + count) = value (elements of dst's dtype), without touching the rest of dst. */
function fillRange(dst: Tensor, offset: number, count: number, value: number): void {
  if (count <= 0) return;
  using one = emptyOn([1], dst.dtype, dst.deviceInfo);
  one.backend.fill(one.storage, code(one), 1, value);
  dst.backend.copy_strided(one.storage, dst.storage, code(dst), new Int32Array([count]), new Int32Array([0]), 0, new Int32Array([1]), offset);
}

/**
 * Bytes of one chunk's logits block when chunkRows is not given (64 MiB: 256 rows of GPT-2's
 * 50257-token vocabulary in f32 for a 1024-row batch). Measured with `nodetron bench head` on a
 * 2-core EPYC (32 MiB L3) shared with other jobs, so indicative: the least CPU time of forward +
 * backward for the tiny GPT's head was 669 ms unfused, 622 ms in chunks of 128 rows, 547 ms of 256,
 * 545 ms of 512 and 661 ms in one chunk of 1024. Smaller chunks re-read the [V, C] weight and its
 * gradient more often; larger ones leave the cache further behind and cost memory. This size keeps
 * the tiny GPT's training step under 250 MB.
 */
export const LINEAR_CE_CHUNK_BYTES = 64 * 2 ** 20;

/**
 * The same budget on cuda (1 GiB: GPT-2's 16×1024-row batch over 50257 tokens in bf16 in two chunks).
 * On a GPU a larger block means fewer, larger GEMMs (the [V, C] weight and its f32 gradient are
 * re-read once per chunk) and fewer launches; 1 GiB stays small beside an 80 GB device's activations.
 */
export const LINEAR_CE_CUDA_CHUNK_BYTES = 2 ** 30;

/** The rows per chunk for n rows over a vocabulary of `vocab` columns: balanced chunks within budgetBytes. */
export function linearCrossEntropyChunkRows(n: number, vocab: number, elementBytes: number, budgetBytes = LINEAR_CE_CHUNK_BYTES): number {
  const most = Math.max(1, Math.floor(budgetBytes / Math.max(1, vocab * elementBytes)));
  const chunks = Math.max(1, Math.ceil(n / most));
  return Math.max(1, Math.ceil(n / chunks));
}

/**
 * What the chunk loop asks of a head (internal: the whole-vocabulary head here, the
 * vocabulary-parallel one in lib/parallel). Given the logits of rows [start, start + rows) over the
 * vocabulary held here, `rows` returns their summed loss, each row's logsumexp over the whole
 * vocabulary, and the targets the gradient kernel reads.
 */
export interface HeadChunkRule {
  /** The name in error messages. */
  readonly call: string;
  /** Rows whose loss counts (the mean's denominator). */
  readonly counted: number;
  /**
   * The same count as an f32 [1] tensor on x's device, made without reading the targets on the host
   * (a CUDA graph capture cannot); when given, `counted` is not used and the mean's 1/count stays on
   * the device (the loop disposes of nothing here: the rule's owner does).
   */
  readonly countOnDevice?: Tensor;
  /** Loss of the chunk: `logits` [rows, V held here] are the chunk's logits (a prefix of the block). */
  rows(logits: Tensor, start: number, rows: number): {
    /**
     * Sum of the chunk's per-row losses (the same on every rank of a group), or the per-row losses
     * themselves as an f32 [rows] tensor on the logits' device (the loop sums them there: no host
     * synchronization per chunk; the caller disposes it).
     */
    loss: number | Tensor;
    /** f32 [≥ rows]: each row's logsumexp over the whole vocabulary (the caller disposes it). */
    lse: Tensor;
    /** i32 [≥ rows]: the targets of the gradient kernel (the caller disposes it). */
    targets: Tensor;
    /** The value in `targets` of rows without loss. */
    ignore: number;
    /** Whether the logits are a slice of the vocabulary (targets outside it get softmax only). */
    shard: boolean;
  };
}

/** Copies rows [start, start + count) of a contiguous [N, width] tensor into the front of dst. */
function copyRows(dst: Tensor, src: Tensor, start: number, count: number, width: number): void {
  const b = dtypeSize(src.dtype);
  src.backend.copy(dst.storage, 0, src.storage, start * width * b, count * width * b);
}

/** C = op(A)·op(B) (+ C when accumulate) for row-major operands; C of A's dtype, or f32 (the cpu backend's outDtype). */
function gemm(c: Tensor, a: Tensor, b: Tensor, m: number, n: number, k: number, transA: boolean, transB: boolean, accumulate = false): void {
  const out = c.dtype !== a.dtype ? [dtypeCode(c.dtype)] : [];
  a.backend.gemm(a.storage, b.storage, c.storage, dtypeCode(a.dtype), 1, m, n, k, transA, transB, 1, accumulate ? 1 : 0, 0, 0, 0, ...out);
}

/**
 * The chunk loop shared by the heads: x [N, C] and weight [V held here, C] (one floating dtype, one
 * device), the rule's loss per chunk, reduced to a scalar by `reduction`. With gradients on, dX and
 * dW are made during the forward and handed to the first backward (scaled by its upstream gradient);
 * a second backward through the same graph throws AutogradError.
 */
export function chunkedLinearCrossEntropy(x: Tensor, weight: Tensor, bias: Tensor | null, extra: readonly Tensor[], rule: HeadChunkRule,
  reduction: 'mean' | 'sum', chunkRows?: number, lossDtype: DType = x.dtype, padVocab = 0): Tensor {
  const call = rule.call;
  const [N, C] = x.shape as [number, number];
  const V0 = weight.shape[0]!;
  // With padding every GEMM, block and gradient buffer below is Vp wide; dw and db stay [V0].
  const V = paddedVocab(V0, padVocab);
  const padded = V !== V0;
  const grad = needsGrad(x, weight, bias);
  const wants = (t: Tensor) => t.requiresGrad || t.gradFn !== null;
  const needX = grad && wants(x), needW = grad && wants(weight), needB = grad && bias !== null && wants(bias);
  const onCuda = x.deviceInfo.type === 'cuda';
  const rows = chunkRows ?? linearCrossEntropyChunkRows(N, V, dtypeSize(x.dtype), onCuda ? LINEAR_CE_CUDA_CHUNK_BYTES : LINEAR_CE_CHUNK_BYTES);
  const chunks = Math.max(1, Math.ceil(N / rows));
  const whole = chunks === 1;
  // 16-bit weights (and bias) accumulate their gradient over chunks in f32 (one rounding, as one GEMM would do).
  const wide = (needW || needB) && !whole && x.dtype !== 'f32';
  // On cuda cuBLASLt does that from the 16-bit block and rows directly (f32 compute and output, beta = 1
  // across chunks) and the bias's gradient comes from the same GEMM (BGRADB): no f32 copies of the block.
  // On cpu the GEMM also writes f32 from the 16-bit block and rows (gemm's outDtype; the AVX512_BF16
  // kernel or the widening path): no f32 copies of them for the weight's gradient (the bias's gradient
  // still sums an f32 copy of the block).
  const ltWide = wide && onCuda && needW;
  const mixed = wide && !onCuda;
  const devCount = rule.countOnDevice ?? null;
  // With the count on the device the backward kernel's scale is 1 and its gradLoss the mean's 1/count (below).
  const scale = reduction === 'sum' || devCount ? 1 : rule.counted > 0 ? 1 / rule.counted : 0;
  // 1/count (f32 [1]; inf for no counted rows, which makes the mean NaN as the host path's 0/0 does).
  using inv = devCount ? emptyOn([1], 'f32', x.deviceInfo) : null;
  if (inv && devCount) {
    inv.backend.fill(inv.storage, code(inv), 1, 1);
    if (reduction === 'mean') inv.backend.binary(BINARY.div, inv.storage, devCount.storage, inv.storage, code(inv), new Int32Array([1]), new Int32Array([1]), new Int32Array([1]));
  }
  const temps: Tensor[] = [];
  const temp = (shape: number[], dtype = x.dtype) => { const t = emptyOn(shape, dtype, x.deviceInfo); temps.push(t); return t; };
  let dx: Tensor | null = null, dw: Tensor | null = null, db: Tensor | null = null;
  let total = 0;
  // The summed loss stays on the device (f32 [1]) where the rule gives per-row losses as a tensor.
  using lossAcc = emptyOn([1], 'f32', x.deviceInfo);
  let onDevice = false;
  try {
    const block = temp([Math.min(rows, N), V]);
    // The padded weight: rows [V0, V) are zero (so the pad columns' gradient adds nothing to dx).
    let w = weight;
    if (padded) {
      w = temp([V, C], weight.dtype);
      w.backend.copy(w.storage, 0, weight.storage, 0, V0 * C * dtypeSize(weight.dtype));
      fillRange(w, V0 * C, (V - V0) * C, 0);
    }
    // A scalar −inf for the pad columns of every chunk's logits.
    const negInf = padded ? temp([1]) : null;
    if (negInf) negInf.backend.fill(negInf.storage, code(negInf), 1, -Infinity);
    const xc = whole ? x : temp([rows, C]);
    const dxc = needX && !whole ? temp([rows, C]) : null;
    const blockF32 = wide && !ltWide && (needB || !mixed) ? temp([rows, V], 'f32') : null, xcF32 = wide && !ltWide && !mixed ? temp([rows, C], 'f32') : null;
    const dwF32 = wide && needW ? temp([V, C], 'f32') : null;
    lossAcc.backend.fill(lossAcc.storage, code(lossAcc), 1, 0);
    const lossChunk = temp([1], 'f32');
    const dbAcc = needB ? (wide ? temp([V], 'f32') : null) : null, dbChunk = needB && !whole ? temp([V], wide ? 'f32' : x.dtype) : null;
    const one = grad ? temp([1]) : null;
    if (one) {
      if (inv) one.backend.cast(inv.storage, code(inv), one.storage, code(one), 1);
      else one.backend.fill(one.storage, code(one), 1, 1);
    }
    if (needX) dx = emptyLike(x);
    if (needW) dw = emptyLike(weight);
    if (needB) db = emptyLike(bias!);
    // Where the GEMMs and sums write the gradients in the weight's dtype: [V] wide buffers when padded (sliced after the loop).
    const dwT = dw && padded && !wide ? temp([V, C], weight.dtype) : dw;
    const dbT = db && padded && !wide ? temp([V], bias!.dtype) : db;
    // No rows: no GEMM writes the weight's gradient, no sum the bias's.
    for (const t of N === 0 ? [dw, db] : []) if (t) t.backend.fill(t.storage, code(t), t.size, 0);
    for (let c = 0, start = 0; start < N; c++, start += rows) {
      const m = Math.min(rows, N - start);
      if (!whole) copyRows(xc, x, start, m, C);
      if (bias) {
        // Every row starts from the bias; the GEMM accumulates onto it (as linear does).
        block.backend.copy_strided(bias.storage, block.storage, code(bias), new Int32Array([m, V0]), new Int32Array([0, 1]), 0, new Int32Array([V, 1]), 0);
      }
      gemm(block, xc, w, m, V, C, false, true, bias !== null);
      // The pad columns' logits are −inf: exp of them is 0 in the log-sum-exp and in the gradient.
      if (negInf) block.backend.copy_strided(negInf.storage, block.storage, code(block), new Int32Array([m, V - V0]), new Int32Array([0, 0]), 0, new Int32Array([V, 1]), V0);
      const r = rule.rows(block, start, m);
      try {
        if (typeof r.loss === 'number') total += r.loss;
        else {
          try {
            const l = r.loss;
            l.backend.sum_to(l.storage, lossChunk.storage, code(l), new Int32Array([m]), new Int32Array([0]), 1);
            lossAcc.backend.binary(BINARY.add, lossAcc.storage, lossChunk.storage, lossAcc.storage, code(lossAcc), new Int32Array([1]), new Int32Array([1]), new Int32Array([1]));
            onDevice = true;
          } finally {
            r.loss.dispose();
          }
        }
        if (!grad) continue;
        const kernel = r.shard ? 'cross_entropy_shard_backward' : 'cross_entropy_backward';
        // softmax − onehot, times the mean's scale, over the logits block in place.
        block.backend[kernel](block.storage, r.targets.storage, r.lse.storage, one!.storage, block.storage, m, V, r.ignore, scale, code(block));
      } finally {
        r.lse.dispose(); r.targets.dispose();
      }
      if (dx) {
        if (whole) gemm(dx, block, w, m, C, V, false, false);
        else {
          gemm(dxc!, block, w, m, C, V, false, false);
          const b = dtypeSize(x.dtype);
          dx.backend.copy(dx.storage, start * C * b, dxc!.storage, 0, m * C * b);
        }
      }
      if (ltWide) {
        // dW (f32) += blockᵀ·xc in f32 from the 16-bit operands; the bias's gradient (f32) of this chunk from the same GEMM.
        const bgrad = needB ? dbChunk! : null;
        block.backend.gemm_epilogue(block.storage, xc.storage, dwF32!.storage, code(block), 1, V, C, m, true, false, 1, c > 0 ? 1 : 0, 0, 0, 0,
          bgrad ? bgrad.storage : null, bgrad ? 4 : 0, null, dtypeCode('f32'));
        if (bgrad) {
          if (c === 0) dbAcc!.backend.copy(dbAcc!.storage, 0, bgrad.storage, 0, V * 4);
          else dbAcc!.backend.binary(BINARY.add, dbAcc!.storage, bgrad.storage, dbAcc!.storage, code(dbAcc!), new Int32Array([V]), new Int32Array([1]), new Int32Array([1]));
        }
        continue;
      }
      if (blockF32) block.backend.cast(block.storage, code(block), blockF32.storage, dtypeCode('f32'), m * V);
      if (dw) {
        if (mixed) gemm(dwF32!, block, xc, V, C, m, true, false, c > 0);
        else if (wide) {
          xc.backend.cast(xc.storage, code(xc), xcF32!.storage, dtypeCode('f32'), m * C);
          gemm(dwF32!, blockF32!, xcF32!, V, C, m, true, false, c > 0);
        } else {
          gemm(dwT!, block, xc, V, C, m, true, false, c > 0);
        }
      }
      if (db) {
        // The bias's gradient: the column sums of the logits' gradient, added up over the chunks.
        const src = wide ? blockF32! : block, acc = wide ? dbAcc! : dbT!;
        const into = c === 0 ? acc : dbChunk!;
        src.backend.sum_to(src.storage, into.storage, code(src), new Int32Array([m, V]), new Int32Array([0, 1]), V);
        if (c > 0) acc.backend.binary(BINARY.add, acc.storage, into.storage, acc.storage, code(acc), new Int32Array([V]), new Int32Array([1]), new Int32Array([1]));
      }
    }
    // The first V0 rows of the [V] buffers are the gradients (a prefix of row-major storage).
    if (dw && wide) dw.backend.cast(dwF32!.storage, dtypeCode('f32'), dw.storage, code(dw), V0 * C);
    if (db && wide) db.backend.cast(dbAcc!.storage, dtypeCode('f32'), db.storage, code(db), V0);
    if (dw && dwT !== dw && N > 0) dw.backend.copy(dw.storage, 0, dwT!.storage, 0, V0 * C * dtypeSize(dw.dtype));
    if (db && dbT !== db && N > 0) db.backend.copy(db.storage, 0, dbT!.storage, 0, V0 * dtypeSize(db.dtype));
  } catch (e) {
    dx?.dispose(); dw?.dispose(); db?.dispose();
    throw e;
  } finally {
    for (const t of temps) t.dispose();
  }
  const out = emptyLike(x, [], lossDtype);
  const factor = reduction === 'sum' ? 1 : 1 / rule.counted;
  if (inv) {
    // loss = (device sum + host sum) · (1/count on the device): no host read at all.
    using acc = emptyLike(out, [], 'f32');
    acc.backend.fill(acc.storage, code(acc), 1, total);
    if (onDevice) acc.backend.binary(BINARY.add, acc.storage, lossAcc.storage, acc.storage, code(acc), new Int32Array([1]), new Int32Array([1]), new Int32Array([1]));
    acc.backend.binary(BINARY.mul, acc.storage, inv.storage, acc.storage, code(acc), new Int32Array([1]), new Int32Array([1]), new Int32Array([1]));
    out.backend.cast(acc.storage, code(acc), out.storage, code(out), 1);
  } else if (onDevice) {
    // loss = (device sum + host sum) · factor, without reading the device sum back.
    using acc = emptyLike(out, [], 'f32');
    acc.backend.fill(acc.storage, code(acc), 1, total);
    acc.backend.binary(BINARY.add, acc.storage, lossAcc.storage, acc.storage, code(acc), new Int32Array([1]), new Int32Array([1]), new Int32Array([1]));
    acc.backend.unary(UNARY.scale, acc.storage, acc.storage, 1, code(acc), factor);
    out.backend.cast(acc.storage, code(acc), out.storage, code(out), 1);
  } else {
    out.backend.fill(out.storage, code(out), 1, reduction === 'sum' ? total : total / rule.counted);
  }
  if (!grad) return out;
  const saved = [dx, dw, db].filter((t): t is Tensor => t !== null).map((t) => own(t));
  const inputs = bias ? [x, weight, bias, ...extra] : [x, weight, ...extra];
  // backward scales the gradients made in forward by the loss's gradient and hands them over.
  const scaleSaved = (g: Tensor) => {
    if (saved.some((t) => t.disposed)) {
      throw new AutogradError(`backward through '${call}' a second time: its gradients were computed in forward and handed to the first backward (run the forward again to differentiate again)`);
    }
    if (g.deviceInfo.type === 'cpu') {
      const k = (g.toArraySync() as ArrayLike<number>)[0]!;
      if (k !== 1) g.backend.scale_in_place(saved.map((t) => t.storage), saved.map((t) => t.size), saved.map((t) => code(t)), k);
    } else {
      // On a GPU the upstream gradient is not read back (no host synchronization): each gradient is
      // multiplied by it on the device (g broadcast, in each gradient's dtype).
      for (const t of saved) {
        using gk = emptyLike(t, [1]);
        g.backend.cast(g.storage, code(g), gk.storage, code(gk), 1);
        t.backend.binary(BINARY.mul, t.storage, gk.storage, t.storage, code(t), new Int32Array([t.size]), new Int32Array([1]), new Int32Array([0]));
      }
    }
  };
  // The gradients move to the engine: it gets new handles on their storage and the node drops its own.
  const handOver = (t: Tensor | null): Tensor | null => {
    if (t === null) return null;
    const moved = alias(t);
    t.dispose();
    return moved;
  };
  return record(call, out, inputs, (g) => {
    scaleSaved(g);
    return [handOver(dx), handOver(dw), ...(bias ? [handOver(db)] : []), ...extra.map(() => null)];
  }, saved, {
    // Zero-bubble pipelines (deferWeightGrads): dx now, the weight's (and bias's) gradient handed over later.
    weights: bias ? [1, 2] : [1],
    inputs: (g) => {
      scaleSaved(g);
      return {
        grads: [handOver(dx), null, ...(bias ? [null] : []), ...extra.map(() => null)],
        weightGrads: () => [null, handOver(dw), ...(bias ? [handOver(db)] : []), ...extra.map(() => null)],
      };
    },
  });
}

/** Checks the shapes every head shares: x [N, C], weight [V, C], targets i32 [N]; returns N, C and V. */
export function checkHeadShapes(call: string, x: Tensor, weight: Tensor, targets: Tensor): { n: number; c: number; v: number } {
  checkFloats(call, { x, weight });
  checkIndices(call, 'targets', targets);
  if (x.ndim !== 2) throw new ShapeError(`${call}: x must be [N, C] (flatten the leading dimensions), got ${fmtShape(x.shape)}`);
  if (weight.ndim !== 2 || weight.shape[1] !== x.shape[1]) {
    throw new ShapeError(`${call}: weight must be [V, ${x.shape[1]}] to match x ${fmtShape(x.shape)}, got ${fmtShape(weight.shape)}`);
  }
  if (weight.shape[0] === 0) throw new ShapeError(`${call}: empty vocabulary (weight ${fmtShape(weight.shape)})`);
  if (targets.ndim !== 1 || targets.shape[0] !== x.shape[0]) {
    throw new ShapeError(`${call}: targets must be [${x.shape[0]}] (one per row of x), got ${fmtShape(targets.shape)}`);
  }
  return { n: x.shape[0]!, c: x.shape[1]!, v: weight.shape[0]! };
}

/**
 * x [..., C] and targets [...] as x [N, C] and targets [N] (views; a ShapeError when targets' shape
 * is not x's without its last dimension).
 */
export function flattenRows(call: string, x: Tensor, targets: Tensor): [Tensor, Tensor] {
  checkLossInputs(call, 'x', 'C', x, targets);
  if (x.ndim === 2) return [x, targets];
  const n = targets.size;
  return [x.reshape([n, x.shape[x.ndim - 1]!]), targets.reshape([n])];
}

/** Checks reduction, ignoreIndex and chunkRows of the heads' options. */
export function checkHeadOptions(call: string, opts: LinearCrossEntropyOptions): { reduction: 'mean' | 'sum'; ignoreIndex: number; chunkRows: number | undefined; padVocab: number } {
  const { reduction, ignoreIndex } = checkLossOptions(call, opts);
  const chunkRows = opts.chunkRows;
  if (chunkRows !== undefined && (!Number.isInteger(chunkRows) || chunkRows < 1)) {
    throw new ArgumentError(`${call}: chunkRows must be a positive integer, got ${chunkRows}`);
  }
  const padVocab = opts.padVocab ?? padVocabFromEnv();
  if (!Number.isInteger(padVocab) || padVocab < 0 || padVocab > 65536) {
    throw new ArgumentError(`${call}: padVocab must be an integer in [0, 65536] (0: no padding), got ${padVocab}`);
  }
  return { reduction, ignoreIndex, chunkRows, padVocab };
}

/**
 * Cross-entropy of the logits x·weightᵀ against i32 targets, without materializing the logits:
 * equal to `crossEntropy(linear(x, weight), targets, opts)` up to float rounding. x [..., C] (e.g. the
 * final hidden states), weight [V, C] (PyTorch's linear layout, e.g. a tied token table), targets
 * [...] (x's shape without C) in [0, V) or ignoreIndex. The logits exist one chunk of rows at a time
 * (opts.chunkRows); with gradients on, both inputs' gradients are computed in the same pass, so
 * the [N, V] logits' gradient never exists either. Without gradients (evaluation) only the loss is
 * computed. The gradients are handed to the first backward: a second backward through the same
 * graph (retainGraph) throws AutogradError.
 */
export function linearCrossEntropy(x: Tensor, weight: Tensor, targets: Tensor, opts: LinearCrossEntropyOptions = {}): Tensor {
  return headUnderAutocast('linearCrossEntropy', x, weight, opts.bias ?? null,
    (x2, w2, b2, lossDtype) => linearCrossEntropyIn(x2, w2, targets, { ...opts, bias: b2 }, lossDtype));
}

/**
 * A fused head (`call`) as autocast wants it (internal: the single-process and vocabulary-parallel
 * heads): under autocast for `call` the GEMMs run in the low dtype (f32 accumulation) on x, weight and
 * bias cast to it, and the loss comes out in f32, as a 16-bit linear followed by crossEntropy (an f32
 * op) would give it; otherwise `head` gets its inputs as they are and no loss dtype (x's).
 */
export function headUnderAutocast(call: string, x: Tensor, weight: Tensor, bias: Tensor | null,
  head: (x: Tensor, weight: Tensor, bias: Tensor | null, lossDtype: DType | undefined) => Tensor): Tensor {
  const low = autocastDtypeFor(call);
  if (low === undefined) return head(x, weight, bias, undefined);
  const cast = (t: unknown) => t instanceof Tensor && !t.disposed && isFloating(t.dtype) && t.dtype !== low;
  if (cast(x) || cast(weight) || cast(bias)) return runCast(low, [x, weight, bias] as const, (x2, w2, b2) => head(x2, w2, b2, 'f32'));
  return head(x, weight, bias, 'f32');
}

function linearCrossEntropyIn(x: Tensor, weight: Tensor, targets: Tensor, opts: LinearCrossEntropyOptions, lossDtype: DType | undefined): Tensor {
  const call = 'linearCrossEntropy';
  [x, targets] = flattenRows(call, x, targets);
  const { n, v } = checkHeadShapes(call, x, weight, targets);
  const { reduction, ignoreIndex, chunkRows, padVocab } = checkHeadOptions(call, opts);
  const bias = opts.bias ?? null;
  if (bias !== null) {
    checkFloats(call, { x, weight }, { bias });
    if (bias.ndim !== 1 || bias.shape[0] !== v) throw new ShapeError(`${call}: bias must be [${v}], got ${fmtShape(bias.shape)}`);
  }
  // Under a CUDA graph capture (or NODETRON_HEAD_DEVICE_COUNT=1) the mean's count is a device
  // reduction: the targets are not read on the host, so not checked there either (the cuda kernel
  // gives a NaN loss for a target outside the vocabulary).
  const devCount = headDeviceCount(x) ? countTargetsOnDevice(targets, ignoreIndex) : null;
  const counted = devCount ? 0 : countTargets(call, targets.toArraySync() as Int32Array, ignoreIndex, v);
  const rule: HeadChunkRule = {
    call, counted, ...(devCount ? { countOnDevice: devCount } : {}),
    rows(logits, start, rows) {
      const tc = emptyLike(targets, [rows]), losses = emptyLike(logits, [rows], 'f32'), lse = emptyLike(logits, [rows], 'f32');
      try {
        tc.backend.copy(tc.storage, 0, targets.storage, start * 4, rows * 4);
        // The block's width: V, or the padded vocabulary (its pad columns are −inf).
        logits.backend.cross_entropy_forward(logits.storage, tc.storage, losses.storage, lse.storage, rows, logits.shape[1]!, ignoreIndex, code(logits));
        // The per-row losses stay on the device: the chunk loop sums them there (no synchronization per chunk).
        return { loss: losses, lse, targets: tc, ignore: ignoreIndex, shard: false };
      } catch (e) {
        tc.dispose(); lse.dispose(); losses.dispose();
        throw e;
      }
    },
  };
  try {
    return chunkedLinearCrossEntropy(x, weight, bias, [targets], rule, reduction, chunkRows, lossDtype ?? x.dtype, padVocab);
  } finally {
    devCount?.dispose();
  }
}

/**
 * Whether the head counts its targets on the device: during a CUDA graph capture on x's device, or
 * with NODETRON_HEAD_DEVICE_COUNT=1 (anything but 0, 1 or unset is an ArgumentError).
 */
export function headDeviceCount(x: Tensor): boolean {
  const raw = process.env.NODETRON_HEAD_DEVICE_COUNT;
  if (raw !== undefined && raw !== '' && raw !== '0' && raw !== '1') {
    throw new ArgumentError(`NODETRON_HEAD_DEVICE_COUNT must be 0 or 1, got '${raw}'`);
  }
  if (raw === '1') return true;
  return x.deviceInfo.type === 'cuda' && isCapturing(x.device);
}

/**
 * The number of targets that are not ignoreIndex, as an f32 [1] tensor on the targets' device, from
 * elementwise kernels and a sum (no host read): d = f32(t) − ignoreIndex, min(d·d, 1), summed. Every
 * step is exact for targets and ignoreIndex of magnitude below 2^24 (an integer d ≠ 0 has d·d ≥ 1,
 * whatever d·d rounds to), and the sum of ones is exact below 2^24 rows.
 */
export function countTargetsOnDevice(targets: Tensor, ignoreIndex: number): Tensor {
  const n = targets.size;
  using f = emptyLike(targets, [n], 'f32');
  using one = emptyLike(targets, [1], 'f32');
  f.backend.cast(targets.storage, code(targets), f.storage, code(f), n);
  f.backend.unary(UNARY.addScalar, f.storage, f.storage, n, code(f), -ignoreIndex);
  const sh = new Int32Array([n]), s1 = new Int32Array([1]), s0 = new Int32Array([0]);
  f.backend.binary(BINARY.mul, f.storage, f.storage, f.storage, code(f), sh, s1, s1);
  one.backend.fill(one.storage, code(one), 1, 1);
  f.backend.binary(BINARY.min, f.storage, one.storage, f.storage, code(f), sh, s1, s0);
  const count = emptyLike(targets, [1], 'f32');
  try {
    f.backend.sum_to(f.storage, count.storage, code(f), sh, s0, 1);
  } catch (e) {
    count.dispose();
    throw e;
  }
  return count;
}
