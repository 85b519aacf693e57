// Context parallelism for the GPT: the ContextLayout a GPT is built with (its positions and attention
// over the context-parallel group), and the slicing of a batch's token columns to this rank's tokens.
import { ArgumentError, ShapeError } from '../../errors.js';
import { cat, slice } from '../../ops/index.js';
import type { Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import type { ContextLayout } from '../../nn/gpt.js';
import type { ContextParallelMode } from '../layout.js';
import { ringAttentionPacked, ringChunks, type TokenRange } from './ring.js';
import { ulyssesAttentionPacked, ulyssesChunk } from './ulysses.js';

/** The token ranges of a sequence of seqLen tokens that context-parallel rank `rank` of `cp` holds, in its order. */
export function contextChunks(seqLen: number, cp: number, rank: number, mode: ContextParallelMode): TokenRange[] {
  if (mode !== 'ring' && mode !== 'ulysses') throw new ArgumentError(`context parallelism: mode must be ring or ulysses, got ${String(mode)}`);
  return mode === 'ring' ? ringChunks(seqLen, cp, rank) : [ulyssesChunk(seqLen, cp, rank)];
}

/**
 * The ContextLayout of a GPT whose sequences are split over `group`: ring attention with Megatron's
 * load-balanced chunks, or Ulysses' contiguous chunks and all-to-all. Each token's position is its
 * global one.
 */
export function contextParallelLayout(group: CollectiveGroup, mode: ContextParallelMode = 'ring'): ContextLayout {
  const cp = group.size, rank = group.rank;
  contextChunks(2 * cp, cp, rank, mode);  // checks the mode
  return {
    parts: cp,
    positions(localLen: number): Int32Array {
      const out = new Int32Array(localLen);
      let k = 0;
      for (const c of contextChunks(localLen * cp, cp, rank, mode)) for (let t = c.start; t < c.start + c.count; t++) out[k++] = t;
      return out;
    },
    attention: (qkv, heads) => (mode === 'ring' ? ringAttentionPacked(qkv, heads, group) : ulyssesAttentionPacked(qkv, heads, group)),
  };
}

/**
 * This context-parallel rank's tokens of a batch t [B, T] (token ids or targets): the columns of
 * its chunks, in its order, as a new [B, T/cp] tensor. A ShapeError when the chunks do not divide T.
 */
export function contextSlice(t: Tensor, cp: number, rank: number, mode: ContextParallelMode): Tensor {
  if (t.ndim !== 2) throw new ShapeError(`context parallelism: expected a batch [B, T], got ${t.describe()}`);
  const chunks = contextChunks(t.shape[1]!, cp, rank, mode);
  const parts = chunks.map((c) => slice(t, 1, c.start, c.start + c.count));
  if (parts.length === 1) return parts[0]!;
  const out = cat(parts, 1);
  for (const p of parts) p.dispose();
  return out;
}
