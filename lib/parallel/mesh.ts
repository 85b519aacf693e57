// The parallel topology (Megatron's parallel_state): the rank math of a TP × CP × PP × DP mesh, the
// process groups built once from it, and accessors that fail loudly before initialization.
// CP (context parallelism) splits the sequence; like DP it holds whole copies of the parameters, so
// gradients are averaged over the DP × CP ranks of a (tp, pp) coordinate (Megatron's
// data-parallel group with context parallelism), which is also the group ZeRO shards over.
import * as dist from '../distributed/init.js';
import { setFlightMesh } from '../distributed/flight.js';
import { ArgumentError, StateError } from '../errors.js';
import type { CollectiveGroup, WorldGroup } from '../distributed/group.js';
import { rangeAcrossRanks } from '../distributed/agree.js';

/** A mesh dimension: tensor-, context-, pipeline- or data-parallel. */
export type ParallelDim = 'tp' | 'cp' | 'pp' | 'dp';

/** The sizes of a TP × PP × DP mesh. */
export interface ParallelLayout {
  /** Tensor-parallel ranks. */
  tp: number;
  /** Pipeline stages. */
  pp: number;
  /** Data-parallel ranks. */
  dp: number;
  /** Context-parallel ranks (the sequence split over them; default 1). */
  cp?: number;
  /**
   * Dimensions from fastest- to slowest-varying rank; default 'tp-cp-pp-dp' (TP groups are contiguous
   * ranks, then CP, as in Megatron). An order naming only tp, pp and dp gets cp right after tp.
   */
  order?: string;
  /**
   * Expert-parallel ranks (default 1): each data-parallel group splits into dp/ep expert-parallel
   * groups of ep consecutive data-parallel ranks, which split the MoE experts among them; the ranks
   * at the same place of each form an expert-data-parallel group, over which expert weights are replicated.
   */
  ep?: number;
}

/** A rank's coordinate along each mesh dimension. */
export type MeshCoords = Record<ParallelDim, number>;
/** Mesh coordinates as a caller gives them: cp may be left out (0). */
export type MeshCoordsInput = Omit<MeshCoords, 'cp'> & {
  /** The context-parallel coordinate (default 0). */
  cp?: number;
};

const DIMS: readonly ParallelDim[] = ['tp', 'cp', 'pp', 'dp'];

function parseOrder(order: string): ParallelDim[] {
  const parts = order.split('-');
  const three = DIMS.filter((d) => d !== 'cp');
  const ok = new Set(parts).size === parts.length && ((parts.length === 3 && three.every((d) => parts.includes(d))) || (parts.length === 4 && DIMS.every((d) => parts.includes(d))));
  if (!ok) throw new ArgumentError(`parallel layout: order must name tp, pp and dp (and optionally cp) once each, separated by '-' (e.g. 'tp-pp-dp'), got '${order}'`);
  if (parts.length === 3) parts.splice(parts.indexOf('tp') + 1, 0, 'cp');
  return parts as ParallelDim[];
}

/** Pure rank arithmetic of a mesh: no communication, so it is the same on every rank and testable anywhere. */
export class MeshLayout {
  /** Tensor-parallel ranks. */
  readonly tp: number;
  /** Pipeline stages. */
  readonly pp: number;
  /** Data-parallel ranks. */
  readonly dp: number;
  /** Context-parallel ranks. */
  readonly cp: number;
  /** Dimensions from fastest- to slowest-varying rank. */
  readonly order: readonly ParallelDim[];
  /** Expert-parallel ranks (a divisor of dp; 1: experts replicated over the data-parallel group). */
  readonly ep: number;
  /** tp · cp · pp · dp. */
  readonly worldSize: number;
  readonly #stride: MeshCoords;

