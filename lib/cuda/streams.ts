// CUDA streams and events for TypeScript: the current stream per device, new streams, events to
// order streams without blocking the host, and timing. Thin handles over the cuda addon's ids.
import { type DeviceLike, parseDevice } from '../device.js';
import { ArgumentError, DeviceError, StateError } from '../errors.js';
import { cuda } from '../native.js';
import { checkTensor, type Tensor } from '../tensor.js';

function cudaIndex(device: DeviceLike | undefined, call: string): number {
  const dev = parseDevice(device ?? 'cuda', call);
  if (dev.type !== 'cuda') throw new DeviceError(`${call}: ${dev.name} is not a cuda device`);
  return dev.index;
}

/** A queue of GPU work on one device. Stream 0 is the device's default stream. */
export class Stream {
  #destroyed = false;
  /**
   * Internal: wraps an addon stream id. Use newStream() or currentStream().
   * @param device CUDA device index.
   * @param id The addon's stream id (0: the default stream).
   */
  constructor(readonly device: number, readonly id: number) {}

  /** Waits on the host until all work queued on this stream has finished. */
  synchronize(): void { cuda().streamSynchronize(this.device, this.live('synchronize')); }
  /** Whether all queued work has finished (never blocks). */
  query(): boolean { return cuda().streamQuery(this.device, this.live('query')) as boolean; }
  /** Later work on this stream waits for the event (no host block). */
  waitEvent(event: Event): void { cuda().streamWaitEvent(this.device, this.live('waitEvent'), event.id); }
  /** Later work on this stream waits for everything queued so far on `other`. */
  waitStream(other: Stream): void {
    const e = new Event(this.device);
    try { e.record(other); this.waitEvent(e); } finally { e.destroy(); }
  }
  /** Whether destroy() was called on this handle. */
  get destroyed(): boolean { return this.#destroyed; }
  /** Frees a stream made by newStream() (the default stream cannot be destroyed). */
  destroy(): void {
    if (this.#destroyed || this.id === 0) return;
    cuda().streamDestroy(this.id);
    this.#destroyed = true;
  }
  private live(call: string): number {
    if (this.#destroyed) throw new StateError(`Stream.${call}: stream ${this.id} was destroyed`);
    return this.id;
  }
}

/** A marker in a stream: record it, make other streams wait on it, wait for it, time between two. */
export class Event {
  /** The addon's event id. */
  readonly id: number;
  #destroyed = false;
  /**
   * Creates an event on a device.
   * @param device CUDA device index.
   * @param opts `timing: true` makes elapsedMs() usable (default false: cheaper events).
   */
  constructor(readonly device: number, opts: { timing?: boolean } = {}) {
    this.id = cuda().eventCreate(device, opts.timing ?? false) as number;
  }
  /** Records the event at the current end of `stream` (default: the device's current stream). */
  record(stream?: Stream): this {
    cuda().eventRecord(this.live('record'), (stream ?? currentStream(`cuda:${this.device}`)).id);
    return this;
  }
  /** Makes `stream` (default: current) wait for this event without blocking the host. */
  wait(stream?: Stream): void { (stream ?? currentStream(`cuda:${this.device}`)).waitEvent(this); }
  /** Blocks the host until the event has completed. */
  synchronize(): void { cuda().eventSynchronize(this.live('synchronize')); }
  /** Whether the event has completed. */
  query(): boolean { return cuda().eventQuery(this.live('query')) as boolean; }
  /** Milliseconds from this event to `end` (both recorded, created with { timing: true }). */
  elapsedMs(end: Event): number { return cuda().eventElapsedMs(this.live('elapsedMs'), end.live('elapsedMs')) as number; }
  /** Frees the event. Idempotent; other methods throw StateError afterwards. */
  destroy(): void {
    if (this.#destroyed) return;
    cuda().eventDestroy(this.id);
    this.#destroyed = true;
  }
  /** destroy(), for `using` declarations. */
  [Symbol.dispose](): void { this.destroy(); }
  private live(call: string): number {
    if (this.#destroyed) throw new StateError(`Event.${call}: event ${this.id} was destroyed`);
    return this.id;
  }
}

/** The stream that ops on `device` (default 'cuda') are queued on. */
export function currentStream(device?: DeviceLike): Stream {
  const d = cudaIndex(device, 'currentStream');
  return new Stream(d, cuda().currentStream(d) as number);
}

/** A new non-blocking stream on `device`; lower priority numbers run first (CUDA's convention). */
export function newStream(device?: DeviceLike, opts: { priority?: number } = {}): Stream {
  const d = cudaIndex(device, 'newStream');
  return new Stream(d, cuda().streamCreate(d, opts.priority ?? 0) as number);
}

/** Makes `stream` current on its device; returns the previous current stream. */
export function setStream(stream: Stream): Stream {
  const prev = new Stream(stream.device, cuda().currentStream(stream.device) as number);
  cuda().setCurrentStream(stream.device, stream.id);
  return prev;
}

/** Runs fn with `stream` as its device's current stream, restoring the previous one after (also across await). */
export function withStream<T>(stream: Stream, fn: () => T): T;
export function withStream<T>(stream: Stream, fn: () => Promise<T>): Promise<T>;
export function withStream<T>(stream: Stream, fn: () => T | Promise<T>): T | Promise<T> {
  const prev = setStream(stream);
  let result: T | Promise<T>;
  try {
    result = fn();
  } catch (e) {
    setStream(prev);
    throw e;
  }
  if (result instanceof Promise) return result.finally(() => setStream(prev));
  setStream(prev);
  return result;
}

/**
 * Declares that `tensor`'s memory is used by work queued on `stream`, a stream other than the one
 * it was allocated on (PyTorch's Tensor.record_stream). The caching allocator otherwise reuses a
 * freed block for later work on its own stream at once; after recordStream it waits, when the
 * tensor is freed, until the work queued on `stream` by then has finished. Call it for every
 * tensor an op on a side stream reads or writes and that may be freed before that op finishes.
 * Views share their storage, so recording one records them all. A stream destroyed later needs
 * nothing more (streamDestroy synchronizes it first).
 */
export function recordStream(tensor: Tensor, stream: Stream): void {
  checkTensor(tensor, 'recordStream', 'tensor');
  if (!(stream instanceof Stream)) throw new ArgumentError(`recordStream: stream must be an nt.cuda.Stream, got ${stream === null ? 'null' : typeof stream}`);
  const dev = tensor.deviceInfo;
  if (dev.type !== 'cuda') throw new DeviceError(`recordStream: the tensor is on ${dev.name}, not a cuda device`);
  if (dev.index !== stream.device) throw new DeviceError(`recordStream: the tensor is on ${dev.name}, the stream on cuda:${stream.device}`);
  if (stream.destroyed) throw new StateError(`recordStream: stream ${stream.id} was destroyed`);
  cuda().recordStream(tensor.storage, stream.id);
}

/** Blocks the host until all work on `device` (default 'cuda') has finished. */
export function synchronize(device?: DeviceLike): void {
  cuda().synchronize(cudaIndex(device, 'synchronize'));
}
