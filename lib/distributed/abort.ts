// Aborting every Gloo communicator of the process at once (in-job recovery, issue #37): directly, or
// from the launcher's abort file through a native watcher thread that runs even while the JS thread
// blocks in a waitSync(). Typed wrappers over the cpu addon's abortCommunicators, watchAbortFile
// and stopAbortWatch (native/cpu/comm/abort.cc), and the abort file read from JS (readAbortFile,
// abortWhileConnecting: a regroup's communicators made after the watcher read the file; untilAborted:
// a wait no communicator abort reaches).
import { readFileSync } from 'node:fs';
import { ArgumentError, BackendUnavailableError, CommError } from '../errors.js';
import { cpu } from '../native.js';

interface AbortAddon {
  abortCommunicators(reason: string): number;
  watchAbortFile(path: string, generation: number): void;
  stopAbortWatch(): void;
}

function addon(call: string): AbortAddon {
  const a = cpu() as Partial<AbortAddon> & { GlooCommunicator?: unknown };
  if (typeof a.GlooCommunicator !== 'function') {
    throw new BackendUnavailableError(`${call}: the cpu addon was built without Gloo (install libgloo-dev and rebuild)`, call);
  }
  if (typeof a.abortCommunicators !== 'function' || typeof a.watchAbortFile !== 'function' || typeof a.stopAbortWatch !== 'function') {
    throw new BackendUnavailableError(`${call}: the cpu addon predates communicator abort; rebuild it (node scripts/setup.mjs)`, call);
  }
  return a as AbortAddon;
}

function checkReason(reason: unknown, call: string): string {
  if (typeof reason !== 'string' || reason.length === 0) throw new ArgumentError(`${call}: reason must be a non-empty string`, call);
  return reason;
}

/**
 * Aborts every live Gloo communicator of this process: each op in flight rejects promptly with
 * CommError naming `reason`, later ops fail at once, destroy() still resolves. Returns how many
 * communicators it aborted (those destroyed or aborted before are not counted). NCCL communicators
 * are not included: abort them through their group (CommBackend.abort).
 */
export function abortAllCommunicators(reason: string): number {
  const call = 'abortAllCommunicators';
  return addon(call).abortCommunicators(checkReason(reason, call));
}

/**
 * Starts (or retargets) the process's abort-file watcher: a native thread polls `path` every 20 ms,
 * and when the file holds a decimal number greater than `generation` it aborts every live Gloo
 * communicator with the reason `generation N started (abort file PATH)`, then watches for more than
 * N. A missing file or one that is not a plain number is ignored. Works while the JS thread is
 * blocked in a synchronous wait. The launcher writes the file atomically (tmp + rename).
 */
export function watchAbortFile(path: string, generation: number): void {
  const call = 'watchAbortFile';
  if (typeof path !== 'string' || path.length === 0) throw new ArgumentError(`${call}: path must be a non-empty string`, call);
  if (path.includes('\0')) throw new ArgumentError(`${call}: path must not contain a NUL character`, call);
  if (!Number.isSafeInteger(generation) || generation < 0) {
    throw new ArgumentError(`${call}: generation must be a non-negative integer, got ${String(generation)}`, call);
  }
  addon(call).watchAbortFile(path, generation);
}

/** Ends the abort-file watcher thread (a no-op when none runs). It also ends at process exit. */
export function stopAbortWatch(): void {
  addon('stopAbortWatch').stopAbortWatch();
}

/** The generation an abort file says (its decimal content), or -1 when it is missing or not a plain number (as the watcher reads it). */
export function readAbortFile(path: string): number {
  let text: string;
  try { text = readFileSync(path, 'utf8'); } catch { return -1; }
  // As native/cpu/comm/abort.cc's readGeneration: leading whitespace, digits, then whitespace or the end.
  const m = /^[ \t\r\n]*(\d{1,15})(?:[ \t\r\n]|$)/.exec(text.slice(0, 63));
  return m ? Number(m[1]) : -1;
}

/** How often abortWhileConnecting reads the abort file (the native watcher's own period is 20 ms). */
const CONNECTING_POLL_MS = 20;

/**
 * While a regroup builds the communicators of `generation`: reads the abort file `path` every 20 ms
 * and, once it says a later generation, aborts every live Gloo communicator (the ones connecting
 * then, and any made after), so a connect waiting for a peer of `generation` that will never come
 * (a replacement that died while it started) fails at once instead of at its timeout. The native
 * watcher cannot do this alone: it aborts the communicators that exist when it reads the file and
 * then watches above that generation, so those a regroup makes after that read are not its targets.
 * Returns the function that stops the polling.
 */
export function abortWhileConnecting(path: string, generation: number): () => void {
  const call = 'abortWhileConnecting';
  if (typeof path !== 'string' || path.length === 0) throw new ArgumentError(`${call}: path must be a non-empty string`, call);
  if (!Number.isSafeInteger(generation) || generation < 0) throw new ArgumentError(`${call}: generation must be a non-negative integer, got ${String(generation)}`, call);
  const native = addon(call);
  const check = (): void => {
    const g = readAbortFile(path);
    if (g > generation) native.abortCommunicators(`generation ${g} started while generation ${generation} connected (abort file ${path})`);
  };
  const timer = setInterval(check, CONNECTING_POLL_MS);
  timer.unref();
  return () => clearInterval(timer);
}

/**
 * Waits for `work` unless the abort file `path` announces a generation after `generation` first: then
 * rejects with a CommError naming `what` (the lost-peer error in-job recovery handles), and `work`
 * goes on unawaited. For a wait no communicator abort reaches, such as a rank's in-memory copy on its
 * way to a holder whose node was cut off: without this, the wait lasts until the copy's own timeout
 * while the others regroup. Reads the file every 20 ms while `work` is pending (once at the start).
 */
export async function untilAborted<T>(work: Promise<T>, path: string, generation: number, what: string): Promise<T> {
  const call = 'untilAborted';
  if (typeof path !== 'string' || path.length === 0) throw new ArgumentError(`${call}: path must be a non-empty string`, call);
  if (!Number.isSafeInteger(generation) || generation < 0) throw new ArgumentError(`${call}: generation must be a non-negative integer, got ${String(generation)}`, call);
  const later = (): CommError | undefined => {
    const g = readAbortFile(path);
    return g > generation ? new CommError(`${what}: generation ${g} started (abort file ${path}) while this rank waited`, call) : undefined;
  };
  const now = later();
  if (now) throw now;
  let timer: ReturnType<typeof setInterval> | undefined;
  const aborted = new Promise<never>((_, reject) => {
    timer = setInterval(() => {
      const e = later();
      if (e) reject(e);
    }, CONNECTING_POLL_MS);
  });
  try {
    return await Promise.race([work, aborted]);
  } finally {
    clearInterval(timer);
  }
}
