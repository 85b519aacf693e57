// ZeRO stages 1 and 2 (DeepSpeed): each data-parallel rank keeps the optimizer state (and, at stage
// 2, the gradients) of one contiguous shard of the flattened parameters; a step reduce-scatters the
// gradients, updates the local shard and allgathers the updated parameters.
import { dtypeCode } from '../../dtype.js';
import { ArgumentError, StateError } from '../../errors.js';
import { parseDevice } from '../../device.js';
import { tensor } from '../../creation.js';
import { clipFactor, gradSumSquares, scaleGrads } from '../../optim/clip.js';
import { Lamb } from '../../optim/lamb.js';
import type { Optimizer } from '../../optim/optimizer.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import type { ProcessGroup } from '../group.js';
import { copyElements, FlatLayout } from '../flat.js';

export type ZeroStage = 1 | 2;

export interface ZeroOptions {
  /** The data-parallel group the state is sharded over. */
  group: ProcessGroup;
  stage: ZeroStage;
  /**
   * Keep the shard (master copy, its gradient, the optimizer state) in host memory and run the
   * update there. For parameters already on the CPU this moves nothing: the flag is accepted and
   * changes no placement.
   */
  offload?: boolean;
}

/** A parameter group as the caller's optimizer would take it: parameters plus option overrides. */
export type ZeroParamGroup<H> = { params: Iterable<Tensor> } & Partial<H>;

/** Builds the inner optimizer over the shard tensors (one per parameter group, with that group's options). */
export type InnerOptimizerFactory<H extends { lr: number }> = (groups: ZeroParamGroup<H>[]) => Optimizer<H>;

interface ShardedGroup {
  layout: FlatLayout;
  shardCount: number;
  /** This rank's slice of the flattened parameters: the tensor the inner optimizer updates. */
  master: Tensor;
}

/** How a gradient norm extends beyond the data-parallel group when the model itself is split (TP, PP). */
export interface GradNormScope {
  /** Parameters whose gradient another rank counts (a tensor-parallel replica, the tied embedding's second copy). */
  skip?: Iterable<Tensor>;
  /** Further groups holding the model's other parts: the sum of squares is summed over each in turn. */
  groups?: readonly ProcessGroup[];
}

/** Bytes held on one rank, by kind (what the ZeRO paper's formula predicts). */
export interface ZeroMemoryBytes {
  params: number;
  grads: number;
  optimizerState: number;
  masterShard: number;
  total: number;
}

export class ZeroOptimizer<H extends { lr: number }> {
  readonly inner: Optimizer<H>;
  readonly stage: ZeroStage;
  readonly group: ProcessGroup;
  readonly offload: boolean;
  readonly #groups: ShardedGroup[];

