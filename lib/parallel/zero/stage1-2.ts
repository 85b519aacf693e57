// ZeRO stages 1 and 2: the bucket engine (../buckets.ts) with the reduce-scatter sync. Gradients are
// reduce-scattered bucket by bucket from autograd's post-accumulate-grad hooks while backward runs,
// so each rank receives the averaged gradient of its elements, and after the update the buckets'
// parameters are allgathered back.
//
// Each bucket is laid out flat (Megatron's distributed optimizer): its parameters back to back, the
// total padded to a multiple of the group size N, and rank r holds the contiguous range
// [r*S, (r+1)*S) of it (S = padded/N), parameters straddling the boundaries. The bucket's flat
// buffer is its reduceScatter's input as it is, so it is every gradient's home: a gradient
// allocator makes each parameter's first gradient of a round a view of its range there (as
// GradBuffer does for plain data parallelism), backward writes it in place, later micro-batches
// accumulate into it, and nothing is copied into the bucket. A gradient that is not its view when
// marked (set by hand, or left from a step that was not zeroed) is copied in once. Because the
// buckets decide which rank holds which elements, they are never rebuilt in readiness order (as
// Megatron's buffers): the first step's buckets are the last.
//
// Stage 1 communicates once per step: earlier micro-batches accumulate full gradients without
// communication (noSync), and the last one's backward starts each bucket's reduce-scatter as the
// bucket fills. The full gradients stay (stage 1 shards only the optimizer state).
// Stage 2 shards the gradients as they are produced: every backward pass lets go of each gradient
// as soon as it is final and in its bucket (p.grad becomes null; the bucket's buffer is the only
// full gradient) and reduce-scatters the bucket, so a rank never holds more than the buckets being
// filled or in flight, not the whole model's gradients; the shards of successive micro-batches add up.
//
// What a backward pass leaves incomplete is launched when it ends (zeros for gradients that never
// came). Parameters in `deferred` (a pipeline's tied embedding, whose gradient the stages sum after
// backward) are left alone by the hooks and reduce-scattered in step().
import { registerGradAllocator, type RemovableHandle } from '../../autograd/engine.js';
import { dtypeCode } from '../../dtype.js';
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { emptyOn, viewOf, type Tensor } from '../../tensor.js';
import type { CollectiveGroup } from '../../distributed/group.js';
import { bucketRuns, GradientBuckets, type Bucket, type BucketSync } from '../buckets.js';
import { copyElements, FlatLayout } from '../flat.js';
import { ChunkedShards, type ElementRange, type HeldSplit, type PartitionedParam } from './chunks.js';

export interface GradientShardOptions {
  stage: 1 | 2;
  offload: boolean;
  /** Target bytes of full gradients per bucket (a parameter never straddles two buckets; it may straddle two ranks' ranges). */
  bucketBytes: number;
  /** Reduce-scatter from the hooks during backward (false: everything in step()). */
  overlap: boolean;
  /** Parameters whose gradient is completed after backward by the caller: reduce-scattered in step(). */
  deferred: readonly Tensor[];
  /**
   * The parameters in the order the model creates them (model.parameters()); the buckets take them
   * in reverse, roughly backward's order. Default: the parameter groups' order.
   */
  order?: readonly Tensor[];
}

/** What the reduction did (counts since construction), for tests and benchmarks. */
export interface ReduceStats {
  /** Buckets reduce-scattered from the hooks (or in step() without overlap), and the deferred ones reduce-scattered in step(). */
  buckets: number;
  /** Buckets deferred to step() (parameters whose gradient the caller completes after backward). */
  deferredBuckets: number;
  /** Rounds: launches of every (non-deferred) bucket, one per backward with sync on, or one in step(). */
  rounds: number;
  /** Bucket reduce-scatters launched (the deferred ones included). */
  reduceScatters: number;
  /** Of those, the ones a hook launched while backward was still running (a bucket's last gradient ready). */
  duringBackward: number;
  /**
   * The most bytes of full gradients seen at a hook (the parameters' .grad, buckets being filled or
   * in flight): at stage 2 a few buckets' worth, at stage 1 the whole model's and more.
   */
  peakFullGradBytes: number;
}

