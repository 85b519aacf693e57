// The only module that touches the native addons: loads the cpu addon (choosing OpenBLAS's kernel
// for this CPU first), registers the typed-error factory, and loads the cuda addon lazily.
import { spawnSync } from 'node:child_process';
import { closeSync, existsSync, openSync, readdirSync, readFileSync, readSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ArgumentError, BackendUnavailableError, errorFromCode } from './errors.js';
import { elfNeeded } from './elf.js';

const require = createRequire(import.meta.url);

/** The package root: lib/ and dist/ both sit one level below it. */
export const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..');

/** A native storage handle (host memory on cpu, device memory on cuda). */
export interface NativeStorage {
  readonly bytes: number;
  readonly disposed: boolean;
  dispose(): void;
}

type S = NativeStorage;
type Ints = Int32Array;
type Lists = [storages: S[], counts: number[], dtypes: number[]];

/**
 * The one kernel interface: every function both addons export, with one signature (native/cpu and
 * native/cuda implement each; lib/ops and lib/optim call them the same way on either device). Kernels
 * are snake_case, runtime calls camelCase. Dtypes are native codes (lib/dtype.ts), sizes are element
 * counts unless a name says bytes. test/core/kernel-interface.test.ts checks both addons against it.
 */
export interface BackendKernels {
  /**
   * `new Storage(bytes, zero, device)` allocates; `new Storage(parent, offsetBytes, bytes)` is an alias of
   * that range of parent's bytes (they stay allocated until parent and every alias are disposed).
   */
  Storage: {
    new (bytes: number, zero: boolean, device?: number): NativeStorage;
    new (parent: NativeStorage, offsetBytes: number, bytes: number): NativeStorage;
  };
  setErrorFactory(f: (code: string, message: string, call: string) => Error): void;
  memoryStats(device?: number): { allocated: number; reserved: number; peak: number; allocations: number; [k: string]: number };
  resetPeakMemory(device?: number): void;
  emptyCache(device?: number): void;
  /** prctl(PR_SET_PDEATHSIG): `signal` comes when the parent ends (a launcher's worker does not outlive it); false where there is no such setting (not Linux). */
  setParentDeathSignal(signal: number): boolean;
  noop(): void;
  read(s: S, offsetBytes: number, out: ArrayBufferView): void;
  write(s: S, offsetBytes: number, src: ArrayBufferView): void;
  copy(dst: S, dstOffsetBytes: number, src: S, srcOffsetBytes: number, bytes: number): void;
  cast(src: S, srcDtype: number, dst: S, dstDtype: number, n: number): void;
  fill(s: S, dtype: number, n: number, value: number): void;
  arange(s: S, dtype: number, n: number, start: number, step: number): void;
  random_fill(s: S, dtype: number, n: number, kind: number, seedHi: number, seedLo: number, baseBlock: number, firstElement: number, a: number, b: number): void;
  /** outDtype (cpu only; leave it out elsewhere): f32 C for bf16/f16 A and B (the f32 sums, not rounded to 16 bits). */
  gemm(a: S, b: S, c: S, dtype: number, batch: number, m: number, n: number, k: number,
    transA: boolean, transB: boolean, alpha: number, beta: number, strideA: number, strideB: number, strideC: number, outDtype?: number): void;
  binary(op: number, a: S, b: S, out: S, dtype: number, outShape: Ints, aStrides: Ints, bStrides: Ints): void;
  unary(op: number, inp: S, out: S, n: number, dtype: number, p: number): void;
  unary_backward(op: number, inp: S, out: S, gradOut: S, gradIn: S, n: number, dtype: number, p: number): void;
  sum_to(inp: S, out: S, dtype: number, inShape: Ints, outStrides: Ints, outCount: number): void;
  max_dim(inp: S, out: S, argmax: S, outer: number, red: number, inner: number, dtype: number): void;
  max_dim_backward(gradOut: S, argmax: S, gradIn: S, outer: number, red: number, inner: number, dtype: number): void;
  copy_strided(src: S, dst: S, dtype: number, shape: Ints, srcStrides: Ints, srcOffset: number, dstStrides: Ints, dstOffset: number): void;
  gelu_forward(inp: S, out: S, n: number, dtype: number): void;
  gelu_backward(inp: S, gradOut: S, gradIn: S, n: number, dtype: number): void;
  bias_gelu_forward(pre: S, bias: S | null, out: S, rows: number, cols: number, dtype: number): void;
  bias_gelu_backward(pre: S, gradOut: S, gradPre: S, gradBias: S | null, rows: number, cols: number, dtype: number): void;
  /** out = silu(gate)·up, or silu(gate) when up is null. */
  swiglu_forward(gate: S, up: S | null, out: S, n: number, dtype: number): void;
  /** Gradients of swiglu_forward (overwritten); gradUp is null exactly when up is. */
  swiglu_backward(gate: S, up: S | null, gradOut: S, gradGate: S, gradUp: S | null, n: number, dtype: number): void;
  /**
   * Rotary embeddings in rotate-half layout over inp/out [batch, seq, heads, dim] (out may be inp): positions i32 [seq]
   * or [batch, seq] (posCount entries), or null for offset + t; inverse rotates backward (the gradient).
   */
  rope(inp: S, out: S, positions: S | null, posCount: number, batch: number, seq: number, heads: number, dim: number, offset: number,
    theta: number, inverse: boolean, dtype: number): void;
  softmax_forward(inp: S, out: S, rows: number, cols: number, dtype: number, log: boolean): void;
  softmax_backward(out: S, gradOut: S, gradIn: S, rows: number, cols: number, dtype: number, log: boolean): void;
  cross_entropy_forward(logits: S, targets: S, losses: S, lse: S, rows: number, vocab: number, ignoreIndex: number, dtype: number): void;
  cross_entropy_backward(logits: S, targets: S, lse: S, gradLoss: S, gradLogits: S, rows: number, vocab: number, ignoreIndex: number, scale: number, dtype: number): void;
  cross_entropy_shard_backward(logits: S, targets: S, lse: S, gradLoss: S, gradLogits: S, rows: number, vocab: number, ignoreIndex: number, scale: number, dtype: number): void;
  attention_softmax_forward(scores: S, probs: S, batch: number, tq: number, tk: number, scale: number, causal: boolean, window: number, dtype: number): void;
  attention_softmax_backward(probs: S, gradProbs: S, gradScores: S, batch: number, tq: number, tk: number, scale: number, dtype: number): void;
  /**
   * Flash attention (no T×T scores): out = softmax(scale·q·kᵀ + mask)·v per (batch, head); q, k, v and out
   * read/written through layouts [offset, batchStride, headStride, tokenStride] (elements, head dim
   * contiguous); lse f32 [batch, heads, tq] gets each row's log-sum-exp for backward.
   */
  flash_attention_forward(q: S, k: S, v: S, out: S, lse: S, qLayout: Ints, kLayout: Ints, vLayout: Ints, outLayout: Ints,
    batch: number, heads: number, tq: number, tk: number, dim: number, scale: number, causal: boolean, window: number, dtype: number): void;
  /** Gradients of flash_attention_forward: gradOut through outLayout, gradQ/K/V through q/k/v's layouts (may share one storage). */
  flash_attention_backward(q: S, k: S, v: S, out: S, gradOut: S, lse: S, gradQ: S, gradK: S, gradV: S, qLayout: Ints, kLayout: Ints, vLayout: Ints,
    outLayout: Ints, batch: number, heads: number, tq: number, tk: number, dim: number, scale: number, causal: boolean, window: number, dtype: number): void;
  embedding_forward(ids: S, weight: S, out: S, n: number, vocab: number, dim: number, dtype: number): void;
  embedding_backward(ids: S, gradOut: S, gradWeight: S, n: number, vocab: number, dim: number, dtype: number): void;
  layernorm_forward(x: S, weight: S, bias: S | null, out: S, mean: S, rstd: S, rows: number, cols: number, eps: number, dtype: number): void;
  add_layernorm_forward(x: S, residual: S, weight: S, bias: S | null, sum: S, out: S, mean: S, rstd: S, rows: number, cols: number, eps: number, dtype: number): void;
  layernorm_backward(x: S, weight: S, mean: S, rstd: S, gradOut: S, gradX: S, gradW: S, gradB: S | null, rows: number, cols: number, dtype: number): void;
  rmsnorm_forward(x: S, weight: S, out: S, rstd: S, rows: number, cols: number, eps: number, dtype: number): void;
  rmsnorm_backward(x: S, weight: S, rstd: S, gradOut: S, gradX: S, gradW: S, rows: number, cols: number, dtype: number): void;
  adamw_step(params: S[], grads: S[], expAvg: S[], expAvgSq: S[], counts: number[], paramDtypes: number[], gradDtypes: number[],
    lr: number, beta1: number, beta2: number, eps: number, weightDecay: number, step: number, gradScale: number, biasCorrection?: boolean): void;
  /** adamw_step with lr (f64) and step (i32) read from `meta`, a 16-byte device tensor, when the kernel runs (a captured graph replays with new values). */
  adamw_step_meta(params: S[], grads: S[], expAvg: S[], expAvgSq: S[], counts: number[], paramDtypes: number[], gradDtypes: number[],
    meta: S, beta1: number, beta2: number, eps: number, weightDecay: number, gradScale: number): void;
  lamb_step(params: S[], grads: S[], expAvg: S[], expAvgSq: S[], counts: number[], paramDtypes: number[], gradDtypes: number[],
    lr: number, beta1: number, beta2: number, eps: number, weightDecay: number, step: number, gradScale: number, biasCorrection?: boolean): Float64Array;
  sgd_step(params: S[], grads: S[], momentumBufs: S[], counts: number[], paramDtypes: number[], gradDtypes: number[],
    lr: number, momentum: number, dampening: number, weightDecay: number, nesterov: boolean, firstStep: boolean, gradScale: number): void;
  sum_squares(...lists: Lists): Float64Array;
  scale_in_place(...args: [...Lists, alpha: number]): void;
}

