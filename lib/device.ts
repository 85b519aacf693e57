// Devices: parsing 'cpu' | 'cuda' | 'cuda:N' and reaching the backend addon that owns a device.
import { DeviceError } from './errors.js';
import { type BackendAddon, cpu, cuda } from './native.js';

export type DeviceType = 'cpu' | 'cuda';
/** Where a tensor lives: 'cpu', 'cuda' (the current cuda device) or 'cuda:N'. */
export type DeviceLike = string;

/** A parsed device (see parseDevice). */
export interface Device {
  /** 'cpu' or 'cuda'. */
  readonly type: DeviceType;
  /** Device ordinal: 0 for cpu; the CUDA device index for cuda. */
  readonly index: number;
  /** Canonical name: 'cpu' or 'cuda:N'. */
  readonly name: string;
}

const cache = new Map<string, Device>();
let defaultCudaIndex = 0;

/** Sets the device that plain 'cuda' means (the launcher sets it from LOCAL_RANK). */
export function setCudaDevice(index: number): void {
  if (!Number.isInteger(index) || index < 0) throw new DeviceError(`setCudaDevice: bad device index ${index}`);
  defaultCudaIndex = index;
  cache.delete('cuda');
}

/**
 * Parses 'cpu', 'cuda' (the device set by setCudaDevice, default 0) or 'cuda:N' into a Device; undefined means cpu and
 * a Device passes through. Throws DeviceError for anything else (including 'cpu:1'). `call` names the caller in the
 * error message.
 */
export function parseDevice(d: DeviceLike | Device | undefined, call = 'device'): Device {
  if (d === undefined) return parseDevice('cpu');
  if (typeof d === 'object' && d !== null && 'type' in d) return d;
  if (typeof d !== 'string') throw new DeviceError(`${call}: device must be a string like 'cpu' or 'cuda:0', got ${typeof d}`);
  const hit = cache.get(d);
  if (hit) return hit;
  let dev: Device;
  const m = /^(cpu|cuda)(?::(\d+))?$/.exec(d);
  if (!m) throw new DeviceError(`${call}: unknown device ${JSON.stringify(d)} (use 'cpu', 'cuda' or 'cuda:N')`);
  if (m[1] === 'cpu') {
    if (m[2] !== undefined && m[2] !== '0') throw new DeviceError(`${call}: there is one cpu device ('cpu'), got ${JSON.stringify(d)}`);
    dev = { type: 'cpu', index: 0, name: 'cpu' };
  } else {
    const index = m[2] === undefined ? defaultCudaIndex : Number(m[2]);
    dev = { type: 'cuda', index, name: `cuda:${index}` };
  }
  cache.set(d, dev);
  return dev;
}

/** The addon that implements a device's kernels (the cuda addon loads on first use). */
export function backendOf(dev: Device): BackendAddon {
  return dev.type === 'cpu' ? cpu() : cuda();
}
