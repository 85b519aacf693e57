// The optimizer base: parameter groups with per-group hyperparameters, per-parameter state held in
// tensors (so ZeRO can shard it and checkpoints can save it), zeroGrad, stateDict/loadStateDict.
import { dtypeCode } from '../dtype.js';
import { ArgumentError, DTypeError, ShapeError, StateError } from '../errors.js';
import { keep } from '../memory.js';
import type { NativeStorage } from '../native.js';
import { checkTensor, emptyOn, Tensor } from '../tensor.js';

/** A set of parameters sharing hyperparameters (e.g. no weight decay for biases and norms). */
export interface ParamGroup<H> {
  /** The parameters of the group. */
  params: Tensor[];
  /** The group's hyperparameters: the optimizer's defaults overridden by the group's own. */
  options: H;
}

/** Parameters as a flat list, or as groups whose options override the optimizer's defaults. */
export type ParamsInput<H> = Iterable<Tensor> | Array<{
  /** The group's parameters. */
  params: Iterable<Tensor>;
} & Partial<H>>;

/** What stateDict() returns: the step of each parameter's state and its state tensors, by parameter index. */
export interface OptimizerStateDict {
  /** Each group's hyperparameters, in group order. */
  groups: Array<Record<string, number | boolean>>;
  /**
   * Each parameter's state, in parameter order (null for a parameter without state yet); tensors are live references.
   */
  state: Array<{
    /** Updates the parameter has received. */
    step: number;
    /** State tensors by name. */
    tensors: Record<string, Tensor>;
  } | null>;
}

/** Per-parameter state: the number of updates it has received and its buffers (f32, parameter-shaped). */
export interface ParamState {
  /** Updates the parameter has received. */
  step: number;
  /** State tensors by name (f32, parameter-shaped). */
  tensors: Record<string, Tensor>;
}

/** Native arguments for a fused step over a list of parameters. */
export interface FusedBatch {
  params: Tensor[];
  storages: { params: NativeStorage[]; grads: NativeStorage[] };
  counts: number[];
  paramDtypes: number[];
  gradDtypes: number[];
}

/**
 * The optimizer base: parameter groups with per-group hyperparameters, per-parameter state held in f32 tensors (so
 * ZeRO can shard it and checkpoints can save it), zeroGrad, stateDict/loadStateDict. Subclasses implement stepGroup().
 */
export abstract class Optimizer<H extends { lr: number }> {
  /** The parameter groups (a flat parameter list makes one group). */
  readonly paramGroups: ParamGroup<H>[];
  /** Per-parameter state, created on a parameter's first update (or by ensureState()). */
  readonly state = new Map<Tensor, ParamState>();
  /** Names of the state tensors each parameter gets. */
  protected abstract readonly stateNames: readonly string[];

