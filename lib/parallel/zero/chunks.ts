// The shard layout every ZeRO stage shares: which elements of each parameter each rank of the
// data-parallel group holds, and this rank's pieces packed into one master tensor per parameter
// group. Two splits: stage 3 cuts each parameter into equal per-rank chunks (the last zero-padded)
// and packs a run of parameters (a unit) into the rank-major buffers its allGather and
// reduceScatter move, so any run makes an even collective; stages 1 and 2 give the split
// themselves (`held`: each rank's contiguous range of every gradient bucket laid out flat,
// stage1-2.ts), so a gradient written into its bucket is already in the reduce-scatter's input.
import { accumulateInto } from '../../autograd/engine.js';
import type { BucketOrder } from '../buckets.js';
import { parseDevice, type Device } from '../../device.js';
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { emptyOn, type Tensor } from '../../tensor.js';
import { copyElements, FlatLayout } from '../flat.js';
import type { CollectiveGroup } from '../../distributed/group.js';

/** An element range of a parameter: [start, start + count) (count ≤ 0: nothing). */
export interface ElementRange { start: number; count: number }

/**
 * Where one parameter's chunks live: by default chunk `rank` of ceil(size/N) elements, zero-padded
 * at the end; with `held`, the range each rank holds.
 */
export interface PartitionedParam {
  param: Tensor;
  /** Elements of each rank's chunk (the even split; with `held`, the most any rank holds). */
  chunk: number;
  /** The elements rank r holds (stages 1 and 2); null: the even split. */
  held: ((rank: number) => ElementRange) | null;
  /** The parameter group (and master tensor) holding this rank's chunk, and where in it. */
  master: number;
  masterOffset: number;
}

/** How a parameter is split when the caller gives the split (stages 1 and 2): rank r's range, and the most any rank holds. */
export interface HeldSplit { range: (rank: number) => ElementRange; chunk: number }

/** This rank's chunk of one parameter: where it is in the masters and which elements of the parameter it holds. */
export interface LocalChunk { param: Tensor; master: number; masterOffset: number; start: number; count: number }

/** A parameter inside a run's per-rank shard. */
export interface ShardSlot {
  part: PartitionedParam;
  name: string;
  /** First element of the chunk inside the run's per-rank shard. */
  offset: number;
}

/**
 * Parameters whose chunks travel in one collective. Rank r's part of the run's allGather (and of
 * its reduceScatter's input) is the concatenation of r's chunks of the parameters, in slot order.
 */
export interface ShardRun {
  slots: ShardSlot[];
  /** Elements each rank contributes to the run's gather (and receives from its reduce-scatter). */
  shardCount: number;
  /** The run's reduce-scattered gradient, summed over the reductions since the last step. */
  gradShard: Tensor | null;
}

/**
 * The partition of a list of parameter groups over a process group. Subclasses add when the
 * collectives happen; this holds where every chunk is and how runs are packed.
 */
export abstract class ChunkedShards {
  /** This rank's chunks of each parameter group's parameters, back to back: what the inner optimizer updates. */
  readonly masters: Tensor[];
  protected readonly group: CollectiveGroup;
  protected readonly parts = new Map<Tensor, PartitionedParam>();
  protected readonly paramDevice: Device;
  protected readonly call: string;

  /**
   * Copies this rank's chunks into the masters (on the CPU with `offload`). `held`: the elements
   * each rank holds of each parameter, by rank (default: the even split); a master keeps exactly
   * this rank's elements then, and with the even split a whole chunk per parameter (padding included).
   */
  constructor(groups: readonly Tensor[][], group: CollectiveGroup, offload: boolean, call: string, held?: ReadonlyMap<Tensor, HeldSplit>) {
    this.group = group;
    this.call = call;
    const n = group.size;
    if (groups.some((ps) => ps.length === 0)) throw new ArgumentError(`${call}: a parameter group has no parameters`);
    // One dtype, one device, no parameter twice (across groups too).
    const layout = new FlatLayout(groups.flat(), 1, 'ZeroOptimizer');
    if (layout.dtype !== 'f32') throw new ArgumentError(`${call}: parameters are ${layout.dtype}; this implementation shards f32 parameters`);
    this.paramDevice = layout.entries[0]!.param.deviceInfo;
    const masterDevice = offload ? parseDevice('cpu') : this.paramDevice;
    this.masters = groups.map((ps, gi) => {
      let offset = 0;
      for (const p of ps) {
        const split = held?.get(p) ?? null;
        if (held && !split) throw new ArgumentError(`${call}: no split of ${p.describe()} over the ${n} ranks`);
        const chunk = split ? split.chunk : Math.ceil(p.size / n);
        this.parts.set(p, { param: p, chunk, held: split ? split.range : null, master: gi, masterOffset: offset });
        offset += split ? Math.max(0, split.range(group.rank).count) : chunk;
      }
      const master = keep(emptyOn([offset], 'f32', masterDevice, true));
      for (const p of ps) {
        const part = this.parts.get(p)!;
        const { start, count } = this.rangeOf(part);
        if (count <= 0) continue;
        if (masterDevice.name === this.paramDevice.name) copyElements(master, part.masterOffset, p, start, count);
        else {
          using here = p.to(masterDevice.name);
          copyElements(master, part.masterOffset, here, start, count);
        }
      }
      return master;
    });
  }

