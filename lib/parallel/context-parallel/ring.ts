// Ring attention (Megatron-core's context parallelism): the sequence is split over a context-parallel
// (cp) group with Megatron's causal load balancing — the sequence is cut into 2·cp chunks and rank i
// holds chunks i and 2·cp−1−i, so every rank does the same attention work under the causal mask.
// Key/value blocks travel around the ring (send to rank i+1, receive from rank i−1) while each rank
// runs flash attention of its queries on the block it holds; the partial outputs are combined exactly
// with online softmax through each block's per-row log-sum-exp. Backward re-circulates the key/value
// blocks and passes their gradient accumulators along with them, so after cp steps each rank holds
// the full gradient of its own keys and values.
//
// Why no block needs an offset mask: with chunk indices a (queries) and b (keys), a block is either
// fully visible (a > b), causal on the diagonal (a = b: the same chunk), or invisible (a < b).
import { accumulateInto, needsGrad, own, record, save } from '../../autograd/engine.js';
import { dtypeCode } from '../../dtype.js';
import { ArgumentError, ShapeError } from '../../errors.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { finishSync } from '../../distributed/finish-sync.js';
import { add, div, exp, log, mul, scale as scaleBy, sqrt, sub } from '../../ops/index.js';
import { flashLayout } from '../../ops/attention.js';

/** The checks both context-parallel attentions make of their packed input: qkv [B, T/cp, 3·heads·D]. */
export function checkPackedQkv(call: string, qkv: Tensor, heads: number): void {
  if (!Number.isInteger(heads) || heads < 1) throw new ArgumentError(`${call}: heads must be a positive integer, got ${heads}`);
  if (qkv.ndim !== 3 || qkv.shape[2]! % (3 * heads) !== 0) throw new ShapeError(`${call}: qkv must be [B, T/cp, 3·heads·D] with ${heads} heads, got ${qkv.describe()}`);
}

/** A range of token positions of a sequence. */
export interface TokenRange {
  /** The first position. */
  start: number;
  /** The number of positions. */
  count: number;
}

/**
 * The global positions a cp rank holds of a sequence of `seqLen` tokens under ring attention's load
 * balancing: chunk `rank` then chunk 2·cp−1−rank of the 2·cp equal chunks. A ShapeError when 2·cp
 * does not divide seqLen.
 */
export function ringChunks(seqLen: number, cp: number, rank: number): TokenRange[] {
  if (seqLen % (2 * cp) !== 0) {
    throw new ShapeError(`ring attention: the sequence length ${seqLen} is not a multiple of 2·cp = ${2 * cp} (each of the ${cp} context-parallel ranks holds two of 2·cp equal chunks)`);
  }
  const c = seqLen / (2 * cp);
  return [{ start: rank * c, count: c }, { start: (2 * cp - 1 - rank) * c, count: c }];
}

/** Chunk index of half `h` (0 or 1) of rank `r`'s tokens among 2·cp chunks. */
const chunkOf = (r: number, h: number, cp: number) => (h === 0 ? r : 2 * cp - 1 - r);

/** Options of {@link ringAttentionPacked}. */
export interface RingAttentionOptions {
  /** Score scale (default 1/√D). */
  scale?: number;
}

/**
 * Causal self-attention of a sequence split over `group` (the context-parallel ranks) by
 * {@link ringChunks}: qkv [B, T/cp, 3·H·D] holds this rank's tokens (chunk rank, then chunk
 * 2·cp−1−rank) packed as [B, t, 3, H, D], like attentionPacked's input; returns [B, T/cp, H·D], the
 * heads merged back. Equals attentionPacked over the whole sequence, restricted to this rank's tokens,
 * to float32 rounding (forward and gradients). Every rank of the group must call it with the same shapes.
 */