/** The names of BackendKernels as a runtime list; `satisfies` keeps it equal to the interface's keys. */
export const BACKEND_KERNELS = Object.keys({
  Storage: 1, setErrorFactory: 1, memoryStats: 1, resetPeakMemory: 1, emptyCache: 1, setParentDeathSignal: 1, noop: 1, read: 1, write: 1, copy: 1,
  cast: 1, fill: 1, arange: 1, random_fill: 1, gemm: 1, binary: 1, unary: 1, unary_backward: 1, sum_to: 1, max_dim: 1, max_dim_backward: 1,
  copy_strided: 1, gelu_forward: 1, gelu_backward: 1, bias_gelu_forward: 1, bias_gelu_backward: 1, swiglu_forward: 1, swiglu_backward: 1, rope: 1, softmax_forward: 1, softmax_backward: 1, cross_entropy_forward: 1,
  cross_entropy_backward: 1, cross_entropy_shard_backward: 1, attention_softmax_forward: 1, attention_softmax_backward: 1,
  flash_attention_forward: 1, flash_attention_backward: 1,
  embedding_forward: 1, embedding_backward: 1, layernorm_forward: 1, add_layernorm_forward: 1, layernorm_backward: 1, rmsnorm_forward: 1, rmsnorm_backward: 1,
  adamw_step: 1, adamw_step_meta: 1, lamb_step: 1, sgd_step: 1, sum_squares: 1, scale_in_place: 1,
} satisfies Record<keyof BackendKernels, 1>) as (keyof BackendKernels)[];

