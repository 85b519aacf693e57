// Rotary position embeddings (RoPE, Su et al.) with autograd, in Hugging Face's rotate-half layout: a
// head vector's first and second halves are rotated pairwise, (x[i], x[i + D/2]) by the angle
// p·theta^(−2i/D) at position p. Llama applies it to q and k. Positions are offset + t by default, or
// given per token, so a pipeline stage, a context-parallel shard or a decode step with a cache passes
// global positions. Kernel `rope` on both backends; its backward is the inverse rotation.
import { needsGrad, record, save } from '../autograd/engine.js';
import { ArgumentError, ShapeError } from '../errors.js';
import { checkSameDevice, type Tensor } from '../tensor.js';
import { checkFloats, checkIndices, checkOptions, code, emptyLike } from './common.js';

/** Options of {@link rope}. */
export interface RopeOptions {
  /** Base of the angles, Hugging Face's rope_theta (default 10000; Llama 3 uses 500000). */
  theta?: number;
  /** Position of the first token: token t is at offset + t (default 0). Ignored when positions are given. */
  offset?: number;
  /** Explicit positions, i32 [T] (shared by the batch) or [B, T]. */
  positions?: Tensor;
}

/**
 * x [B, T, H, D] (the projection's layout, heads not yet moved before the tokens) rotated by its
 * positions; D must be even. Angles are computed in double and rounded once; bf16/f16 inputs are
 * rotated in f32 and rounded once.
 */
export function rope(x: Tensor, opts: RopeOptions = {}): Tensor {
  checkFloats('rope', { x });
  checkOptions('rope', opts, { theta: 'number', offset: 'integer', positions: 'any' });
  if (x.ndim !== 4) throw new ShapeError(`rope: x must be [B, T, H, D], got ${x.describe()}`);
  const [B, T, H, D] = x.shape as [number, number, number, number];
  if (D % 2 !== 0) throw new ShapeError(`rope: the head dim D must be even, got ${x.describe()}`);
  const theta = opts.theta ?? 10000;
  if (!(theta > 0) || !Number.isFinite(theta)) throw new ArgumentError(`rope: theta must be a finite number > 0, got ${theta}`);
  const offset = opts.offset ?? 0;
  if (offset < 0) throw new ArgumentError(`rope: offset must be >= 0, got ${offset}`);
  let pos: Tensor | null = null;
  if (opts.positions !== undefined) {
    pos = checkIndices('rope', 'positions', opts.positions);
    checkSameDevice('rope', x, pos);
    const ok = (pos.ndim === 1 && pos.shape[0] === T) || (pos.ndim === 2 && pos.shape[0] === B && pos.shape[1] === T);
    if (!ok) throw new ShapeError(`rope: positions must be i32 [${T}] or [${B}, ${T}] for x ${x.describe()}, got ${pos.describe()}`);
  }
  const run = (inp: Tensor, inverse: boolean, p: Tensor | null): Tensor => {
    const out = emptyLike(inp);
    inp.backend.rope(inp.storage, out.storage, p ? p.storage : null, pos ? pos.size : 0, B, T, H, D, pos ? 0 : offset, theta, inverse, code(inp));
    return out;
  };
  const out = run(x, false, pos);
  if (!needsGrad(x)) return out;
  const ps = pos ? save(pos) : null;
  return record('rope', out, [x], (g) => [run(g, true, ps)], ps ? [ps] : []);
}
