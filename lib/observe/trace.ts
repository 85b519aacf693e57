// Timelines: NODETRON_TRACE=dir writes one Chrome trace-event JSON per rank (`rank-R.trace.json`,
// pid = rank) when the process exits: every collective as an async span from issue to completion
// (group, sequence number, bytes), point-to-point ops as slices on a send and a recv track joined by
// flow arrows, and the phases code marks with traceSpan (the trainer's forward/backward per
// micro-batch, gradient sync, optimizer step). `nodetron trace merge DIR` shifts every rank by its
// clock offset (measured at init by alignTraceClock) and writes one file for Perfetto / chrome://tracing.
// Collectives reach it through the flight recorder's hook (lib/distributed/flight.ts): one place observes ProcessGroup.
// Layers: traceLayer wraps a transformer block's forward in a span and names the autograd region its
// nodes are recorded in; the outermost backward() (lib/autograd/engine.ts) emits one span per
// contiguous run of nodes of one region (BackwardRegions). Checkpoint stages and data loading go on
// their own tracks. With tracing off every entry point is one boolean check.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

/** Where traces go; undefined when tracing is off. */
export const TRACE_DIR: string | undefined = process.env.NODETRON_TRACE || undefined;
export const traceEnabled = TRACE_DIR !== undefined;

/** Tracks (Chrome trace "threads") of a rank. */
export const TRACKS = { compute: 1, communication: 2, send: 3, recv: 4, data: 5, checkpoint: 6 } as const;
export type Track = keyof typeof TRACKS;

interface TraceEvent {
  name: string; ph: string; ts: number; pid: number; tid: number;
  cat?: string; dur?: number; id?: string; bp?: string; args?: Record<string, unknown>;
}

const events: TraceEvent[] = [];
let clockOffsetUs = 0;
let coords: Record<string, number> | undefined;
let exitHook = false;
const RANK = Number(process.env.RANK ?? 0);
const rank = (): number => RANK;
/** Microseconds since the epoch (the trace's clock). */
export const traceNowUs = (): number => (performance.timeOrigin + performance.now()) * 1000;

function hook(): void {
  if (exitHook) return;
  exitHook = true;
  process.on('exit', () => { writeTrace(); });
}

/** The fields of a finished op the trace needs (a flight recorder entry). */
export interface TracedOp {
  id: number; group: string; seq: number; op: string; p2p: boolean; bytes: number; dtype: string;
  peer?: number; tag?: number; state: string; issuedAt: number; endedAt?: number; error?: string;
}

/** Records a finished collective or point-to-point op (times in ms since the epoch). */
export function traceOp(o: TracedOp, selfRank: number): void {
  if (!traceEnabled) return;
  hook();
  const pid = rank();
  const ts = o.issuedAt * 1000, end = (o.endedAt ?? o.issuedAt) * 1000;
  const args: Record<string, unknown> = { group: o.group, seq: o.seq, bytes: o.bytes, dtype: o.dtype, state: o.state };
  if (o.error) args.error = o.error;
  if (!o.p2p) {
    const id = `r${pid}c${o.id}`;
    events.push({ name: o.op, cat: 'collective', ph: 'b', ts, pid, tid: TRACKS.communication, id, args });
    events.push({ name: o.op, cat: 'collective', ph: 'e', ts: end, pid, tid: TRACKS.communication, id });
    return;
  }
  const send = o.op === 'send';
  args.peer = o.peer;
  args.tag = o.tag ?? 0;
  const tid = send ? TRACKS.send : TRACKS.recv;
  events.push({ name: `${o.op} ${send ? 'to' : 'from'} ${o.peer}`, cat: 'p2p', ph: 'X', ts, dur: Math.max(end - ts, 1), pid, tid, args });
  // The same id on both ends: the k-th send src→dst in this group with this tag.
  const src = send ? selfRank : o.peer!, dst = send ? o.peer! : selfRank;
  const id = `${o.group}|${src}>${dst}|${o.tag ?? 0}|${o.seq}`;
  events.push(send
    ? { name: 'p2p', cat: 'flow', ph: 's', ts, pid, tid, id }
    : { name: 'p2p', cat: 'flow', ph: 'f', bp: 'e', ts, pid, tid, id });
}

/** Runs `fn` as a named slice on a track (sync or async); just calls it when tracing is off. */
export function traceSpan<T>(name: string, fn: () => T, track: Track = 'compute', args?: Record<string, unknown>): T {
  if (!traceEnabled) return fn();
  hook();
  const ts = traceNowUs();
  const done = (): void => {
    events.push({ name, ph: 'X', ts, dur: traceNowUs() - ts, pid: rank(), tid: TRACKS[track], ...(args ? { args } : {}) });
  };
  let out: T;
  try {
    out = fn();
  } catch (e) {
    done();
    throw e;
  }
  if (out instanceof Promise) return out.finally(done) as T;
  done();
  return out;
}