/** Reductions in flight beyond which a hook waits for the oldest (bounds the full-gradient bytes held). */
const MAX_IN_FLIGHT = 2;

/** This rank's piece of one parameter inside a bucket. */
interface HeldPiece {
  part: PartitionedParam;
  /** Its first element inside this rank's shard of the bucket (the reduceScatter's output). */
  shardOffset: number;
  count: number;
}

/** A bucket laid out flat: its parameters back to back, padded to N·S; rank r holds [r·S, (r+1)·S). */
interface FlatRun {
  layout: FlatLayout;
  /** S: the elements each rank holds of the bucket (the reduceScatter's output, the allGather's input). */
  shard: number;
  /** This rank's pieces of the bucket's parameters. */
  pieces: HeldPiece[];
  /** The run's reduce-scattered gradient, summed over the reductions since the last step. */
  gradShard: Tensor | null;
}

/** The flat layout of a bucket holding `params` over `n` ranks. */
function flatLayoutOf(params: readonly Tensor[], n: number): { layout: FlatLayout; shard: number } {
  const layout = new FlatLayout(params, n, 'ZeroOptimizer');
  return { layout, shard: layout.paddedCount / n };
}

/** The elements rank r holds of a parameter at `offset` (`count` elements) of a bucket whose ranks hold `shard` each. */
function heldRange(offset: number, count: number, shard: number, r: number): ElementRange {
  const lo = Math.max(offset, r * shard), hi = Math.min(offset + count, (r + 1) * shard);
  return hi > lo ? { start: lo - offset, count: hi - lo } : { start: 0, count: 0 };
}

/**
 * Which elements of each parameter each of `n` ranks holds when the buckets cut from `order` (first
 * bucket first) are laid out flat: what the masters are built from, before the buckets exist. A
 * parameter's split is computed on demand (no per-rank list: O(parameters), not O(parameters × ranks)).
 */
function flatHoldings(order: readonly Tensor[], deferred: ReadonlySet<Tensor>, bucketBytes: number, n: number): Map<Tensor, HeldSplit> {
  const held = new Map<Tensor, HeldSplit>();
  for (const run of bucketRuns(order, deferred, bucketBytes)) {
    const { layout, shard } = flatLayoutOf(run.params, n);
    for (const { param, offset, count } of layout.entries) {
      // The ranks whose ranges it overlaps: the most any of them holds.
      let chunk = 0;
      for (let r = Math.floor(offset / shard); r * shard < offset + count && r < n; r++) chunk = Math.max(chunk, heldRange(offset, count, shard, r).count);
      held.set(param, { range: (r) => heldRange(offset, count, shard, r), chunk });
    }
  }
  return held;
}

export class GradientShards extends ChunkedShards {
  readonly stage: 1 | 2;
  readonly overlap: boolean;
  readonly #buckets: GradientBuckets<FlatRun>;
  readonly #allocators: RemovableHandle[] = [];
  /** The views of bucket buffers handed out as gradients, by parameter, with the buffer each is a view of. */
  readonly #views = new Map<Tensor, { view: Tensor; flat: Tensor }>();
  #peakFullGradBytes = 0;