/**
 * What only the cpu addon exports: OpenBLAS and Gloo (with the process-wide communicator abort and abort-file watcher), kernel threads, the kernels' instruction-set level
 * (cpuIsa, setCpuIsa) and the measured FMA peak (fmaPeak), the bf16 GEMM's kernel choice (gemmBf16Kernel,
 * setBf16Gemm), host-storage leaks, the library preloader.
 */
export const CPU_ONLY_EXPORTS = [
  'GlooCommunicator', 'abortCommunicators', 'blasInfo', 'cblasSgemmLoop', 'cpuIsa', 'dlopenGlobal', 'fmaPeak', 'gemmBf16Kernel', 'glooInfo', 'kernelThreads', 'leakedStorages', 'setBf16Gemm',
  'setBlasThreads', 'setCpuIsa', 'setHostMemoryLimit', 'setKernelThreads', 'stopAbortWatch', 'streamTriadLoop', 'watchAbortFile',
] as const;
/** What only the cuda addon exports: devices, streams and events, cuBLASLt settings and epilogues, NCCL. */
export const CUDA_ONLY_EXPORTS = [
  'NcclComm', 'currentStream', 'debugSync', 'deviceCount', 'deviceInfo', 'driverStatus', 'eventCreate', 'eventDestroy', 'eventElapsedMs', 'eventQuery',
  'eventRecord', 'eventSynchronize', 'gemmPlanCache', 'gemm_epilogue', 'graphAbort', 'graphBegin', 'graphCapturing', 'graphDestroy', 'graphEnd', 'graphLaunch',
  'libraryInfo', 'ncclUniqueId', 'ncclVersion', 'recordStream', 'setCurrentStream',
  'setMatmulTf32', 'streamCreate', 'streamDestroy', 'streamQuery', 'streamSynchronize', 'streamWaitEvent', 'switches', 'synchronize',
] as const;

