// Parameter families, as Megatron keeps dense and expert buffers apart: each family is a set of
// parameters, the group over which they are identical copies, how their gradients are synchronized
// over it (bucketed all-reduce, ZeRO 1/2 or ZeRO 3) and the optimizer that updates them.
// ParallelTrainer holds a list of them and runs one step path over it: hold the syncs on micro-batches
// whose gradients are not final, finish them, one gradient norm over every family, clip, update.
//
// The families of a rank: `dense` (everything but the routed experts, copies over the data- and
// context-parallel ranks) and, under expert parallelism, `experts` (copies over the expert-data-
// parallel ranks only; the expert-parallel ranks hold other experts, so their squares add there).
import { ArgumentError } from '../errors.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { globalGradNorm, gradSumSquares, scaleGrads, type GradNormPart } from '../optim/clip.js';
import type { Optimizer } from '../optim/optimizer.js';
import type { Parameter } from '../nn/module.js';
import { moeLayers } from '../nn/moe.js';
import type { Tensor } from '../tensor.js';
import { traceSpan } from '../observe/trace.js';
import { engineOf } from './buckets.js';
import { GradBuffer } from './data-parallel/buffer.js';
import type { ParallelState } from './mesh.js';
import type { PipelineModule } from './pipeline/gpt-stage.js';
import { ZeroOptimizer, type InnerOptimizerFactory, type ZeroParamGroup } from './zero/optimizer.js';

/** How a family's gradients become the average over its copies. */
export type FamilySync<H extends { lr: number }> =
  /** No copies (or one): the gradients are final after backward. */
  | { readonly kind: 'none' }
  /** Plain data parallelism: bucketed all-reduce in place, started from backward's hooks. */
  | { readonly kind: 'buckets'; readonly buffer: GradBuffer }
  /** ZeRO 1, 2 or 3: reduce-scatter to the shards' owners; the ZeRO optimizer updates the shards and hands the update back. */
  | { readonly kind: 'zero'; readonly zero: ZeroOptimizer<H> };

/** One family of parameters (see the file's comment). */
export interface ParamFamily<H extends { lr: number }> {
  /** 'dense' or 'experts' (trace spans, messages). */
  readonly name: 'dense' | 'experts';
  /** The family's parameters, in model.parameters() order. */
  readonly params: readonly Parameter[];
  /** The group over which the parameters are identical copies (null: this rank holds the only copy). */
  readonly replicas: CollectiveGroup | null;
  /**
   * Groups beyond the model-parallel ones whose ranks hold other parameters of the family, so the
   * gradient norm's squares add over them (the experts: the expert-parallel group); empty for dense.
   */
  readonly partsOver: readonly CollectiveGroup[];
  /** How the gradients are synchronized over `replicas`. */
  readonly sync: FamilySync<H>;
  /**
   * The optimizer that updates the family: ZeRO's inner one over the shards, or one over whole
   * parameters (at ZeRO 0 the families share the trainer's one optimizer).
   */
  readonly optimizer: Optimizer<H>;
}

/** What buildFamilies needs of the trainer's options. */
export interface FamilyOptions<H extends { lr: number }> {
  /** The ZeRO stage (0: plain). */
  zero: 0 | 1 | 2 | 3;
  /** ZeRO's offload. */
  offload: boolean;
  /** Target bytes per gradient bucket (undefined: the default). */
  bucketBytes: number | undefined;
  /** Builds an optimizer over parameter groups. */
  createOptimizer: InnerOptimizerFactory<H>;
}

/**
 * The families of this rank: dense, and under expert parallelism (mesh.epSize > 1) the experts. At
 * ZeRO 0 one optimizer serves both (each family's gradients synchronized over its own group); under
 * ZeRO the dense parameters are sharded over the data- and context-parallel group and the experts
 * over their expert-data-parallel copies (with no copies, ep = dp, they keep a plain optimizer).
 */
