// `nt.info()` / `nodetron info`: version, backends and their libraries, devices, and why not.
import { readFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { blasKernelChoice, cpu, cuda } from './native.js';
import { version } from './version.js';

export interface BackendInfo {
  available: boolean;
  /** Why the backend cannot be used, when it cannot. */
  reason?: string;
  [detail: string]: unknown;
}

export interface Info {
  version: string;
  node: string;
  platform: string;
  cpu: { model: string; cores: number; avx512: boolean };
  backends: { cpu: BackendInfo; cuda: BackendInfo };
  collectives: { gloo: BackendInfo; nccl: BackendInfo };
}

function cudaInfo(): { cuda: BackendInfo; nccl: BackendInfo } {
  try {
    const addon = cuda();
    const devices = addon.deviceInfo ? addon.deviceInfo() : [];
    const libs = addon.libraryInfo ? addon.libraryInfo() : {};
    if (!devices.length) {
      const why = addon.driverStatus ? addon.driverStatus() : 'no CUDA device found';
      return { cuda: { available: false, reason: why, ...libs }, nccl: { available: false, reason: why, version: libs.nccl } };
    }
    return { cuda: { available: true, devices, ...libs }, nccl: { available: true, version: libs.nccl } };
  } catch (e) {
    const reason = (e as Error).message;
    return { cuda: { available: false, reason }, nccl: { available: false, reason } };
  }
}

/** What this installation can do, and exactly why not where it cannot. */
export function info(): Info {
  const addon = cpu();
  const blas = addon.blasInfo() as { config: string; coreType: string; threads: number };
  const choice = blasKernelChoice();
  const c = cpus();
  let flags = '';
  try { flags = readFileSync('/proc/cpuinfo', 'utf8'); } catch { /* not linux */ }
  const gloo = addon.glooInfo ? addon.glooInfo() : undefined;
  const { cuda: cudaB, nccl } = cudaInfo();
  return {
    version,
    node: process.version,
    platform: `${process.platform}-${process.arch}`,
    cpu: { model: c[0]?.model ?? 'unknown', cores: c.length, avx512: /\bavx512f\b/.test(flags) },
    backends: {
      cpu: {
        available: true,
        blas: 'OpenBLAS',
        blasConfig: blas.config.trim(),
        blasCoreType: blas.coreType,
        blasCoreChoice: choice.reason,
        blasThreads: blas.threads,
      },
      cuda: cudaB,
    },
    collectives: {
      gloo: gloo ? { available: true, ...gloo } : { available: false, reason: 'the Gloo communicator is not compiled into this build' },
      nccl,
    },
  };
}
