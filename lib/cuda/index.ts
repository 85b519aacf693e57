// The cuda namespace: availability, devices, GEMM precision, streams and events.
import { cuda as cudaAddon } from '../native.js';
import { ArgumentError } from '../errors.js';

export { Stream, Event, currentStream, newStream, setStream, withStream, synchronize, recordStream } from './streams.js';
export { graph, isCapturing, CudaGraph, type GraphOptions } from './graph.js';

/** Number of usable GPUs (0 without the cuda backend, a driver or a GPU). */
export function deviceCount(): number {
  try {
    return cudaAddon().deviceCount() as number;
  } catch {
    return 0;
  }
}

/** Whether at least one GPU can run nodetron's cuda backend. */
export function isAvailable(): boolean {
  return deviceCount() > 0;
}

/** Why cuda is not usable ('ok' when it is): the missing build, library, driver or GPU. */
export function unavailableReason(): string {
  try {
    return cudaAddon().driverStatus() as string;
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * Precision of f32 matrix products on cuda, as in PyTorch: 'highest' (true f32, the default) or
 * 'high' (TF32 tensor cores: 10-bit mantissa inputs, f32 accumulation, several times faster).
 */
export function setFloat32MatmulPrecision(precision: 'highest' | 'high'): void {
  if (precision !== 'highest' && precision !== 'high') {
    throw new ArgumentError(`setFloat32MatmulPrecision: expected 'highest' or 'high', got ${String(precision)}`);
  }
  float32Precision = precision;
  cudaAddon().setMatmulTf32(precision === 'high');
}
let float32Precision: 'highest' | 'high' = 'highest';

/** The current f32 matmul precision on cuda (see setFloat32MatmulPrecision). */
export function getFloat32MatmulPrecision(): 'highest' | 'high' {
  return float32Precision;
}