  /**
   * Checks the sizes and the order. Throws ArgumentError for a size < 1, a bad order, or a worldSize other than tp ·
   * cp · pp · dp.
   * @param layout The sizes and order.
   * @param worldSize When given, must equal tp · cp · pp · dp.
   */
  constructor(layout: ParallelLayout, worldSize?: number) {
    for (const d of DIMS) {
      const v = d === 'cp' ? layout.cp ?? 1 : layout[d];
      if (!Number.isInteger(v) || v < 1) throw new ArgumentError(`parallel layout: ${d} must be an integer >= 1, got ${v}`);
    }
    this.tp = layout.tp; this.pp = layout.pp; this.dp = layout.dp; this.cp = layout.cp ?? 1;
    const ep = layout.ep ?? 1;
    if (!Number.isInteger(ep) || ep < 1) throw new ArgumentError(`parallel layout: ep must be an integer >= 1, got ${ep}`);
    if (this.dp % ep !== 0) throw new ArgumentError(`parallel layout: ep (${ep}) must divide dp (${this.dp}): the expert-parallel groups are carved out of the data-parallel ranks`);
    if (ep > 1 && this.cp > 1) throw new ArgumentError(`parallel layout: ep (${ep}) with cp (${this.cp}) is not supported yet (router counts and expert gradients would need the data × context-parallel group)`);
    this.ep = ep;
    this.order = parseOrder(layout.order ?? 'tp-pp-dp');
    this.worldSize = this.tp * this.cp * this.pp * this.dp;
    if (worldSize !== undefined && worldSize !== this.worldSize) {
      throw new ArgumentError(this.cp === 1 ? `parallel layout: tp·pp·dp = ${this.tp}·${this.pp}·${this.dp} = ${this.worldSize} but the world has ${worldSize} ranks`
        : `parallel layout: tp·cp·pp·dp = ${this.tp}·${this.cp}·${this.pp}·${this.dp} = ${this.worldSize} but the world has ${worldSize} ranks`);
    }
    const stride = { tp: 0, cp: 0, pp: 0, dp: 0 };
    let s = 1;
    for (const d of this.order) { stride[d] = s; s *= this[d]; }
    this.#stride = stride;
  }

  /** The size of a dimension. */
  sizeOf(dim: ParallelDim): number { return this[dim]; }