/** A loaded addon: the shared kernels, and its own calls (CPU_ONLY_EXPORTS / CUDA_ONLY_EXPORTS) by name. */
export interface BackendAddon extends BackendKernels {
  [own: string]: any;
}

// ---- OpenBLAS kernel choice ----------------------------------------------------------------------
/** Why OpenBLAS runs the kernels it runs: the user's setting, or nodetron's choice for this CPU. */
export interface BlasChoice {
  coreType: string | null;
  reason: string;
  /** OPENBLAS_CORETYPE as the process inherited it, before nodetron's choice. */
  inherited?: string;
}

function cpuFlags(): Set<string> {
  try {
    const info = readFileSync('/proc/cpuinfo', 'utf8');
    const line = info.split('\n').find((l) => l.startsWith('flags'));
    return new Set(line ? line.split(':')[1]!.trim().split(/\s+/) : []);
  } catch {
    return new Set();
  }
}

// OpenBLAS 0.3.21's runtime detection maps several AVX-512 CPUs (AMD Zen 4 among them) to its
// Haswell (AVX2) kernels, and environments often pin OPENBLAS_CORETYPE=Haswell for the same reason.
// Its SKYLAKEX kernels run on any CPU with AVX-512 F/BW/VL/DQ and were measured 1.8x faster at
// 2048^3 on such a machine, so nodetron chooses them there, even over an inherited
// OPENBLAS_CORETYPE naming an older core. NODETRON_BLAS_CORETYPE=<core> forces a core, and
// NODETRON_BLAS_CORETYPE=auto leaves the choice to OpenBLAS (and OPENBLAS_CORETYPE).
const AVX512_CORES = new Set(['SKYLAKEX', 'COOPERLAKE', 'SAPPHIRERAPIDS']);

function chooseBlasCore(): BlasChoice {
  const forced = process.env.NODETRON_BLAS_CORETYPE;
  const inherited = process.env.OPENBLAS_CORETYPE;
  if (forced && forced !== 'auto') {
    process.env.OPENBLAS_CORETYPE = forced;
    return { coreType: forced, reason: 'forced by NODETRON_BLAS_CORETYPE' };
  }
  if (forced === 'auto') {
    return { coreType: inherited ?? null, reason: inherited ? 'OPENBLAS_CORETYPE (NODETRON_BLAS_CORETYPE=auto)' : "OpenBLAS's own detection (NODETRON_BLAS_CORETYPE=auto)" };
  }
  // The AVX-512 choice below is x86-64's; elsewhere (arm64) OpenBLAS picks its own kernels.
  if (process.arch !== 'x64') {
    return { coreType: inherited ?? null, reason: inherited ? 'set by OPENBLAS_CORETYPE' : `OpenBLAS's own detection (${process.arch})` };
  }
  const f = cpuFlags();
  const avx512 = ['avx512f', 'avx512bw', 'avx512vl', 'avx512dq'].every((x) => f.has(x));
  if (!avx512) {
    return { coreType: inherited ?? null, reason: inherited ? 'set by OPENBLAS_CORETYPE' : "OpenBLAS's own detection (no AVX-512 on this CPU)" };
  }
  if (inherited && AVX512_CORES.has(inherited.toUpperCase())) return { coreType: inherited, reason: 'set by OPENBLAS_CORETYPE' };
  process.env.OPENBLAS_CORETYPE = 'SKYLAKEX';
  return {
    coreType: 'SKYLAKEX',
    reason: inherited
      ? `chosen by nodetron over OPENBLAS_CORETYPE=${inherited}: the CPU has AVX-512 F/BW/VL/DQ (NODETRON_BLAS_CORETYPE=${inherited} keeps it)`
      : 'chosen by nodetron: the CPU has AVX-512 F/BW/VL/DQ',
  };
}

let cpuAddon: BackendAddon | undefined;
let blasChoice: BlasChoice | undefined;

// ---- which binary: this machine's architecture ----------------------------------------------------
/** ELF e_machine of the architectures nodetron builds for, by process.arch. */
const ELF_MACHINES: Record<string, number> = { x64: 62, arm64: 183 };

/** The process.arch an ELF file was built for ('e_machine N' when nodetron does not build for it), or undefined when unreadable. */
export function elfArch(path: string): string | undefined {
  try {
    const fd = openSync(path, 'r');
    try {
      const h = Buffer.alloc(20);
      if (readSync(fd, h, 0, 20, 0) !== 20 || h.readUInt32BE(0) !== 0x7f454c46) return undefined;
      const machine = h.readUInt16LE(18);
      return Object.keys(ELF_MACHINES).find((a) => ELF_MACHINES[a] === machine) ?? `e_machine ${machine}`;
    } finally {
      closeSync(fd);
    }
  } catch {
    return undefined;
  }
}

