// Whether autograd records operations: a per-async-context switch, so noGrad() spans `await`
// without leaking into concurrent work.
import { AsyncLocalStorage } from 'node:async_hooks';
import { ArgumentError } from '../errors.js';

const mode = new AsyncLocalStorage<boolean>();

/** True when operations on tensors that require grad are being recorded. */
export function isGradEnabled(): boolean {
  return mode.getStore() ?? true;
}

function withMode<T>(enabled: boolean, fn: () => T, call: string): T {
  if (typeof fn !== 'function') throw new ArgumentError(`${call}: fn must be a function (sync or async), got ${fn === null ? 'null' : typeof fn}`);
  return mode.run(enabled, fn);
}

/** Runs fn (sync or async) without recording the autograd graph. */
export function noGrad<T>(fn: () => T): T {
  return withMode(false, fn, 'noGrad');
}

/** Runs fn (sync or async) with recording on, also inside noGrad(). */
export function enableGrad<T>(fn: () => T): T {
  return withMode(true, fn, 'enableGrad');
}
