// The flight recorder: every rank keeps its last N collectives and point-to-point ops in a ring
// (sequence number, op, group, bytes, dtype, peer/root, state, timestamps, the JS stack that issued
// it) and writes the ring as JSON when a collective fails (CommError/TimeoutError) or when asked
// (SIGUSR2, which the launcher sends to every rank when a job fails or hangs). The launcher reads the
// dumps and prints which rank never reached the collective the others wait in (lib/launch/flight-analysis.ts).
//
// NODETRON_FLIGHT_RECORDER=N sets the ring size (default 2000, 0 turns it off); NODETRON_FLIGHT_DIR
// is where dumps go (the launcher sets it to a fresh directory per attempt; else the temp dir), and
// NODETRON_FLIGHT_PROGRESS=1 (set by the launcher under --hang-timeout-ms) adds a progress file there.
// ProcessGroup reports ops through opIssued / FlightOp.started / FlightOp.settled: the one hook.
import { mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CommError, TimeoutError } from '../errors.js';
import { setTraceCoords, traceEnabled, traceOp } from '../observe/trace.js';

export type FlightState = 'issued' | 'started' | 'completed' | 'failed';

/** One op in the ring. Times are ms since the epoch (fractional). */
export interface FlightOp {
  /** Per-process op counter (every op, collective or not). */
  id: number;
  group: string;
  /** The group's collective sequence number; for send/recv the n-th op between this pair in this direction. */
  seq: number;
  op: string;
  p2p: boolean;
  bytes: number;
  dtype: string;
  /** Global rank of the peer (send/recv) or of the root (broadcast/reduce). */
  peer?: number;
  root?: number;
  tag?: number;
  state: FlightState;
  issuedAt: number;
  startedAt?: number;
  endedAt?: number;
  error?: string;
  /** This process's global rank. */
  self?: number;
  /** The captured (lazily formatted) stack; written as a string array in dumps. */
  stackHolder?: { stack?: string };
}

/** What a rank writes: its ring (oldest first) and per-group progress counters that outlive the ring. */
export interface FlightDump {
  version: 1;
  rank: number;
  worldSize: number;
  pid: number;
  host: string;
  reason: string;
  dumpedAt: number;
  coords?: Record<string, number>;
  /** Every world rank's coordinates (index = rank), so the analysis can place ranks that wrote no dump. */
  meshCoords?: Record<string, number>[];
  groups: Record<string, { ranks: number[]; dim?: string; entered: number; completed: number; lastOp?: string }>;
  ops: Array<Omit<FlightOp, 'stackHolder'> & { stack?: string[] }>;
}

interface GroupInfo { name: string; rank: number; ranks: readonly number[] }

const envSize = process.env.NODETRON_FLIGHT_RECORDER;
const parsedSize = envSize === undefined || envSize === '' ? 2000 : Number(envSize);
/** Ring size; 0 when the recorder is off. */
export const FLIGHT_SIZE = Number.isInteger(parsedSize) && parsedSize > 0 ? parsedSize : 0;

const ring: (FlightOp | undefined)[] = [];
let nextId = 0;
const groups = new Map<string, { ranks: number[]; dim?: string; entered: number; completed: number; lastOp?: string }>();
const p2pCounters = new Map<string, number>();
let coords: Record<string, number> | undefined;
let meshCoords: Record<string, number>[] | undefined;
let signalInstalled = false;
// Under the launcher's hang check: a file whose mtime says when this rank last completed an op.
let progressPath: string | undefined;
let lastProgress = 0;
function touchProgress(at: number): void {
  lastProgress = at;
  try { writeFileSync(progressPath!, String(nextId)); } catch { progressPath = undefined; }
}
/** Stack frames kept per op (the top ones are the group's own and are dropped when written). */
const STACK_FRAMES = 8;

const ringOn = FLIGHT_SIZE > 0;
/** Whether ops are observed, by the ring or the trace (checked on the hot path: one branch when both are off). */
export const flightEnabled = ringOn || traceEnabled;