/**
 * The cpu addon for this process's architecture. node-gyp-build takes a checkout's build/Release first
 * whatever it was built for; when that is another architecture's (an arm64 Node under qemu in an x64
 * checkout, as .ci/arm64-smoke.sh runs it), the prebuilt binary of this architecture is taken instead.
 */
export function cpuAddonFile(): string {
  const load = require('node-gyp-build') as { path(dir: string): string };
  const chosen = load.path(packageRoot);
  const arch = elfArch(chosen);
  if (arch === undefined || arch === process.arch || !(process.arch in ELF_MACHINES)) return chosen;
  const prebuilt = join(packageRoot, 'prebuilds', `${process.platform}-${process.arch}`, 'nodetron.napi.node');
  if (existsSync(prebuilt)) return prebuilt;
  throw new Error(`${chosen} is built for ${arch}, this Node.js is ${process.arch}, and there is no ${prebuilt}`);
}

const factory = (code: string, message: string, call: string) => errorFromCode(code, message, call);

/**
 * A worker of `nodetron launch` (NODETRON_LAUNCHER_PID, the launcher's pid, is its parent) gets SIGKILL
 * from the kernel when the launcher ends, so a launcher killed with SIGKILL (which cannot stop its
 * workers) leaves none behind, holding cores, GPUs and ports. Set when the cpu addon loads (every
 * training script loads it at start). A launcher already gone then (before the setting, or before the
 * addon loaded): the worker ends here, saying why. A process with the variable whose parent is not
 * the launcher while the launcher lives (a worker's own child) is left alone. Where the kernel refuses
 * the setting (a sandbox), a warning, and the worker runs on.
 */
function dieWithLauncher(addon: Pick<BackendKernels, 'setParentDeathSignal'>): void {
  const launcher = process.env.NODETRON_LAUNCHER_PID;
  if (!launcher || !/^\d+$/.test(launcher) || typeof addon.setParentDeathSignal !== 'function') return;
  const gone = (): boolean => {
    try {
      process.kill(Number(launcher), 0);
      return false;
    } catch (e) {
      return (e as NodeJS.ErrnoException).code === 'ESRCH';
    }
  };
  const end = (): void => {
    process.stderr.write(`nodetron: the launcher (pid ${launcher}) that started this worker is gone; the worker ends\n`);
    process.kill(process.pid, 'SIGKILL');
  };
  if (String(process.ppid) !== launcher) {
    if (gone()) end();
    return;
  }
  try {
    if (!addon.setParentDeathSignal(9)) return;
  } catch (e) {
    process.stderr.write(`nodetron: this worker is not tied to its launcher (${(e as Error).message}); if the launcher is killed with SIGKILL, stop its workers by hand\n`);
    return;
  }
  if (String(process.ppid) !== launcher) end();
}

/** The cpu addon, loaded on first use. */
export function cpu(): BackendAddon {
  if (cpuAddon) return cpuAddon;
  const inherited = process.env.OPENBLAS_CORETYPE;
  blasChoice = { ...chooseBlasCore(), ...(inherited ? { inherited } : {}) };
  let addon: BackendAddon;
  try {
    addon = require(cpuAddonFile()) as BackendAddon;
  } catch (e) {
    throw new BackendUnavailableError(
      `the nodetron native addon could not be loaded (${(e as Error).message.split('\n')[0]}). ` +
        'Build it with `npm run build` (needs cmake, a C++ compiler, libopenblas-dev and libgloo-dev; ' +
        '`node scripts/setup.mjs` installs them with apt when run as root).',
      'load',
    );
  }
  addon.setErrorFactory(factory);
  // A setting from the environment handed to the addon's setter when set and not empty; a bad or
  // unsupported value fails every load with an ArgumentError naming the variable.
  const fromEnv = (variable: string, setter: 'setCpuIsa' | 'setBf16Gemm' | 'setKernelThreads') => {
    const value = process.env[variable];
    if (value === undefined || value === '') return;
    try {
      if (setter === 'setKernelThreads') {
        if (!/^\d+$/.test(value.trim())) throw new Error(`${setter}: expected a whole number of threads, got '${value}'`);
        addon.setKernelThreads(Number(value.trim()));
      } else addon[setter](value);
    } catch (e) {
      throw new ArgumentError(`${variable}=${value}: ${(e as Error).message.replace(new RegExp(`^${setter}: `), '')}`, 'load');
    }
  };
  // NODETRON_CPU_ISA=auto|baseline|avx2|avx512 (x86-64) or auto|baseline|neon (arm64): the SIMD level of
  // the cpu kernels (default: the best this CPU supports; native/cpu/kernels/util.h).
  fromEnv('NODETRON_CPU_ISA', 'setCpuIsa');
  // NODETRON_BF16_GEMM=auto|fallback: bf16 GEMMs on the AVX512_BF16 kernel where the CPU has it
  // (auto, the default) or widened to f32 for cblas_sgemm (fallback; native/cpu/kernels/gemm_bf16.cc).
  fromEnv('NODETRON_BF16_GEMM', 'setBf16Gemm');
  // NODETRON_KERNEL_THREADS=n: the cpu kernels' thread pool (default: the cores, at most 4), as
  // OPENBLAS_NUM_THREADS is OpenBLAS's; 1 when ranks share a machine's cores one each.
  fromEnv('NODETRON_KERNEL_THREADS', 'setKernelThreads');
  // NODETRON_MEMORY_LIMIT=bytes (K, M, G, T suffixes are powers of 1024): the most host storage this
  // process holds at once; an allocation past it is an OutOfMemoryError (native/core/core.cc).
  const limit = process.env.NODETRON_MEMORY_LIMIT;
  if (limit !== undefined && limit.trim() !== '') addon.setHostMemoryLimit(parseMemoryLimit(limit));
  dieWithLauncher(addon);
  cpuAddon = addon;
  return addon;
}

