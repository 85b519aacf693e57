// ZeRO stage 3 (DeepSpeed): every parameter is cut into equal per-rank chunks over the data-parallel
// group and only this rank's chunks stay allocated; each unit (a module such as a transformer block)
// gathers its parameters just in time for its forward and again for its backward, prefetching the
// next unit's gather, and reduce-scatters its gradients into the shard as its backward finishes.
//
// How the hooks ride on autograd. A unit's forward is wrapped (an own `forward` on the instance).
// The wrapper gathers the unit, starts the next unit's gather, and puts identity ops around the
// call: `exit` on the output and `enter` on each input that needs a gradient. Every op of the unit
// consumes enter's output (or a parameter) and feeds exit's input, so in any reverse topological
// order — the one engine.ts walks — exit's backward runs before all of them (it gathers the unit
// again) and enter's backward after all of them (the unit's gradients of this pass are complete:
// it reduce-scatters them and releases the parameters). Residual connections do not break this: a
// skip path inside the unit also starts at enter's output and ends in exit's input. A unit that
// runs twice in a pass, or once per micro-batch, is simply gathered and reduce-scattered each time
// (its shard gradient sums the parts), as DeepSpeed does at every micro-step.
//
// Why release and regather work with a tape that saved the weights: ops save aliases of a tensor,
// which share its StorageRef. Eviction frees the bytes behind that reference and restoration gives
// it new ones, so the parameter object (held by the optimizer and the model) and every saved alias
// see the gathered values again in backward. Between uses reading a parameter throws a StateError
// that names its unit.
//
// The model itself is the root unit: parameters outside every unit (GPT: embeddings, the final
// LayerNorm, the tied LM head) and parameters shared by several units. It is gathered when the
// model's forward starts and stays gathered until step(): a tied embedding is used by the first
// and the last op of the step, so its gradient is complete only when backward returns. That is
// the price of gathering it once per step instead of four times: for GPT-2 small the root holds
// 32% of the parameters (the token table), a share that falls as models deepen and widen.
//
// Offload keeps the masters (this rank's chunks, their gradients, the optimizer state) in host
// memory and copies a unit's chunks to the parameters' device for each gather; for parameters
// already on the CPU it changes no placement.
import { needsGrad, record } from '../../autograd/engine.js';
import { isGradEnabled } from '../../autograd/grad-mode.js';
import { ArgumentError, StateError } from '../../errors.js';
import { keep } from '../../memory.js';
import { Module } from '../../nn/module.js';
import { emptyOn, Tensor } from '../../tensor.js';
import type { CollectiveGroup, CollectiveWork } from '../../distributed/group.js';
import { finishSync } from '../../distributed/finish-sync.js';
import { ChunkedShards, type ShardRun } from './chunks.js';

/** A module whose parameters are gathered together: its slots are the parameters only it uses. */
interface Unit extends ShardRun {
  /** The module's dotted name in the model ('' for the model itself). */
  name: string;
  module: Module;
  gathered: boolean;
  /** A gather started before it was needed: its receive buffer and Work. */
  inFlight: { work: CollectiveWork; full: Tensor; local: Tensor } | null;
  /** The module's own `forward` property before attach (undefined: the prototype's). */
  ownForward: PropertyDescriptor | undefined;
}

/** What ZeRO-3 did, for tests and benchmarks (counts since construction). */
export interface GatherStats {
  /** Gathers whose allGather was started before the unit asked for its parameters. */
  prefetched: number;
  /** Gathers started at the moment the unit needed them (the first unit of a pass, a mispredicted order). */
  onDemand: number;
  /** Prefetched gathers released before any use (wasted communication). */
  unused: number;
  /** Gradient reduce-scatters run. */
  reduceScatters: number;
  /**
   * Largest number of bytes of gathered parameters seen at once: restored parameter storages plus
   * the receive buffers of gathers in flight or being unpacked. With units in forward order this
   * is the root unit, the unit running and the next unit's receive buffer.
   */
  peakGatheredBytes: number;
}

const CALL = 'ZeroOptimizer(stage 3)';

/** The modules in a model's array fields (GPT: its blocks `h`), the usual repeated layers. */
export function defaultUnits(model: Module): Module[] {
  const out: Module[] = [];
  for (const [name, child] of model.namedChildren()) if (name.includes('.')) out.push(child);
  return out;
}

/**
 * The partition of the parameters and the hooks that gather them. Owned by ZeroOptimizer
 * (stage 3), which builds its inner optimizer over `masters` (one per parameter group: this
 * rank's chunks of the group's parameters, back to back).
 */
