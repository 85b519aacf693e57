// `nodetron bench gemm`: the machine's measured float32 FMA peak (independent FMA chains on every kernel
// thread, at each SIMD level the CPU supports), GFLOP/s of nodetron's matmul beside cblas_sgemm called
// directly on the same buffers in the same run (and as a share of that peak), OpenBLAS's own kernel
// choice in a child process, and the per-call dispatch cost of tiny ops (the figure that says whether
// JS can keep a GPU fed). --bf16 adds bf16 rows (the AVX512_BF16 kernel where the CPU has it, see
// `nodetron info`), the small bench GPT's GEMM shapes, and PyTorch's f32 and bf16 torch.matmul on the
// same shapes in the same run (scripts/bench/gemm_torch.py, when python3 has torch).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { randn } from '../creation.js';
import { blasKernelChoice, cpu, packageRoot } from '../native.js';
import { add, gelu, matmul } from '../ops/index.js';
import { runTorchPeer, timeIt } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';
import { info } from '../info.js';

const SHAPES: [string, number, number, number][] = [
  ['square 1024', 1024, 1024, 1024],
  ['square 2048', 2048, 2048, 2048],
  ['MLP up 4096x768x3072', 4096, 3072, 768],
  ['MLP down 4096x3072x768', 4096, 768, 3072],
  ['QKV 4096x768x2304', 4096, 2304, 768],
];

/** The small bench GPT's GEMMs (1024 tokens, C 384, V 50257; the head in chunks of 512 rows): added by --bf16. */
const MODEL_SHAPES: [string, number, number, number][] = [
  ['small QKV 1024x1152x384', 1024, 1152, 384],
  ['small MLP down 1024x384x1536', 1024, 384, 1536],
  ['small head 512x50257x384', 512, 50257, 384],
];

interface Row { name: string; m: number; n: number; k: number; nodetronGflops: number; cblasGflops: number; ratio: number; peakPercent?: number; torchGflops?: number }

/** The measured float32 FMA peak at one SIMD level (native fmaPeak): best of a few runs on all kernel threads. */
export interface FmaPeak {
  isa: string;
  /** The peak: the larger of gflopsAllThreads and threads × gflopsOneThread. */
  gflops: number;
  /** All kernel threads running FMA chains together (best of five runs). */
  gflopsAllThreads: number;
  /** One thread alone (best of five runs). */
  gflopsOneThread: number;
  /** One thread alone per second of its own CPU time (best of five runs): what load leaves nearly intact. */
  gflopsOneThreadCpuTime: number;
  threads: number;
  chains: number;
  lanes: number;
}

/**
 * The machine's float32 FMA peak as measured here: independent FMA chains at `isa` ('auto': the best
 * level the CPU supports) on all kernel threads together and on one thread alone (times the thread
 * count), best of five runs each, about `seconds` in all; the larger of the two. Other work on the
 * machine can only lower it.
 */
export function measureFmaPeak(isa = 'auto', seconds = 0.5): FmaPeak {
  const r = cpu().fmaPeak(isa, seconds) as FmaPeak & { checksum: number; seconds: number };
  return { isa: r.isa, gflops: r.gflops, gflopsAllThreads: r.gflopsAllThreads, gflopsOneThread: r.gflopsOneThread, gflopsOneThreadCpuTime: r.gflopsOneThreadCpuTime, threads: r.threads, chains: r.chains, lanes: r.lanes };
}

