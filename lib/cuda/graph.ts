// nt.cuda.graph: a function's GPU work captured once into a CUDA graph and replayed with one launch
// (native/cuda/graph.cc), so a training step's ~1,000 kernel launches cost one.
import { parseDevice, type DeviceLike } from '../device.js';
import { ArgumentError, BackendUnavailableError, GraphCaptureError, NodetronError, StateError } from '../errors.js';
import { cuda } from '../native.js';
import { currentStream, newStream, type Stream, withStream } from './streams.js';

/** Options of {@link graph}. */
export interface GraphOptions {
  /** The device whose work is captured (default 'cuda'); 'cpu' gives a graph whose replay runs fn. */
  device?: DeviceLike;
  /**
   * Eager runs of fn before the capture (default 1): they create what a first call creates lazily
   * (cuBLASLt plans and workspaces, optimizer state), which should not happen inside the capture.
   */
  warmup?: number;
}

/** What fn's error says about where it happened: the op named first in its message, else its first frames. */
function failedOp(e: unknown): string {
  const msg = e instanceof Error ? e.message : String(e);
  const named = /^([A-Za-z_][\w.]*):/.exec(msg)?.[1];
  if (named) return named;
  const frames = (e instanceof Error ? e.stack ?? '' : '').split('\n').slice(1).map((l) => /at (?:new )?([\w.<>]+) /.exec(l)?.[1]).filter(Boolean);
  return frames.slice(0, 3).join(' < ') || 'unknown';
}

/**
 * A captured CUDA graph: replay() queues all of fn's captured work again with one launch, on the
 * device's current stream (it waits for work queued there before, and later work waits for it).
 * Replays read and write the same memory the capture used: tensors made inside fn keep their
 * storage (their values change with each replay), tensors from outside that fn used must stay
 * alive (not disposed) while the graph exists. On 'cpu' replay() calls fn.
 */
export class CudaGraph {
  #disposed = false;
  /** @internal */
  constructor(
    /** The device: 'cpu' or 'cuda:N'. */
    readonly device: string,
    /** Whether replays launch a captured graph (false on cpu, where they call fn). */
    readonly captured: boolean,
    private readonly id: number,
    private readonly stream: Stream | null,
    private readonly fn: () => void,
  ) {}

  /** Runs the captured work once more (on cpu: calls fn). */
  replay(): void {
    if (this.#disposed) throw new StateError('CudaGraph.replay: the graph was disposed', 'graphLaunch');
    if (!this.captured) { this.fn(); return; }
    const outer = currentStream(this.device);
    this.stream!.waitStream(outer);
    cuda().graphLaunch(this.id);
    outer.waitStream(this.stream!);
  }

  /** Frees the graph after its replays finish; memory the capture deferred or pooled goes back to the allocator. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    if (!this.captured) return;
    try {
      cuda().graphDestroy(this.id);
    } finally {
      this.stream!.destroy();
    }
  }

  /** Whether dispose() was called. */
  get disposed(): boolean { return this.#disposed; }
  /** dispose(), for `using g = nt.cuda.graph(...)`. */
  [Symbol.dispose](): void { this.dispose(); }
}

/**
 * Captures the GPU work of `fn` into a CUDA graph. fn runs `warmup` times eagerly, then once more
 * under stream capture on a side stream: that run queues nothing (the graph records it), so call
 * replay() to run the work, as often as needed (a training step: `const g = nt.cuda.graph(step);
 * for (...) g.replay();`). fn must be replayable as recorded: no host synchronization (reading
 * values, a loss as a number), no new tensors from outside the graph on later replays, the same
 * shapes every time. What cannot be captured throws GraphCaptureError naming the op, and the capture
 * is discarded; the caller may then run fn eagerly instead. On 'cpu' nothing is captured and
 * replay() calls fn (the same code runs on both backends).
 */
export function graph(fn: () => void, opts: GraphOptions = {}): CudaGraph {
  if (typeof fn !== 'function') throw new ArgumentError(`cuda.graph: expected a function, got ${typeof fn}`);
  const warmup = opts.warmup ?? 1;
  if (!Number.isInteger(warmup) || warmup < 0) throw new ArgumentError(`cuda.graph: warmup must be an integer >= 0, got ${warmup}`);
  const dev = parseDevice(opts.device ?? 'cuda', 'cuda.graph');
  if (dev.type === 'cpu') return new CudaGraph('cpu', false, 0, null, fn);
  const addon = cuda();
  if (!((addon.deviceCount() as number) > dev.index)) {
    throw new BackendUnavailableError(`cuda.graph: ${dev.name} is not available (${addon.driverStatus() as string})`);
  }
  if (addon.debugSync() as boolean) {
    throw new StateError('cuda.graph: NODETRON_CUDA_SYNC=1 synchronizes the device after every launch, which a capture does not allow (unset it to capture)');
  }
  const outer = currentStream(dev.name);
  const side = newStream(dev.name);
  let ok = false;
  try {
    side.waitStream(outer);
    withStream(side, () => { for (let i = 0; i < warmup; i++) fn(); });
    addon.graphBegin(dev.index, side.id);
    try {
      withStream(side, fn);
    } catch (e) {
      addon.graphAbort(dev.index);
      const op = failedOp(e);
      throw new GraphCaptureError(`cuda.graph: ${op} cannot be captured into a CUDA graph (capture discarded): ${e instanceof Error ? e.message : String(e)}`, op,
        e instanceof NodetronError ? e.call : undefined);
    }
    let id: number;
    try {
      id = addon.graphEnd(dev.index) as number;
    } catch (e) {
      throw new GraphCaptureError(`cuda.graph: the capture was invalidated by a call it does not allow (capture discarded): ${(e as Error).message}`, 'cudaStreamEndCapture', 'cudaStreamEndCapture');
    }
    outer.waitStream(side);
    ok = true;
    return new CudaGraph(dev.name, true, id, side, fn);
  } finally {
    if (!ok) side.destroy();
  }
}

/** Whether a capture is running on `device` (default 'cuda'); false without a usable GPU. */
export function isCapturing(device: DeviceLike = 'cuda'): boolean {
  const dev = parseDevice(device, 'cuda.isCapturing');
  if (dev.type !== 'cuda') return false;
  try {
    return cuda().graphCapturing(dev.index) as boolean;
  } catch {
    return false;
  }
}