/** Records an op as issued; undefined when the recorder is off. */
export function opIssued(g: GroupInfo, op: string, seq: number, bytes: number, dtype: string,
  extra?: { peer?: number; root?: number; tag?: number; send?: boolean }): FlightOp | undefined {
  if (!flightEnabled) return undefined;
  let info = groups.get(g.name);
  if (!info) { info = { ranks: [...g.ranks], entered: -1, completed: -1 }; groups.set(g.name, info); }
  const p2p = extra?.peer !== undefined;
  if (p2p) {
    // Matches the k-th send a→b with the k-th recv at b from a (same group, same tag).
    const key = `${g.name}|${extra!.send ? `${g.ranks[g.rank]}>${extra!.peer}` : `${extra!.peer}>${g.ranks[g.rank]}`}|${extra!.tag ?? 0}`;
    seq = p2pCounters.get(key) ?? 0;
    p2pCounters.set(key, seq + 1);
  } else {
    info.entered = seq;
    info.lastOp = op;
  }
  let holder: { stack?: string } | undefined;
  if (ringOn) {
    holder = {};
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = STACK_FRAMES;
    Error.captureStackTrace(holder);  // formatted only if the op is ever written
    Error.stackTraceLimit = limit;
  }
  const entry: FlightOp = { id: nextId, group: g.name, seq, op, p2p, bytes, dtype, state: 'issued', issuedAt: now(), stackHolder: holder };
  entry.self = g.ranks[g.rank]!;
  if (extra) {
    if (extra.peer !== undefined) entry.peer = extra.peer;
    if (extra.root !== undefined) entry.root = g.ranks[extra.root];
    if (extra.tag !== undefined) entry.tag = extra.tag;
  }
  if (ringOn) ring[nextId % FLIGHT_SIZE] = entry;
  nextId++;
  return entry;
}

/** The native op was posted. */
export function opStarted(e: FlightOp | undefined): void {
  if (!e) return;
  e.state = 'started';
  e.startedAt = now();
}

/** The op finished; a CommError/TimeoutError also writes this rank's dump. */
export function opSettled(e: FlightOp | undefined, failed: boolean, error?: unknown): void {
  if (!e) return;
  e.endedAt = now();
  if (!failed) {
    e.state = 'completed';
    if (!e.p2p) {
      const info = groups.get(e.group);
      if (info && e.seq > info.completed) info.completed = e.seq;
    }
    if (traceEnabled) traceOp(e, e.self ?? 0);
    if (progressPath && e.endedAt - lastProgress >= 1000) touchProgress(e.endedAt);
    return;
  }
  e.state = 'failed';
  e.error = error instanceof Error ? error.message : String(error);
  if (traceEnabled) traceOp(e, e.self ?? 0);
  if (error instanceof CommError || error instanceof TimeoutError) {
    dumpFlightRecord(`${e.op} #${e.seq} in group '${e.group}' failed: ${e.error}`);
  }
}

/** Registers this rank's mesh coordinates and which group is which dimension (lib/parallel/mesh.ts). */
export function setFlightMesh(all: readonly Record<string, number>[], rank: number, dims: Record<string, string>): void {
  if (!flightEnabled) return;
  coords = { ...all[rank] };
  if (traceEnabled) setTraceCoords(coords);
  meshCoords = all.map((c) => ({ ...c }));
  for (const [dim, name] of Object.entries(dims)) {
    const info = groups.get(name);
    if (info) info.dim = dim;
    else groups.set(name, { ranks: [], dim, entered: -1, completed: -1 });
  }
}

/** Notes a group (its member list) before its first op, so a dump names it even if it never ran one. */
export function flightGroup(g: GroupInfo): void {
  if (!flightEnabled) return;
  const info = groups.get(g.name);
  if (!info) groups.set(g.name, { ranks: [...g.ranks], entered: -1, completed: -1 });
  else if (info.ranks.length === 0) info.ranks = [...g.ranks];
}

