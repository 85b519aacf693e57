// Tensor: a shape, a dtype and a device over reference-counted contiguous storage. Ops live in
// lib/ops/* and attach methods to Tensor.prototype; this file holds what every op stands on.
import { backendOf, type Device, type DeviceLike, parseDevice } from './device.js';
import { type ArrayFor, type DType, dtypeCode, dtypeSize, isFloating, parseDType, readArrayFor, type TypedArray } from './dtype.js';
import { ArgumentError, AutogradError, DeviceError, DisposedError, StateError } from './errors.js';
import { track, untrack } from './memory.js';
import type { BackendAddon, NativeStorage } from './native.js';
import { checkShape, fmtShape, inferShape, numel, type Shape } from './shape.js';

/** Storage shared by tensors that are views of the same bytes (reshape); freed with its last tensor. */
export class StorageRef {
  refs = 1;
  /**
   * Bumped by whatever rewrites the values of a parameter in place (optimizer steps, loadStateDict,
   * checkpoint loads, ZeRO's gathers): autocast's weight-cast cache compares it to decide whether its
   * low-precision copy is still the weight's value.
   */
  version = 0;
  #native: NativeStorage | null;
  #bytes: number;
  #evictedBecause = '';
  constructor(native: NativeStorage, readonly device: Device, bytes: number) {
    this.#native = native;
    this.#bytes = bytes;
  }
  /** The native bytes; throws StateError while evicted (the reason says who holds them). */
  get native(): NativeStorage {
    if (this.#native === null) throw new StateError(this.#evictedBecause);
    return this.#native;
  }
  /** Bytes allocated now (0 while evicted). */
  get bytes(): number { return this.#bytes; }
  get evicted(): boolean { return this.#native === null; }
  release(): void {
    if (--this.refs === 0) { this.#native?.dispose(); this.#native = null; }
  }
  /**
   * Internal (ZeRO stage 3): frees the bytes now while every tensor over this reference (a
   * parameter, the autograd graph's saved aliases of it) stays alive; reading one throws
   * StateError(reason) until restore(). Tensor objects keep their identity, which optimizers and
   * the autograd tape rely on.
   */
  evict(reason: string): void {
    this.#native?.dispose();
    this.#native = null;
    this.#bytes = 0;
    this.#evictedBecause = reason;
  }
  /** Internal (ZeRO stage 3): gives an evicted reference fresh, uninitialized bytes on its device. */
  restore(bytes: number): void {
    if (this.#native !== null) throw new StateError('StorageRef.restore: the storage is not evicted');
    this.#native = new (backendOf(this.device).Storage)(bytes, false, this.device.index);
    this.#bytes = bytes;
    this.version++;
  }
}

/** Options accepted by creation functions. */
export interface TensorOptions {
  /** Element type (default 'f32'; aliases such as 'float32' accepted). */
  dtype?: DType | string;
  /** Device (default 'cpu'). */
  device?: DeviceLike;
  /** Mark the result as a leaf that autograd tracks (default false). */
  requiresGrad?: boolean;
}

/** What a tensor holds of the autograd node that produced it (lib/autograd/engine.ts implements it). */
export interface GradNode {
  /** The output that referenced the node is gone; the node frees its saved tensors when nothing else needs them. */
  unref(): void;
}

/**
 * An n-dimensional array on a device, with autograd. Create tensors with tensor(), zeros(), randn(), ...; free them
 * with dispose() (or `using`, or scope()). Op methods (add, matmul, ...) are the functions of the same name in the ops
 * module.
 */
export class Tensor {
  /** Dimensions; [] for a scalar. */
  readonly shape: readonly number[];
  /** Element type. */
  readonly dtype: DType;
  /** Number of elements. */
  readonly size: number;
  #requiresGrad = false;
  /** Accumulated gradient, set by backward(). */
  grad: Tensor | null = null;
  /** The autograd node that produced this tensor (null for leaves). Managed by lib/autograd. */
  gradFn: GradNode | null = null;
  /** Optional name (parameters carry theirs). */
  name?: string;

  #storage: StorageRef | null;
  readonly #device: Device;

  /** Internal: wraps storage. Users create tensors with nt.tensor, nt.zeros, ... */
  constructor(storage: StorageRef, shape: readonly number[], dtype: DType) {
    this.#storage = storage;
    this.#device = storage.device;
    this.shape = shape;
    this.dtype = dtype;
    this.size = numel(shape);
    track(this, this.#device);
  }

  /**
   * Whether autograd records operations on this tensor. Only floating-point tensors (f32, bf16, f16)
   * can require grad: setting true on an i32 or u8 tensor throws AutogradError, a non-boolean ArgumentError.
   */
  get requiresGrad(): boolean { return this.#requiresGrad; }
  /** Turns recording on or off; true only on floating-point tensors (AutogradError otherwise). */
  set requiresGrad(v: boolean) {
    if (typeof v !== 'boolean') throw new ArgumentError(`requiresGrad must be a boolean, got ${typeof v}`);
    if (v) checkCanRequireGrad(this.dtype, 'requiresGrad');
    this.#requiresGrad = v;
  }

  /** Canonical device name: 'cpu' or 'cuda:N'. */
  get device(): string { return this.#device.name; }
  /** The parsed device (type and index). */
  get deviceInfo(): Device { return this.#device; }
  /** Number of dimensions. */
  get ndim(): number { return this.shape.length; }
  /** Size of the data in bytes (size × bytes per element). */
  get nbytes(): number { return this.size * dtypeSize(this.dtype); }
  /** Whether dispose() has been called. */
  get disposed(): boolean { return this.#storage === null; }

  /** The native storage, for kernels. Throws DisposedError after dispose(). */
  get storage(): NativeStorage {
    const s = this.#storage;
    if (s === null) throw new DisposedError(`tensor ${this.describe()} was disposed`);
    return s.native;
  }
  /** Internal: the shared storage reference (for views). */
  get storageRef(): StorageRef {
    const s = this.#storage;
    if (s === null) throw new DisposedError(`tensor ${this.describe()} was disposed`);
    return s;
  }
  /** The backend addon that owns this tensor's device. */
  get backend(): BackendAddon { return backendOf(this.#device); }
  /**
   * A counter of in-place rewrites of this tensor's storage (shared by its views): optimizer steps,
   * loadStateDict and checkpoint loads bump it (see {@link markModified}); autocast's weight-cast
   * cache re-casts a weight whose version moved.
   */
  get version(): number { return this.storageRef.version; }
  /** Records that this tensor's values were rewritten in place (bumps {@link version}). */
  markModified(): void { this.storageRef.version++; }

  /** Releases the memory now. Idempotent. */
  dispose(): void {
    const s = this.#storage;
    if (s === null) return;
    this.#storage = null;
    untrack(this, this.#device);
    s.release();
    if (this.grad) { this.grad.dispose(); this.grad = null; }
    // Dropping the output's hold on its graph node lets forward passes that never reach backward
    // (evaluation without noGrad) free the tensors the node saved.
    const fn = this.gradFn;
    this.gradFn = null;
    fn?.unref();
  }
  /** dispose(), for `using` declarations. */
  [Symbol.dispose](): void { this.dispose(); }

  /** A short description: shape, dtype, device and name, e.g. '[2, 3] f32 on cpu (w)'. */
  describe(): string {
    return `${fmtShape(this.shape)} ${this.dtype} on ${this.#device.name}${this.name ? ` (${this.name})` : ''}`;
  }
  /** 'Tensor(<describe()>)', with ', disposed' after dispose(). */
  toString(): string { return `Tensor(${this.describe()}${this.disposed ? ', disposed' : ''})`; }

  /** Copies the data out (waits for the device). bf16 and f16 read back as Float32Array. */
  async toArray(): Promise<ArrayFor<DType>> { return this.toArraySync(); }

  /** Synchronous toArray(). */
  toArraySync(): TypedArray {
    const storage = this.storage;
    if (this.dtype === 'f32' || this.dtype === 'i32' || this.dtype === 'u8') {
      const out = readArrayFor(this.dtype, this.size);
      this.backend.read(storage, 0, out);
      return out;
    }
    // Half types widen to f32 on the device's side, then one copy out.
    using wide = this.to('f32');
    return wide.toArraySync();
  }

  /** The single value of a one-element tensor. */
  item(): number {
    void this.storage;  // DisposedError first
    if (this.size !== 1) throw new ArgumentError(`item(): tensor ${this.describe()} has ${this.size} elements, not 1`);
    return this.toArraySync()[0]!;
  }

  /** Nested arrays of numbers, for printing and tests. */
  tolist(): unknown {
    const flat = Array.from(this.toArraySync());
    const build = (dim: number, offset: number): unknown => {
      if (dim === this.shape.length) return flat[offset];
      const stride = numel(this.shape.slice(dim + 1));
      return Array.from({ length: this.shape[dim]! }, (_, i) => build(dim + 1, offset + i * stride));
    };
    return build(0, 0);
  }

  /** Same data, new shape (one dimension may be -1). Shares storage; no copy. */
  reshape(shape: readonly number[]): Tensor {
    const ref = this.storageRef;
    const target = inferShape(shape, this.size, this.shape);
    ref.refs++;
    return new Tensor(ref, target, this.dtype);
  }

  /** A copy with its own storage. */
  clone(): Tensor {
    const src = this.storage;
    const out = emptyOn(this.shape, this.dtype, this.#device);
    this.backend.copy(out.storage, 0, src, 0, this.nbytes);
    return out;
  }

  /**
   * Converts to a dtype and/or moves to a device; returns a new tensor (a copy even when nothing changes).
   * Casts into an integer dtype truncate toward zero and saturate at its range (f32 300 → u8 255, NaN → 0).
   */
  to(target: DType | DeviceLike | { dtype?: DType | string; device?: DeviceLike }): Tensor {
    void this.storage;  // DisposedError before anything is allocated
    let dtype: DType = this.dtype;
    let device: Device = this.#device;
    if (typeof target === 'string') {
      if (/^(cpu|cuda)(:\d+)?$/.test(target)) device = parseDevice(target, 'to');
      else dtype = parseDType(target, 'to');
    } else if (target && typeof target === 'object') {
      for (const k of Object.keys(target)) if (k !== 'dtype' && k !== 'device') throw new ArgumentError(`to(): unknown option ${JSON.stringify(k)} (options: dtype, device)`);
      if (target.dtype !== undefined) dtype = parseDType(target.dtype, 'to');
      if (target.device !== undefined) device = parseDevice(target.device, 'to');
    } else {
      throw new ArgumentError(`to(): expected a dtype, a device or { dtype, device }`);
    }
    const src: Tensor = device.name === this.#device.name ? this : transfer(this, device);
    if (dtype === src.dtype) return src === this ? this.clone() : src;
    const out = emptyOn(this.shape, dtype, device);
    out.backend.cast(src.storage, dtypeCode(src.dtype), out.storage, dtypeCode(dtype), this.size);
    if (src !== this) src.dispose();
    return out;
  }
}

/** Moves a tensor's bytes to another device (same dtype) through host memory. */
function transfer(t: Tensor, device: Device): Tensor {
  const out = emptyOn(t.shape, t.dtype, device);
  const bytes = new Uint8Array(t.nbytes);
  t.backend.read(t.storage, 0, bytes);
  out.backend.write(out.storage, 0, bytes);
  return out;
}

/** Internal: an uninitialized tensor on a device. */
export function emptyOn(shape: readonly number[], dtype: DType, device: Device, zero = false): Tensor {
  const bytes = numel(shape) * dtypeSize(dtype);
  if (!Number.isSafeInteger(bytes) || bytes < 0) {
    throw new ArgumentError(`cannot allocate a ${fmtShape(shape)} ${dtype} tensor: ${numel(shape)} elements is more than 2^53 bytes`);
  }
  const addon = backendOf(device);
  const native = new addon.Storage(bytes, zero, device.index);
  return new Tensor(new StorageRef(native, device, bytes), shape, dtype);
}

/**
 * Internal: a tensor of `shape` whose bytes are elements [offset, offset + numel(shape)) of base's
 * storage: writes through either show in the other (gradient buckets hand these out as parameters'
 * `.grad`, Megatron's main_grad). The bytes stay allocated while the view lives, even after base is
 * disposed. Throws ArgumentError when the range does not lie inside base.
 */
export function viewOf(base: Tensor, offset: number, shape: readonly number[]): Tensor {
  const count = numel(shape), e = dtypeSize(base.dtype);
  if (!Number.isSafeInteger(offset) || offset < 0 || offset + count > base.size) {
    throw new ArgumentError(`viewOf: elements [${offset}, ${offset + count}) do not lie inside ${base.describe()}`);
  }
  const native = new (base.backend.Storage)(base.storage, offset * e, count * e);
  return new Tensor(new StorageRef(native, base.deviceInfo, count * e), shape, base.dtype);
}

/** The options of tensor creation functions. */
export const TENSOR_OPTIONS: readonly string[] = ['dtype', 'device', 'requiresGrad'];

/** Throws AutogradError unless tensors of `dtype` can require grad (floating point only). */
export function checkCanRequireGrad(dtype: DType, call: string): void {
  if (!isFloating(dtype)) {
    throw new AutogradError(`${call}: only floating-point tensors (f32, bf16, f16) can require grad, not ${dtype} (integer tensors have no gradient)`);
  }
}

/**
 * Resolves creation options to a dtype, a device and requiresGrad, before anything is allocated:
 * options must be an object, requiresGrad a boolean, and requiresGrad only on a floating dtype.
 */
export function resolveOptions(opts: TensorOptions | undefined, call: string, defaultDtype: DType = 'f32', allowed?: readonly string[]): { dtype: DType; device: Device; requiresGrad: boolean } {
  if (opts !== undefined && (typeof opts !== 'object' || opts === null || Array.isArray(opts))) {
    throw new ArgumentError(`${call}: options must be an object like { dtype, device, requiresGrad }, got ${opts === null ? 'null' : Array.isArray(opts) ? 'an array' : typeof opts}`);
  }
  if (allowed && opts) {
    // A misspelt option (dtyp) would otherwise be ignored silently.
    for (const k of Object.keys(opts)) if (!allowed.includes(k)) throw new ArgumentError(`${call}: unknown option ${JSON.stringify(k)} (options: ${allowed.join(', ')})`);
  }
  const dtype = opts?.dtype === undefined ? defaultDtype : parseDType(opts.dtype, call);
  const device = parseDevice(opts?.device, call);
  const requiresGrad = opts?.requiresGrad ?? false;
  if (typeof requiresGrad !== 'boolean') throw new ArgumentError(`${call}: requiresGrad must be a boolean, got ${typeof requiresGrad}`);
  if (requiresGrad) checkCanRequireGrad(dtype, call);
  return { dtype, device, requiresGrad };
}

/** An uninitialized tensor. */
export function empty(shape: Shape, opts?: TensorOptions): Tensor {
  const s = checkShape(shape, 'empty');
  const { dtype, device, requiresGrad } = resolveOptions(opts, 'empty', 'f32', TENSOR_OPTIONS);
  const t = emptyOn(s, dtype, device);
  if (requiresGrad) t.requiresGrad = true;
  return t;
}

/** Checks that a value is a live tensor; names the argument in the error. */
export function checkTensor(t: unknown, call: string, arg = 'argument'): Tensor {
  if (!(t instanceof Tensor)) throw new ArgumentError(`${call}: ${arg} must be a Tensor, got ${t === null ? 'null' : typeof t}`);
  if (t.disposed) throw new DisposedError(`${call}: ${arg} ${t.describe()} was disposed`);
  return t;
}

/**
 * Checks an iterable of live tensors (a parameter list, gradients) and returns it as an array; names
 * the argument and the bad element in the error.
 */
export function checkTensorList(list: unknown, call: string, arg = 'tensors'): Tensor[] {
  if (list === null || typeof list !== 'object' || typeof (list as Iterable<unknown>)[Symbol.iterator] !== 'function') {
    throw new ArgumentError(`${call}: ${arg} must be an iterable of Tensors (an array), got ${list === null ? 'null' : typeof list}`);
  }
  const out = Array.from(list as Iterable<unknown>);
  out.forEach((t, i) => checkTensor(t, call, `${arg}[${i}]`));
  return out as Tensor[];
}

/** Checks that tensors share a device; throws DeviceError naming both. */
export function checkSameDevice(call: string, ...ts: Tensor[]): void {
  const d = ts[0]!.device;
  for (const t of ts) if (t.device !== d) throw new DeviceError(`${call}: tensors are on different devices (${d} and ${t.device})`);
}