export function blasKernelChoice(): BlasChoice {
  cpu();
  return blasChoice!;
}

// ---- cuda (lazy) ---------------------------------------------------------------------------------
let cudaAddon: BackendAddon | undefined;
let cudaFailure: BackendUnavailableError | undefined;

function cudaAddonPath(): string | undefined {
  // The prebuilt cuda addon sits in a folder of its own, so node-gyp-build never takes it for the cpu addon.
  for (const p of ['build/Release/nodetron_cuda.node', 'build/Debug/nodetron_cuda.node', `prebuilds/${process.platform}-${process.arch}/cuda/nodetron_cuda.node`]) {
    const full = join(packageRoot, p);
    if (existsSync(full) && [undefined, process.arch as string].includes(elfArch(full))) return full;
  }
  return undefined;
}

/** Why the cuda addon is not there, from the build's own record. */
function cudaBuildStatus(): string {
  try {
    return readFileSync(join(packageRoot, 'build', 'cuda-status.txt'), 'utf8').trim();
  } catch {
    return 'no build record (build/cuda-status.txt)';
  }
}

/** The CUDA major version of the first cuBLAS/cuBLASLt soname among `sonames` (libcublasLt.so.12 → 12), if any. */
function cublasMajor(sonames: readonly string[]): number | undefined {
  const m = sonames.map((n) => /^libcublas(?:Lt)?\.so\.(\d+)/.exec(n)).find(Boolean);
  return m ? Number(m[1]) : undefined;
}

/** What to pip install for a CUDA library soname (the wheels of CUDA 13 and of CUDA 12 are named differently). */
function pipFor(soname: string, cudaMajor: number): string | undefined {
  const own = cublasMajor([soname]);
  if (own !== undefined) return own >= 13 ? 'nvidia-cublas' : `nvidia-cublas-cu${own}`;
  if (soname.startsWith('libnccl')) return `nvidia-nccl-cu${cudaMajor}`;
  return undefined;
}

/**
 * Turns a dlopen failure into what to install. cudaMajor is the CUDA the addon was built with (read
 * from its cuBLASLt soname when not given; 13 when neither says).
 */
export function explainCudaLoadFailure(message: string, cudaMajor?: number): string {
  const all = [...message.matchAll(/(lib[\w.+-]+\.so[\w.]*): cannot open shared object file/g)].map((m) => m[1]!);
  const major = cudaMajor ?? cublasMajor(all) ?? 13;
  if (all.length > 1) return all.map((m) => explainCudaLoadFailure(`${m}: cannot open shared object file`, major)).join('; ');
  const missing = all[0];
  if (!missing) return message;
  if (missing.startsWith('libcublas')) return `${missing} (cuBLAS/cuBLASLt) was not found: \`pip install ${pipFor(missing, major)}\` or add its directory to LD_LIBRARY_PATH`;
  if (missing.startsWith('libnccl')) return `${missing} (NCCL) was not found: \`pip install ${pipFor(missing, major)}\` or set NCCL_HOME and LD_LIBRARY_PATH`;
  if (missing.startsWith('libcudart')) return `${missing} (the CUDA runtime) was not found: install the CUDA ${major} toolkit or runtime`;
  if (missing.startsWith('libcuda.')) return `${missing} (the NVIDIA driver) was not found: install the NVIDIA driver (${minDriverFor(major)} or newer for CUDA ${major})`;
  return `${missing} was not found`;
}

