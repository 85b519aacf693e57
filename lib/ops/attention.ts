// Scaled dot-product self-attention with autograd (causal and sliding-window masks), q/k/v laid out
// [B, H, T, D] or, in groupedQueryAttention, [B, T, H, D] as the projections give them; k and v may
// have fewer heads than q (grouped-query and multi-query attention, heads shared by index, no copies); and the same on a packed QKV projection [B, T, 3·H·D] with the heads merged back
// (attentionPacked, a GPT block's layout). Both run the flash attention kernels
// (flash_attention_forward/backward, FlashAttention-2's algorithm on either backend): no T×T scores or
// probabilities are ever stored; forward saves the output and each row's log-sum-exp (f32 [B, H, T])
// and backward recomputes the probabilities tile by tile. The kernels read q, k, v and write the output
// and the gradients through strided layouts, so attentionPacked reads q, k, v straight from qkv, writes
// the merged heads, and writes dq, dk, dv straight into one gradient of qkv (no copies).
// The materializing path (per-(batch, head) GEMMs around attention_softmax_forward/backward, T×T
// probabilities kept for backward) is taken only for head dims above FLASH_MAX_DIM, which the cuda
// flash kernels refuse.
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { autocastRun } from './autocast.js';
import { checkFloats, checkOptions, code, emptyLike } from './common.js';
import { BINARY } from '../kernel-codes.js';

/** Options of {@link attention}. */
export interface AttentionOptions {
  /** Query i sees only keys j <= i (default true). */
  causal?: boolean;
  /** Sliding window: key j is visible to query i only if i − window < j (0 or undefined: no window). */
  window?: number;
  /** Score scale (default 1/√D). */
  scale?: number;
}

function bmm(out: Tensor, a: Tensor, b: Tensor, batch: number, m: number, n: number, k: number, tA: boolean, tB: boolean): void {
  a.backend.gemm(a.storage, b.storage, out.storage, code(a), batch, m, n, k, tA, tB, 1, 0,
    m * k, k * n, m * n);
}

/** The largest head dim the flash kernels take (the cuda kernels keep D/32 values per lane in registers). */
export const FLASH_MAX_DIM = 256;

/** A flash kernel layout [offset, batchStride, headStride, tokenStride] in elements. */
function layout(offset: number, batch: number, head: number, token: number): Int32Array {
  for (const v of [offset, batch, head, token]) {
    if (v > 0x7fffffff) throw new ShapeError(`attention: a stride or offset of ${v} elements does not fit the kernels' 32-bit layouts`);
  }
  return new Int32Array([offset, batch, head, token]);
}

/**
 * Internal: a flash kernel layout [offset, batchStride, headStride, tokenStride] in elements, checked
 * to fit 32 bits (context parallelism's ring attention calls the kernels on blocks of the sequence).
 */
export const flashLayout = layout;

/** Where q, k, v (in one or three storages), the output and their gradients live for the flash kernels. */
interface FlashLayouts { q: Int32Array; k: Int32Array; v: Int32Array; o: Int32Array }

interface FlashArgs { B: number; H: number; T: number; Tk: number; D: number; scale: number; causal: boolean; window: number }

/**
 * Flash attention as an autograd op: q, k, v are read through L's layouts, the output [outShape] is
 * written through L.o. `packed`: q, k and v are one packed QKV tensor (one input, whose one gradient
 * holds dq, dk and dv in its thirds: the kernel writes every element); otherwise three inputs with three
 * gradients, even when the caller passes one tensor three times (autograd then adds them). Saves the
 * inputs, the output and the per-row log-sum-exp (f32 [B, H, T]); backward recomputes the probabilities
 * tile by tile.
 */