function gemmRows(shapes: typeof SHAPES, dtypes: ('f32' | 'bf16')[], minSeconds = 0.4): Row[] {
  const rows: Row[] = [];
  const addon = cpu();
  for (const [name, m, n, k] of shapes) {
    const a = randn([m, k], { seed: 1 }), b = randn([k, n], { seed: 2 });
    const c = randn([m, n], { seed: 3 });
    const flops = 2 * m * n * k;
    // Interleave the two so that clock and cache state affect both alike.
    let tN = Infinity, tC = Infinity;
    for (let r = 0; r < 3; r++) {
      tN = Math.min(tN, timeIt(() => matmul(a, b).dispose(), { minSeconds, rounds: 3 }));
      tC = Math.min(tC, timeIt(() => addon.cblasSgemmLoop(a.storage, b.storage, c.storage, m, n, k, 1), { minSeconds, rounds: 3 }));
    }
    rows.push({ name: `${name} f32`, m, n, k, nodetronGflops: flops / tN / 1e9, cblasGflops: flops / tC / 1e9, ratio: tC / tN });
    for (const dt of dtypes.filter((d) => d !== 'f32')) {
      const ah = a.to(dt), bh = b.to(dt);
      let t = Infinity;
      for (let r = 0; r < 3; r++) t = Math.min(t, timeIt(() => matmul(ah, bh).dispose(), { minSeconds, rounds: 3 }));
      rows.push({ name: `${name} ${dt}`, m, n, k, nodetronGflops: flops / t / 1e9, cblasGflops: NaN, ratio: NaN });
      ah.dispose(); bh.dispose();
    }
    a.dispose(); b.dispose(); c.dispose();
  }
  return rows;
}

const addonThreads = (): number => cpu().kernelThreads() as number;

function dispatchCosts(minSeconds = 0.5): Record<string, number> {
  const addon = cpu();
  const x = randn([1], { seed: 1 }), y = randn([1, 1], { seed: 2 });
  const us = (fn: () => void) => timeIt(fn, { minSeconds, rounds: 5, warmup: 1000 }) * 1e6;
  const out: Record<string, number> = {
    'native no-op call': us(() => addon.noop()),
    'reshape (no copy, new tensor)': us(() => x.reshape([1, 1]).dispose()),
    'clone of 1 element (alloc + copy)': us(() => x.clone().dispose()),
    'add of 1 element (a + b, new output)': us(() => add(x, x).dispose()),
    'gelu of 1 element': us(() => gelu(x).dispose()),
    'matmul 1x1x1': us(() => matmul(y, y).dispose()),
  };
  x.dispose(); y.dispose();
  return out;
}

/** cblas_sgemm at 2048^3 with OpenBLAS left to its own kernel choice, in a child process. */
function openblasOwnChoice(): { coreType: string; gflops: number } | undefined {
  // The child sees the environment this process inherited, without nodetron's kernel choice.
  const env: NodeJS.ProcessEnv = { ...process.env, NODETRON_BLAS_CORETYPE: 'auto' };
  const inherited = blasKernelChoice().inherited;
  if (inherited) env.OPENBLAS_CORETYPE = inherited; else delete env.OPENBLAS_CORETYPE;
  const r = spawnSync(process.execPath, [join(packageRoot, 'bin', 'nodetron.js'), 'bench', 'gemm', '--blas-only'], { env, encoding: 'utf8' });
  try { return JSON.parse(r.stdout.trim().split('\n').pop()!); } catch { return undefined; }
}