export class ParameterPartition extends ChunkedShards {
  #root: Unit | null = null;
  #units: Unit[] = [];
  #model: Module | null = null;
  /** The model's own entry-method properties before attach (undefined: the prototype's). */
  readonly #entryOwn: [string, PropertyDescriptor | undefined][] = [];
  #inModelForward = false;
  /** The last unit whose forward ran inside a forward pass; released when another one starts. */
  #lastForward: Unit | null = null;
  /** The reduce-scatter in flight (at most one: it overlaps the next unit's backward). */
  #reducing: { unit: Unit; work: CollectiveWork; input: Tensor; out: Tensor } | null = null;
  #gatheredBytes = 0;
  /** Whether the parameters gave up their bytes (a refused construction leaves them whole). */
  #evicted = false;
  /** Inside holdReductions(): units release their parameters after backward but keep their gradients full. */
  #holding = 0;
  readonly stats: GatherStats = { prefetched: 0, onDemand: 0, unused: 0, reduceScatters: 0, peakGatheredBytes: 0 };

  /** Copies this rank's chunks into the masters; the parameters keep their bytes until evictParameters(). */
  constructor(groups: readonly Tensor[][], group: CollectiveGroup, offload: boolean) {
    super(groups, group, offload, CALL);
  }

  get attached(): boolean { return this.#model !== null; }

  /** Frees every parameter's bytes: from now on they exist only while gathered. */
  evictParameters(): void {
    this.#evicted = true;
    for (const p of this.parts.keys()) {
      p.storageRef.evict(`${p.describe()} is sharded by ZeRO stage 3 and is not gathered now: call attach(model) on the ZeroOptimizer so ` +
        'the model gathers it for each forward and backward, and read values with fullParameters()');
    }
  }

  /**
   * Installs the gathering hooks. `units` are submodules of `model` in the order their forwards run;
   * every other parameter (and any parameter shared by two units) belongs to the model's root unit,
   * gathered when one of the model's `entries` methods starts a forward pass. Parameters in `exclude`
   * belong to another optimizer and are left alone.
   */
  attach(model: Module, units: readonly Module[], entries: readonly string[], exclude: ReadonlySet<Tensor> = new Set()): void {
    if (this.#model) throw new StateError(`${CALL}.attach: already attached to a model`);
    if (!(model instanceof Module)) throw new ArgumentError(`${CALL}.attach: the model must be a Module`);
    const method = (m: Module, name: string) => (m as unknown as Record<string, unknown>)[name];
    const badEntries = entries.filter((e) => typeof method(model, e) !== 'function');
    if (entries.length === 0 || badEntries.length > 0) {
      throw new ArgumentError(`${CALL}.attach: the model has no method ${badEntries.join(', ') || '(none given)'} to start a forward pass through`);
    }
    const names = new Map<Module, string>();
    for (const [name, m] of model.namedModules()) if (!names.has(m)) names.set(m, name);
    const seen = new Set<Module>();
    for (const u of units) {
      if (!(u instanceof Module) || !names.has(u) || u === model) throw new ArgumentError(`${CALL}.attach: every unit must be a submodule of the model (not the model itself)`);
      if (seen.has(u)) throw new ArgumentError(`${CALL}.attach: unit '${names.get(u)}' is listed twice`);
      if (typeof (u as unknown as { forward?: unknown }).forward !== 'function') throw new ArgumentError(`${CALL}.attach: unit '${names.get(u)}' has no forward method`);
      seen.add(u);
    }
    for (const u of units) {
      for (const [, inner] of u.namedModules()) {
        if (inner !== u && seen.has(inner)) throw new ArgumentError(`${CALL}.attach: unit '${names.get(inner)}' is nested inside unit '${names.get(u)}'; units must not overlap`);
      }
    }
    const paramNames = new Map(model.namedParameters().filter(([, p]) => !exclude.has(p)).map(([n, p]) => [p as Tensor, n]));
    const outside = [...this.parts.keys()].filter((p) => !paramNames.has(p)).map((p) => p.describe());
    const missing = [...paramNames].filter(([p]) => !this.parts.has(p)).map(([, n]) => n);
    const problems: string[] = [];
    if (missing.length > 0) problems.push(`model parameters not given to the optimizer: ${missing.join(', ')}`);
    if (outside.length > 0) problems.push(`optimizer parameters that are not the model's: ${outside.join(', ')}`);
    if (problems.length > 0) throw new ArgumentError(`${CALL}.attach: every parameter must be both the model's and the optimizer's (a parameter outside the partition would never be gathered); ${problems.join('; ')}`);

    // A parameter reached from one unit only belongs to it; the rest to the root.
    const owners = new Map<Tensor, Module[]>();
    for (const u of units) for (const p of u.parameters()) owners.set(p, [...(owners.get(p) ?? []), u]);
    const ownerOf = (p: Tensor): Module => { const o = owners.get(p); return o && o.length === 1 ? o[0]! : model; };
    const build = (m: Module): Unit => ({
      ...this.slotsOf([...paramNames].filter(([p]) => ownerOf(p) === m)),
      name: names.get(m)!, module: m, gathered: false, inFlight: null, gradShard: null, ownForward: Object.getOwnPropertyDescriptor(m, 'forward'),
    });
    this.#model = model;
    this.#root = build(model);
    this.#units = units.map(build).filter((u) => u.slots.length > 0);
    // The same eviction with a message that names the parameter and its unit.
    for (const u of [this.#root, ...this.#units]) for (const s of u.slots) this.#evict(u, s);
    this.#units.forEach((u, i) => this.#wrapUnit(u, i));
    for (const e of entries) this.#wrapEntry(model, e);
  }

  // A method that runs a forward pass of the model (or of the stage it is): the root unit is gathered
  // for it and the first unit's gather starts.
  #wrapEntry(model: Module, name: string): void {
    const root = this.#root!;
    this.#entryOwn.push([name, Object.getOwnPropertyDescriptor(model, name)]);
    const original = (model as unknown as Record<string, (...a: unknown[]) => unknown>)[name]!;
    const wrapped = (...args: unknown[]): unknown => {
      if (this.#inModelForward) return original.apply(model, args);
      this.#inModelForward = true;
      try {
        this.#ensureGathered(root);
        this.#prefetch(this.#units[0]);
        const out = original.apply(model, args);
        // Without a graph nothing comes back for these parameters. With one, backward starts with
        // the last unit, so it stays gathered; the root stays until step().
        if (!isGradEnabled()) this.#releaseAll();
        return out;
      } catch (e) {
        this.#releaseAll();
        throw e;
      } finally {
        this.#inModelForward = false;
      }
    };
    Object.defineProperty(model, name, { value: wrapped, configurable: true, writable: true, enumerable: false });
  }

  #wrapUnit(unit: Unit, index: number): void {
    const module = unit.module as unknown as { forward: (...a: unknown[]) => unknown };
    const original = module.forward;
    const wrapped = (...args: unknown[]): unknown => {
      if (this.#inModelForward) {
        if (this.#lastForward && this.#lastForward !== unit) this.#release(this.#lastForward);
        this.#lastForward = unit;
        this.#ensureGathered(unit);
        this.#prefetch(this.#units[index + 1]);
      } else {
        // Outside the model's forward: a recomputation inside backward (checkpoint), which walks
        // the units in reverse, so the previous unit is the one to prefetch.
        this.#ensureGathered(unit);
        this.#prefetch(this.#units[index - 1]);
      }
      const inputs = args.map((a) => (a instanceof Tensor && needsGrad(a) ? this.#enter(a, unit) : a));
      const out = original.apply(unit.module, inputs);
      return out instanceof Tensor && needsGrad(out) ? this.#exit(out, unit, index) : out;
    };
    Object.defineProperty(unit.module, 'forward', { value: wrapped, configurable: true, writable: true, enumerable: false });
  }

  // Identity whose backward runs after every op of the unit: its gradients are complete.
  #enter(x: Tensor, unit: Unit): Tensor {
    return record('zero3.reduceScatterUnit', x.reshape(x.shape), [x], (g) => {
      if (this.#holding === 0) this.#reduceScatter(unit);
      this.#release(unit);
      return [g];
    });
  }

  // Identity whose backward runs before every op of the unit: the parameters must be back.
  #exit(y: Tensor, unit: Unit, index: number): Tensor {
    return record('zero3.gatherUnit', y.reshape(y.shape), [y], (g) => {
      this.#ensureGathered(unit);
      this.#prefetch(this.#units[index - 1]);
      return [g];
    });
  }

  #startGather(unit: Unit): void {
    const local = keep(this.localShard(unit));
    const full = keep(emptyOn([this.group.size * unit.shardCount], 'f32', this.paramDevice));
    this.#countGathered(full.nbytes);
    let work: CollectiveWork;
    try {
      work = this.group.allGather(full, local);
    } catch (e) {
      this.#countGathered(-full.nbytes);
      full.dispose();
      local.dispose();
      throw e;
    }
    // A group that cannot block is refused at the first gather, the same on every rank (the buffers
    // are released once the op it started has settled).
    if (!work.waitSync) {
      this.#countGathered(-full.nbytes);
      finishSync(work, { call: CALL, group: this.group, buffers: [full, local] });
    }
    unit.inFlight = { work, full, local };
  }

  #prefetch(unit: Unit | undefined): void {
    if (!unit || unit.gathered || unit.inFlight) return;
    this.#startGather(unit);
  }

  #ensureGathered(unit: Unit): void {
    if (unit.gathered) return;
    if (unit.shardCount === 0) { unit.gathered = true; return; }
    if (unit.inFlight) this.stats.prefetched++;
    else {
      this.stats.onDemand++;
      this.#startGather(unit);
    }
    const { work, full, local } = unit.inFlight!;
    unit.inFlight = null;
    try {
      finishSync(work, { call: CALL, group: this.group });
      local.dispose();
      for (const s of unit.slots) {
        const p = s.part.param;
        p.storageRef.restore(p.nbytes);
        this.#countGathered(p.nbytes);
      }
      this.unpackGathered(unit, full);
      unit.gathered = true;
    } finally {
      this.#countGathered(-full.nbytes);
      full.dispose();
      local.dispose();
    }
  }

  #countGathered(bytes: number): void {
    this.#gatheredBytes += bytes;
    this.stats.peakGatheredBytes = Math.max(this.stats.peakGatheredBytes, this.#gatheredBytes);
  }

  #release(unit: Unit): void {
    if (unit.inFlight) {
      // Every rank started this gather, so every rank finishes it before dropping the buffer.
      const { work, full, local } = unit.inFlight;
      unit.inFlight = null;
      this.stats.unused++;
      try { finishSync(work, { call: CALL, group: this.group }); } finally { this.#countGathered(-full.nbytes); full.dispose(); local.dispose(); }
    }
    if (!unit.gathered) return;
    for (const s of unit.slots) {
      this.#countGathered(-s.part.param.storageRef.bytes);
      this.#evict(unit, s);
    }
    unit.gathered = false;
  }

  #evict(unit: Unit, slot: Unit['slots'][number]): void {
    slot.part.param.storageRef.evict(`parameter '${slot.name}' is sharded by ZeRO stage 3: its bytes exist only while ` +
      (unit === this.#root ? "the model's forward, backward and step run" : `unit '${unit.name}' runs its forward or backward`) +
      ' (read values with ZeroOptimizer.fullParameters())');
  }

  #releaseAll(): void {
    for (const u of [...this.#units, this.#root!]) this.#release(u);
    this.#lastForward = null;
  }

  /** Packs the unit's full gradients rank by rank, frees them and starts their reduce-scatter (averaged over the group). */
  #reduceScatter(unit: Unit): void {
    if (!unit.slots.some((s) => s.part.param.grad)) return;
    const input = keep(emptyOn([this.group.size * unit.shardCount], 'f32', this.paramDevice, true));
    for (const s of unit.slots) this.packGrad(unit, s, input, true);
    const out = keep(emptyOn([unit.shardCount], 'f32', this.paramDevice));
    try {
      this.#finishReduction();
    } catch (e) {
      // The previous reduce-scatter failed (the step is abandoned): this one's buffers go too.
      input.dispose();
      out.dispose();
      throw e;
    }
    this.stats.reduceScatters++;
    this.#reducing = { unit, work: this.group.reduceScatter(out, input, { op: 'avg' }), input, out };
  }

  /**
   * Runs fn (a zero-bubble schedule's input-gradient pass B, whose weight gradients come later in
   * its W) with the units' reduce-scatters held back: each unit still releases its parameters when
   * its backward ends, but its gradients stay full until {@link reduceHeld}.
   */
  async holdReductions<T>(fn: () => T | Promise<T>): Promise<T> {
    this.#holding++;
    try { return await fn(); } finally { this.#holding--; }
  }

  /**
   * Reduce-scatters, unit by unit in order, the gradients the units hold full (after a W pass, when
   * the micro-batch's gradients are final; a later B's contributions already there go with them:
   * the shards add up). The root unit waits for step(), as always.
   */
  reduceHeld(): void {
    for (const u of this.#units) this.#reduceScatter(u);
  }

  #finishReduction(): void {
    const r = this.#reducing;
    if (!r) return;
    this.#reducing = null;
    finishSync(r.work, { call: CALL, group: this.group, buffers: [r.input, r.out] });
    r.input.dispose();
    this.foldReduced(r.unit, r.out);
  }

  /**
   * Before the update: finishes the reduce-scatter in flight, reduce-scatters what backward left
   * full (the root unit, units whose input needed no gradient), moves every unit's shard gradient
   * into the masters' gradients and releases all gathered parameters.
   */
  finishGradients(): void {
    if (!this.#model) {
      throw new StateError(`${CALL}.step: not attached to a model; call attach(model) before the first forward (the parameters are sharded and no forward can gather them)`);
    }
    this.#finishReduction();
    for (const u of [this.#root!, ...this.#units]) {
      this.#reduceScatter(u);
      this.#finishReduction();
    }
    this.#releaseAll();
    this.writeMasterGrads([this.#root!, ...this.#units]);
  }

  zeroGrad(): void {
    for (const p of this.parts.keys()) { p.grad?.dispose(); p.grad = null; }
    for (const u of [this.#root, ...this.#units]) { u?.gradShard?.dispose(); if (u) u.gradShard = null; }
    for (const m of this.masters) { m.grad?.dispose(); m.grad = null; }
  }

  /**
   * Abandons a step that failed midway (the communicator is dead: nothing is awaited): gathers and the
   * reduce-scatter in flight are let go (their Works pin the buffers' storage until they settle),
   * every gathered parameter is evicted again (re-gathered by the next forward), the forward's
   * bookkeeping and any hold on the reductions cleared, every gradient dropped.
   */
  abandon(): void {
    for (const u of [this.#root, ...this.#units]) {
      if (!u) continue;
      if (u.inFlight) {
        this.#countGathered(-u.inFlight.full.nbytes);
        u.inFlight.full.dispose();
        u.inFlight.local.dispose();
        u.inFlight = null;
      }
      if (u.gathered) {
        for (const s of u.slots) {
          this.#countGathered(-s.part.param.storageRef.bytes);
          this.#evict(u, s);
        }
        u.gathered = false;
      }
    }
    if (this.#reducing) { this.#reducing.input.dispose(); this.#reducing.out.dispose(); this.#reducing = null; }
    this.#lastForward = null;
    this.#inModelForward = false;
    this.#holding = 0;
    this.zeroGrad();
  }

  /** Bytes of parameter storage gathered now, of full gradients, and of shard gradients (units' and masters'). */
  memory(): { gatheredParams: number; fullGrads: number; shardGrads: number } {
    let fullGrads = 0, shardGrads = 0;
    for (const p of this.parts.keys()) if (p.grad && !p.grad.disposed) fullGrads += p.grad.nbytes;
    for (const u of [this.#root, ...this.#units]) if (u?.gradShard) shardGrads += u.gradShard.nbytes;
    if (this.#reducing) fullGrads += this.#reducing.input.nbytes;
    for (const m of this.masters) if (m.grad) shardGrads += m.grad.nbytes;
    let gatheredParams = 0;
    for (const p of this.parts.keys()) gatheredParams += p.disposed ? 0 : p.storageRef.bytes;
    return { gatheredParams, fullGrads, shardGrads };
  }

  /**
   * Removes the hooks and frees the shards. Not collective: the parameters stay evicted (their
   * values are gone); read them with fullParameters() first.
   */
  dispose(): void {
    if (this.#model) {
      for (const [name, own] of this.#entryOwn) restoreMethod(this.#model, name, own);
      for (const u of this.#units) restoreMethod(u.module, 'forward', u.ownForward);
    }
    for (const u of [this.#root, ...this.#units]) {
      if (!u) continue;
      u.inFlight?.full.dispose();
      u.inFlight?.local.dispose();
      u.inFlight = null;
      u.gradShard?.dispose();
      u.gradShard = null;
    }
    if (this.#reducing) { this.#reducing.input.dispose(); this.#reducing.out.dispose(); this.#reducing = null; }
    for (const p of this.parts.keys()) {
      if (this.#evicted && !p.disposed) p.storageRef.evict(`${p.describe()} belonged to a ZeRO stage 3 optimizer that was disposed; its values are gone (read them with fullParameters() before dispose)`);
    }
    this.disposeMasters();
    this.#model = null;
  }
}

function restoreMethod(m: Module, name: string, own: PropertyDescriptor | undefined): void {
  if (own) Object.defineProperty(m, name, own);
  else delete (m as unknown as Record<string, unknown>)[name];
}
