// What the two test doubles of the cuda addon's NCCL surface share (test/distributed/fake-nccl.ts: ranks of
// one process; test/helpers/file-nccl.ts: ranks of separate processes): element sizes by dtype code, the
// reduction of one element over the ranks' inputs, and the collective calls of NcclNativeComm, each of
// which posts one op (what posting and completing it means is each double's own).
import type { NativeStorage } from '../../lib/native.js';

/** Bytes of an element by NCCL-surface dtype code (f32, f16, bf16, i32, u8). */
export const ELEMENT_BYTES = [4, 2, 2, 4, 1];

/** A buffer of an op: a storage and an element offset. */
export interface Buf { s: NativeStorage; off: number }

/** One element of a reduction over the ranks' values `xs`, in rank order (op codes: sum, avg, max, min, prod). */
export function reduceElement(op: number, xs: number[], dtype: number): number {
  if (op === 2) return Math.max(...xs);
  if (op === 3) return Math.min(...xs);
  if (op === 4) return xs.reduce((a, b) => a * b, 1);
  const s = xs.reduce((a, b) => a + b, 0);
  return op === 1 ? (dtype === 3 ? Math.trunc(s / xs.length) : s / xs.length) : s;
}

/** The collective calls of a fake communicator, each one op posted through postCollective (op and root undefined where the call has none). */
export abstract class CollectiveCalls {
  protected abstract postCollective(kind: string, send: Buf, recv: Buf, count: number, dtype: number, op?: number, root?: number): number;

  allReduce(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number, op: number): number {
    return this.postCollective('allReduce', { s, off: so }, { s: r, off: ro }, n, dt, op);
  }
  broadcast(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number, root: number): number {
    return this.postCollective('broadcast', { s, off: so }, { s: r, off: ro }, n, dt, undefined, root);
  }
  reduce(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number, op: number, root: number): number {
    return this.postCollective('reduce', { s, off: so }, { s: r, off: ro }, n, dt, op, root);
  }
  allGather(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number): number {
    return this.postCollective('allGather', { s, off: so }, { s: r, off: ro }, n, dt);
  }
  reduceScatter(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number, op: number): number {
    return this.postCollective('reduceScatter', { s, off: so }, { s: r, off: ro }, n, dt, op);
  }
  allToAll(s: NativeStorage, so: number, r: NativeStorage, ro: number, n: number, dt: number): number {
    return this.postCollective('allToAll', { s, off: so }, { s: r, off: ro }, n, dt);
  }
}