  /** The parameters, all groups in order. */
  get params(): Tensor[] { return [...this.parts.keys()]; }

  /** The elements of the parameter that rank `rank`'s chunk covers (count ≤ 0: padding only). */
  protected rangeOf(part: PartitionedParam, rank = this.group.rank): ElementRange {
    if (part.held) return part.held(rank);
    const start = rank * part.chunk;
    return { start, count: Math.min(part.chunk, part.param.size - start) };
  }

  /** The slots of a run (even split) holding `params` (with their names for messages) in the given order. */
  protected slotsOf(params: readonly (readonly [Tensor, string])[]): { slots: ShardSlot[]; shardCount: number } {
    const slots: ShardSlot[] = [];
    let offset = 0;
    for (const [p, name] of params) {
      const part = this.parts.get(p)!;
      slots.push({ part, name, offset });
      offset += part.chunk;
    }
    return { slots, shardCount: offset };
  }

  /** Calls fn for this rank's chunk of every parameter (padding left out): its master and where in it. */
  forEachLocalChunk(fn: (param: Tensor, master: Tensor, masterOffset: number, count: number) => void): void {
    for (const part of this.parts.values()) {
      const { count } = this.rangeOf(part);
      if (count > 0) fn(part.param, this.masters[part.master]!, part.masterOffset, count);
    }
  }

  /**
   * Where this rank's chunk of every parameter is (padding-only chunks left out): the parameter, its
   * master (group) and offset there, and the elements [start, start + count) of the parameter it holds.
   */
  localChunks(): LocalChunk[] {
    const out: LocalChunk[] = [];
    for (const part of this.parts.values()) {
      const { start, count } = this.rangeOf(part);
      if (count > 0) out.push({ param: part.param, master: part.master, masterOffset: part.masterOffset, start, count });
    }
    return out;
  }

  /** Copies `count` elements of a master (from `masterOffset`) into `dst` at `offset`, across devices when offloaded. */
  protected copyFromMaster(dst: Tensor, offset: number, master: Tensor, masterOffset: number, count: number): void {
    if (count <= 0) return;
    if (master.device === dst.device) copyElements(dst, offset, master, masterOffset, count);
    else {
      using host = emptyOn([count], 'f32', master.deviceInfo);
      copyElements(host, 0, master, masterOffset, count);
      using here = host.to(dst.device);
      copyElements(dst, offset, here, 0, count);
    }
  }

  /** This rank's chunks of the run's parameters, from the masters, on the parameters' device: its part of the run's allGather (stage 3). */
  protected localShard(run: ShardRun): Tensor {
    const local = emptyOn([run.shardCount], 'f32', this.paramDevice, true);
    for (const s of run.slots) this.copyFromMaster(local, s.offset, this.masters[s.part.master]!, s.part.masterOffset, s.part.chunk);
    return local;
  }

  /** Writes an allGather's result ([rank][run shard], even split) into the parameters' own storage. */
  protected unpackGathered(run: ShardRun, full: Tensor): void {
    const n = this.group.size;
    for (const s of run.slots) {
      for (let r = 0; r < n; r++) {
        const { start, count } = this.rangeOf(s.part, r);
        if (count > 0) copyElements(s.part.param, start, full, r * run.shardCount + s.offset, count);
      }
    }
  }