export function buildFamilies<H extends { lr: number }>(model: PipelineModule, paramGroups: ZeroParamGroup<H>[], mesh: ParallelState | null, o: FamilyOptions<H>): ParamFamily<H>[] {
  const experts = new Set<Tensor>(mesh && mesh.epSize > 1 ? moeLayers(model).flatMap((l) => l.experts.flatMap((e) => e.parameters())) : []);
  const all = model.parameters();
  const denseParams = all.filter((p) => !experts.has(p)), expertParams = all.filter((p) => experts.has(p));
  const bucketing = o.bucketBytes ? { bucketBytes: o.bucketBytes } : {};
  const dpCp = mesh && mesh.dpCpGroup.size > 1 ? mesh.dpCpGroup : null;
  const edp = mesh?.edpGroup && mesh.edpGroup.size > 1 ? mesh.edpGroup : null;
  const expertFamily = (sync: FamilySync<H>, optimizer: Optimizer<H>): ParamFamily<H> => ({
    name: 'experts', params: expertParams, replicas: edp, partsOver: [mesh!.epGroup!], sync, optimizer,
  });
  if (o.zero === 0) {
    const optimizer = o.createOptimizer(paramGroups);
    const built: ParamFamily<H>[] = [];
    try {
      // Context-parallel ranks hold the same parameters as data-parallel ones: dense gradients average over both.
      const dense: FamilySync<H> = dpCp && denseParams.length > 0 ? { kind: 'buckets', buffer: new GradBuffer(denseParams, { group: dpCp, ...bucketing }) } : { kind: 'none' };
      built.push({ name: 'dense', params: denseParams, replicas: dpCp, partsOver: [], sync: dense, optimizer });
      if (expertParams.length > 0) {
        built.push(expertFamily(edp ? { kind: 'buckets', buffer: new GradBuffer(expertParams, { group: edp, ...bucketing }) } : { kind: 'none' }, optimizer));
      }
      return built;
    } catch (e) {
      disposeFamilies(built);
      optimizer.dispose();
      throw e;
    }
  }
  if (!dpCp) throw new ArgumentError(`ParallelTrainer: ZeRO ${o.zero} shards over a data-parallel group of more than one rank`);
  const stage = o.zero;
  // The tied embedding's gradient is complete only after the stages sum it, so ZeRO 1/2 leave it out
  // of the reduce-scatters that start during backward.
  const deferGrads = mesh!.embeddingGroup ? model.tiedParameters : [];
  const split = expertParams.length > 0 ? splitParamGroups(paramGroups, experts) : { dense: paramGroups, experts: [] };
  // ZeRO 1/2's buckets are fixed at construction: laid out in the order gradients are final in the
  // pass that synchronizes (a pipeline stage of several chunks says it), so their reduce-scatters overlap it.
  const readyOrder = (model as { gradientReadyOrder?(): Tensor[] }).gradientReadyOrder?.();
  const denseSet = new Set<Tensor>(denseParams);
  const denseOrder = readyOrder && readyOrder.length === all.length ? readyOrder.filter((p) => denseSet.has(p)) : denseParams;
  const dense = new ZeroOptimizer(split.dense, o.createOptimizer, { group: dpCp, stage, offload: o.offload, deferGrads, bucketOrder: denseOrder, ...bucketing });
  const families: ParamFamily<H>[] = [{ name: 'dense', params: denseParams, replicas: dpCp, partsOver: [], sync: { kind: 'zero', zero: dense }, optimizer: dense.inner }];
  try {
    if (expertParams.length > 0) {
      if (edp) {
        const zero = new ZeroOptimizer(split.experts, o.createOptimizer, { group: edp, stage, offload: o.offload, bucketOrder: expertParams, ...bucketing });
        families.push(expertFamily({ kind: 'zero', zero }, zero.inner));
      } else families.push(expertFamily({ kind: 'none' }, o.createOptimizer(split.experts)));
    }
  } catch (e) {
    dense.dispose();
    throw e;
  }
  // ZeRO 3's units: the model's blocks for the dense parameters; each expert for the experts.
  if (dense.stage === 3) dense.attach(model, { entries: ['forwardStage'], exclude: expertParams });
  const ez = families[1]?.sync.kind === 'zero' ? families[1].sync.zero : null;
  if (ez?.stage === 3) ez.attach(model, { units: moeLayers(model).flatMap((l) => l.experts), entries: ['forwardStage'], exclude: denseParams });
  return families;
}

/** The parameter groups cut in two: without the experts, and the experts only (groups left empty dropped). */
function splitParamGroups<H>(groups: ZeroParamGroup<H>[], experts: ReadonlySet<Tensor>): { dense: ZeroParamGroup<H>[]; experts: ZeroParamGroup<H>[] } {
  const part = (keep: (p: Tensor) => boolean) => groups.map((g) => ({ ...g, params: [...g.params].filter(keep) })).filter((g) => g.params.length > 0);
  return { dense: part((p) => !experts.has(p)), experts: part((p) => experts.has(p)) };
}