/** Records a finished slice with times measured elsewhere (µs since the epoch, as {@link traceNowUs}). */
export function traceSlice(name: string, ts: number, dur: number, track: Track = 'compute', args?: Record<string, unknown>): void {
  if (!traceEnabled) return;
  hook();
  events.push({ name, ph: 'X', ts, dur: Math.max(dur, 0), pid: rank(), tid: TRACKS[track], ...(args ? { args } : {}) });
}

/**
 * The layer whose forward is running (set by {@link traceLayer} while tracing); autograd nodes
 * remember it, so backward can say which layer it is in. Null outside any layer, or when tracing is off.
 */
export let gradRegion: string | null = null;

/**
 * Runs a layer's forward (`fn`) as a span `forward <kind> <index>` on the compute track and tags the
 * autograd nodes it records, so the backward pass shows `backward <kind> <index>` spans too. With
 * tracing off it only calls `fn` (the name is not even built).
 */
export function traceLayer<T>(kind: string, index: number, fn: () => T): T {
  if (!traceEnabled) return fn();
  const outer = gradRegion, name = `${kind} ${index}`;
  gradRegion = name;
  try {
    return traceSpan(`forward ${name}`, fn, 'compute', { layer: name });
  } finally {
    gradRegion = outer;
  }
}

/**
 * The backward spans of one backward() call: `at(region)` before each node runs closes the span of
 * the previous region when the region changes; `end()` closes the last. Nodes outside any layer
 * (the head's loss, the embeddings) get no span of their own.
 */
export class BackwardRegions {
  #region: string | null = null;
  #start = 0;
  /** Called before a node of `region` runs its backward. */
  at(region: string | null): void {
    if (region === this.#region) return;
    const now = traceNowUs();
    this.#close(now);
    this.#region = region;
    this.#start = now;
  }
  /** Closes the open span (after the last node). */
  end(): void { this.#close(traceNowUs()); this.#region = null; }
  #close(now: number): void {
    if (this.#region !== null) traceSlice(`backward ${this.#region}`, this.#start, now - this.#start, 'compute', { layer: this.#region });
  }
}

/** Notes this rank's mesh coordinates (shown in the merged trace's process names). */
export function setTraceCoords(c: Record<string, number>): void { coords = { ...c }; }

/**
 * Estimates this rank's clock offset to rank 0: a few rounds of barrier, then everyone reads its
 * clock and the readings are gathered; ranks leave a barrier at about the same moment, so rank 0's
 * reading minus this rank's is the offset (median over rounds; good to the barrier's exit skew,
 * about 0.1–0.3 ms on one loaded host). A job on one node shares one clock and skips this.
 */
export async function alignTraceClock(world: {
  size: number; rank: number;
  barrier(): PromiseLike<unknown>;
  allGather(out: import('../tensor.js').Tensor, t: import('../tensor.js').Tensor): PromiseLike<unknown>;
}): Promise<number> {
  if (!traceEnabled || world.size < 2) return clockOffsetUs;
  // One host, one clock: the estimate below could only add its own error.
  if (process.env.LOCAL_WORLD_SIZE !== undefined && process.env.LOCAL_WORLD_SIZE === process.env.WORLD_SIZE) return clockOffsetUs;
  const { tensor, zeros } = await import('../creation.js');
  const samples: number[] = [];
  using all = zeros([2 * world.size], { dtype: 'i32' });
  for (let round = 0; round < 5; round++) {
    await world.barrier();
    const t = traceNowUs();
    // µs since the epoch as two int32 (no f64 dtype): whole 1000 s and the µs within them.
    const hi = Math.floor(t / 1e9);
    using mine = tensor(new Int32Array([hi, Math.floor(t - hi * 1e9)]), [2], { dtype: 'i32' });
    await world.allGather(all, mine);
    const got = all.toArraySync() as Int32Array;
    const at = (r: number) => got[2 * r]! * 1e9 + got[2 * r + 1]!;
    samples.push(at(0) - at(world.rank));
  }
  samples.sort((x, y) => x - y);
  clockOffsetUs = samples[samples.length >> 1]!;
  return clockOffsetUs;
}

/** Writes this rank's events (also run at process exit); returns the path. */
export function writeTrace(): string | undefined {
  if (!traceEnabled) return undefined;
  try {
    mkdirSync(TRACE_DIR!, { recursive: true });
    const path = join(TRACE_DIR!, `rank-${rank()}.trace.json`);
    writeFileSync(path, JSON.stringify({ traceEvents: events, otherData: { rank: rank(), clockOffsetUs, ...(coords ? { coords } : {}) } }));
    return path;
  } catch (e) {
    process.stderr.write(`nodetron trace: could not write the trace: ${(e as Error).message}\n`);
    return undefined;
  }
}