function flashAttention(op: string, q: Tensor, k: Tensor, v: Tensor, packed: boolean, outShape: readonly number[], L: FlashLayouts, a: FlashArgs): Tensor {
  const out = emptyLike(q, outShape);
  const lse = emptyLike(q, [a.B, a.H, a.T], 'f32');
  try {
    q.backend.flash_attention_forward(q.storage, k.storage, v.storage, out.storage, lse.storage, L.q, L.k, L.v, L.o,
      a.B, a.H, a.T, a.Tk, a.D, a.scale, a.causal, a.window, code(q));
  } catch (e) {
    out.dispose();
    lse.dispose();
    throw e;
  }
  const inputs = packed ? [q] : [q, k, v];
  if (!needsGrad(...inputs)) { lse.dispose(); return out; }
  const saved = inputs.map(save), os = save(out);
  const three = <T>(xs: T[]): [T, T, T] => (packed ? [xs[0]!, xs[0]!, xs[0]!] : [xs[0]!, xs[1]!, xs[2]!]);
  const [qs, ks, vs] = three(saved);
  return record(op, out, inputs, (g) => {
    const grads = saved.map((t) => emptyLike(t));
    const [dq, dk, dv] = three(grads);
    try {
      g.backend.flash_attention_backward(qs.storage, ks.storage, vs.storage, os.storage, g.storage, lse.storage, dq.storage, dk.storage, dv.storage,
        L.q, L.k, L.v, L.o, a.B, a.H, a.T, a.Tk, a.D, a.scale, a.causal, a.window, code(g));
    } catch (e) {
      for (const t of grads) t.dispose();
      throw e;
    }
    return grads;
  }, [...saved, os, own(lse)]);
}

/**
 * softmax(q·kᵀ·scale + mask)·v for q [B, H, T, D] and k, v [B, H, Tk, D]. With T < Tk the queries
 * are the last T positions (as when decoding with a cache). Flash attention: keeps the output and
 * the per-row log-sum-exp for backward (O(T) memory), never the T×T probabilities.
 */
export function attention(q: Tensor, k: Tensor, v: Tensor, opts: AttentionOptions = {}): Tensor {
  const cast = autocastRun('attention', [q, k, v] as const, (q2, k2, v2) => attention(q2, k2, v2, opts));
  if (cast) return cast;
  checkFloats('attention', { q, k, v });
  checkOptions('attention', opts, { causal: 'boolean', window: 'integer', scale: 'number' });
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) throw new ShapeError(`attention: q, k, v must be [B, H, T, D], got ${fmtShape(q.shape)}, ${fmtShape(k.shape)}, ${fmtShape(v.shape)}`);
  const [B, H, T, D] = q.shape as [number, number, number, number];
  const Tk = k.shape[2]!, KV = k.shape[1]!;
  if (k.shape[0] !== B || k.shape[3] !== D || v.shape[0] !== B || v.shape[1] !== KV || v.shape[2] !== Tk || v.shape[3] !== D) {
    throw new ShapeError(`attention: k ${fmtShape(k.shape)} and v ${fmtShape(v.shape)} do not match q ${fmtShape(q.shape)}`);
  }
  checkKvHeads('attention', H, KV);
  const { causal, window, scale } = attentionOptions(opts, T, Tk, D);
  if (D > FLASH_MAX_DIM) {
    if (KV !== H) throw new ShapeError(`attention: grouped-query attention (${KV} kv heads for ${H} heads) needs a head dim <= ${FLASH_MAX_DIM}, got ${D}`);
    return attentionMaterialized(q, k, v, { causal, window, scale });
  }
  const a: FlashArgs = { B, H, T, Tk, D, scale, causal, window };
  const L: FlashLayouts = { q: layout(0, H * T * D, T * D, D), k: layout(0, KV * Tk * D, Tk * D, D), v: layout(0, KV * Tk * D, Tk * D, D), o: layout(0, H * T * D, T * D, D) };
  if (KV !== H) return groupedFlashAttention('attention', q, k, v, [B, H, T, D], L, a, KV);
  return flashAttention('attention', q, k, v, false, [B, H, T, D], L, a);
}

/** Checks that kvHeads divides heads (grouped-query attention; kvHeads = 1 is multi-query). */
function checkKvHeads(call: string, heads: number, kvHeads: number): void {
  if (!(kvHeads >= 1) || heads % kvHeads !== 0) {
    throw new ShapeError(`${call}: the ${kvHeads} key/value heads must divide the ${heads} query heads (grouped-query attention)`);
  }
}

/**
 * Grouped-query flash attention: query head h attends with key/value head ⌊h / G⌋, G = H / KV. No
 * copy of k or v is made: the kernels run G times, call g taking the query heads j·G + g (j < KV) —
 * one more offset and a G-fold head stride in the q and output layouts — against the KV heads as they
 * are. Backward writes each call's dq into its heads of one dq, and adds the G calls' dk and dv (the
 * shared heads' gradients are the sums over their query heads).
 */