/** The ZeRO optimizer of a family, or null. */
export function zeroOf<H extends { lr: number }>(f: ParamFamily<H> | undefined): ZeroOptimizer<H> | null {
  return f?.sync.kind === 'zero' ? f.sync.zero : null;
}

/** Where a backward pass stands in a micro-batch: a whole backward, or a zero-bubble schedule's input (B) or weight (W) pass. */
export type BackwardPhase = 'backward' | 'input' | 'weight';

/**
 * Runs `go` (one micro-batch's backward pass) with each family's gradient communication held where
 * the gradients are not final yet: bucketed all-reduce and ZeRO 1 (which communicate once per step)
 * on every micro-batch but the last; ZeRO 2 and 3 under a zero-bubble schedule, whose micro-batch
 * gradients are final only after its W pass while the next micro-batch's B may come first: B runs
 * with the reductions held back (ZeRO 2: its hooks off, the gradients accumulate in full; ZeRO 3: the
 * units release their parameters but keep their gradients), W reduces (ZeRO 2: its hooks fill the
 * buckets and the pass's end launches the rest, B's gradients included; ZeRO 3: every unit
 * reduce-scatters). The first family's hold is the outermost.
 */
export function holdingSync<H extends { lr: number }>(families: readonly ParamFamily<H>[], final: boolean, phase: BackwardPhase, go: () => void | Promise<void>): void | Promise<void> {
  let run = go;
  for (let i = families.length - 1; i >= 0; i--) {
    const inner = run, sync = families[i]!.sync;
    if (sync.kind === 'buckets') {
      if (!final) run = () => sync.buffer.noSync(inner);
    } else if (sync.kind === 'zero') {
      const zero = sync.zero;
      if (zero.stage === 1) {
        if (!final) run = () => zero.noSync(inner);
      } else if (phase === 'input') {
        run = zero.stage === 3 ? () => zero.holdReductions(inner) : () => zero.noSync(inner);
      } else if (phase === 'weight' && zero.stage === 3) {
        run = () => {
          const out = inner();
          if (out) return out.then(() => zero.reduceHeld());
          zero.reduceHeld();
        };
      }
    }
  }
  return run();
}

/**
 * Finishes the bucketed all-reduces (their averages written back into .grad); the ZeRO families'
 * reduce-scatters are finished by {@link finishShardedSync}, after the caller has completed the
 * gradients ZeRO defers (the tied embedding's, summed over the stages that hold it).
 */
export async function finishBucketSync<H extends { lr: number }>(families: readonly ParamFamily<H>[]): Promise<void> {
  for (const f of families) {
    if (f.sync.kind === 'buckets') {
      const buffer = f.sync.buffer;
      await traceSpan(f.name === 'dense' ? 'grad sync' : `grad sync (${f.name})`, () => buffer.finishGradSync());
    }
  }
}

/** Finishes the ZeRO families' reduce-scatters: each rank's shards then hold the averaged gradients. */
export async function finishShardedSync<H extends { lr: number }>(families: readonly ParamFamily<H>[]): Promise<void> {
  for (const f of families) if (f.sync.kind === 'zero') await traceSpan(`grad reduce (ZeRO, ${f.name})`, () => zeroOf(f)!.reduceGradients());
}

/**
 * The norm of the whole model's gradient over every family, the same on every rank (after the syncs
 * finished): each family's part is this rank's squares that no other rank counts (`skip`: a
 * tensor-parallel replica, the tied embedding's second copy) — a ZeRO shard's summed over its
 * replicas, whole gradients not (the replicas hold the same average) — summed over the family's own
 * further groups (the experts' expert-parallel group); the parts add, and the total is summed over
 * the model-parallel groups (tensor, then pipeline).
 */
export function familiesGradNorm<H extends { lr: number }>(families: readonly ParamFamily<H>[], skip: ReadonlySet<Tensor>, modelParallel: readonly CollectiveGroup[]): Promise<number> {
  const parts: GradNormPart[] = families.map((f) => {
    const zero = zeroOf(f);
    const sumSquares = zero ? zero.shardGradSumSquares(skip) : gradSumSquares(f.params.filter((p) => !skip.has(p)));
    const groups = [...(zero ? [zero.group] : []), ...f.partsOver];
    return groups.length > 0 ? { sumSquares, groups } : { sumSquares };
  });
  return globalGradNorm(parts, modelParallel);
}