  constructor(params: Iterable<Tensor> | ZeroParamGroup<H>[], createOptimizer: InnerOptimizerFactory<H>, options: ZeroOptions) {
    if (options.stage !== 1 && options.stage !== 2) {
      throw new ArgumentError(`ZeroOptimizer: stage must be 1 or 2, got ${String(options.stage)} (stage 3, parameters sharded between layers, is not implemented)`);
    }
    this.stage = options.stage;
    this.group = options.group;
    this.offload = options.offload ?? false;
    const list = Array.from(params as Iterable<unknown>);
    const grouped = list.length > 0 && list.every((g) => g !== null && typeof g === 'object' && 'params' in (g as object));
    const userGroups: ZeroParamGroup<H>[] = grouped ? (list as ZeroParamGroup<H>[]) : [{ params: list as Tensor[] } as unknown as ZeroParamGroup<H>];
    const n = this.group.size;
    this.#groups = userGroups.map(({ params: ps }) => {
      const layout = new FlatLayout(Array.from(ps), n, 'ZeroOptimizer');
      if (layout.dtype !== 'f32') throw new ArgumentError(`ZeroOptimizer: parameters are ${layout.dtype}; this implementation shards f32 parameters`);
      const shardCount = layout.paddedCount / n;
      const device = this.offload ? parseDevice('cpu') : layout.entries[0]!.param.deviceInfo;
      const master = emptyOn([shardCount], 'f32', device, true);
      this.#copyShardFromParams(layout, master, shardCount);
      return { layout, shardCount, master };
    });
    this.inner = createOptimizer(userGroups.map(({ params: _ps, ...over }, i) => ({ ...over, params: [this.#groups[i]!.master] }) as unknown as ZeroParamGroup<H>));
    if (this.inner instanceof Lamb) {
      this.dispose();
      throw new ArgumentError('ZeroOptimizer: LAMB scales each parameter by its own norm ratio, which a shard that cuts parameters apart cannot compute; use an elementwise optimizer (AdamW, SGD)');
    }
    const inner = this.inner.paramGroups.flatMap((g) => g.params);
    if (inner.length !== this.#groups.length || inner.some((p, i) => p !== this.#groups[i]!.master)) {
      throw new ArgumentError('ZeroOptimizer: the factory must build the optimizer over exactly the shard groups it is given');
    }
  }

  /** The parameters (all groups, in order). */
  get params(): Tensor[] { return this.#groups.flatMap((g) => g.layout.entries.map((e) => e.param)); }

  // Each parameter range that intersects this rank's shard [start, start + shardCount).
  #forEachInShard(layout: FlatLayout, shardCount: number, fn: (param: Tensor, paramOffset: number, shardOffset: number, count: number) => void): void {
    const start = this.group.rank * shardCount, end = start + shardCount;
    for (const e of layout.entries) {
      const lo = Math.max(start, e.offset), hi = Math.min(end, e.offset + e.count);
      if (lo < hi) fn(e.param, lo - e.offset, lo - start, hi - lo);
    }
  }

  #copyShardFromParams(layout: FlatLayout, master: Tensor, shardCount: number): void {
    if (master.device === layout.entries[0]!.param.device) {
      this.#forEachInShard(layout, shardCount, (p, po, so, c) => copyElements(master, so, p, po, c));
      return;
    }
    this.#forEachInShard(layout, shardCount, (p, po, so, c) => {
      using here = p.to(master.device);
      copyElements(master, so, here, po, c);
    });
  }

  zeroGrad(): void {
    for (const p of this.params) { p.grad?.dispose(); p.grad = null; }
    for (const g of this.#groups) { g.master.grad?.dispose(); g.master.grad = null; }
  }

  /**
   * One update: reduce-scatter the averaged gradients (each rank receives its shard's), optionally
   * clip them to a global norm, step the shard, allgather the updated shards into every parameter.
   * Every rank of the group calls it. Returns the global gradient norm before clipping when
   * `maxGradNorm` is given.
   */
  async step(options: { maxGradNorm?: number; normScope?: GradNormScope } = {}): Promise<{ gradNorm?: number }> {
    const { maxGradNorm } = options;
    if (maxGradNorm !== undefined && !(typeof maxGradNorm === 'number' && maxGradNorm > 0)) {
      throw new ArgumentError(`ZeroOptimizer.step: maxGradNorm must be a number > 0, got ${String(maxGradNorm)}`);
    }
    for (const g of this.#groups) {
      const first = g.layout.entries[0]!.param;
      using flatGrad = emptyOn([g.layout.paddedCount], 'f32', first.deviceInfo, true);
      for (const e of g.layout.entries) {
        if (!e.param.grad) continue;
        if (e.param.grad.dtype !== 'f32') throw new StateError(`ZeroOptimizer.step: the gradient of ${e.param.describe()} is ${e.param.grad.dtype}, expected f32`);
        copyElements(flatGrad, e.offset, e.param.grad, 0, e.count);
      }
      using shardGrad = emptyOn([g.shardCount], 'f32', first.deviceInfo);
      await this.group.reduceScatter(shardGrad, flatGrad, { op: 'avg' });
      g.master.grad?.dispose();
      g.master.grad = shardGrad.device === g.master.device ? shardGrad.clone() : shardGrad.to(g.master.device);
      // Stage 2 keeps only the shard's gradient; the full per-parameter gradients are released.
      if (this.stage === 2) for (const e of g.layout.entries) { e.param.grad?.dispose(); e.param.grad = null; }
    }
    const gradNorm = maxGradNorm === undefined ? undefined : await this.#clipShardGrads(maxGradNorm, options.normScope ?? {});
    this.inner.step();
    for (const g of this.#groups) await this.#allGatherParams(g);
    return gradNorm === undefined ? {} : { gradNorm };
  }

  // The shards partition the averaged gradient (padding holds zeros), so the global sum of squares
  // is the group sum of the shards' sums (then summed over the scope's model-parallel groups).
  async #clipShardGrads(maxGradNorm: number, scope: GradNormScope): Promise<number> {
    const masters = this.#groups.map((g) => g.master);
    const first = this.#groups[0]!.layout.entries[0]!.param;
    const skip = new Set(scope.skip ?? []);
    let local = 0;
    if (skip.size === 0) local = gradSumSquares(masters);
    else {
      for (const g of this.#groups) {
        const shardGrad = g.master.grad!;
        this.#forEachInShard(g.layout, g.shardCount, (p, _po, so, c) => {
          if (skip.has(p)) return;
          using run = emptyOn([c], 'f32', shardGrad.deviceInfo);
          copyElements(run, 0, shardGrad, so, c);
          local += (run.backend.sumSquares([run.storage], [c], [dtypeCode('f32')]) as Float64Array)[0]!;
        });
      }
    }
    using total = tensor(new Float32Array([local]), [1], { device: first.device });
    await this.group.allReduce(total, { op: 'sum' });
    for (const g of scope.groups ?? []) if (g.size > 1) await g.allReduce(total, { op: 'sum' });
    const norm = Math.sqrt(total.toArraySync()[0]!);
    const factor = clipFactor(norm, maxGradNorm);
    if (factor < 1) scaleGrads(masters, factor);
    return norm;
  }

  async #allGatherParams(g: ShardedGroup): Promise<void> {
    const first = g.layout.entries[0]!.param;
    using local = g.master.device === first.device ? g.master.clone() : g.master.to(first.device);
    using full = emptyOn([g.layout.paddedCount], 'f32', first.deviceInfo);
    await this.group.allGather(full, local);
    for (const e of g.layout.entries) copyElements(e.param, 0, full, e.offset, e.count);
  }

  /** Bytes this rank holds now: parameters, gradients (full ones and the shard's), optimizer state, master shard. */
  memoryBytes(): ZeroMemoryBytes {
    const params = this.params.reduce((s, p) => s + p.nbytes, 0);
    let grads = this.params.reduce((s, p) => s + (p.grad && !p.grad.disposed ? p.grad.nbytes : 0), 0);
    let optimizerState = 0, masterShard = 0;
    for (const g of this.#groups) {
      masterShard += g.master.nbytes;
      if (g.master.grad) grads += g.master.grad.nbytes;
      const st = this.inner.state.get(g.master);
      if (st) for (const t of Object.values(st.tensors)) optimizerState += t.nbytes;
    }
    return { params, grads, optimizerState, masterShard, total: params + grads + optimizerState + masterShard };
  }

  dispose(): void {
    this.inner?.dispose();
    for (const g of this.#groups) { g.master.grad?.dispose(); g.master.dispose(); }
  }
}

