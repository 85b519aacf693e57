// Bounded concurrency for tests that start many launcher jobs: at most `NODETRON_TEST_JOBS` (default:
// the core count, at least 2) run at once per test file, and each job's time limit counts from its
// own start, not from when it was queued, so a loaded machine makes a file slower but not red.
import { spawn } from 'node:child_process';
import { availableParallelism } from 'node:os';

/** How many jobs of one file run at once. */
export const TEST_JOBS = Math.max(1, Number(process.env.NODETRON_TEST_JOBS) || Math.max(2, availableParallelism()));

/** A vitest timeout for a test that awaits queued jobs: the jobs' own limits catch hangs. */
export const QUEUED_TEST_TIMEOUT_MS = 20 * 60_000;

/** Runs async tasks with at most `size` in flight, in submission order. */
export class JobPool {
  #active = 0;
  readonly #queue: Array<() => void> = [];
  constructor(readonly size = TEST_JOBS) {}

  run<T>(task: () => Promise<T>): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const start = (): void => {
        this.#active++;
        task().then(resolve, reject).finally(() => {
          this.#active--;
          this.#queue.shift()?.();
        });
      };
      if (this.#active < this.size) start();
      else this.#queue.push(start);
    });
  }
}

export interface ProcessResult { code: number | null; output: string; timedOut: boolean; ms: number }

/**
 * Runs a command to completion, collecting stdout and stderr together. After `limitMs` of its own
 * run time it is stopped (SIGTERM, then SIGKILL) and the output says so.
 */
export function runProcess(cmd: string, args: string[], opts: { cwd: string; limitMs: number; env?: NodeJS.ProcessEnv }): Promise<ProcessResult> {
  const t0 = Date.now();
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '', timedOut = false;
    child.stdout.on('data', (d: Buffer) => { output += d.toString(); });
    child.stderr.on('data', (d: Buffer) => { output += d.toString(); });
    const kill = setTimeout(() => {
      timedOut = true;
      output += `\n[test] stopped after ${opts.limitMs} ms of its own run time: ${[cmd, ...args].join(' ')}\n`;
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 5000).unref();
    }, opts.limitMs);
    child.on('close', (code) => {
      clearTimeout(kill);
      resolve({ code, output, timedOut, ms: Date.now() - t0 });
    });
  });
}

/** Whether a process with this id is alive (signal 0 reaches it). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
