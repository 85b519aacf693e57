// The parallel topology (Megatron's parallel_state): the rank math of a TP × PP × DP mesh, the
// process groups built once from it, and accessors that fail loudly before initialization.
import { tensor } from '../creation.js';
import * as dist from '../distributed/init.js';
import { setFlightMesh } from '../distributed/flight.js';
import { ArgumentError, StateError } from '../errors.js';
import type { CollectiveGroup, WorldGroup } from '../distributed/group.js';

export type ParallelDim = 'tp' | 'pp' | 'dp';

export interface ParallelLayout {
  tp: number;
  pp: number;
  dp: number;
  /** Dimensions from fastest- to slowest-varying rank; default 'tp-pp-dp' (TP groups are contiguous ranks). */
  order?: string;
}

export type MeshCoords = Record<ParallelDim, number>;

const DIMS: readonly ParallelDim[] = ['tp', 'pp', 'dp'];

function parseOrder(order: string): ParallelDim[] {
  const parts = order.split('-');
  const ok = parts.length === 3 && DIMS.every((d) => parts.includes(d));
  if (!ok) throw new ArgumentError(`parallel layout: order must name tp, pp and dp once each, separated by '-' (e.g. 'tp-pp-dp'), got '${order}'`);
  return parts as ParallelDim[];
}

/** Pure rank arithmetic of a mesh: no communication, so it is the same on every rank and testable anywhere. */
export class MeshLayout {
  readonly tp: number;
  readonly pp: number;
  readonly dp: number;
  readonly order: readonly ParallelDim[];
  readonly worldSize: number;
  readonly #stride: MeshCoords;

  constructor(layout: ParallelLayout, worldSize?: number) {
    for (const d of DIMS) {
      const v = layout[d];
      if (!Number.isInteger(v) || v < 1) throw new ArgumentError(`parallel layout: ${d} must be an integer >= 1, got ${v}`);
    }
    this.tp = layout.tp; this.pp = layout.pp; this.dp = layout.dp;
    this.order = parseOrder(layout.order ?? 'tp-pp-dp');
    this.worldSize = this.tp * this.pp * this.dp;
    if (worldSize !== undefined && worldSize !== this.worldSize) {
      throw new ArgumentError(`parallel layout: tp·pp·dp = ${this.tp}·${this.pp}·${this.dp} = ${this.worldSize} but the world has ${worldSize} ranks`);
    }
    const stride = { tp: 0, pp: 0, dp: 0 };
    let s = 1;
    for (const d of this.order) { stride[d] = s; s *= this[d]; }
    this.#stride = stride;
  }

  sizeOf(dim: ParallelDim): number { return this[dim]; }

  coords(rank: number): MeshCoords {
    this.#checkRank(rank);
    const c = { tp: 0, pp: 0, dp: 0 };
    for (const d of this.order) c[d] = Math.floor(rank / this.#stride[d]) % this[d];
    return c;
  }

  rankOf(c: MeshCoords): number {
    let r = 0;
    for (const d of DIMS) {
      if (!Number.isInteger(c[d]) || c[d] < 0 || c[d] >= this[d]) throw new ArgumentError(`mesh: ${d} coordinate ${c[d]} is outside [0, ${this[d]})`);
      r += c[d] * this.#stride[d];
    }
    return r;
  }

  /** World ranks of `rank`'s group along `dim`, in group-rank order (the coordinate along dim). */
  groupRanks(dim: ParallelDim, rank: number): number[] {
    const c = this.coords(rank);
    return Array.from({ length: this[dim] }, (_, i) => this.rankOf({ ...c, [dim]: i }));
  }

  /** Every group along `dim`, ordered by their lowest rank (the order every rank creates them in). */
  allGroups(dim: ParallelDim): number[][] {
    const out: number[][] = [];
    for (let r = 0; r < this.worldSize; r++) if (this.coords(r)[dim] === 0) out.push(this.groupRanks(dim, r));
    return out;
  }

  /**
   * The embedding groups (Megatron's): for each (tp, dp) coordinate, the first and the last pipeline
   * stage, which both hold the tied token embedding and sum its gradient. None when pp = 1 (one
   * stage holds both uses of the one parameter).
   */
  embeddingGroups(): number[][] {
    if (this.pp === 1) return [];
    return this.allGroups('pp').map((ranks) => [ranks[0]!, ranks[this.pp - 1]!]);
  }

  /** Stable text of the layout, compared across ranks to catch mismatched launches. */
  describe(): string { return `tp=${this.tp} pp=${this.pp} dp=${this.dp} order=${this.order.join('-')}`; }

  #checkRank(rank: number): void {
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.worldSize) throw new ArgumentError(`mesh: rank ${rank} is outside [0, ${this.worldSize})`);
  }
}

/** One rank's view of an initialized mesh: its coordinates and its groups along each dimension. */
export class ParallelState {
  /**
   * @param embeddingGroup this rank's embedding group (first and last pipeline stage of its (tp, dp)
   *   coordinate), or null when pp = 1 or the rank is on a middle stage.
   */
  constructor(readonly layout: MeshLayout, readonly rank: number, readonly world: CollectiveGroup,
    readonly groups: Readonly<Record<ParallelDim, CollectiveGroup>>, readonly embeddingGroup: CollectiveGroup | null = null) {}
  get coords(): MeshCoords { return this.layout.coords(this.rank); }
  get tpRank(): number { return this.coords.tp; }
  get ppRank(): number { return this.coords.pp; }
  get dpRank(): number { return this.coords.dp; }
  get tpSize(): number { return this.layout.tp; }
  get ppSize(): number { return this.layout.pp; }
  get dpSize(): number { return this.layout.dp; }
  get tpGroup(): CollectiveGroup { return this.groups.tp; }
  get ppGroup(): CollectiveGroup { return this.groups.pp; }
  get dpGroup(): CollectiveGroup { return this.groups.dp; }
  get isFirstStage(): boolean { return this.ppRank === 0; }
  get isLastStage(): boolean { return this.ppRank === this.layout.pp - 1; }
}