  constructor(groups: readonly Tensor[][], group: CollectiveGroup, options: GradientShardOptions) {
    const call = `ZeroOptimizer(stage ${options.stage})`;
    const all = groups.flat(), known = new Set(all);
    const deferred = new Set(options.deferred);
    for (const p of deferred) if (!known.has(p)) throw new ArgumentError(`${call}: a deferred parameter ${p.describe()} is not one of the optimizer's parameters`);
    const order = options.order ?? all;
    if (order.length !== known.size || new Set(order).size !== order.length || order.some((p) => !known.has(p))) {
      throw new ArgumentError(`${call}: the bucket order must list every parameter of the optimizer exactly once`);
    }
    if (!(options.bucketBytes > 0)) throw new ArgumentError(`${call}: bucketBytes must be > 0, got ${options.bucketBytes}`);
    // The engine's buckets take the order in reverse; each rank holds its range of each, laid out flat.
    super(groups, group, options.offload, call, flatHoldings([...order].reverse(), deferred, options.bucketBytes, group.size));
    this.stage = options.stage;
    this.overlap = options.overlap;
    this.#buckets = new GradientBuckets(order, {
      name: this.call, group, sync: this.#reduceScatterSync(), bucketBytes: options.bucketBytes, overlap: options.overlap, deferred,
      oneRoundPerStep: this.stage === 1, roundPerPass: true, maxInFlight: MAX_IN_FLIGHT, rebuild: false,
      onReady: () => { this.#peakFullGradBytes = Math.max(this.#peakFullGradBytes, this.memory().fullGrads); },
    });
    for (const p of order) if (p.requiresGrad) this.#allocators.push(registerGradAllocator(p, (q) => this.#gradHome(q)));
  }

  // The view backward writes p's first gradient of a round into: p's range of its bucket's buffer
  // (none once p is marked this round: a second synchronized backward is an error the hooks report).
  #gradHome(p: Tensor): Tensor | null {
    const home = this.#buckets.home(p);
    if (!home) return null;
    return this.#attach(p, home.bucket.layout.layout.entries[home.index]!.offset, home.flat);
  }

  /** The view of p's range (from `offset`) in `flat`, made p.grad (disposing whatever gradient p held). */
  #attach(p: Tensor, offset: number, flat: Tensor): Tensor {
    let v = this.#views.get(p);
    if (!v || v.flat !== flat || v.view.disposed) {
      v = { view: keep(viewOf(flat, offset, p.shape)), flat };
      this.#views.set(p, v);
    }
    if (p.grad !== v.view) { p.grad?.dispose(); p.grad = v.view; }
    return v.view;
  }

  /** Whether p.grad is the live view of p's range in `flat`. */
  #isView(p: Tensor, flat: Tensor): boolean {
    const v = this.#views.get(p);
    return v !== undefined && v.flat === flat && p.grad === v.view && !v.view.disposed;
  }

  /** Whether p.grad is the view of p's range in its bucket's buffer (what backward writes and accumulates into, with no copy). */
  gradIsView(p: Tensor): boolean {
    const v = this.#views.get(p);
    return v !== undefined && p.grad === v.view && !v.view.disposed;
  }

  /** Puts the gradient of the bucket's parameter `i` into `flat` (nothing to do when backward wrote it there); stage 2 then lets go of p.grad. */
  #pack(b: Bucket<FlatRun>, i: number, flat: Tensor): void {
    const e = b.layout.layout.entries[i]!, p = e.param;
    if (!this.#isView(p, flat)) {
      const old = p.grad && !p.grad.disposed ? p.grad : null;
      if (old && old.dtype !== 'f32') throw new StateError(`${this.call}: the gradient of '${p.describe()}' is ${old.dtype}, expected f32`);
      // A parameter without a gradient contributes zeros.
      if (old) copyElements(flat, e.offset, old, 0, e.count);
      else {
        using range = viewOf(flat, e.offset, [e.count]);
        range.backend.fill(range.storage, dtypeCode('f32'), e.count, 0);
      }
      if (this.stage === 1) {
        p.grad = null;
        this.#attach(p, e.offset, flat);
      }
      old?.dispose();
      if (this.stage === 2) p.grad = null;
    } else if (this.stage === 2) {
      // The bucket's buffer is the only full gradient from here on.
      p.grad!.dispose();
      p.grad = null;
    }
  }

  /** The reduce-scatter sync over the buckets' flat buffers (the gradients' homes): this rank's reduced range added to the bucket's gradShard. */
  #reduceScatterSync(): BucketSync<FlatRun> {
    const n = this.group.size;
    return {
      layout: (params) => {
        const { layout, shard } = flatLayoutOf(params, n), r = this.group.rank;
        const pieces: HeldPiece[] = [];
        for (const e of layout.entries) {
          const part = this.parts.get(e.param)!, held = this.rangeOf(part);
          const expected = heldRange(e.offset, e.count, shard, r);
          if (held.count !== expected.count || (held.count > 0 && held.start !== expected.start)) {
            throw new StateError(`${this.call}: the buckets no longer match the shards (${e.param.describe()}); ZeRO 1/2's buckets are fixed at construction`);
          }
          if (held.count > 0) pieces.push({ part, shardOffset: e.offset + held.start - r * shard, count: held.count });
        }
        return { layout, shard, pieces, gradShard: null };
      },
      // Uninitialized: pack() writes every parameter's range; the padding is zeroed here.
      allocate: (b) => {
        const { layout } = b.layout;
        const flat = keep(emptyOn([layout.paddedCount], 'f32', this.paramDevice));
        const pad = layout.paddedCount - layout.count;
        if (pad > 0) {
          using tail = viewOf(flat, layout.count, [pad]);
          tail.backend.fill(tail.storage, dtypeCode('f32'), pad, 0);
        }
        return flat;
      },
      pack: (b, i, flat) => this.#pack(b, i, flat),
      start: (b, flat) => {
        const out = keep(emptyOn([b.layout.shard], 'f32', this.paramDevice));
        try {
          return { work: this.group.reduceScatter(out, flat, { op: 'avg' }), out };
        } catch (e) {
          out.dispose();
          throw e;
        }
      },
      settle: (b, out) => this.foldReduced(b.layout, out),
      collect: (buckets) => this.#writeMasterGrads(buckets.map((b) => b.layout)),
    };
  }

  /** The masters' gradients from the buckets' reduced ranges (zeros for a bucket nothing reached); frees the buckets' shards. */
  #writeMasterGrads(runs: readonly FlatRun[]): void {
    this.zeroMasterGrads();
    for (const run of runs) {
      if (!run.gradShard) continue;
      for (const piece of run.pieces) copyElements(this.masters[piece.part.master]!.grad!, piece.part.masterOffset, run.gradShard, piece.shardOffset, piece.count);
      run.gradShard.dispose();
      run.gradShard = null;
    }
  }

  /** This rank's range of the bucket, from the masters, on the parameters' device (the padding zero): its part of the bucket's allGather. */
  #localShard(run: FlatRun): Tensor {
    const local = keep(emptyOn([run.shard], 'f32', this.paramDevice, true));
    for (const piece of run.pieces) this.copyFromMaster(local, piece.shardOffset, this.masters[piece.part.master]!, piece.part.masterOffset, piece.count);
    return local;
  }

  get stats(): ReduceStats {
    const all = this.#buckets.buckets, deferredBuckets = all.filter((b) => b.deferred).length, c = this.#buckets.counts;
    return {
      buckets: all.length - deferredBuckets, deferredBuckets, rounds: c.rounds, reduceScatters: c.launched,
      duringBackward: c.launchedOnReady, peakFullGradBytes: this.#peakFullGradBytes,
    };
  }

  /**
   * Runs fn with gradient communication off: gradients accumulate in p.grad and are reduce-scattered
   * by the next synchronized backward or by step(). At stage 1, every micro-batch but the last.
   */
  async noSync<T>(fn: () => T | Promise<T>): Promise<T> {
    if (this.stage === 1 && this.#buckets.syncedThisStep) {
      throw new StateError(`${this.call}.noSync: this step's gradients were already reduce-scattered by a backward with sync on; ` +
        'stage 1 communicates once per step, so the micro-batch that syncs must be the last (call step() first)');
    }
    return this.#buckets.noSync(fn);
  }

  /**
   * Before the update: launches what no backward reduced (gradients accumulated under noSync, set
   * by hand, or every gradient without overlap), then the deferred parameters, waits for every
   * reduction and writes the shards into the masters' gradients. After the first step with hooks,
   * the buckets are rebuilt in the order that step's gradients were ready (rank 0's, for every rank).
   */
  async finishGradients(): Promise<void> {
    await this.#buckets.finish();
  }

  /** After the update: every bucket's updated chunks allgathered into the parameters (the next bucket's gather runs while one is unpacked). */
  async finishStep(): Promise<void> {
    const runs = this.#buckets.buckets.map((b) => b.layout);
    const start = (run: FlatRun) => {
      const local = this.#localShard(run);
      const full = keep(emptyOn([run.layout.paddedCount], 'f32', this.paramDevice));
      return { run, local, full, work: this.group.allGather(full, local) };
    };
    let next: ReturnType<typeof start> | null = runs.length > 0 ? start(runs[0]!) : null;
    for (let i = 0; next; i++) {
      const cur = next;
      try {
        next = i + 1 < runs.length ? start(runs[i + 1]!) : null;
        await cur.work;
        // The gathered bucket is its parameters back to back: one copy each.
        for (const e of cur.run.layout.entries) copyElements(e.param, 0, cur.full, e.offset, e.count);
      } finally {
        cur.local.dispose();
        cur.full.dispose();
      }
    }
  }

  zeroGrad(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    // Reductions already started finish on every rank; their results are dropped.
    this.#buckets.drop();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
  }

  /** Abandons a failed step: its reductions are let go unawaited (the buckets' abandon), the gradients dropped. */
  abandon(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    this.#buckets.abandon();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
  }

  /** The bucket order (GradientBuckets.orderState), for a process that must launch the same reductions. */
  override orderState(): { order: number[]; rebuilt: boolean } { return this.#buckets.orderState(); }

  /**
   * Takes the bucket order another rank's orderState() gave: the same as this one's (the buckets
   * decide which rank holds which elements, so they never change); another is a StateError.
   */
  override loadOrderState(s: { order: number[]; rebuilt: boolean }): void {
    const own = this.#buckets.orderState().order;
    if (!Array.isArray(s?.order) || s.order.length !== own.length || s.order.some((i, k) => i !== own[k])) {
      throw new StateError(`${this.call}: another bucket order was given; ZeRO 1/2's buckets are fixed at construction (which rank holds which elements follows them)`);
    }
  }

  /**
   * Bytes of full gradients (the parameters', counted once where they are views of a bucket being
   * filled or in flight; the buckets' buffers) and of shard gradients.
   */
  memory(): { fullGrads: number; shardGrads: number } {
    const inBuckets = this.#buckets.memory();
    let fullGrads = inBuckets.inputs, shardGrads = inBuckets.outputs;
    for (const p of this.parts.keys()) {
      if (!p.grad || p.grad.disposed) continue;
      const v = this.#views.get(p);
      if (!(v && v.view === p.grad && !v.flat.disposed)) fullGrads += p.grad.nbytes;
    }
    for (const b of this.#buckets.buckets) if (b.layout.gradShard) shardGrads += b.layout.gradShard.nbytes;
    for (const m of this.masters) if (m.grad) shardGrads += m.grad.nbytes;
    return { fullGrads, shardGrads };
  }

  /** Removes the hooks and gradient allocators and frees the shards and buffers (gradients handed out as views keep their bytes until disposed). */
  dispose(): void {
    for (const h of this.#allocators) h.remove();
    this.#allocators.length = 0;
    this.#views.clear();
    this.#buckets.dispose();
    for (const b of this.#buckets.buckets) { b.layout.gradShard?.dispose(); b.layout.gradShard = null; }
    this.disposeMasters();
  }
}