export function ringAttentionPacked(qkv: Tensor, heads: number, group: CollectiveGroup, opts: RingAttentionOptions = {}): Tensor {
  const call = 'ringAttentionPacked';
  checkPackedQkv(call, qkv, heads);
  if (qkv.dtype !== 'f32' && qkv.dtype !== 'bf16' && qkv.dtype !== 'f16') throw new ArgumentError(`${call}: qkv must be f32, bf16 or f16, got ${qkv.dtype}`);
  const [B, Tl, W] = qkv.shape as [number, number, number];
  const cp = group.size, r = group.rank;
  if (Tl % 2 !== 0) throw new ShapeError(`${call}: this rank's ${Tl} tokens are not two equal chunks (the sequence length must be a multiple of 2·cp = ${2 * cp})`);
  const H = heads, C = W / 3, D = C / H, c = Tl / 2;
  const scale = opts.scale ?? 1 / Math.sqrt(D);
  if (!Number.isFinite(scale)) throw new ArgumentError(`${call}: scale must be finite, got ${scale}`);
  const dev = qkv.deviceInfo, dt = qkv.dtype, dc = dtypeCode(dt);
  const blk = B * H * c * D;
  // Compact buffers: Q [2 halves, B, H, c, D]; KV [k|v, 2 halves, B, H, c, D] (one message per ring step).
  const Q = emptyOn([2, B, H, c, D], dt, dev), KV = emptyOn([2, 2, B, H, c, D], dt, dev);
  qkv.backend.copy_strided(qkv.storage, Q.storage, dc, new Int32Array([2, B, H, c, D]), new Int32Array([c * W, Tl * W, D, W, 1]), 0,
    new Int32Array([blk, H * c * D, c * D, D, 1]), 0);
  qkv.backend.copy_strided(qkv.storage, KV.storage, dc, new Int32Array([2, 2, B, H, c, D]), new Int32Array([C, c * W, Tl * W, D, W, 1]), C,
    new Int32Array([2 * blk, blk, H * c * D, c * D, D, 1]), 0);
  const qL = (a: number) => flashLayout(a * blk, H * c * D, c * D, D);
  const kL = (b: number) => flashLayout(b * blk, H * c * D, c * D, D);
  const vL = (b: number) => flashLayout(2 * blk + b * blk, H * c * D, c * D, D);
  const oL = flashLayout(0, H * c * D, c * D, D);
  /** The (query half, key half, causal) blocks of this rank's queries on rank j's keys. */
  const blocks = (j: number): [number, number, boolean][] => {
    const out: [number, number, boolean][] = [];
    for (let a = 0; a < 2; a++) for (let b = 0; b < 2; b++) {
      const qa = chunkOf(r, a, cp), kb = chunkOf(j, b, cp);
      if (qa >= kb) out.push([a, b, qa === kb]);
    }
    return out;
  };
  const next = (r + 1) % cp, prev = (r - 1 + cp) % cp;
  /** Sends `t` to the next rank and receives the previous rank's into a new tensor; returns it once both are done. */
  const shift = (t: Tensor): Tensor => {
    const into = emptyOn(t.shape, t.dtype, dev);
    // Even ranks send first and odd ranks receive first, so blocking transports never wait on each other in a cycle.
    finishSync(() => {
      if (r % 2 === 0) {
        const s = group.send(t, next);
        return [s, group.recv(into, prev)];
      }
      const v = group.recv(into, prev);
      return [v, group.send(t, next)];
    }, { call, group, buffers: [into] });
    return into;
  };

  // Forward: per query half a, the running output (f32 [B, H, c, D]) and log-sum-exp (f32 [B, H, c]).
  const acc: { o: Tensor | null; l: Tensor | null }[] = [{ o: null, l: null }, { o: null, l: null }];
  let cur = KV;
  try {
    for (let s = 0; s < cp; s++) {
      const j = (r - s + cp) % cp;
      for (const [a, b, causal] of blocks(j)) {
        const o = emptyOn([B, H, c, D], dt, dev), l = emptyOn([B, H, c], 'f32', dev);
        qkv.backend.flash_attention_forward(Q.storage, cur.storage, cur.storage, o.storage, l.storage, qL(a), kL(b), vL(b), oL,
          B, H, c, c, D, scale, causal, 0, dc);
        const o32 = dt === 'f32' ? o : o.to('f32');
        if (o32 !== o) o.dispose();
        merge(acc[a]!, o32, l);
      }
      if (s < cp - 1) {
        const got = shift(cur);
        if (cur !== KV) cur.dispose();
        cur = got;
      }
    }
  } finally {
    if (cur !== KV) cur.dispose();
    KV.dispose();
  }
  const out = emptyOn([B, Tl, C], dt, dev);
  for (let a = 0; a < 2; a++) {
    const o = dt === 'f32' ? acc[a]!.o! : acc[a]!.o!.to(dt);
    // [B, H, c, D] into the merged heads [B, Tl, H·D] at rows a·c…
    o.backend.copy_strided(o.storage, out.storage, dc, new Int32Array([B, H, c, D]), new Int32Array([H * c * D, c * D, D, 1]), 0,
      new Int32Array([Tl * C, D, C, 1]), a * c * C);
    if (o !== acc[a]!.o) o.dispose();
    acc[a]!.o!.dispose();
  }
  const lse = [acc[0]!.l!, acc[1]!.l!];
  if (!needsGrad(qkv)) { Q.dispose(); for (const l of lse) l.dispose(); return out; }
  const qs = save(qkv), os = save(out);
  return record(call, out, [qkv], (g) => {
    const gc = g;
    const Q2 = Q; // the compact queries, kept from forward
    const KV0 = emptyOn([2, 2, B, H, c, D], dt, dev);
    qs.backend.copy_strided(qs.storage, KV0.storage, dc, new Int32Array([2, 2, B, H, c, D]), new Int32Array([C, c * W, Tl * W, D, W, 1]), C,
      new Int32Array([2 * blk, blk, H * c * D, c * D, D, 1]), 0);
    const dQ = emptyOn([2, B, H, c, D], dt, dev, true);
    // Each query half's and each key half's kernel output lands in its own region of a zeroed scratch
    // tensor of the accumulator's shape (the kernel writes dq, dk, dv through q's, k's and v's layouts).
    const dQs = [emptyOn([2, B, H, c, D], dt, dev, true), emptyOn([2, B, H, c, D], dt, dev, true)];
    const dKVs = [emptyOn([2, 2, B, H, c, D], dt, dev, true), emptyOn([2, 2, B, H, c, D], dt, dev, true)];
    let kv = KV0, dKV = emptyOn([2, 2, B, H, c, D], dt, dev, true);
    const oLg = (a: number) => flashLayout(a * c * C, Tl * C, D, C);
    try {
      for (let s = 0; s < cp; s++) {
        const j = (r - s + cp) % cp;
        for (const [a, b, causal] of blocks(j)) {
          qs.backend.flash_attention_backward(Q2.storage, kv.storage, kv.storage, os.storage, gc.storage, lse[a]!.storage,
            dQs[a]!.storage, dKVs[b]!.storage, dKVs[b]!.storage, qL(a), kL(b), vL(b), oLg(a), B, H, c, c, D, scale, causal, 0, dc);
          accumulateInto(dQ, dQs[a]!);
          accumulateInto(dKV, dKVs[b]!);
        }
        if (s < cp - 1) {
          const got = shift(kv);
          kv.dispose();
          kv = got;
        }
        if (cp > 1) {
          const got = shift(dKV);
          dKV.dispose();
          dKV = got;
        }
      }
      const dqkv = emptyOn([B, Tl, W], dt, dev);
      qs.backend.copy_strided(dQ.storage, dqkv.storage, dc, new Int32Array([2, B, H, c, D]), new Int32Array([blk, H * c * D, c * D, D, 1]), 0,
        new Int32Array([c * W, Tl * W, D, W, 1]), 0);
      qs.backend.copy_strided(dKV.storage, dqkv.storage, dc, new Int32Array([2, 2, B, H, c, D]), new Int32Array([2 * blk, blk, H * c * D, c * D, D, 1]), 0,
        new Int32Array([C, c * W, Tl * W, D, W, 1]), C);
      return [dqkv];
    } finally {
      for (const t of [kv, dKV, dQ, ...dQs, ...dKVs]) t.dispose();
    }
  }, [qs, os, own(Q), own(lse[0]!), own(lse[1]!)]);
}

