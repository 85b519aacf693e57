// The only module that touches the native addons: loads the cpu addon (choosing OpenBLAS's kernel
// for this CPU first), registers the typed-error factory, and loads the cuda addon lazily.
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { BackendUnavailableError, errorFromCode } from './errors.js';

const require = createRequire(import.meta.url);

/** The package root: lib/ and dist/ both sit one level below it. */
export const packageRoot = join(dirname(fileURLToPath(import.meta.url)), '..');

/** A native storage handle (host memory on cpu, device memory on cuda). */
export interface NativeStorage {
  readonly bytes: number;
  readonly disposed: boolean;
  dispose(): void;
}

/** Functions every backend addon exports with the same signatures (kernels add more by name). */
export interface BackendAddon {
  Storage: new (bytes: number, zero: boolean, device?: number) => NativeStorage;
  setErrorFactory(f: (code: string, message: string, call: string) => Error): void;
  memoryStats(device?: number): { allocated: number; reserved: number; peak: number; allocations: number; [k: string]: number };
  resetPeakMemory(device?: number): void;
  read(s: NativeStorage, offsetBytes: number, out: ArrayBufferView): void;
  write(s: NativeStorage, offsetBytes: number, src: ArrayBufferView): void;
  copy(dst: NativeStorage, dstOffsetBytes: number, src: NativeStorage, srcOffsetBytes: number, bytes: number): void;
  cast(src: NativeStorage, srcDtype: number, dst: NativeStorage, dstDtype: number, n: number): void;
  fill(s: NativeStorage, dtype: number, n: number, value: number): void;
  arange(s: NativeStorage, dtype: number, n: number, start: number, step: number): void;
  randomFill(s: NativeStorage, dtype: number, n: number, kind: number, seedHi: number, seedLo: number, baseBlock: number, firstElement: number, a: number, b: number): void;
  gemm(a: NativeStorage, b: NativeStorage, c: NativeStorage, dtype: number, batch: number, m: number, n: number, k: number,
    transA: boolean, transB: boolean, alpha: number, beta: number, strideA: number, strideB: number, strideC: number): void;
  noop(): void;
  // Kernel families register further functions by name (see native/*/kernels); ops reach them here.
  [kernel: string]: any;
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

const factory = (code: string, message: string, call: string) => errorFromCode(code, message, call);

/** The cpu addon, loaded on first use. */
export function cpu(): BackendAddon {
  if (cpuAddon) return cpuAddon;
  const inherited = process.env.OPENBLAS_CORETYPE;
  blasChoice = { ...chooseBlasCore(), ...(inherited ? { inherited } : {}) };
  let addon: BackendAddon;
  try {
    const load = require('node-gyp-build') as (dir: string) => BackendAddon;
    addon = load(packageRoot);
  } catch (e) {
    throw new BackendUnavailableError(
      `the nodetron native addon could not be loaded (${(e as Error).message.split('\n')[0]}). ` +
        'Build it with `npm run build` (needs cmake, a C++ compiler, libopenblas-dev and libgloo-dev; ' +
        '`node scripts/setup.mjs` installs them with apt when run as root).',
      'load',
    );
  }
  addon.setErrorFactory(factory);
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
    if (existsSync(full)) return full;
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

/** Turns a dlopen failure into what to install. */
export function explainCudaLoadFailure(message: string): string {
  const all = [...message.matchAll(/(lib[\w.+-]+\.so[\w.]*): cannot open shared object file/g)].map((m) => m[1]!);
  if (all.length > 1) return all.map((m) => explainCudaLoadFailure(`${m}: cannot open shared object file`)).join('; ');
  const missing = all[0];
  if (!missing) return message;
  if (missing.startsWith('libcublas')) return `${missing} (cuBLAS/cuBLASLt) was not found: \`pip install nvidia-cublas\` or add its directory to LD_LIBRARY_PATH`;
  if (missing.startsWith('libnccl')) return `${missing} (NCCL) was not found: \`pip install nvidia-nccl-cu13\` or set NCCL_HOME and LD_LIBRARY_PATH`;
  if (missing.startsWith('libcudart')) return `${missing} (the CUDA runtime) was not found: install the CUDA 13 toolkit or runtime`;
  if (missing.startsWith('libcuda.')) return `${missing} (the NVIDIA driver) was not found: install the NVIDIA driver (580 or newer for CUDA 13)`;
  return `${missing} was not found`;
}

/** The shared libraries the cuda addon links besides the system's, and where each comes from. */
const CUDA_LIBRARIES = [
  { soname: 'libcublasLt.so.13', wheel: 'cu13', home: 'CUDA_HOME' },
  { soname: 'libnccl.so.2', wheel: 'nccl', home: 'NCCL_HOME' },
] as const;

/** Folders that may hold the CUDA libraries on this machine: the nvidia pip wheels' and the toolkit's. */
export function cudaLibraryDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const dirs: string[] = [];
  for (const v of ['CUDA_HOME', 'CUDA_PATH', 'NCCL_HOME']) if (env[v]) dirs.push(join(env[v]!, 'lib64'), join(env[v]!, 'lib'));
  dirs.push('/usr/local/cuda/lib64', '/usr/local/cuda/targets/x86_64-linux/lib');
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
function preloadCudaLibraries(): string[] {
  const addon = cpu();
  const missing: string[] = [];
  let dirs: string[] | undefined;
  for (const lib of CUDA_LIBRARIES) {
    try { addon.dlopenGlobal(lib.soname); continue; } catch { /* not on the loader's paths */ }
    dirs ??= cudaLibraryDirs();
    const found = dirs.map((d) => join(d, lib.soname)).find((p) => {
      if (!existsSync(p)) return false;
      try { addon.dlopenGlobal(p); return true; } catch { return false; }
    });
    if (!found) missing.push(lib.soname);
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
  try {
    const missing = preloadCudaLibraries();
    if (missing.length) {
      throw new Error(missing.map((m) => `${m}: cannot open shared object file`).join('; '));
    }
    addon = require(path) as BackendAddon;
  } catch (e) {
    cudaFailure = new BackendUnavailableError(`the cuda backend cannot load: ${explainCudaLoadFailure((e as Error).message)}`, 'loadCuda');
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