let current: ParallelState | null = null;

export interface InitializeParallelOptions {
  /** The world to build the mesh over; default: nt.distributed's (after nt.distributed.init()). */
  world?: WorldGroup;
  /** Install the result as this process's mesh for the accessors (default true; in-process rank simulations pass false). */
  install?: boolean;
}

/**
 * Builds every TP, PP and DP group once. Every world rank must call it with the same layout:
 * the layouts are compared across ranks first, and a mismatch is an ArgumentError on every rank.
 */
export async function initializeParallel(layout: ParallelLayout, options: InitializeParallelOptions = {}): Promise<ParallelState> {
  const install = options.install ?? true;
  const world = options.world ?? distributedWorld();
  if (install && current) throw new StateError('initializeParallel: the mesh is already initialized (call destroyParallel() first)');
  const mesh = new MeshLayout(layout, world.size);
  await checkSameLayoutEverywhere(world, mesh);
  const groups = {} as Record<ParallelDim, CollectiveGroup>;
  for (const dim of mesh.order) {
    // Group creation is collective over the world: every rank creates every group, in the same order.
    for (const ranks of mesh.allGroups(dim)) {
      const g = await world.newGroup(ranks);
      if (ranks.includes(world.rank)) groups[dim] = g;
    }
  }
  let embeddingGroup: CollectiveGroup | null = null;
  for (const ranks of mesh.embeddingGroups()) {
    const g = await world.newGroup(ranks);
    if (ranks.includes(world.rank)) embeddingGroup = g;
  }
  const state = new ParallelState(mesh, world.rank, world, groups, embeddingGroup);
  if (install) {
    current = state;
    setFlightMesh(Array.from({ length: mesh.worldSize }, (_, r) => mesh.coords(r)), world.rank, Object.fromEntries(Object.entries(groups).map(([d, g]) => [d, g.name])));
  }
  return state;
}

function distributedWorld(): WorldGroup {
  if (!dist.isInitialized()) throw new StateError('initializeParallel: call nt.distributed.init() first (or pass options.world)');
  const w = dist.world();
  return {
    rank: w.rank, size: w.size, ranks: w.ranks, name: w.name,
    allReduce: (t, o) => w.allReduce(t, o),
    allGather: (out, t) => w.allGather(out, t),
    reduceScatter: (out, t, o) => w.reduceScatter(out, t, o),
    broadcast: (t, o) => w.broadcast(t, o),
    send: (t, dst) => w.send(t, dst),
    recv: (t, src) => w.recv(t, src),
    // Non-members get a handle too (whose ops throw); the mesh keeps only groups that contain this rank.
    newGroup: (ranks) => dist.newGroup(ranks) as Promise<CollectiveGroup>,
  };
}

async function checkSameLayoutEverywhere(world: CollectiveGroup, mesh: MeshLayout): Promise<void> {
  const mine = [mesh.tp, mesh.pp, mesh.dp, ...mesh.order.map((d) => DIMS.indexOf(d))];
  const seen = await rangeAcrossRanks(world, mine);
  if (seen) {
    throw new ArgumentError(`initializeParallel: ranks were started with different layouts (this rank: ${mesh.describe()}; ` +
      `values seen across ranks range from [${seen.min.join(',')}] to [${seen.max.join(',')}] as [tp,pp,dp,order])`);
  }
}

/**
 * Compares integer values across every member of `group` (two max-allReduces): null when every
 * member passed the same values, else their elementwise minimum and maximum. Every member must
 * pass as many values, and every member learns the outcome, so all of them can fail together.
 */
export async function rangeAcrossRanks(group: CollectiveGroup, values: readonly number[]): Promise<{ min: number[]; max: number[] } | null> {
  if (values.some((v) => !Number.isInteger(v) || Math.abs(v) > 0x7fffffff)) throw new ArgumentError(`rangeAcrossRanks: values must be 32-bit integers, got [${values.join(',')}]`);
  using hi = tensor(new Int32Array(values), [values.length], { dtype: 'i32' });
  using lo = tensor(new Int32Array(values.map((v) => -v)), [values.length], { dtype: 'i32' });
  await group.allReduce(hi, { op: 'max' });
  await group.allReduce(lo, { op: 'max' });
  const max = Array.from(hi.toArraySync()), min = Array.from(lo.toArraySync(), (v) => 0 - v);
  return max.some((v, i) => v !== min[i]) ? { min, max } : null;
}

/** The installed mesh; StateError before initializeParallel(). */
export function parallelState(): ParallelState {
  if (!current) throw new StateError('the parallel mesh is not initialized: call initializeParallel(world, { tp, pp, dp }) first');
  return current;
}

export function isParallelInitialized(): boolean { return current !== null; }

/** Forgets the installed mesh (its groups belong to the distributed package and stay open). */
export function destroyParallel(): void { current = null; }

export const tpRank = (): number => parallelState().tpRank;
export const tpSize = (): number => parallelState().tpSize;
export const tpGroup = (): CollectiveGroup => parallelState().tpGroup;
export const ppRank = (): number => parallelState().ppRank;
export const ppSize = (): number => parallelState().ppSize;
export const ppGroup = (): CollectiveGroup => parallelState().ppGroup;
export const dpRank = (): number => parallelState().dpRank;
export const dpSize = (): number => parallelState().dpSize;
export const dpGroup = (): CollectiveGroup => parallelState().dpGroup;