/** The oldest driver branch a CUDA major version's runtime runs on (CUDA's minor-version compatibility). */
export function minDriverFor(cudaMajor: number): number {
  return cudaMajor >= 13 ? 580 : cudaMajor === 12 ? 525 : 450;
}

/**
 * The CUDA libraries (cuBLASLt, NCCL) the cuda addon at `path` links besides the system's, read from
 * the addon's own dynamic section (a CUDA 12 build asks for libcublasLt.so.12, a CUDA 13 one for .so.13),
 * and the CUDA major version that implies (undefined when it links no cuBLAS).
 */
export function cudaLibrariesOf(path: string): { sonames: string[]; cudaMajor: number | undefined } {
  const sonames = elfNeeded(path).filter((n) => /^lib(cublasLt|cublas|nccl|cudart)\.so\.\d+/.test(n));
  return { sonames, cudaMajor: cublasMajor(sonames) };
}

/**
 * The NVIDIA driver's version from /proc/driver/nvidia/version ("NVRM version: NVIDIA UNIX x86_64 Kernel
 * Module  580.65.06  ..."), or undefined where there is none (no driver, not Linux). `text` replaces the
 * file (tests).
 */
export function nvidiaDriverVersion(text?: string): { major: number; version: string } | undefined {
  let t = text;
  if (t === undefined) {
    try { t = readFileSync('/proc/driver/nvidia/version', 'utf8'); } catch { return undefined; }
  }
  const m = /NVRM version:[^\n]*?\s(\d+)\.(\d+)(?:\.(\d+))?(?=\s|$)/.exec(t);
  return m ? { major: Number(m[1]), version: m[3] === undefined ? `${m[1]}.${m[2]}` : `${m[1]}.${m[2]}.${m[3]}` } : undefined;
}

/**
 * Why a driver is too old for a cuda addon built with CUDA `cudaMajor`, naming what to install;
 * undefined when it is new enough or either is unknown.
 */
export function driverMismatch(driver: { major: number; version: string } | undefined, cudaMajor: number | undefined): string | undefined {
  if (!driver || cudaMajor === undefined) return undefined;
  const need = minDriverFor(cudaMajor);
  if (driver.major >= need) return undefined;
  const other = cudaMajor >= 13
    ? ', or build nodetron against CUDA 12 on this machine (`npm install nodetron --build-from-source` with the CUDA 12.8+ toolkit and `pip install nvidia-cublas-cu12 nvidia-nccl-cu12`)'
    : '';
  return `the NVIDIA driver ${driver.version} is older than the ${need} branch that CUDA ${cudaMajor}, which this cuda addon was built with, needs: update the driver to ${need} or newer${other}`;
}

/** Folders that may hold the CUDA libraries on this machine: the nvidia pip wheels' and the toolkit's. */
export function cudaLibraryDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const dirs: string[] = [];
  for (const v of ['CUDA_HOME', 'CUDA_PATH', 'NCCL_HOME']) if (env[v]) dirs.push(join(env[v]!, 'lib64'), join(env[v]!, 'lib'));
  // The toolkit's own folder per architecture: x86_64-linux, or sbsa-linux on arm64 servers (Grace).
  dirs.push('/usr/local/cuda/lib64', `/usr/local/cuda/targets/${process.arch === 'arm64' ? 'sbsa' : 'x86_64'}-linux/lib`);
  // The nvidia wheels: ask each python on PATH where its `nvidia` package is, then look where pip installs.
  for (const py of ['python3', 'python']) {
    const r = spawnSync(py, ['-c', 'import nvidia,os;print("\\n".join(os.path.join(p,d,"lib") for p in nvidia.__path__ for d in os.listdir(p)))'],
      { encoding: 'utf8', timeout: 10_000, stdio: ['ignore', 'pipe', 'ignore'] });
    if (r.status === 0) dirs.push(...r.stdout.split('\n').filter(Boolean));
  }
  const sitePackages = [
    ...[env.VIRTUAL_ENV, env.CONDA_PREFIX].filter((p): p is string => !!p).map((p) => join(p, 'lib')),
    join(env.HOME ?? '/root', '.local', 'lib'), '/usr/local/lib', '/usr/lib', '/opt/conda/lib',
  ];
  for (const base of sitePackages) {
    for (const py of safeReaddir(base).filter((d) => /^python3/.test(d))) {
      for (const kind of ['site-packages', 'dist-packages']) {
        const nv = join(base, py, kind, 'nvidia');
        for (const d of safeReaddir(nv)) dirs.push(join(nv, d, 'lib'));
      }
    }
  }
  return [...new Set(dirs)].filter((d) => existsSync(d));
}