/**
 * Online softmax: folds a block's output o (f32 [B, H, c, D]) and log-sum-exp l (f32 [B, H, c]) into
 * the running pair (taking both tensors over). lse = m + log(e^(la−m) + e^(lb−m)) with m ≈ max(la, lb)
 * (m = (la + lb + |la − lb|)/2, so both exponents are ≤ 0 up to rounding and nothing overflows), and
 * o = (oa·e^(la−m) + ob·e^(lb−m)) / (e^(la−m) + e^(lb−m)).
 */
function merge(run: { o: Tensor | null; l: Tensor | null }, o: Tensor, l: Tensor): void {
  if (!run.o) { run.o = o; run.l = l; return; }
  const la = run.l!, oa = run.o;
  const d = sub(la, l);
  const dd = mul(d, d), ad = sqrt(dd), sum2 = add(add(la, l), ad), m = scaleBy(sum2, 0.5);
  const x1 = sub(la, m), x2 = sub(l, m);
  const ea = exp(x1), eb = exp(x2);
  const tot = add(ea, eb), lt = log(tot), lNew = add(m, lt);
  const shape4 = [...la.shape, 1];
  const wa0 = div(ea, tot), wb0 = div(eb, tot), wa = wa0.reshape(shape4), wb = wb0.reshape(shape4);
  const pa = mul(oa, wa), pb = mul(o, wb), oNew = add(pa, pb);
  for (const t of [d, dd, ad, sum2, m, x1, x2, ea, eb, tot, lt, wa0, wb0, wa, wb, pa, pb, oa, la, o, l]) t.dispose();
  run.o = oNew; run.l = lNew;
}
