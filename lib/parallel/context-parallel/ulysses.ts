// Ulysses (DeepSpeed-Ulysses) context parallelism: the sequence is split over the context-parallel
// (cp) group in cp contiguous chunks; around attention an all-to-all trades the sequence split for a
// head split (each rank gets the whole sequence of H/cp heads), ordinary flash attention runs on it,
// and a second all-to-all trades back. Communication per layer: each rank sends and receives
// (cp−1)/cp of its q, k, v and of its output, independent of the ring's cp steps.
import { needsGrad, record } from '../../autograd/engine.js';
import { dtypeCode } from '../../dtype.js';
import { ShapeError, StateError } from '../../errors.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { attentionPacked } from '../../ops/index.js';
import { checkPackedQkv, type TokenRange } from './ring.js';
import { finishSync } from '../../distributed/finish-sync.js';

/** Rank `rank`'s contiguous chunk of a sequence of seqLen tokens split cp ways; a ShapeError when cp does not divide it. */
export function ulyssesChunk(seqLen: number, cp: number, rank: number): TokenRange {
  if (seqLen % cp !== 0) throw new ShapeError(`Ulysses attention: the sequence length ${seqLen} is not a multiple of cp = ${cp}`);
  return { start: rank * (seqLen / cp), count: seqLen / cp };
}

/** A copy of x's elements walked by `shape` with `srcStrides` into a new tensor of `outShape`, written with `dstStrides`. */
function permuted(x: Tensor, outShape: number[], shape: number[], srcStrides: number[], dstStrides: number[]): Tensor {
  const out = emptyOn(outShape, x.dtype, x.deviceInfo);
  x.backend.copy_strided(x.storage, out.storage, dtypeCode(x.dtype), new Int32Array(shape), new Int32Array(srcStrides), 0, new Int32Array(dstStrides), 0);
  return out;
}

/** allToAll of `send` (cp equal blocks, block i to rank i) into a new tensor of its shape. */
function exchange(send: Tensor, group: CollectiveGroup, call: string): Tensor {
  if (!group.allToAll) throw new StateError(`${call}: group '${group.name}' has no allToAll, which Ulysses context parallelism needs (use the ring mode or a ProcessGroup)`);
  const out = emptyOn(send.shape, send.dtype, send.deviceInfo);
  finishSync(() => group.allToAll!(out, send), { call, group, buffers: [out] });
  return out;
}

/**
 * [B, Tl, 3, H, D] of this rank's tokens (as a packed qkv [B, Tl, 3·H·D]) → [B, cp·Tl, 3, H/cp, D]:
 * the whole sequence of this rank's heads. Its backward is the inverse exchange.
 */
function sequenceToHeads(x: Tensor, group: CollectiveGroup, H: number, D: number, call: string): Tensor {
  const cp = group.size, [B, Tl] = x.shape as [number, number], Hd = H / cp, E = Hd * D, W = 3 * H * D, T = cp * Tl;
  // send [dest, B, Tl, 3, E] ← x [B, Tl, 3, dest, E]
  const send = permuted(x, [cp, B, Tl, 3, E], [cp, B, Tl, 3, E], [E, Tl * W, W, H * D, 1], [B * Tl * 3 * E, Tl * 3 * E, 3 * E, E, 1]);
  let got: Tensor;
  try { got = exchange(send, group, call); } finally { send.dispose(); }
  // got [src, B, Tl, 3E] → out [B, src·Tl + t, 3E]
  const out = permuted(got, [B, T, 3 * E], [cp, B, Tl * 3 * E], [B * Tl * 3 * E, Tl * 3 * E, 1], [Tl * 3 * E, T * 3 * E, 1]);
  got.dispose();
  if (!needsGrad(x)) return out;
  return record(call, out, [x], (g) => {
    const back = permuted(g, [cp, B, Tl * 3 * E], [cp, B, Tl * 3 * E], [Tl * 3 * E, T * 3 * E, 1], [B * Tl * 3 * E, Tl * 3 * E, 1]);
    let r: Tensor;
    try { r = exchange(back, group, call); } finally { back.dispose(); }
    // r [src head group, B, Tl, 3, E] → dx [B, Tl, 3, src, E]
    const dx = permuted(r, [B, Tl, W], [cp, B, Tl, 3, E], [B * Tl * 3 * E, Tl * 3 * E, 3 * E, E, 1], [E, Tl * W, W, H * D, 1]);
    r.dispose();
    return [dx];
  });
}

/** [B, cp·Tl, E] (this rank's heads, whole sequence) → [B, Tl, cp·E] (all heads, this rank's tokens). Its backward is the inverse exchange. */
function headsToSequence(y: Tensor, group: CollectiveGroup, call: string): Tensor {
  const cp = group.size, [B, T, E] = y.shape as [number, number, number], Tl = T / cp, C = cp * E;
  const send = permuted(y, [cp, B, Tl * E], [cp, B, Tl * E], [Tl * E, T * E, 1], [B * Tl * E, Tl * E, 1]);
  let got: Tensor;
  try { got = exchange(send, group, call); } finally { send.dispose(); }
  // got [src head group, B, Tl, E] → out [B, Tl, src, E]
  const out = permuted(got, [B, Tl, C], [cp, B, Tl, E], [B * Tl * E, Tl * E, E, 1], [E, Tl * C, C, 1]);
  got.dispose();
  if (!needsGrad(y)) return out;
  return record(call, out, [y], (g) => {
    const back = permuted(g, [cp, B, Tl, E], [cp, B, Tl, E], [E, Tl * C, C, 1], [B * Tl * E, Tl * E, E, 1]);
    let r: Tensor;
    try { r = exchange(back, group, call); } finally { back.dispose(); }
    const dy = permuted(r, [B, T, E], [cp, B, Tl * E], [B * Tl * E, Tl * E, 1], [Tl * E, T * E, 1]);
    r.dispose();
    return [dy];
  });
}

/** Options of {@link ulyssesAttentionPacked}. */
export interface UlyssesAttentionOptions {
  /** Score scale (default 1/√D). */
  scale?: number;
}

/**
 * Causal self-attention of a sequence split over `group` in contiguous chunks ({@link ulyssesChunk}):
 * qkv [B, T/cp, 3·H·D] holds this rank's tokens, packed as attentionPacked's input; returns
 * [B, T/cp, H·D]. The heads must divide by cp. Equals attentionPacked over the whole sequence,
 * restricted to this rank's tokens (the same kernel on the same rows: to float32 rounding).
 */
export function ulyssesAttentionPacked(qkv: Tensor, heads: number, group: CollectiveGroup, opts: UlyssesAttentionOptions = {}): Tensor {
  const call = 'ulyssesAttentionPacked';
  checkPackedQkv(call, qkv, heads);
  const cp = group.size;
  if (heads % cp !== 0) throw new ShapeError(`${call}: ${heads} attention heads (per tensor-parallel rank) are not divisible by cp = ${cp}; Ulysses gives each context-parallel rank heads/cp whole heads (use --cp-mode ring)`);
  if (cp === 1) return attentionPacked(qkv, heads, { causal: true, scale: opts.scale });
  const D = qkv.shape[2]! / (3 * heads);
  const whole = sequenceToHeads(qkv, group, heads, D, call);
  const y = attentionPacked(whole, heads / cp, { causal: true, scale: opts.scale });
  return headsToSequence(y, group, call);
}
