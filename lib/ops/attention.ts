// Scaled dot-product self-attention with autograd: per (batch, head) GEMMs around a fused masked
// softmax (causal and sliding-window masks), q/k/v laid out [B, H, T, D].
import { needsGrad, own, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { fmtShape } from '../shape.js';
import type { Tensor } from '../tensor.js';
import { checkFloats, checkOptions, code, emptyLike } from './common.js';

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

/**
 * softmax(q·kᵀ·scale + mask)·v for q [B, H, T, D] and k, v [B, H, Tk, D]. With T < Tk the queries
 * are the last T positions (as when decoding with a cache). Keeps the probabilities for backward.
 */
export function attention(q: Tensor, k: Tensor, v: Tensor, opts: AttentionOptions = {}): Tensor {
  checkFloats('attention', { q, k, v });
  checkOptions('attention', opts, { causal: 'boolean', window: 'integer', scale: 'number' });
  if (q.ndim !== 4 || k.ndim !== 4 || v.ndim !== 4) throw new ShapeError(`attention: q, k, v must be [B, H, T, D], got ${fmtShape(q.shape)}, ${fmtShape(k.shape)}, ${fmtShape(v.shape)}`);
  const [B, H, T, D] = q.shape as [number, number, number, number];
  const Tk = k.shape[2]!;
  if (k.shape[0] !== B || k.shape[1] !== H || k.shape[3] !== D || v.shape[0] !== B || v.shape[1] !== H || v.shape[2] !== Tk || v.shape[3] !== D) {
    throw new ShapeError(`attention: k ${fmtShape(k.shape)} and v ${fmtShape(v.shape)} do not match q ${fmtShape(q.shape)}`);
  }
  const causal = opts.causal ?? true;
  const window = opts.window ?? 0;
  if (!Number.isInteger(window) || window < 0) throw new ArgumentError(`attention: window must be a non-negative integer, got ${window}`);
  if (causal && T > Tk) throw new ShapeError(`attention: causal attention needs T <= Tk (${T} > ${Tk})`);
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  if (!Number.isFinite(scale)) throw new ArgumentError(`attention: scale must be finite, got ${scale}`);
  const batch = B * H;
  const scores = emptyLike(q, [B, H, T, Tk]);
  bmm(scores, q, k, batch, T, Tk, D, false, true);
  const probs = emptyLike(q, [B, H, T, Tk]);
  q.backend.attention_softmax_forward(scores.storage, probs.storage, batch, T, Tk, scale, causal, window, code(q));
  scores.dispose();
  const out = emptyLike(q, [B, H, T, D]);
  bmm(out, probs, v, batch, T, D, Tk, false, false);
  if (!needsGrad(q, k, v)) { probs.dispose(); return out; }
  const qs = save(q), ks = save(k), vs = save(v);
  return record('attention', out, [q, k, v], (g) => {
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
  }, [qs, ks, vs, own(probs)]);
}