  /**
   * Groups the parameters and checks them. Throws ArgumentError for an empty list, a non-Tensor, a parameter listed
   * twice or a bad hyperparameter.
   * @param params A flat parameter list, or groups whose fields override `defaults`.
   * @param defaults Hyperparameters of groups that do not override them.
   * @param call The subclass's name, for error messages.
   */
  constructor(params: ParamsInput<H>, readonly defaults: H, call: string) {
    if (params === null || typeof params !== 'object' || typeof (params as Iterable<unknown>)[Symbol.iterator] !== 'function') {
      throw new ArgumentError(`${call}: params must be an iterable of Tensors or an array of groups { params, ...options }, got ${params === null ? 'null' : typeof params}`);
    }
    const list = Array.from(params as Iterable<unknown>);
    if (list.length === 0) throw new ArgumentError(`${call}: got an empty parameter list`);
    const known = Object.keys(defaults);
    const grouped = list.every((g) => g !== null && typeof g === 'object' && !(g instanceof Tensor) && 'params' in (g as object));
    const groups = grouped
      ? (list as Array<{ params: Iterable<Tensor> } & Partial<H>>).map(({ params: ps, ...over }, i) => {
        for (const k of Object.keys(over)) if (!known.includes(k)) throw new ArgumentError(`${call}: group ${i} has unknown option ${JSON.stringify(k)} (options: ${known.join(', ')})`);
        if (ps === null || typeof ps !== 'object' || typeof (ps as Iterable<unknown>)[Symbol.iterator] !== 'function') throw new ArgumentError(`${call}: group ${i}'s params must be an iterable of Tensors`);
        const groupParams = Array.from(ps);
        if (groupParams.length === 0) throw new ArgumentError(`${call}: group ${i} has no parameters`);
        return { params: groupParams, options: { ...defaults, ...over } as H };
      })
      : [{ params: list as Tensor[], options: { ...defaults } }];
    const seen = new Set<Tensor>();
    for (const g of groups) {
      for (const p of g.params) {
        if (!(p instanceof Tensor)) throw new ArgumentError(`${call}: parameters must be Tensors, got ${p === null ? 'null' : typeof p}`);
        checkTensor(p, call, 'parameter');
        if (p.dtype !== 'f32' && p.dtype !== 'bf16' && p.dtype !== 'f16') throw new DTypeError(`${call}: parameter ${p.describe()} is not floating point (f32, bf16, f16); integer tensors have no gradient to follow`);
        if (seen.has(p)) throw new ArgumentError(`${call}: parameter ${p.describe()} appears more than once`);
        seen.add(p);
      }
      checkHyper(g.options, call, defaults);
    }
    this.paramGroups = groups;
  }

  /** Sets the learning rate of every group (what a schedule calls each step). */
  setLr(lr: number): void {
    if (!Number.isFinite(lr) || lr < 0) throw new ArgumentError(`setLr: lr must be a finite number >= 0, got ${lr}`);
    for (const g of this.paramGroups) g.options.lr = lr;
  }

  /** Drops the gradients of every parameter (they are freed, not zero-filled). */
  zeroGrad(): void {
    for (const g of this.paramGroups) for (const p of g.params) { p.grad?.dispose(); p.grad = null; }
  }

  /** One update of every parameter that has a gradient. */
  step(): void {
    for (const g of this.paramGroups) {
      const ready = g.params.filter((p) => p.grad !== null);
      if (ready.length > 0) this.stepGroup(ready, g.options);
      // The values changed in place: autocast's weight-cast cache must not serve the old ones.
      for (const p of ready) p.markModified();
    }
  }

  /** Updates `params` (the group's parameters that have a gradient) with the group's hyperparameters. */
  protected abstract stepGroup(params: Tensor[], options: H): void;

  /** The state of a parameter, created (zero-filled f32 buffers) if it has none yet: what a checkpoint loads into. */
  ensureState(p: Tensor): ParamState {
    if (!this.paramGroups.some((g) => g.params.includes(p))) throw new ArgumentError(`ensureState: ${p.describe()} is not a parameter of this optimizer`);
    return this.stateOf(p);
  }

  /** The names of each parameter's state tensors (AdamW: exp_avg, exp_avg_sq). */
  get stateTensorNames(): readonly string[] { return this.stateNames; }

  /** The state of a parameter, created (zero-filled f32 buffers) on first use. */
  protected stateOf(p: Tensor): ParamState {
    let s = this.state.get(p);
    if (!s) {
      const tensors: Record<string, Tensor> = {};
      // State lives as long as the optimizer, even when first created inside a scope (a training step).
      for (const name of this.stateNames) tensors[name] = keep(emptyOn(p.shape, 'f32', p.deviceInfo, true));
      s = { step: 0, tensors };
      this.state.set(p, s);
    }
    return s;
  }