/**
 * Per-rank bytes for Ψ f32 parameters over N ranks with an optimizer holding `stateBytesPerParam`
 * per parameter (Adam: 8), as this implementation holds them. The ZeRO paper's mixed-precision
 * count is 2Ψ + 2Ψ + KΨ (K = 12: f32 master, momentum, variance); for f32 training it becomes
 * 4Ψ params + 4Ψ grads + 8Ψ state, and sharding divides: stage 1 the state, stage 2 the gradients
 * too, stage 3 the parameters too. Differences from the paper, because shards cannot be views of
 * the parameters: each rank also keeps a 4Ψ/N f32 master copy of its shard, and at stage 1 the
 * shard's reduced gradient (4Ψ/N) beside the full gradients. Shards are ceil(Ψ/N) elements.
 */
export function zeroMemoryFormula(numParams: number, ranks: number, stage: 0 | ZeroStage | 3, stateBytesPerParam = 8): ZeroMemoryBytes {
  const psi = numParams;
  const shard = stage === 0 ? psi : Math.ceil(psi / ranks);
  const params = 4 * (stage >= 3 ? shard : psi);
  const grads = stage === 0 ? 4 * psi : stage === 1 ? 4 * psi + 4 * shard : 4 * shard;
  const optimizerState = stateBytesPerParam * shard;
  const masterShard = stage >= 1 ? 4 * shard : 0;
  return { params, grads, optimizerState, masterShard, total: params + grads + optimizerState + masterShard };
}
