// What the parallel layer needs from a process group: the collectives it calls and the Work they
// return. lib/distributed's ProcessGroup (gloo, nccl) satisfies it structurally, and so does the
// in-process LocalGroup used to test parallel layouts without processes.
import type { Tensor } from '../tensor.js';

export type ReduceOp = 'sum' | 'avg' | 'max' | 'min' | 'prod';

/**
 * A started collective. Awaiting it (or `wait()`) resolves when the result is in the output
 * tensors. Code that must finish a collective inside a synchronous call (an autograd backward)
 * needs `waitSync`, which only groups whose communication runs off the JS thread can offer.
 */
export interface Work extends PromiseLike<unknown> {
  wait(): Promise<unknown>;
  waitSync?(): void;
}

/**
 * A set of ranks that run collectives together. Every member calls each collective in the same
 * order. Tensors are contiguous; allGather/reduceScatter treat them as flat arrays whose rank
 * chunks are consecutive (rank i owns elements [i·n, (i+1)·n) of the full buffer).
 */
export interface ProcessGroup {
  /** This process's index inside the group. */
  readonly rank: number;
  readonly size: number;
  /** Global (world) ranks of the members, in group-rank order. */
  readonly ranks: readonly number[];
  readonly name: string;
  /** In place: every member's `t` becomes the reduction of all members' `t`. */
  allReduce(t: Tensor, opts?: { op?: ReduceOp }): Work;
  /** `out` (size·n elements) receives every member's `input` (n elements), in rank order. */
  allGather(out: Tensor, input: Tensor): Work;
  /** `out` (n elements) receives chunk `rank` of the reduction of every member's `input` (size·n elements). */
  reduceScatter(out: Tensor, input: Tensor, opts?: { op?: ReduceOp }): Work;
  /** In place: every member's `t` becomes group rank `root`'s `t`. */
  broadcast(t: Tensor, opts: { root?: number }): Work;
  /** Point to point, by group rank. A send completes when the receiver has the data. */
  send(t: Tensor, dst: number): Work;
  recv(t: Tensor, src: number): Work;
}

/** A world group that can create subgroups; every world rank calls newGroup with the same ranks in the same order. */
export interface WorldGroup extends ProcessGroup {
  newGroup(ranks: readonly number[]): ProcessGroup | Promise<ProcessGroup>;
}