export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { json: 'outfile', quick: 'boolean', 'blas-only': 'boolean', bf16: 'boolean', help: 'boolean' }, { h: 'help' });
  if (o.help) {
    console.log('usage: nodetron bench gemm [--json F] [--quick] [--bf16]\n  f32 GEMM GFLOP/s beside cblas_sgemm direct, and tiny-op dispatch cost\n' +
      '  --bf16: bf16 rows too, the small GPT\'s GEMM shapes, and torch.matmul f32/bf16 on the same shapes (python3 with torch)');
    return 0;
  }
  expectPositionals(o, 'nothing', 0);
  if (o['blas-only']) {
    const [row] = gemmRows([['square 2048', 2048, 2048, 2048]], ['f32']);
    console.log(JSON.stringify({ coreType: info().backends.cpu.blasCoreType, gflops: row!.cblasGflops }));
    return 0;
  }
  const all = info();
  const i = all.backends.cpu;
  console.log(`# nodetron bench gemm — ${i.blasConfig}\n# core type ${i.blasCoreType} (${i.blasCoreChoice}), ${i.blasThreads} threads\n`);
  // The FMA peak at every level the CPU supports (the kernels' own level is all.cpu.isa.active).
  const peaks = all.cpu.isa.supported.map((level) => measureFmaPeak(level, o.quick ? 0.2 : 0.6));
  const peak = peaks[peaks.length - 1]!;
  printTable(['FMA peak (f32, independent chains)', 'peak GFLOP/s', 'threads', 'all threads GFLOP/s', 'one thread GFLOP/s'],
    peaks.map((p) => [`${p.isa} (${p.lanes} lanes x ${p.chains} chains)`, p.gflops.toFixed(1), p.threads, p.gflopsAllThreads.toFixed(1), p.gflopsOneThread.toFixed(1)]));
  console.log('# peak: the larger of all threads together and one thread alone times the thread count (best of 5 runs each; other load can only lower them)');
  console.log(`# the machine's peak here: ${peak.gflops.toFixed(1)} GFLOP/s (${peak.isa}); the cpu kernels run at ${all.cpu.isa.active}\n`);
  const shapes = [...(o.quick ? SHAPES.slice(0, 1) : SHAPES), ...(o.bf16 && !o.quick ? MODEL_SHAPES : [])];
  // --quick: one shape and a quarter of the timing (a smoke run: the numbers are rougher).
  const rows = gemmRows(shapes, o.bf16 ? ['f32', 'bf16'] : ['f32'], o.quick ? 0.1 : 0.4);
  for (const r of rows) r.peakPercent = (100 * r.nodetronGflops) / peak.gflops;
  let torch: { torch?: string; error?: string } | undefined;
  if (o.bf16) {
    // PyTorch's matmul on the same shapes, after nodetron's rows (the same threads as the kernels).
    const res = runTorchPeer([join(packageRoot, 'scripts', 'bench', 'gemm_torch.py'), '--threads', String(addonThreads()),
      ...shapes.map(([, m, n, k]) => `${m},${n},${k}`)], 'default', 10 * 60_000);
    if ('error' in res) torch = { error: res.error };
    else {
      const peer = res.result as { torch: string; rows: { m: number; n: number; k: number; f32: number; bf16: number }[] };
      torch = { torch: peer.torch };
      for (const r of rows) {
        const p = peer.rows.find((q) => q.m === r.m && q.n === r.n && q.k === r.k);
        if (p) r.torchGflops = r.name.endsWith(' bf16') ? p.bf16 : p.f32;
      }
    }
  }
  const bf16Gemm = o.bf16 ? (cpu().gemmBf16Kernel() as { kernel: string }).kernel : undefined;
  if (bf16Gemm) console.log(`# bf16 rows: ${bf16Gemm === 'avx512bf16' ? 'the AVX512_BF16 kernel (bf16 peak: twice the f32 FMA peak)' : 'widened to f32 for cblas_sgemm'}` +
    `${torch?.torch ? `; torch ${torch.torch} torch.matmul beside them` : torch?.error ? `; PyTorch peer: ${torch.error}` : ''}`);
  printTable(['product (M x N x K)', 'nodetron GFLOP/s', 'cblas_sgemm GFLOP/s', 'nodetron / cblas', '% of FMA peak', ...(o.bf16 ? ['torch.matmul GFLOP/s'] : [])],
    rows.map((r) => [r.name, r.nodetronGflops.toFixed(1), Number.isNaN(r.cblasGflops) ? '-' : r.cblasGflops.toFixed(1), Number.isNaN(r.ratio) ? '-' : `${(r.ratio * 100).toFixed(1)}%`,
      `${r.peakPercent!.toFixed(1)}%`, ...(o.bf16 ? [r.torchGflops === undefined ? '-' : r.torchGflops.toFixed(1)] : [])]));
  const own = o.quick ? undefined : openblasOwnChoice();
  if (own) console.log(`\nOpenBLAS left to its own choice (${own.coreType}): cblas_sgemm 2048^3 = ${own.gflops.toFixed(1)} GFLOP/s`);
  const dispatch = dispatchCosts(o.quick ? 0.125 : 0.5);
  console.log('');
  printTable(['tiny op (cpu, 1 element)', 'µs per call'], Object.entries(dispatch).map(([k, v]) => [k, v.toFixed(3)]));
  writeJson(o.json as string | undefined, { bench: 'gemm', machine: machineRecord(), rows, openblasOwnChoice: own, dispatchMicroseconds: dispatch,
    fmaPeak: { gflops: peak.gflops, isa: peak.isa, levels: peaks }, cpuIsa: all.cpu.isa, ...(o.bf16 ? { bf16Gemm: all.cpu.bf16Gemm, torch } : {}) });
  return 0;
}