  /** Storages and sizes of a list of parameters and their gradients, for one fused native call. */
  protected batch(params: Tensor[]): FusedBatch {
    for (const p of params) {
      const g = p.grad!;
      if (g.size !== p.size) throw new ShapeError(`optimizer: gradient ${g.describe()} does not match parameter ${p.describe()}`);
    }
    return {
      params,
      storages: { params: params.map((p) => p.storage), grads: params.map((p) => p.grad!.storage) },
      counts: params.map((p) => p.size),
      paramDtypes: params.map((p) => dtypeCode(p.dtype)),
      gradDtypes: params.map((p) => dtypeCode(p.grad!.dtype)),
    };
  }

  /** Groups' hyperparameters and each parameter's state (in parameter order); tensors are live references. */
  stateDict(): OptimizerStateDict {
    const all = this.paramGroups.flatMap((g) => g.params);
    return {
      groups: this.paramGroups.map((g) => ({ ...(g.options as unknown as Record<string, number | boolean>) })),
      state: all.map((p) => {
        const s = this.state.get(p);
        return s ? { step: s.step, tensors: { ...s.tensors } } : null;
      }),
    };
  }

  /** Restores hyperparameters and state (copied in); shapes and counts must match. */
  loadStateDict(sd: OptimizerStateDict): void {
    const all = this.paramGroups.flatMap((g) => g.params);
    const call = `${this.constructor.name}.loadStateDict`;
    if (sd === null || typeof sd !== 'object' || Array.isArray(sd) || !Array.isArray(sd.groups) || !Array.isArray(sd.state)) {
      throw new StateError(`${call}: not an optimizer state dict: expected { groups: [...], state: [...] } as stateDict() returns, got ${sd === null ? 'null' : Array.isArray(sd) ? 'an array' : typeof sd === 'object' ? `an object with keys [${Object.keys(sd).join(', ')}]` : typeof sd}`);
    }
    if (sd.groups.length !== this.paramGroups.length || sd.state.length !== all.length) {
      throw new StateError(`loadStateDict: the state has ${sd.groups.length} groups and ${sd.state.length} parameters, the optimizer ${this.paramGroups.length} and ${all.length}`);
    }
    // Everything is checked before anything changes: a bad state dict leaves the optimizer as it was.
    sd.groups.forEach((g, i) => {
      if (g === null || typeof g !== 'object' || Array.isArray(g)) throw new StateError(`${call}: group ${i} must be an object of hyperparameters, got ${g === null ? 'null' : typeof g}`);
      const own = this.paramGroups[i]!.options as Record<string, unknown>;
      for (const k of Object.keys(g)) if (!Object.hasOwn(own, k)) throw new StateError(`${call}: group ${i} has unknown hyperparameter ${JSON.stringify(k)} (this optimizer's: ${Object.keys(own).join(', ')})`);
      checkHyper({ ...own, ...g }, `${call}: group ${i}`, this.defaults);
    });
    sd.state.forEach((entry, i) => {
      if (entry === null) return;
      if (typeof entry !== 'object' || entry.tensors === null || typeof entry.tensors !== 'object') {
        throw new StateError(`${call}: state ${i} must be null or { step, tensors }, got ${typeof entry === 'object' ? `keys [${Object.keys(entry).join(', ')}]` : typeof entry}`);
      }
      if (!Number.isSafeInteger(entry.step) || entry.step < 0) throw new StateError(`${call}: state ${i} has step ${String(entry.step)}; a step is an integer >= 0`);
      const p = all[i]!;
      for (const name of this.stateNames) {
        const t = entry.tensors[name];
        if (t === undefined || t === null) throw new StateError(`${call}: parameter ${i} lacks state '${name}'`);
        checkTensor(t, call, `state '${name}' of parameter ${i}`);
        if (!(t.dtype === 'f32' || t.dtype === 'bf16' || t.dtype === 'f16')) throw new DTypeError(`${call}: state '${name}' of parameter ${i} is ${t.dtype}; optimizer state is floating point`);
        if (t.size !== p.size) throw new ShapeError(`${call}: state '${name}' of parameter ${i} has ${t.size} elements, the parameter ${p.size}`);
      }
    });
    sd.state.forEach((entry, i) => { if (entry === null) this.dropState(all[i]!); });
    this.paramGroups.forEach((g, i) => Object.assign(g.options, sd.groups[i]));
    sd.state.forEach((entry, i) => {
      if (entry === null) return;
      const p = all[i]!;
      const s = this.stateOf(p);
      s.step = entry.step;
      for (const name of this.stateNames) {
        const src = entry.tensors[name]!;
        const dst = s.tensors[name]!;
        if (src.dtype === 'f32' && src.device === dst.device) dst.backend.copy(dst.storage, 0, src.storage, 0, dst.nbytes);
        else {
          using conv = src.to({ dtype: 'f32', device: dst.device });
          dst.backend.copy(dst.storage, 0, conv.storage, 0, dst.nbytes);
        }
      }
    });
  }

