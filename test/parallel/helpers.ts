// Shared helpers of the parallel tests: seeded random data, float64 references and a group wrapper that counts calls.
import * as nt from '../../lib/index.js';
import type { CollectiveGroup } from '../../lib/distributed/group.js';

/** Deterministic pseudo-random floats in [-1, 1) (mulberry32), independent of the library under test. */
export function randomArray(n: number, seed: number): Float32Array {
  let a = seed >>> 0;
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    out[i] = (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 2 - 1;
  }
  return out;
}

export function randomTensor(shape: number[], seed: number): nt.Tensor {
  return nt.tensor(randomArray(shape.reduce((a, b) => a * b, 1), seed), shape);
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i]! - b[i]!));
  return m;
}

/** Wraps a group, logging every collective it is asked to start. */
export function countingGroup(g: CollectiveGroup, log: string[]): CollectiveGroup {
  const wrap = <K extends 'allReduce' | 'allGather' | 'reduceScatter' | 'broadcast' | 'send' | 'recv'>(k: K) =>
    ((...args: unknown[]) => { log.push(k); return (g[k] as (...a: unknown[]) => unknown).apply(g, args); }) as CollectiveGroup[K];
  return {
    get rank() { return g.rank; }, get size() { return g.size; }, get ranks() { return g.ranks; }, get name() { return g.name; },
    allReduce: wrap('allReduce'), allGather: wrap('allGather'), reduceScatter: wrap('reduceScatter'),
    broadcast: wrap('broadcast'), send: wrap('send'), recv: wrap('recv'),
  };
}

/** The chain tests' parameter shapes (odd sizes, so chunks over 2–4 ranks need padding). */
export const CHAIN_SHAPES = [[7, 3], [5], [1, 11], [13], [2, 2]];
export const ALL = [0, 1, 2, 3, 4];

/** Seeded parameters of CHAIN_SHAPES that require grad (the same values in every call). */
export function leafParams(): nt.Tensor[] {
  return CHAIN_SHAPES.map((s, i) => { const p = randomTensor(s, 100 + i); p.requiresGrad = true; return p; });
}

/**
 * A loss over the parameters `chain` lists, in which each one's gradient depends on all that
 * follow it (s_k = Σ tanh(p_k · s_{k-1} ⊙ a_k), each p_k on the path from the loss to the one
 * before), so backward finishes them strictly in reverse chain order.
 */
export function chainLoss(params: nt.Tensor[], rank: number, micro: number, chain: readonly number[] = ALL): nt.Tensor {
  return nt.scope(() => {
    let s: nt.Tensor | null = null;
    for (const i of chain) {
      const p = params[i]!;
      const a = randomTensor(p.shape as number[], 7000 + 100 * micro + 10 * rank + i);
      s = nt.sum(nt.tanh(nt.mul(s ? nt.mul(p, s) : p, a)));
    }
    return s!;
  });
}

/** The gradients a rank computes alone (plain autograd), summed over its micro-batches. */
function localGrads(rank: number, micros: number, chain: readonly number[], firstMicro: number): Float32Array[] {
  const params = leafParams();
  for (let m = firstMicro; m < firstMicro + micros; m++) chainLoss(params, rank, m, chain).backward();
  const grads = params.map((p) => (p.grad ? p.grad.toArraySync() as Float32Array : new Float32Array(p.size)));
  for (const p of params) p.dispose();
  return grads;
}

/** Float64 mean over ranks of each parameter's local gradient (micro-batches firstMicro.. summed). */
export function meanOverRanks(world: number, micros: number, chainOf: (rank: number) => readonly number[] = () => ALL, firstMicro = 0): Float64Array[] {
  const perRank = Array.from({ length: world }, (_, r) => localGrads(r, micros, chainOf(r), firstMicro));
  return perRank[0]!.map((_, i) => {
    const m = new Float64Array(perRank[0]![i]!.length);
    for (const grads of perRank) grads[i]!.forEach((v, j) => { m[j] += v / world; });
    return m;
  });
}
