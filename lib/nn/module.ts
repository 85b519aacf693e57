// Module and Parameter: named parameters found by walking a module's own fields (Parameters, Modules and
// arrays of Modules, in assignment order), state dicts with strict checking, train/eval, dispose.
import { ArgumentError, ShapeError, StateError } from '../errors.js';
import { fmtShape, sameShape } from '../shape.js';
import { checkCanRequireGrad, checkTensor, Tensor } from '../tensor.js';

/**
 * Where a parameter held in parts (a tensor-parallel slice) sits in the whole one: the local tensor is
 * the concatenation, along `dim`, of the whole tensor's runs [start, start + count) of that dimension.
 */
export interface TensorSplit {
  /** The whole parameter's shape. */
  fullShape: number[];
  /** The split dimension. */
  dim: number;
  /** The runs [start, count] of that dimension held, concatenated in order. */
  runs: Array<[number, number]>;
}

/** A tensor that a Module owns and an optimizer updates: requiresGrad is on. */
export class Parameter extends Tensor {
  /** Set when this is a slice of a larger parameter (tensor parallelism); null when held whole. Checkpoints use it. */
  partOf: TensorSplit | null = null;

  /** Takes over `data`'s storage (data is released; the parameter holds the only reference). */
  constructor(data: Tensor, split: TensorSplit | null = null) {
    checkTensor(data, 'Parameter', 'data');
    checkCanRequireGrad(data.dtype, 'Parameter');
    const ref = data.storageRef;
    ref.refs++;
    super(ref, data.shape, data.dtype);
    data.dispose();
    this.requiresGrad = true;
    this.partOf = split;
  }
}

/** Options of {@link Module.loadStateDict}. */
export interface LoadStateDictOptions {
  /** Missing or unexpected names are errors (default true). Shape mismatches always are. */
  strict?: boolean;
}

/** What {@link Module.loadStateDict} returns. */
export interface LoadStateDictResult {
  /** The module's parameter names absent from the state dict (not loaded). */
  missing: string[];
  /** State dict names that are not parameters of the module (ignored). */
  unexpected: string[];
}

/**
 * A neural-network module: its parameters and submodules are its own fields (Parameters, Modules and arrays of
 * Modules), found in assignment order. Subclasses add a forward().
 */
export abstract class Module {
  /** Whether the module is in training mode (dropout active). */
  training = true;

  /** Direct submodules with their field names (array elements as `name.i`). */
  *namedChildren(): Generator<[string, Module]> {
    for (const [key, value] of Object.entries(this)) {
      if (value instanceof Module) yield [key, value];
      else if (Array.isArray(value)) {
        for (let i = 0; i < value.length; i++) if (value[i] instanceof Module) yield [`${key}.${i}`, value[i] as Module];
      }
    }
  }

  /** Every module in the tree (this one first, name ''), depth first in field order. */
  *namedModules(prefix = ''): Generator<[string, Module]> {
    yield [prefix, this];
    for (const [name, child] of this.namedChildren()) yield* child.namedModules(prefix ? `${prefix}.${name}` : name);
  }

  /** Parameters with dotted names; a parameter shared by two modules (tied weights) is listed once, under its first name. */
  namedParameters(): Array<[string, Parameter]> {
    const out: Array<[string, Parameter]> = [];
    const seen = new Set<Parameter>();
    for (const [prefix, m] of this.namedModules()) {
      for (const [key, value] of Object.entries(m)) {
        if (value instanceof Parameter && !seen.has(value)) {
          seen.add(value);
          out.push([prefix ? `${prefix}.${key}` : key, value]);
        }
      }
    }
    return out;
  }

  /** Every parameter, in namedParameters() order. */
  parameters(): Parameter[] { return this.namedParameters().map(([, p]) => p); }

  /** Total number of parameter elements. */
  numParameters(): number { return this.parameters().reduce((s, p) => s + p.size, 0); }

  /** Name → parameter (live references, not copies). */
  stateDict(): Record<string, Tensor> {
    return Object.fromEntries(this.namedParameters());
  }

  /**
   * Copies values into the parameters by name (converting dtype and device as needed). Every problem
   * is collected and reported in one StateError (missing, unexpected) or ShapeError (misshaped).
   */
  loadStateDict(sd: Record<string, Tensor>, options: LoadStateDictOptions = {}): LoadStateDictResult {
    const call = `${this.constructor.name}.loadStateDict`;
    if (sd === null || typeof sd !== 'object' || Array.isArray(sd) || sd instanceof Tensor) {
      throw new ArgumentError(`${call}: the state dict must be an object of name → Tensor (as stateDict() returns), got ${sd === null ? 'null' : Array.isArray(sd) ? 'an array' : sd instanceof Tensor ? 'a Tensor' : typeof sd}`);
    }
    if (options === null || typeof options !== 'object') throw new ArgumentError(`${call}: options must be an object like { strict: false }`);
    const { strict = true } = options;
    if (typeof strict !== 'boolean') throw new ArgumentError(`${call}: strict must be a boolean, got ${typeof strict}`);
    for (const [name, t] of Object.entries(sd)) checkTensor(t, call, `'${name}'`);
    const own = new Map(this.namedParameters());
    const missing = [...own.keys()].filter((k) => !Object.hasOwn(sd, k));
    const unexpected = Object.keys(sd).filter((k) => !own.has(k));
    const misshaped: string[] = [];
    for (const [name, p] of own) {
      const t = Object.hasOwn(sd, name) ? sd[name] : undefined;
      if (t && !sameShape(t.shape, p.shape)) misshaped.push(`${name} (expected ${fmtShape(p.shape)}, got ${fmtShape(t.shape)})`);
    }
    if (misshaped.length > 0) throw new ShapeError(`loadStateDict: shape mismatch for ${misshaped.join(', ')}`);
    if (strict && (missing.length > 0 || unexpected.length > 0)) {
      const parts = [];
      if (missing.length > 0) parts.push(`missing keys: ${missing.join(', ')}`);
      if (unexpected.length > 0) parts.push(`unexpected keys: ${unexpected.join(', ')}`);
      throw new StateError(`loadStateDict: ${parts.join('; ')}`);
    }
    for (const [name, p] of own) {
      const src = Object.hasOwn(sd, name) ? sd[name] : undefined;
      if (!src) continue;
      if (src.dtype === p.dtype && src.device === p.device) p.backend.copy(p.storage, 0, src.storage, 0, p.nbytes);
      else {
        using conv = src.to({ dtype: p.dtype, device: p.device });
        p.backend.copy(p.storage, 0, conv.storage, 0, p.nbytes);
      }
      p.markModified();
    }
    return { missing, unexpected };
  }

  /** Sets training mode on this module and every submodule. */
  train(mode = true): this {
    if (typeof mode !== 'boolean') throw new ArgumentError(`train: mode must be a boolean, got ${typeof mode}`);
    for (const [, m] of this.namedModules()) m.training = mode;
    return this;
  }

  /** Sets evaluation mode (train(false)). */
  eval(): this { return this.train(false); }

  /** Drops every parameter's gradient. */
  zeroGrad(): void {
    for (const p of this.parameters()) { p.grad?.dispose(); p.grad = null; }
  }

  /** Frees every parameter (and its gradient). */
  dispose(): void {
    for (const p of this.parameters()) p.dispose();
  }
  /** dispose(), for `using` declarations. */
  [Symbol.dispose](): void { this.dispose(); }
}