/** Multiplies every family's gradients by `factor` (< 1: clipping; a ZeRO family's shard gradients). */
export function scaleFamilyGrads<H extends { lr: number }>(families: readonly ParamFamily<H>[], factor: number): void {
  if (factor >= 1) return;
  for (const f of families) {
    const zero = zeroOf(f);
    if (zero) zero.scaleShardGrads(factor);
    else scaleGrads(f.params, factor);
  }
}

/** The distinct optimizers of the families, in family order (at ZeRO 0 the families share one). */
export function optimizersOf<H extends { lr: number }>(families: readonly ParamFamily<H>[]): Optimizer<H>[] {
  return [...new Set(families.map((f) => f.optimizer))];
}

/**
 * Updates every family: a ZeRO family its shards, then the update handed back to the parameters (an
 * all-gather at stages 1 and 2); another its optimizer, once however many families share it, through
 * `timed` (the trainer's compute time, which leaves the ZeRO step's collectives out).
 */
export async function updateFamilies<H extends { lr: number }>(families: readonly ParamFamily<H>[], timed: (fn: () => void) => void = (fn) => fn()): Promise<void> {
  const stepped = new Set<Optimizer<H>>();
  for (const f of families) {
    const zero = zeroOf(f);
    if (zero) await zero.step();
    else if (!stepped.has(f.optimizer)) timed(() => f.optimizer.step());
    stepped.add(f.optimizer);
  }
}

/** Drops every family's gradients (and a ZeRO family's shard gradients). */
export function zeroFamilyGrads<H extends { lr: number }>(families: readonly ParamFamily<H>[]): void {
  const done = new Set<unknown>();
  for (const f of families) {
    const owner = zeroOf(f) ?? f.optimizer;
    if (!done.has(owner)) owner.zeroGrad();
    done.add(owner);
  }
}

/**
 * Abandons a step that failed midway (a collective failed; in-job recovery): every family's
 * collectives in flight are let go unawaited (the communicator is dead), bucket marks and holds
 * reset, ZeRO 3's gathered parameters released, every gradient dropped. Never throws for a family
 * with nothing in flight.
 */
export function abandonFamilies<H extends { lr: number }>(families: readonly ParamFamily<H>[]): void {
  const done = new Set<unknown>();
  for (const f of families) {
    if (f.sync.kind === 'buckets') { const b = f.sync.buffer.buckets[0]; if (b) engineOf(b)?.abandon(); }
    const zero = zeroOf(f);
    if (zero) zero.abandonStep();
    const owner = zero ?? f.optimizer;
    if (!done.has(owner)) owner.zeroGrad();
    done.add(owner);
  }
}

import type { BucketOrder } from './buckets.js';
export type { BucketOrder };

/** Each family's bucket order, in family order (null where the family has no buckets). */
export function familyBucketOrders<H extends { lr: number }>(families: readonly ParamFamily<H>[]): (BucketOrder | null)[] {
  return families.map((f) => {
    if (f.sync.kind === 'buckets') { const b = f.sync.buffer.buckets[0]; return b ? engineOf(b)?.orderState() ?? null : null; }
    return zeroOf(f)?.bucketOrder() ?? null;
  });
}

/** Takes the bucket orders familyBucketOrders() gave on another process of the same layout (between steps). */
export function loadFamilyBucketOrders<H extends { lr: number }>(families: readonly ParamFamily<H>[], orders: readonly (BucketOrder | null)[]): void {
  families.forEach((f, i) => {
    const o = orders[i];
    if (!o) return;
    if (f.sync.kind === 'buckets') { const b = f.sync.buffer.buckets[0]; if (b) engineOf(b)?.loadOrderState(o); }
    zeroOf(f)?.loadBucketOrder(o);
  });
}

/** Frees the families' ZeRO shards, optimizers and gradient buffers (each once). */
export function disposeFamilies<H extends { lr: number }>(families: readonly ParamFamily<H>[]): void {
  const done = new Set<unknown>();
  for (const f of families) {
    const owner = zeroOf(f) ?? f.optimizer;
    if (!done.has(owner)) owner.dispose();
    done.add(owner);
    if (f.sync.kind === 'buckets') f.sync.buffer.dispose();
  }
}