function safeReaddir(dir: string): string[] {
  try { return readdirSync(dir); } catch { return []; }
}

/**
 * Makes the cuda addon's libraries loadable wherever they are: each is tried by soname first
 * (LD_LIBRARY_PATH, the system's paths), then by absolute path in cudaLibraryDirs(); the first that
 * loads is bound for the addon (RTLD_GLOBAL). Returns what it could not find.
 */
function preloadCudaLibraries(sonames: readonly string[]): string[] {
  const addon = cpu();
  const missing: string[] = [];
  let dirs: string[] | undefined;
  for (const soname of sonames) {
    try { addon.dlopenGlobal(soname); continue; } catch { /* not on the loader's paths */ }
    dirs ??= cudaLibraryDirs();
    const found = dirs.map((d) => join(d, soname)).find((p) => {
      if (!existsSync(p)) return false;
      try { addon.dlopenGlobal(p); return true; } catch { return false; }
    });
    if (!found) missing.push(soname);
  }
  return missing;
}

/** The cuda addon; throws BackendUnavailableError saying exactly what is missing. */
export function cuda(): BackendAddon {
  if (cudaAddon) return cudaAddon;
  if (cudaFailure) throw cudaFailure;
  cpu();
  const path = cudaAddonPath();
  if (!path) {
    cudaFailure = new BackendUnavailableError(
      `the cuda backend is not built in this installation (${cudaBuildStatus()}). It builds when nvcc ` +
        '(CUDA toolkit 12.8+/13) and the cuBLAS and NCCL headers are found: install the toolkit, ' +
        '`pip install nvidia-cublas nvidia-nccl-cu13`, then `npm run build`.',
      'loadCuda',
    );
    throw cudaFailure;
  }
  let addon: BackendAddon;
  let cudaMajor: number | undefined;
  try {
    // The sonames this build linked (CUDA 12 or 13), from the addon itself.
    const linked = cudaLibrariesOf(path);
    cudaMajor = linked.cudaMajor;
    const tooOld = driverMismatch(nvidiaDriverVersion(), cudaMajor);
    if (tooOld) {
      cudaFailure = new BackendUnavailableError(`the cuda backend cannot run here: ${tooOld}`, 'loadCuda');
      throw cudaFailure;
    }
    const missing = preloadCudaLibraries(linked.sonames.filter((n) => !n.startsWith('libcudart')));
    if (missing.length) {
      throw new Error(missing.map((m) => `${m}: cannot open shared object file`).join('; '));
    }
    addon = require(path) as BackendAddon;
  } catch (e) {
    if (e === cudaFailure) throw e;
    cudaFailure = new BackendUnavailableError(`the cuda backend cannot load: ${explainCudaLoadFailure((e as Error).message, cudaMajor)}`, 'loadCuda');
    throw cudaFailure;
  }
  addon.setErrorFactory(factory);
  // The addon reports a missing driver or GPU through its own typed error on first device query.
  cudaAddon = addon;
  return addon;
}

/** Whether the cuda addon is loadable (does not say a GPU is present; see cudaDeviceCount). */
export function cudaAddonLoadable(): { ok: true } | { ok: false; reason: string } {
  try {
    cuda();
    return { ok: true };
  } catch (e) {
    return { ok: false, reason: (e as Error).message };
  }
}

/** NODETRON_MEMORY_LIMIT's value in bytes: an integer with an optional K, M, G or T (powers of 1024, `B`/`iB` allowed); ArgumentError otherwise. */
export function parseMemoryLimit(text: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$/i.exec(text);
  const bytes = m ? Math.floor(Number(m[1]) * 1024 ** ' kmgt'.indexOf((m[2] || ' ').toLowerCase())) : NaN;
  if (!m || !Number.isSafeInteger(bytes) || bytes < 1) {
    throw new ArgumentError(`NODETRON_MEMORY_LIMIT=${JSON.stringify(text)}: expected a number of bytes >= 1 with an optional K, M, G or T suffix (e.g. 512M)`, 'load');
  }
  return bytes;
}