  /** The mesh coordinates of a world rank. Throws ArgumentError for a rank outside the mesh. */
  coords(rank: number): MeshCoords {
    this.#checkRank(rank);
    const c = { tp: 0, cp: 0, pp: 0, dp: 0 };
    for (const d of this.order) c[d] = Math.floor(rank / this.#stride[d]) % this[d];
    return c;
  }

  /** The world rank at mesh coordinates. Throws ArgumentError for a coordinate outside the mesh. */
  rankOf(c: MeshCoordsInput): number {
    let r = 0;
    for (const d of DIMS) {
      const v = d === 'cp' ? c.cp ?? 0 : c[d];
      if (!Number.isInteger(v) || v < 0 || v >= this[d]) throw new ArgumentError(`mesh: ${d} coordinate ${v} is outside [0, ${this[d]})`);
      r += v * this.#stride[d];
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
   * World ranks of `rank`'s data-parallel × context-parallel group (the ranks of its (tp, pp)
   * coordinate, which hold the same parameters), in group-rank order cp + cp_size · dp.
   */
  dataContextRanks(rank: number): number[] {
    const c = this.coords(rank), out: number[] = [];
    for (let dp = 0; dp < this.dp; dp++) for (let cp = 0; cp < this.cp; cp++) out.push(this.rankOf({ ...c, dp, cp }));
    return out;
  }

  /** Every data-parallel × context-parallel group, ordered by their lowest rank. */
  allDataContextGroups(): number[][] {
    const out: number[][] = [];
    for (let r = 0; r < this.worldSize; r++) { const c = this.coords(r); if (c.dp === 0 && c.cp === 0) out.push(this.dataContextRanks(r)); }
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

  /**
   * The expert-parallel groups: each data-parallel group's ranks in blocks of ep consecutive
   * data-parallel ranks (none when ep = 1).
   */
  expertGroups(): number[][] {
    if (this.ep === 1) return [];
    return this.allGroups('dp').flatMap((ranks) => Array.from({ length: this.dp / this.ep }, (_, b) => ranks.slice(b * this.ep, (b + 1) * this.ep)));
  }

  /** The expert-data-parallel groups: the data-parallel ranks at the same place of each expert-parallel group (none when ep = 1 or ep = dp). */
  expertDataGroups(): number[][] {
    if (this.ep === 1 || this.ep === this.dp) return [];
    return this.allGroups('dp').flatMap((ranks) => Array.from({ length: this.ep }, (_, i) => ranks.filter((_, j) => j % this.ep === i)));
  }

  /** Stable text of the layout, compared across ranks to catch mismatched launches. */
  describe(): string { return `tp=${this.tp}${this.cp > 1 ? ` cp=${this.cp}` : ''} pp=${this.pp} dp=${this.dp}${this.ep > 1 ? ` ep=${this.ep}` : ''} order=${this.order.join('-')}`; }

  #checkRank(rank: number): void {
    if (!Number.isInteger(rank) || rank < 0 || rank >= this.worldSize) throw new ArgumentError(`mesh: rank ${rank} is outside [0, ${this.worldSize})`);
  }
}

/** A rank's expert-parallel groups (ep > 1). */
export interface ExpertGroups {
  /** The ranks splitting the experts. */
  ep: CollectiveGroup;
  /** The replicas of this rank's experts (null when ep = dp). */
  edp: CollectiveGroup | null;
}

/** One rank's view of an initialized mesh: its coordinates and its groups along each dimension. */
export class ParallelState {
  /**
   * @param layout The mesh's rank arithmetic.
   * @param rank This process's world rank.
   * @param world The group of every rank.
   * @param groups This rank's group along each dimension.
   * @param embeddingGroup this rank's embedding group (first and last pipeline stage of its (tp, dp)
   *   coordinate), or null when pp = 1 or the rank is on a middle stage.
   * @param dataContextGroup this rank's data-parallel × context-parallel group (default: the
   *   data-parallel group, which it is when cp = 1).
   * @param expert this rank's expert-parallel groups, or null when ep = 1.
   */
  constructor(readonly layout: MeshLayout, readonly rank: number, readonly world: CollectiveGroup,
    readonly groups: Readonly<Record<ParallelDim, CollectiveGroup>>, readonly embeddingGroup: CollectiveGroup | null = null,
    dataContextGroup?: CollectiveGroup, readonly expert: ExpertGroups | null = null) {
    this.dpCpGroup = dataContextGroup ?? groups.dp;
  }
  /**
   * The data-parallel × context-parallel group: the ranks holding the same parameters, over which
   * gradients are averaged and ZeRO shards (the data-parallel group when cp = 1).
   */
  readonly dpCpGroup: CollectiveGroup;
  /** This rank's context-parallel rank. */
  get cpRank(): number { return this.coords.cp; }
  /** Context-parallel ranks. */
  get cpSize(): number { return this.layout.cp; }
  /** This rank's context-parallel group (the ranks splitting one sequence); a StateError when cp = 1 (there is none). */
  get cpGroup(): CollectiveGroup {
    if (!this.groups.cp) throw new StateError('cpGroup: the mesh has cp = 1, so no context-parallel group');
    return this.groups.cp;
  }
  /** Expert-parallel ranks (1: none). */
  get epSize(): number { return this.layout.ep; }
  /** This rank's place in its expert-parallel group (0 when ep = 1). */
  get epRank(): number { return this.expert?.ep.rank ?? 0; }
  /** This rank's expert-parallel group (the ranks that split the experts); null when ep = 1. */
  get epGroup(): CollectiveGroup | null { return this.expert?.ep ?? null; }
  /** This rank's expert-data-parallel group (the replicas of its experts); null when there is none (ep = 1 or ep = dp). */
  get edpGroup(): CollectiveGroup | null { return this.expert?.edp ?? null; }
  /** This rank's mesh coordinates. */
  get coords(): MeshCoords { return this.layout.coords(this.rank); }
  /** This rank's tensor-parallel rank. */
  get tpRank(): number { return this.coords.tp; }
  /** This rank's pipeline stage. */
  get ppRank(): number { return this.coords.pp; }
  /** This rank's data-parallel rank. */
  get dpRank(): number { return this.coords.dp; }
  /** Tensor-parallel ranks. */
  get tpSize(): number { return this.layout.tp; }
  /** Pipeline stages. */
  get ppSize(): number { return this.layout.pp; }
  /** Data-parallel ranks. */
  get dpSize(): number { return this.layout.dp; }
  /** This rank's tensor-parallel group. */
  get tpGroup(): CollectiveGroup { return this.groups.tp; }
  /** This rank's pipeline group (its stages, in order). */
  get ppGroup(): CollectiveGroup { return this.groups.pp; }
  /** This rank's data-parallel group. */
  get dpGroup(): CollectiveGroup { return this.groups.dp; }
  /** Whether this rank is on the first pipeline stage. */
  get isFirstStage(): boolean { return this.ppRank === 0; }
  /** Whether this rank is on the last pipeline stage. */
  get isLastStage(): boolean { return this.ppRank === this.layout.pp - 1; }
}

let current: ParallelState | null = null;

/** Options of {@link initializeParallel}. */
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
  // The cp dimension's groups are made only when cp > 1 (layouts without cp create the groups they always did).
  for (const dim of mesh.order) {
    if (dim === 'cp' && mesh.cp === 1) continue;
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
  let dataContextGroup: CollectiveGroup | undefined;
  if (mesh.cp > 1) {
    for (const ranks of mesh.allDataContextGroups()) {
      const g = await world.newGroup(ranks);
      if (ranks.includes(world.rank)) dataContextGroup = g;
    }
  }
  let epGroup: CollectiveGroup | null = null, edpGroup: CollectiveGroup | null = null;
  for (const ranks of mesh.expertGroups()) {
    const g = await world.newGroup(ranks);
    if (ranks.includes(world.rank)) epGroup = g;
  }
  for (const ranks of mesh.expertDataGroups()) {
    const g = await world.newGroup(ranks);
    if (ranks.includes(world.rank)) edpGroup = g;
  }
  const state = new ParallelState(mesh, world.rank, world, groups, embeddingGroup, dataContextGroup, epGroup ? { ep: epGroup, edp: edpGroup } : null);
  if (install) {
    current = state;
    setFlightMesh(Array.from({ length: mesh.worldSize }, (_, r) => mesh.coords(r)), world.rank, Object.fromEntries(Object.entries(groups).map(([d, g]) => [d, g.name])));
  }
  return state;
}

function distributedWorld(): WorldGroup & { readonly connected: boolean } {
  if (!dist.isInitialized()) throw new StateError('initializeParallel: call nt.distributed.init() first (or pass options.world)');
  const w = dist.world();
  return {
    rank: w.rank, size: w.size, ranks: w.ranks, name: w.name, devices: w.devices,
    // A joining process's world is not connected yet: agreements over it answer locally (agree.ts).
    get connected() { return w.connected; },
    allReduce: (t, o) => w.allReduce(t, o),
    allGather: (out, t) => w.allGather(out, t),
    reduceScatter: (out, t, o) => w.reduceScatter(out, t, o),
    broadcast: (t, o) => w.broadcast(t, o),
    send: (t, dst) => w.send(t, dst),
    recv: (t, src) => w.recv(t, src),
    allToAll: (out, t, o) => w.allToAll(out, t, o),
    // Non-members get a handle too (whose ops throw); the mesh keeps only groups that contain this rank.
    newGroup: (ranks) => dist.newGroup(ranks) as Promise<CollectiveGroup>,
  };
}

async function checkSameLayoutEverywhere(world: CollectiveGroup, mesh: MeshLayout): Promise<void> {
  const mine = [mesh.tp, mesh.pp, mesh.dp, mesh.cp, ...mesh.order.map((d) => DIMS.indexOf(d)), mesh.ep];
  const seen = await rangeAcrossRanks(world, mine);
  if (seen) {
    throw new ArgumentError(`initializeParallel: ranks were started with different layouts (this rank: ${mesh.describe()}; ` +
      `values seen across ranks range from [${seen.min.join(',')}] to [${seen.max.join(',')}] as [tp,pp,dp,cp,order,ep])`);
  }
}

/** The installed mesh; StateError before initializeParallel(). */
export function parallelState(): ParallelState {
  if (!current) throw new StateError('the parallel mesh is not initialized: call initializeParallel(world, { tp, pp, dp }) first');
  return current;
}

/** Whether a mesh is installed (initializeParallel() ran and destroyParallel() did not). */
export function isParallelInitialized(): boolean { return current !== null; }

/** Forgets the installed mesh (its groups belong to the distributed package and stay open). */
export function destroyParallel(): void { current = null; }

/** The installed mesh's tensor-parallel rank of this process; StateError before initializeParallel(). */
export const tpRank = (): number => parallelState().tpRank;
/** The installed mesh's tensor-parallel size; StateError before initializeParallel(). */
export const tpSize = (): number => parallelState().tpSize;
/** This process's tensor-parallel group; StateError before initializeParallel(). */
export const tpGroup = (): CollectiveGroup => parallelState().tpGroup;
/** This process's pipeline stage; StateError before initializeParallel(). */
export const ppRank = (): number => parallelState().ppRank;
/** The installed mesh's number of pipeline stages; StateError before initializeParallel(). */
export const ppSize = (): number => parallelState().ppSize;
/** This process's pipeline group; StateError before initializeParallel(). */
export const ppGroup = (): CollectiveGroup => parallelState().ppGroup;
/** This process's data-parallel rank; StateError before initializeParallel(). */
export const dpRank = (): number => parallelState().dpRank;
/** The installed mesh's data-parallel size; StateError before initializeParallel(). */
export const dpSize = (): number => parallelState().dpSize;
/** This process's data-parallel group; StateError before initializeParallel(). */
export const dpGroup = (): CollectiveGroup => parallelState().dpGroup;