function groupedFlashAttention(op: string, q: Tensor, k: Tensor, v: Tensor, outShape: readonly number[], L: FlashLayouts, a: FlashArgs, KV: number): Tensor {
  const G = a.H / KV;
  const sub = (l: Int32Array, g: number): Int32Array => layout(l[0]! + g * l[2]!, l[1]!, l[2]! * G, l[3]!);
  const Ls = Array.from({ length: G }, (_, g): FlashLayouts => ({ q: sub(L.q, g), k: L.k, v: L.v, o: sub(L.o, g) }));
  const out = emptyLike(q, outShape);
  const lses: Tensor[] = [];
  try {
    for (let g = 0; g < G; g++) {
      const lse = emptyLike(q, [a.B, KV, a.T], 'f32');
      lses.push(lse);
      q.backend.flash_attention_forward(q.storage, k.storage, v.storage, out.storage, lse.storage, Ls[g]!.q, L.k, L.v, Ls[g]!.o,
        a.B, KV, a.T, a.Tk, a.D, a.scale, a.causal, a.window, code(q));
    }
  } catch (e) {
    out.dispose();
    for (const t of lses) t.dispose();
    throw e;
  }
  if (!needsGrad(q, k, v)) { for (const t of lses) t.dispose(); return out; }
  const qs = save(q), ks = save(k), vs = save(v), os = save(out);
  return record(op, out, [q, k, v], (g) => {
    const dq = emptyLike(qs), dk = emptyLike(ks), dv = emptyLike(vs);
    const dkg = emptyLike(ks), dvg = emptyLike(vs);
    try {
      for (let j = 0; j < G; j++) {
        const tk = j === 0 ? dk : dkg, tv = j === 0 ? dv : dvg;
        g.backend.flash_attention_backward(qs.storage, ks.storage, vs.storage, os.storage, g.storage, lses[j]!.storage, dq.storage, tk.storage, tv.storage,
          Ls[j]!.q, L.k, L.v, Ls[j]!.o, a.B, KV, a.T, a.Tk, a.D, a.scale, a.causal, a.window, code(g));
        if (j > 0) {
          g.backend.binary(BINARY.add, dk.storage, dkg.storage, dk.storage, code(dk), new Int32Array([dk.size]), new Int32Array([1]), new Int32Array([1]));
          g.backend.binary(BINARY.add, dv.storage, dvg.storage, dv.storage, code(dv), new Int32Array([dv.size]), new Int32Array([1]), new Int32Array([1]));
        }
      }
    } catch (e) {
      for (const t of [dq, dk, dv]) t.dispose();
      throw e;
    } finally {
      dkg.dispose(); dvg.dispose();
    }
    return [dq, dk, dv];
  }, [qs, ks, vs, os, ...lses.map(own)]);
}

/**
 * Causal (by default) self-attention in the projections' layout, with grouped-query attention:
 * q [B, T, H, D] and k, v [B, Tk, KV, D] (KV dividing H; KV = 1 is multi-query), as a Llama block's
 * q/k/v projections give them viewed per head; returns [B, T, H, D] (view it [B, T, H·D] for the
 * output projection). The flash kernels read and write these layouts directly (no transposes), and
 * the KV heads are shared by index, never repeated in memory (see groupedFlashAttention).
 */
export function groupedQueryAttention(q: Tensor, k: Tensor, v: Tensor, opts: AttentionOptions = {}): Tensor {
  const cast = autocastRun('attention', [q, k, v] as const, (q2, k2, v2) => groupedQueryAttention(q2, k2, v2, opts));
  if (cast) return cast;
  checkFloats('groupedQueryAttention', { q, k, v });
  checkOptions('groupedQueryAttention', opts, { causal: 'boolean', window: 'integer', scale: 'number' });
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) {
    throw new ShapeError(`groupedQueryAttention: q must be [B, T, H, D] and k, v [B, Tk, KV, D], got ${fmtShape(q.shape)}, ${fmtShape(k.shape)}, ${fmtShape(v.shape)}`);
  }
  const [B, T, H, D] = q.shape as [number, number, number, number];
  const [, Tk, KV] = k.shape as [number, number, number, number];
  if (k.shape[0] !== B || k.shape[3] !== D || v.shape[0] !== B || v.shape[1] !== Tk || v.shape[2] !== KV || v.shape[3] !== D) {
    throw new ShapeError(`groupedQueryAttention: k ${fmtShape(k.shape)} and v ${fmtShape(v.shape)} do not match q ${fmtShape(q.shape)}`);
  }
  checkKvHeads('groupedQueryAttention', H, KV);
  const { causal, window, scale } = attentionOptions(opts, T, Tk, D, 'groupedQueryAttention');
  if (D > FLASH_MAX_DIM) throw new ShapeError(`groupedQueryAttention: the head dim ${D} exceeds the flash kernels' ${FLASH_MAX_DIM}`);
  const a: FlashArgs = { B, H, T, Tk, D, scale, causal, window };
  const L: FlashLayouts = { q: layout(0, T * H * D, D, H * D), k: layout(0, Tk * KV * D, D, KV * D), v: layout(0, Tk * KV * D, D, KV * D), o: layout(0, T * H * D, D, H * D) };
  if (KV !== H) return groupedFlashAttention('groupedQueryAttention', q, k, v, [B, T, H, D], L, a, KV);
  return flashAttention('groupedQueryAttention', q, k, v, false, [B, T, H, D], L, a);
}

