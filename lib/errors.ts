// The typed errors of nodetron. Native code builds these through the factory registered in
// lib/native.ts, so an error from C++ carries the caller's JS stack and names the failed call.

/** Stable machine-readable codes of {@link NodetronError}, one per error class. */
export type ErrorCode =
  | 'ERR_ARGUMENT'
  | 'ERR_SHAPE'
  | 'ERR_DTYPE'
  | 'ERR_DEVICE'
  | 'ERR_DISPOSED'
  | 'ERR_OUT_OF_MEMORY'
  | 'ERR_BACKEND_UNAVAILABLE'
  | 'ERR_NATIVE'
  | 'ERR_COMM'
  | 'ERR_TIMEOUT'
  | 'ERR_AUTOGRAD'
  | 'ERR_STATE';

/** Base class of every error nodetron raises on purpose. `code` is stable; `call` names the native call that failed, when one did. */
export class NodetronError extends Error {
  /** Stable code of the error class (e.g. 'ERR_SHAPE'); safe to branch on. */
  readonly code: ErrorCode;
  /** The native (C++/library) call that failed, when one did; undefined for errors raised in TypeScript. */
  readonly call?: string;
  constructor(code: ErrorCode, message: string, call?: string) {
    super(message);
    this.name = new.target.name;
    this.code = code;
    if (call) this.call = call;
  }
}

/** A bad argument: wrong type, fractional or negative size, NaN, unknown option. */
export class ArgumentError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_ARGUMENT', message, call); }
}
/**
 * A command-line usage error: an unknown option, a missing or malformed value, a count or size out of
 * range. The `nodetron` command prints its message on one line with a hint to `--help` and exits with
 * code 2 (every ArgumentError reaching the command line is treated the same way).
 */
export class UsageError extends ArgumentError {}
/** Shapes that do not fit together. */
export class ShapeError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_SHAPE', message, call); }
}
/** A dtype an operation does not accept, or mismatched dtypes. */
export class DTypeError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_DTYPE', message, call); }
}
/** Tensors on different devices, or an unknown device. */
export class DeviceError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_DEVICE', message, call); }
}
/** Use of a tensor (or other handle) after dispose(). */
export class DisposedError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_DISPOSED', message, call); }
}
/** An allocation that cannot be satisfied. `stats` holds the device's memory statistics when known. */
export class OutOfMemoryError extends NodetronError {
  /** The device's memory statistics (bytes by counter) when the backend reported them; undefined otherwise. */
  stats?: Record<string, number>;
  constructor(message: string, call?: string, stats?: Record<string, number>) {
    super('ERR_OUT_OF_MEMORY', message, call);
    if (stats) this.stats = stats;
  }
}
/** A backend (cuda, nccl, gloo) that cannot be used here; the message says what is missing and how to get it. */
export class BackendUnavailableError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_BACKEND_UNAVAILABLE', message, call); }
}
/** A failed library call (CUDA, cuBLAS, NCCL, Gloo, OpenBLAS); `call` names it. */
export class NativeError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_NATIVE', message, call); }
}
/**
 * Work that cannot be captured into a CUDA graph (nt.cuda.graph): a host synchronization (reading a
 * tensor's values, `.item()`-like calls), a CUDA call the capture does not allow, or any error thrown
 * inside the captured function. `op` names where it happened; the capture is discarded.
 */
export class GraphCaptureError extends NativeError {
  /** The op, kernel or call that failed the capture. */
  readonly op: string;
  constructor(message: string, op: string, call?: string) {
    super(message, call);
    this.op = op;
  }
}
/** A collective or point-to-point operation that failed. */
export class CommError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_COMM', message, call); }
}
/** An operation that did not complete within its timeout. */
export class TimeoutError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_TIMEOUT', message, call); }
}
/** Misuse of autograd: backward through a freed graph, gradients of integer tensors. */
export class AutogradError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_AUTOGRAD', message, call); }
}
/** An API used in the wrong state, e.g. a process group before initialization. */
export class StateError extends NodetronError {
  constructor(message: string, call?: string) { super('ERR_STATE', message, call); }
}

const byCode: Record<ErrorCode, new (message: string, call?: string) => NodetronError> = {
  ERR_ARGUMENT: ArgumentError,
  ERR_SHAPE: ShapeError,
  ERR_DTYPE: DTypeError,
  ERR_DEVICE: DeviceError,
  ERR_DISPOSED: DisposedError,
  ERR_OUT_OF_MEMORY: OutOfMemoryError,
  ERR_BACKEND_UNAVAILABLE: BackendUnavailableError,
  ERR_NATIVE: NativeError,
  ERR_COMM: CommError,
  ERR_TIMEOUT: TimeoutError,
  ERR_AUTOGRAD: AutogradError,
  ERR_STATE: StateError,
};

/** Builds the error class for a code; used by native code through lib/native.ts. */
export function errorFromCode(code: string, message: string, call?: string): NodetronError {
  const Ctor = byCode[code as ErrorCode] ?? NativeError;
  return new Ctor(message, call || undefined);
}
