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

/** What {@link info} reports: versions, the host and which backends and collectives are usable here. */
export interface Info {
  /** nodetron's package version. */
  version: string;
  /** Node.js version (process.version). */
  node: string;
  /** Platform and architecture, e.g. 'linux-x64'. */
  platform: string;
  /** The host CPU. */
  cpu: {
    /** CPU model name as the OS reports it ('unknown' when it does not). */
    model: string;
    /** Logical CPU count. */
    cores: number;
    /** Whether the CPU has AVX-512F. */
    avx512: boolean;
    /**
     * The SIMD level of the cpu kernels (cross-entropy, softmax, GELU, norms, AdamW, attention's softmax):
     * on x86-64 baseline (x86-64-v2, SSE4.2), avx2 (x86-64-v3) or avx512 (x86-64-v4); on arm64 baseline
     * (scalar, not vectorized) or neon (armv8-a ASIMD, 128-bit vectors).
     */
    isa: {
      /** The level the kernels run at now: the best supported one, or what NODETRON_CPU_ISA chose. */
      active: 'baseline' | 'avx2' | 'avx512' | 'neon';
      /** The best level this CPU and OS support. */
      best: 'baseline' | 'avx2' | 'avx512' | 'neon';
      /** Every level this CPU supports, baseline first. */
      supported: ('baseline' | 'avx2' | 'avx512' | 'neon')[];
      /** NODETRON_CPU_ISA as set in the environment, when it is. */
      env?: string;
    };
    /**
     * How bf16 GEMMs run: on the AVX512_BF16 kernel (`avx512bf16`: supported by the CPU, mode auto and
     * the SIMD level avx512) or widened to f32 for cblas_sgemm (`sgemm`).
     */
    bf16Gemm: {
      /** auto (the AVX512_BF16 kernel where supported) or fallback (always widen), as NODETRON_BF16_GEMM set it. */
      mode: 'auto' | 'fallback';
      /** Whether this CPU and OS have AVX-512 and AVX512_BF16. */
      supported: boolean;
      /** Whether the AVX512_BF16 kernel runs now. */
      active: boolean;
      /** The kernel bf16 GEMMs run on now: avx512bf16 (vdpbf16ps) or sgemm (widened to f32). */
      kernel: 'avx512bf16' | 'sgemm';
      /** NODETRON_BF16_GEMM as set in the environment, when it is. */
      env?: string;
    };
  };
  /** The compute backends: availability, the reason when unavailable, and their details. */
  backends: {
    /** The cpu backend (OpenBLAS). */
    cpu: BackendInfo;
    /** The cuda backend (CUDA runtime, cuBLASLt). */
    cuda: BackendInfo;
  };
  /** The collective libraries: availability and the reason when unavailable. */
  collectives: {
    /** Gloo, for cpu tensors. */
    gloo: BackendInfo;
    /** NCCL, for cuda tensors. */
    nccl: BackendInfo;
  };
}

function cudaInfo(): { cuda: BackendInfo; nccl: BackendInfo } {
  try {
    const addon = cuda();
    const devices = addon.deviceInfo ? addon.deviceInfo() : [];
    // The environment switches as the addon read them at load: NODETRON_CUDA_SYNC (sync), NODETRON_CUDA_EPILOGUES (epilogues), NODETRON_CUDA_VECTOR (vector).
    const libs = { ...(addon.libraryInfo ? addon.libraryInfo() : {}), ...(addon.switches ? { switches: addon.switches() } : {}) };
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
    cpu: {
      model: c[0]?.model ?? 'unknown',
      cores: c.length,
      avx512: /\bavx512f\b/.test(flags),
      isa: { ...(addon.cpuIsa() as Info['cpu']['isa']), ...(process.env.NODETRON_CPU_ISA ? { env: process.env.NODETRON_CPU_ISA } : {}) },
      bf16Gemm: { ...(addon.gemmBf16Kernel() as Info['cpu']['bf16Gemm']), ...(process.env.NODETRON_BF16_GEMM ? { env: process.env.NODETRON_BF16_GEMM } : {}) },
    },
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
