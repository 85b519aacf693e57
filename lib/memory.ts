// Deterministic release of tensors: scopes that work across `await`, keep(), live counts and the
// leak backstop that warns about tensors the garbage collector reclaimed without dispose().
import { AsyncLocalStorage } from 'node:async_hooks';
import { type Device, backendOf, parseDevice, type DeviceLike } from './device.js';
import { cpu } from './native.js';
import { ArgumentError } from './errors.js';

/** Anything a scope can release. */
export interface Disposable {
  dispose(): void;
  readonly disposed: boolean;
}

interface ScopeFrame {
  owned: Set<Disposable>;
  kept: WeakSet<Disposable>;
  parent: ScopeFrame | undefined;
}

const frames = new AsyncLocalStorage<ScopeFrame>();
// Live tensor counts per device name; an object beats a Map on the per-tensor hot path.
const live: Record<string, number> = Object.create(null);
let leakedOther = 0;
let leakSeen = 0;
let leakWarned = false;
let cpuCreations = 0;

function warnLeak(): void {
  if (leakWarned || process.env.NODETRON_WARN_LEAKS === '0') return;
  leakWarned = true;
  process.emitWarning(
    'nodetron: a tensor was garbage-collected without dispose(); its memory was reclaimed late. ' +
      'Use dispose(), `using`, or nt.scope() (set NODETRON_WARN_LEAKS=0 to silence).',
    'NodetronLeakWarning',
  );
}

// The leak backstop. On cpu the addon counts storages that reach their destructor undisposed
// (read every 1024 creations and by memoryStats): registering every tensor with a
// FinalizationRegistry cost 0.45 µs per op, a quarter of a tiny op's dispatch. Other devices
// keep the registry, since their memory must not be freed by the collector behind a stream.
function cpuLeaks(): number {
  const n = cpu().leakedStorages() as number;
  if (n > leakSeen) { leakSeen = n; warnLeak(); }
  return n;
}

const leakRegistry = new FinalizationRegistry<string>((device) => {
  leakedOther++;
  live[device] = (live[device] ?? 1) - 1;
  warnLeak();
});

/** Called by every new tensor: counts it, arms the leak backstop, and adds it to the current scope. */
export function track(t: Disposable, device: Device): void {
  live[device.name] = (live[device.name] ?? 0) + 1;
  if (device.type !== 'cpu') leakRegistry.register(t, device.name, t);
  else if ((++cpuCreations & 1023) === 0) cpuLeaks();
  frames.getStore()?.owned.add(t);
}

/** Called by dispose(): the tensor is no longer live. */
export function untrack(t: Disposable, device: Device): void {
  live[device.name] = (live[device.name] ?? 1) - 1;
  if (device.type !== 'cpu') leakRegistry.unregister(t);
}

function collect(value: unknown, into: Set<Disposable>, seen = new Set<unknown>()): void {
  if (value === null || typeof value !== 'object' || seen.has(value)) return;
  seen.add(value);
  if (typeof (value as Disposable).dispose === 'function' && 'disposed' in (value as object)) {
    into.add(value as Disposable);
  }
  if (Array.isArray(value)) for (const v of value) collect(v, into, seen);
  else if (value instanceof Map) for (const v of value.values()) collect(v, into, seen);
  else if (Object.getPrototypeOf(value) === Object.prototype) for (const v of Object.values(value)) collect(v, into, seen);
}

function close(frame: ScopeFrame, result: unknown): void {
  const returned = new Set<Disposable>();
  collect(result, returned);
  for (const t of frame.owned) {
    if (returned.has(t) || frame.kept.has(t)) {
      frame.parent?.owned.add(t);
      if (frame.kept.has(t)) frame.parent?.kept.add(t);
    } else if (!t.disposed) {
      t.dispose();
    }
  }
  frame.owned.clear();
}

/**
 * Runs fn and disposes every tensor created inside it except those it returns (found in arrays,
 * plain objects and Maps) and those passed to keep(). Works across `await`: concurrent scopes each
 * release only their own tensors. Returned tensors move to the enclosing scope, if any.
 */
export function scope<T>(fn: () => Promise<T>): Promise<T>;
export function scope<T>(fn: () => T): T;
export function scope<T>(fn: () => T | Promise<T>): T | Promise<T> {
  if (typeof fn !== 'function') throw new ArgumentError(`scope: fn must be a function (sync or async), got ${fn === null ? 'null' : typeof fn}`);
  const frame: ScopeFrame = { owned: new Set(), kept: new WeakSet(), parent: frames.getStore() };
  let result: T | Promise<T>;
  try {
    result = frames.run(frame, fn);
  } catch (e) {
    close(frame, undefined);
    throw e;
  }
  if (result instanceof Promise) {
    return result.then(
      (v) => { close(frame, v); return v; },
      (e) => { close(frame, undefined); throw e; },
    );
  }
  close(frame, result);
  return result;
}

/** Exempts tensors from release by the scopes they were created in. Returns its argument. */
export function keep<T extends Disposable | Disposable[]>(t: T): T {
  let frame = frames.getStore();
  const items = Array.isArray(t) ? t : [t];
  for (const x of items) {
    if (x === null || typeof x !== 'object' || typeof (x as Disposable).dispose !== 'function') {
      throw new ArgumentError(`keep: expected a Tensor (or anything with dispose()) or an array of them, got ${x === null ? 'null' : typeof x}`);
    }
  }
  while (frame) {
    for (const x of items) frame.kept.add(x);
    frame = frame.parent;
  }
  return t;
}

/** Memory counters of one device, from {@link memoryStats}. */
export interface MemoryStats {
  /** Canonical device name: 'cpu' or 'cuda:N'. */
  device: string;
  /** Bytes held by live tensors. */
  allocated: number;
  /** Bytes the backend holds from the system (allocated plus cached blocks). */
  reserved: number;
  /** Highest `allocated` since start or resetPeakMemory(). */
  peak: number;
  /** Tensors created and not yet disposed. */
  liveTensors: number;
  /** Tensors (on cpu: storages) reclaimed by the garbage collector without dispose(). */
  leakedTensors: number;
  [extra: string]: number | string;
}

/** Memory statistics of a device (default cpu). */
export function memoryStats(device: DeviceLike = 'cpu'): MemoryStats {
  const dev = parseDevice(device, 'memoryStats');
  const s = backendOf(dev).memoryStats(dev.index);
  const leakedCpu = cpuLeaks();
  const liveCount = (live[dev.name] ?? 0) - (dev.type === 'cpu' ? leakedCpu : 0);
  return { ...s, device: dev.name, liveTensors: liveCount, leakedTensors: leakedCpu + leakedOther };
}

/** Starts a new peak measurement at the current allocation. */
export function resetPeakMemory(device: DeviceLike = 'cpu'): void {
  const dev = parseDevice(device, 'resetPeakMemory');
  backendOf(dev).resetPeakMemory(dev.index);
}

/** Returns a device's cached free blocks to the system (host blocks on cpu, device blocks on cuda). */
export function emptyCache(device: DeviceLike = 'cpu'): void {
  const dev = parseDevice(device, 'emptyCache');
  backendOf(dev).emptyCache(dev.index);
}