  /**
   * Copies the slot's parameter's gradient rank by rank into `input` ([rank][run shard], even split), the input
   * of the run's reduceScatter (where nothing is copied the input keeps its zeros). With `release`
   * the gradient is freed (p.grad becomes null). Returns whether the parameter had a gradient.
   */
  protected packGrad(run: ShardRun, slot: ShardSlot, input: Tensor, release: boolean): boolean {
    const p = slot.part.param, grad = p.grad;
    if (!grad) return false;
    if (grad.dtype !== 'f32') throw new StateError(`${this.call}: the gradient of '${slot.name}' is ${grad.dtype}, expected f32`);
    for (let r = 0; r < this.group.size; r++) {
      const { start, count } = this.rangeOf(slot.part, r);
      if (count > 0) copyElements(input, r * run.shardCount + slot.offset, grad, start, count);
    }
    if (release) { grad.dispose(); p.grad = null; }
    return true;
  }

  /** Adds a finished reduceScatter's output (this rank's shard of the run) into run.gradShard, on the masters' device; consumes `out`. */
  protected foldReduced(run: { gradShard: Tensor | null }, out: Tensor): void {
    const masterDevice = this.masters[0]!.deviceInfo;
    const shard = out.device === masterDevice.name ? out : keep(out.to(masterDevice.name));
    if (shard !== out) out.dispose();
    if (run.gradShard) {
      accumulateInto(run.gradShard, shard);
      shard.dispose();
    } else {
      run.gradShard = shard;
    }
  }

  /** Zero-filled gradients for the masters (what a run nothing reached leaves). */
  protected zeroMasterGrads(): void {
    for (const m of this.masters) {
      m.grad?.dispose();
      m.grad = keep(emptyOn(m.shape, 'f32', m.deviceInfo, true));
    }
  }

  /** The masters' gradients from the runs' reduced shards (zeros for a run nothing reached); frees the runs' shards (stage 3). */
  protected writeMasterGrads(runs: readonly ShardRun[]): void {
    this.zeroMasterGrads();
    for (const run of runs) {
      if (!run.gradShard) continue;
      for (const s of run.slots) copyElements(this.masters[s.part.master]!.grad!, s.part.masterOffset, run.gradShard, s.offset, s.part.chunk);
      run.gradShard.dispose();
      run.gradShard = null;
    }
  }

  /**
   * Collective: every parameter's full value gathered from the masters, as new tensors in `params`
   * order (the caller owns them). The even split only (stage 3; stages 1 and 2 keep whole parameters).
   */
  async fullParameters(): Promise<Tensor[]> {
    const n = this.group.size;
    if ([...this.parts.values()].some((part) => part.held)) throw new StateError(`${this.call}: fullParameters gathers the even split only; these parameters are whole on every rank`);
    const out = new Map<Tensor, Tensor>();
    for (const master of this.masters) {
      using local = master.device === this.paramDevice.name ? master.clone() : master.to(this.paramDevice.name);
      using full = emptyOn([n * master.size], 'f32', this.paramDevice);
      await this.group.allGather(full, local);
      for (const part of this.parts.values()) {
        if (this.masters[part.master] !== master) continue;
        const t = emptyOn(part.param.shape, 'f32', this.paramDevice);
        for (let r = 0; r < n; r++) {
          const { start, count } = this.rangeOf(part, r);
          if (count > 0) copyElements(t, start, full, r * master.size + part.masterOffset, count);
        }
        out.set(part.param, t);
      }
    }
    return this.params.map((p) => out.get(p)!);
  }

  /** Drops every gradient: the parameters', the runs' shards and the masters'. */
  abstract zeroGrad(): void;
  /**
   * Abandons a step that failed midway (a collective failed; nothing is awaited): what the stage
   * holds for the step is let go and the gradients dropped, so the next step starts clean.
   */
  abstract abandon(): void;

  /** The gradient buckets' order (stages 1 and 2 override; stage 3 has no buckets). */
  orderState(): BucketOrder | null { return null; }

  /** Takes a bucket order orderState() gave (stages 1 and 2 override). */
  loadOrderState(_s: BucketOrder): void {}

  /** Frees what the subclass holds and the masters. */
  abstract dispose(): void;

  /** Frees the masters and their gradients. */
  protected disposeMasters(): void {
    for (const m of this.masters) { m.grad?.dispose(); m.dispose(); }
  }
}
