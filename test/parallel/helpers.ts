// Shared helpers of the parallel tests: seeded random data, float64 references and a group wrapper that counts calls.
import * as nt from '../../lib/index.js';
import type { ProcessGroup } from '../../lib/parallel/group.js';

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
export function countingGroup(g: ProcessGroup, log: string[]): ProcessGroup {
  const wrap = <K extends 'allReduce' | 'allGather' | 'reduceScatter' | 'broadcast' | 'send' | 'recv'>(k: K) =>
    ((...args: unknown[]) => { log.push(k); return (g[k] as (...a: unknown[]) => unknown).apply(g, args); }) as ProcessGroup[K];
  return {
    get rank() { return g.rank; }, get size() { return g.size; }, get ranks() { return g.ranks; }, get name() { return g.name; },
    allReduce: wrap('allReduce'), allGather: wrap('allGather'), reduceScatter: wrap('reduceScatter'),
    broadcast: wrap('broadcast'), send: wrap('send'), recv: wrap('recv'),
  };
}
