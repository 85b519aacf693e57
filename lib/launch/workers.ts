// A node's group of worker processes: spawning one per local rank (`.ts` through tsx, an optional peer
// dependency, resolved from this package or the working directory's project), prefixing
// their output by rank line by line, keeping each rank's stderr tail, and stopping the group. In
// in-job recovery mode (lib/launch/recovery.ts) the group also grows: hot spares (rank -1 until
// assigned a lost rank) and replacements are added to it while it runs.
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { extname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { UsageError } from '../errors.js';

/**
 * How one worker ended. `signal` is set when it was killed; `stopped` when the launcher stopped it.
 * A hot spare has `spare` (its id) and rank -1 until it is assigned a rank (then that rank).
 */
export interface WorkerExit {
  rank: number;
  localRank: number;
  pid: number | undefined;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stopped: boolean;
  spare?: string;
}

export interface WorkerSpec {
  /** Global rank; -1 for a hot spare not assigned yet. */
  rank: number;
  localRank: number;
  env: NodeJS.ProcessEnv;
  /** A hot spare's id (NODETRON_SPARE). */
  spare?: string;
}

/** Lines of stderr kept per rank for the failure report. */
export const STDERR_TAIL_LINES = 20;

/**
 * Where tsx is looked up, in order: nodetron's own location (a project that installed both, or a
 * checkout of nodetron), then the project in the working directory (nodetron installed elsewhere, e.g.
 * globally). Each entry is a file path or URL a require is created from.
 */
export function tsxSearchPath(cwd: string = process.cwd()): string[] {
  return [import.meta.url, join(cwd, 'package.json')];
}

/**
 * The file URL of tsx's loader (its main export, which `node --import tsx` loads: it registers both
 * the ESM and the CommonJS hooks), resolved from the first place in `from` that has tsx installed;
 * undefined when none has it. tsx is an optional peer dependency of nodetron.
 */
export function resolveTsx(from: readonly string[] = tsxSearchPath()): string | undefined {
  for (const base of from) {
    try {
      return pathToFileURL(createRequire(base).resolve('tsx')).href;
    } catch {
      // not installed there: try the next place
    }
  }
  return undefined;
}

/** Whether `script` is TypeScript (`.ts`/`.mts`/`.cts`), which the launcher runs through tsx. */
export function isTypeScript(script: string): boolean {
  const ext = extname(script);
  return ext === '.ts' || ext === '.mts' || ext === '.cts';
}

/**
 * The node command line for a script: `.ts`/`.mts`/`.cts` through tsx's loader (resolveTsx: from this
 * package, then from the working directory's project, so any cwd works), others with plain node. A
 * TypeScript script without tsx installed is a UsageError saying how to get it. `tsxFrom` replaces the
 * places tsx is looked up (tsxSearchPath).
 */
export function scriptCommand(script: string, args: string[], tsxFrom?: readonly string[]): string[] {
  if (isTypeScript(script)) {
    const tsx = resolveTsx(tsxFrom);
    if (tsx === undefined) {
      throw new UsageError(
        `\`${script}\` is TypeScript: \`nodetron launch\` runs .ts scripts with tsx, an optional peer dependency that is not installed here; ` +
          'install it in your project (`npm install --save-dev tsx`) or launch a compiled .js',
      );
    }
    return [process.execPath, '--import', tsx, script, ...args];
  }
  return [process.execPath, script, ...args];
}

/**
 * Copies a stream to `out` a whole line at a time with a prefix, so lines of different ranks never
 * interleave mid-line; remembers the last lines when `tail` is given.
 */
function prefixLines(stream: NodeJS.ReadableStream, prefix: () => string, out: NodeJS.WritableStream, tail?: string[]): Promise<void> {
  let partial = '';
  const emit = (line: string) => {
    out.write(`${prefix()}${line}\n`);
    if (tail) {
      tail.push(line);
      if (tail.length > STDERR_TAIL_LINES) tail.shift();
    }
  };
  stream.setEncoding('utf8');
  stream.on('data', (chunk: string) => {
    const lines = (partial + chunk).split('\n');
    partial = lines.pop()!;
    for (const line of lines) emit(line.endsWith('\r') ? line.slice(0, -1) : line);
  });
  return new Promise((resolve) => {
    const finish = () => {
      if (partial) emit(partial);
      partial = '';
      resolve();
    };
    stream.on('end', finish);
    stream.on('error', finish);
  });
}

interface Worker {
  spec: WorkerSpec;
  child: ChildProcess;
  stderrTail: string[];
  exit?: WorkerExit;
  /** The launcher asked it to stop (its exit is not a failure). */
  stopRequested?: boolean;
  /** Resolves once the process has exited and its output has been written out. */
  done: Promise<WorkerExit>;
}

export class WorkerGroup {
  private readonly workers: Worker[] = [];
  private stopping = false;

  /**
   * Starts every worker. `onExit` is called once per worker when it has exited and its output is
   * flushed (so a failure report made there sees the whole stderr tail).
   */
  constructor(
    private readonly command: string[],
    specs: WorkerSpec[],
    private readonly onExit: (exit: WorkerExit, stderrTail: string[]) => void,
  ) {
    for (const spec of specs) this.add(spec);
  }

  /**
   * Starts one more worker (a hot spare or a replacement) with the group's command; returns its pid
   * (undefined when it could not start, or once the group is being stopped: then nothing starts).
   */
  add(spec: WorkerSpec): number | undefined {
    if (this.stopping) return undefined;
    const command = this.command;
    const child = spawn(command[0]!, command.slice(1), { env: spec.env, stdio: ['ignore', 'pipe', 'pipe'] });
    const stderrTail: string[] = [];
    // A spare's lines say so until it is assigned a rank.
    const prefix = () => (spec.rank >= 0 ? `[rank ${spec.rank}] ` : `[spare ${spec.spare}] `);
    const flushed = Promise.all([
      prefixLines(child.stdout!, prefix, process.stdout),
      prefixLines(child.stderr!, prefix, process.stderr, stderrTail),
    ]);
    const spare = spec.spare !== undefined ? { spare: spec.spare } : {};
    const exited = new Promise<WorkerExit>((resolve) => {
      child.on('error', (e) => {
        stderrTail.push(`could not start: ${e.message}`);
        resolve({ rank: spec.rank, localRank: spec.localRank, pid: child.pid, exitCode: 127, signal: null, stopped: false, ...spare });
      });
      child.on('exit', (exitCode, signal) =>
        resolve({ rank: spec.rank, localRank: spec.localRank, pid: child.pid, exitCode, signal, stopped: this.stopping, ...spare }),
      );
    });
    const worker: Worker = { spec, child, stderrTail, done: undefined as unknown as Promise<WorkerExit> };
    // A grandchild holding the pipes open must not hold up the report: wait at most a second for the flush.
    worker.done = exited.then(async (exit) => {
      await Promise.race([flushed, new Promise((r) => setTimeout(r, 1000))]);
      // The rank a spare was assigned after its exit event but before the flush is still its rank.
      const out = { ...exit, rank: spec.rank, localRank: spec.localRank, stopped: exit.stopped || worker.stopRequested === true };
      worker.exit = out;
      this.onExit(out, stderrTail);
      return out;
    });
    this.workers.push(worker);
    return child.pid;
  }

  /**
   * Hands the running spare `id` the rank `rank` (its output and exit are that rank's from now on);
   * false when no such spare is running unassigned.
   */
  assign(id: string, rank: number, localRank: number): boolean {
    const w = this.workers.find((x) => x.spec.spare === id && x.spec.rank < 0 && isRunning(x));
    if (!w) return false;
    w.spec.rank = rank;
    w.spec.localRank = localRank;
    return true;
  }

  /** The hot spares running unassigned, oldest first. */
  spares(): { id: string; pid: number | undefined }[] {
    return this.workers.filter((w) => w.spec.spare !== undefined && w.spec.rank < 0 && isRunning(w)).map((w) => ({ id: w.spec.spare!, pid: w.child.pid }));
  }

  /** Stops the unassigned spares (SIGTERM, then SIGKILL after `graceMs`); resolves when they have exited. */
  async stopSpares(graceMs: number): Promise<void> {
    const spares = this.workers.filter((w) => w.spec.spare !== undefined && w.spec.rank < 0 && isRunning(w));
    await stopWorkers(spares, graceMs);
  }

  /** Global ranks of the workers (spares not counted), in start order: local-rank order, then replacements. */
  get ranks(): number[] {
    return [...new Set(this.workers.filter((w) => w.spec.rank >= 0).map((w) => w.spec.rank))];
  }

  /** The workers that have not exited (unassigned spares not counted). */
  running(): { rank: number; pid: number | undefined }[] {
    return this.workers.filter((w) => w.spec.rank >= 0 && isRunning(w)).map((w) => ({ rank: w.spec.rank, pid: w.child.pid }));
  }

  get pids(): (number | undefined)[] {
    return this.workers.map((w) => w.child.pid);
  }

  /** Resolves when every worker has exited. */
  async wait(): Promise<WorkerExit[]> {
    return Promise.all(this.workers.map((w) => w.done));
  }

  /** Stops the workers still running: SIGTERM, then SIGKILL after `graceMs`; resolves when all have exited. */
  async stop(graceMs: number): Promise<WorkerExit[]> {
    this.stopping = true;
    await stopWorkers(this.workers.filter(isRunning), graceMs);
    return this.wait();
  }
}

const isRunning = (w: Worker): boolean => !w.exit && w.child.exitCode === null && w.child.signalCode === null;

/** SIGTERM to each, SIGKILL after `graceMs` to those still running; resolves once all have exited. */
async function stopWorkers(workers: Worker[], graceMs: number): Promise<void> {
  for (const w of workers) {
    w.stopRequested = true;
    w.child.kill('SIGTERM');
  }
  const killer = setTimeout(() => {
    for (const w of workers) if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
  }, graceMs);
  try {
    await Promise.all(workers.map((w) => w.done));
  } finally {
    clearTimeout(killer);
  }
}