/**
 * The materializing attention (per-(batch, head) GEMMs around attention_softmax_forward/backward,
 * keeping the T×T probabilities for backward): what {@link attention} runs for head dims above
 * FLASH_MAX_DIM, and the independent reference the tests compare the flash kernels with.
 * Options as checked by attention (all set).
 */
export function attentionMaterialized(q: Tensor, k: Tensor, v: Tensor, opts: Required<AttentionOptions>): Tensor {
  const [B, H, T, D] = q.shape as [number, number, number, number];
  const Tk = k.shape[2]!;
  const { causal, window, scale } = opts;
  const probs = attentionProbs(q, k, B * H, T, Tk, D, scale, causal, window);
  const out = emptyLike(q, [B, H, T, D]);
  bmm(out, probs, v, B * H, T, D, Tk, false, false);
  if (!needsGrad(q, k, v)) { probs.dispose(); return out; }
  const qs = save(q), ks = save(k), vs = save(v);
  return record('attention', out, [q, k, v], (g) => attentionGrads(g, qs, ks, vs, probs, B * H, T, Tk, D, scale), [qs, ks, vs, own(probs)]);
}

/** softmax(q·kᵀ·scale + mask) for batch = B·H heads: [B, H, T, Tk]. */
function attentionProbs(q: Tensor, k: Tensor, batch: number, T: number, Tk: number, D: number, scale: number, causal: boolean, window: number): Tensor {
  const [B, H] = q.shape as [number, number];
  const scores = emptyLike(q, [B, H, T, Tk]);
  bmm(scores, q, k, batch, T, Tk, D, false, true);
  const probs = emptyLike(q, [B, H, T, Tk]);
  try {
    q.backend.attention_softmax_forward(scores.storage, probs.storage, batch, T, Tk, scale, causal, window, code(q));
  } catch (e) {
    probs.dispose();
    throw e;
  } finally {
    scores.dispose();
  }
  return probs;
}

/** [dq, dk, dv] of attention's output gradient g [B, H, T, D], from the saved q, k, v and probabilities. */
function attentionGrads(g: Tensor, qs: Tensor, ks: Tensor, vs: Tensor, probs: Tensor, batch: number, T: number, Tk: number, D: number, scale: number): Tensor[] {
  const [B, H] = qs.shape as [number, number];
  const dProbs = emptyLike(g, [B, H, T, Tk]);
  bmm(dProbs, g, vs, batch, T, Tk, D, false, true);
  const dv = emptyLike(vs);
  bmm(dv, probs, g, batch, Tk, D, T, true, false);
  const dScores = emptyLike(g, [B, H, T, Tk]);
  g.backend.attention_softmax_backward(probs.storage, dProbs.storage, dScores.storage, batch, T, Tk, scale, code(g));
  dProbs.dispose();
  const dq = emptyLike(qs), dk = emptyLike(ks);
  bmm(dq, dScores, ks, batch, T, D, Tk, false, false);
  bmm(dk, dScores, qs, batch, Tk, D, T, true, false);
  dScores.dispose();
  return [dq, dk, dv];
}

/**
 * Moves a 4-D block between `dense` (contiguous, of `shape`) and `packed` (read or written with
 * `packedStrides` from `packedOffset`): into dense, or into packed when `toPacked`.
 */
function move4(packed: Tensor, dense: Tensor, shape: readonly number[], packedStrides: readonly number[], packedOffset: number, toPacked: boolean): void {
  const denseStrides = [shape[1]! * shape[2]! * shape[3]!, shape[2]! * shape[3]!, shape[3]!, 1];
  const sh = new Int32Array(shape), ps = new Int32Array(packedStrides), ds = new Int32Array(denseStrides);
  if (toPacked) dense.backend.copy_strided(dense.storage, packed.storage, code(dense), sh, ds, 0, ps, packedOffset);
  else packed.backend.copy_strided(packed.storage, dense.storage, code(packed), sh, ps, packedOffset, ds, 0);
}