/** The directory dumps go to. */
export function flightDir(): string {
  return process.env.NODETRON_FLIGHT_DIR || join(tmpdir(), `nodetron-flight-${process.env.NODETRON_RUN_ID ?? process.ppid}`);
}

/** This rank's ring as written to disk. */
export function flightSnapshot(reason: string): FlightDump {
  const ops: FlightDump['ops'] = [];
  const n = Math.min(nextId, FLIGHT_SIZE);
  for (let i = nextId - n; i < nextId; i++) {
    const e = ring[i % FLIGHT_SIZE]!;
    const { stackHolder, ...rest } = e;
    // Formatting a stack is the expensive part: only the recent ops and those not completed get one.
    const wantStack = i >= nextId - 64 || e.state !== 'completed';
    ops.push(wantStack ? { ...rest, stack: formatStack(stackHolder?.stack) } : rest);
  }
  return {
    version: 1,
    rank: Number(process.env.RANK ?? 0),
    worldSize: Number(process.env.WORLD_SIZE ?? 1),
    pid: process.pid,
    host: hostname(),
    reason,
    dumpedAt: now(),
    ...(coords ? { coords } : {}),
    ...(meshCoords ? { meshCoords } : {}),
    groups: Object.fromEntries([...groups].map(([k, v]) => [k, { ...v }])),
    ops,
  };
}

/** Writes the ring (synchronously: the process may be about to exit) to `<dir>/rank-<R>.json`; returns the path, or undefined when off or on a write error. */
export function dumpFlightRecord(reason: string): string | undefined {
  if (!ringOn) return undefined;
  try {
    const dir = flightDir();
    mkdirSync(dir, { recursive: true });
    const rank = Number(process.env.RANK ?? 0);
    const path = join(dir, `rank-${rank}.json`);
    const tmp = `${path}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(flightSnapshot(reason)));
    renameSync(tmp, path);  // the launcher never reads half a file
    return path;
  } catch (e) {
    process.stderr.write(`nodetron flight recorder: could not write the dump: ${(e as Error).message}\n`);
    return undefined;
  }
}

/**
 * Lets the launcher ask this rank for its ring: SIGUSR2 writes the dump. A marker file tells the
 * launcher this rank handles the signal (a process without the handler would be killed by it).
 * A rank blocked in a synchronous wait runs the handler only when the wait returns (its timeout
 * path dumps by itself).
 */
export function installFlightSignal(): void {
  if (!ringOn || signalInstalled || !process.env.NODETRON_FLIGHT_DIR) return;
  signalInstalled = true;
  process.on('SIGUSR2', () => { dumpFlightRecord('requested by the launcher (SIGUSR2)'); });
  try {
    mkdirSync(flightDir(), { recursive: true });
    writeFileSync(join(flightDir(), `rank-${process.env.RANK ?? 0}.pid`), String(process.pid));
    // Only the launcher's hang check (--hang-timeout-ms) reads it: without one, no file is written.
    if (process.env.NODETRON_FLIGHT_PROGRESS === '1') progressPath = join(flightDir(), `rank-${process.env.RANK ?? 0}.progress`);
  } catch { /* the launcher then just does not signal this rank */ }
}

function formatStack(stack: string | undefined): string[] | undefined {
  if (!stack) return undefined;
  const lines = stack.split('\n').slice(1).map((l) => l.trim().replace(/^at /, ''));
  // Drop the recorder's and the group's own frames: the first frame left is the caller's.
  const own = /[/\\]distributed[/\\](flight|group|work)\.[jt]s/;
  let i = 0;
  while (i < lines.length - 1 && own.test(lines[i]!)) i++;
  return lines.slice(i);
}

function now(): number {
  return performance.timeOrigin + performance.now();
}

/** Test hook: forgets every recorded op. */
export function resetFlightRecorder(): void {
  ring.length = 0;
  nextId = 0;
  groups.clear();
  p2pCounters.clear();
  coords = undefined;
  meshCoords = undefined;
}