  private dropState(p: Tensor): void {
    const s = this.state.get(p);
    if (!s) return;
    for (const t of Object.values(s.tensors)) t.dispose();
    this.state.delete(p);
  }

  /** Frees all state tensors. */
  dispose(): void {
    for (const p of [...this.state.keys()]) this.dropState(p);
  }
}

/**
 * Checks a subclass's options argument (an object whose keys the optimizer knows, values of the
 * defaults' types) and returns the defaults overridden by it. `required` keys have no default.
 */
export function withDefaults<H extends object>(call: string, defaults: Omit<H, 'lr'> & Partial<H>, options: unknown, required: readonly string[] = []): H {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new ArgumentError(`${call}: options must be an object like { lr: 1e-3 }, got ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}`);
  }
  const known = [...required, ...Object.keys(defaults)];
  for (const k of Object.keys(options)) if (!known.includes(k)) throw new ArgumentError(`${call}: unknown option ${JSON.stringify(k)} (options: ${known.join(', ')})`);
  for (const [k, v] of Object.entries(options)) {
    const d = (defaults as Record<string, unknown>)[k];
    if (d !== undefined && v !== undefined && typeof d !== typeof v) throw new ArgumentError(`${call}: ${k} must be a ${typeof d}, got ${typeof v}`);
  }
  const out = { ...defaults } as Record<string, unknown>;
  for (const k of required) out[k] = undefined;
  return { ...out, ...options } as H;
}

function checkHyper(options: object, call: string, defaults?: object): void {
  for (const [k, v] of Object.entries(options)) {
    if (typeof v === 'number' && !Number.isFinite(v)) throw new ArgumentError(`${call}: ${k} must be finite, got ${v}`);
    const d = defaults ? (defaults as Record<string, unknown>)[k] : undefined;
    if (d !== undefined && v !== undefined && typeof d !== typeof v) throw new ArgumentError(`${call}: ${k} must be a ${typeof d}, got ${typeof v}`);
  }
  const o = options as Record<string, unknown>;
  if (typeof o.lr !== 'number' || o.lr < 0) throw new ArgumentError(`${call}: lr must be a finite number >= 0, got ${String(o.lr)}`);
  if (o.weightDecay !== undefined && (typeof o.weightDecay !== 'number' || o.weightDecay < 0)) throw new ArgumentError(`${call}: weightDecay must be >= 0`);
  if (o.eps !== undefined && (typeof o.eps !== 'number' || o.eps < 0)) throw new ArgumentError(`${call}: eps must be >= 0`);
  for (const k of ['momentum', 'dampening'] as const) {
    if (o[k] !== undefined && (typeof o[k] !== 'number' || (o[k] as number) < 0)) throw new ArgumentError(`${call}: ${k} must be a finite number >= 0, got ${String(o[k])}`);
  }
  const betas = o.betas as unknown;
  if (betas !== undefined) {
    if (!Array.isArray(betas) || betas.length !== 2 || betas.some((b) => typeof b !== 'number' || !(b >= 0 && b < 1))) {
      throw new ArgumentError(`${call}: betas must be two numbers in [0, 1), got ${JSON.stringify(betas)}`);
    }
  }
}