/**
 * Causal self-attention on a packed projection, as a GPT block computes it: qkv [B, T, 3·H·D] holds
 * the queries, keys and values of `heads` heads ([B, T, 3, H, D]); returns the heads' outputs merged
 * back to [B, T, H·D]. Equals splitting qkv into q, k, v [B, H, T, D], {@link attention}, and merging
 * the heads, but moves the data once each way: q, k and v are gathered straight from qkv, and
 * backward writes their gradients straight into one gradient of qkv (no slice gradients to zero-fill
 * and add up).
 */
export function attentionPacked(qkv: Tensor, heads: number, opts: AttentionOptions = {}): Tensor {
  const cast = autocastRun('attention', [qkv] as const, (qkv2) => attentionPacked(qkv2, heads, opts));
  if (cast) return cast;
  checkFloats('attentionPacked', { qkv });
  if (!Number.isInteger(heads) || heads < 1) throw new ArgumentError(`attentionPacked: heads must be a positive integer, got ${heads}`);
  if (qkv.ndim !== 3 || qkv.shape[2]! % (3 * heads) !== 0) {
    throw new ShapeError(`attentionPacked: qkv must be [B, T, 3·heads·D] with ${heads} heads, got ${fmtShape(qkv.shape)}`);
  }
  const [B, T, W] = qkv.shape as [number, number, number];
  const H = heads, D = W / (3 * H), C = H * D;
  const { causal, window, scale } = attentionOptions(opts, T, T, D, 'attentionPacked');
  if (D > FLASH_MAX_DIM) return attentionPackedMaterialized(qkv, B, T, H, D, causal, window, scale);
  const a: FlashArgs = { B, H, T, Tk: T, D, scale, causal, window };
  const L: FlashLayouts = { q: layout(0, T * W, D, W), k: layout(C, T * W, D, W), v: layout(2 * C, T * W, D, W), o: layout(0, T * C, D, C) };
  return flashAttention('attentionPacked', qkv, qkv, qkv, true, [B, T, C], L, a);
}

/** attentionPacked for head dims above FLASH_MAX_DIM: strided copies around the materializing attention. */
function attentionPackedMaterialized(qkv: Tensor, B: number, T: number, H: number, D: number, causal: boolean, window: number, scale: number): Tensor {
  const C = H * D, W = 3 * C;
  const shape = [B, H, T, D], packedStrides = [T * W, D, W, 1];
  const [q, k, v] = [0, 1, 2].map((i) => { const t = emptyLike(qkv, shape); move4(qkv, t, shape, packedStrides, i * C, false); return t; }) as [Tensor, Tensor, Tensor];
  const probs = attentionProbs(q, k, B * H, T, T, D, scale, causal, window);
  const heads4 = emptyLike(qkv, shape);
  bmm(heads4, probs, v, B * H, T, D, T, false, false);
  const out = emptyLike(qkv, [B, T, C]);
  const mergedStrides = [T * C, D, C, 1];
  move4(out, heads4, shape, mergedStrides, 0, true);
  heads4.dispose();
  if (!needsGrad(qkv)) { for (const t of [q, k, v, probs]) t.dispose(); return out; }
  return record('attentionPacked', out, [qkv], (g) => {
    const gHeads = emptyLike(g, shape);
    move4(g, gHeads, shape, mergedStrides, 0, false);
    const grads = attentionGrads(gHeads, q, k, v, probs, B * H, T, T, D, scale);
    gHeads.dispose();
    const dqkv = emptyLike(g, [B, T, W]);
    grads.forEach((d, i) => { move4(dqkv, d, shape, packedStrides, i * C, true); d.dispose(); });
    return [dqkv];
  }, [own(q), own(k), own(v), own(probs)]);
}

/** The checked causal flag, window and scale of attention options for T queries over Tk keys of width D. */
function attentionOptions(opts: AttentionOptions, T: number, Tk: number, D: number, call = 'attention'): { causal: boolean; window: number; scale: number } {
  const causal = opts.causal ?? true;
  const window = opts.window ?? 0;
  if (!Number.isInteger(window) || window < 0) throw new ArgumentError(`${call}: window must be a non-negative integer, got ${window}`);
  if (causal && T > Tk) throw new ShapeError(`${call}: causal attention needs T <= Tk (${T} > ${Tk})`);
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  if (!Number.isFinite(scale)) throw new ArgumentError(`${call}: scale must be finite, got ${scale}`);
  return { causal, window, scale };
}
