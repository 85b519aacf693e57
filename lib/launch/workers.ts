// A node's group of worker processes: spawning one per local rank (`.ts` through tsx), prefixing
// their output by rank line by line, keeping each rank's stderr tail, and stopping the group.
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { extname } from 'node:path';
import { pathToFileURL } from 'node:url';

/** How one worker ended. `signal` is set when it was killed; `stopped` when the launcher stopped it. */
export interface WorkerExit {
  rank: number;
  localRank: number;
  pid: number | undefined;
  exitCode: number | null;
  signal: NodeJS.Signals | null;
  stopped: boolean;
}

export interface WorkerSpec {
  rank: number;
  localRank: number;
  env: NodeJS.ProcessEnv;
}

/** Lines of stderr kept per rank for the failure report. */
export const STDERR_TAIL_LINES = 20;

const require = createRequire(import.meta.url);

/** The node command line for a script: `.ts`/`.mts`/`.cts` through tsx's loader (resolved from this package, so any cwd works), others with plain node. */
export function scriptCommand(script: string, args: string[]): string[] {
  const ext = extname(script);
  if (ext === '.ts' || ext === '.mts' || ext === '.cts') {
    const tsx = pathToFileURL(require.resolve('tsx')).href;
    return [process.execPath, '--import', tsx, script, ...args];
  }
  return [process.execPath, script, ...args];
}

/**
 * Copies a stream to `out` a whole line at a time with a prefix, so lines of different ranks never
 * interleave mid-line; remembers the last lines when `tail` is given.
 */
function prefixLines(stream: NodeJS.ReadableStream, prefix: string, out: NodeJS.WritableStream, tail?: string[]): Promise<void> {
  let partial = '';
  const emit = (line: string) => {
    out.write(`${prefix}${line}\n`);
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
  constructor(command: string[], specs: WorkerSpec[], onExit: (exit: WorkerExit, stderrTail: string[]) => void) {
    for (const spec of specs) {
      const child = spawn(command[0]!, command.slice(1), { env: spec.env, stdio: ['ignore', 'pipe', 'pipe'] });
      const stderrTail: string[] = [];
      const prefix = `[rank ${spec.rank}] `;
      const flushed = Promise.all([
        prefixLines(child.stdout!, prefix, process.stdout),
        prefixLines(child.stderr!, prefix, process.stderr, stderrTail),
      ]);
      const exited = new Promise<WorkerExit>((resolve) => {
        child.on('error', (e) => {
          stderrTail.push(`could not start: ${e.message}`);
          resolve({ rank: spec.rank, localRank: spec.localRank, pid: child.pid, exitCode: 127, signal: null, stopped: false });
        });
        child.on('exit', (exitCode, signal) =>
          resolve({ rank: spec.rank, localRank: spec.localRank, pid: child.pid, exitCode, signal, stopped: this.stopping }),
        );
      });
      const worker: Worker = { spec, child, stderrTail, done: undefined as unknown as Promise<WorkerExit> };
      // A grandchild holding the pipes open must not hold up the report: wait at most a second for the flush.
      worker.done = exited.then(async (exit) => {
        await Promise.race([flushed, new Promise((r) => setTimeout(r, 1000))]);
        worker.exit = exit;
        onExit(exit, stderrTail);
        return exit;
      });
      this.workers.push(worker);
    }
  }

  /** Global ranks of the workers, in local-rank order. */
  get ranks(): number[] {
    return this.workers.map((w) => w.spec.rank);
  }

  /** The workers that have not exited. */
  running(): { rank: number; pid: number | undefined }[] {
    return this.workers.filter((w) => !w.exit && w.child.exitCode === null && w.child.signalCode === null).map((w) => ({ rank: w.spec.rank, pid: w.child.pid }));
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
    const running = this.workers.filter((w) => !w.exit && w.child.exitCode === null && w.child.signalCode === null);
    for (const w of running) w.child.kill('SIGTERM');
    const killer = setTimeout(() => {
      for (const w of running) if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
    }, graceMs);
    try {
      return await this.wait();
    } finally {
      clearTimeout(killer);
    }
  }
}
