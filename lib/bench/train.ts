// `nodetron bench train`: ms per GPT training step (forward + backward + AdamW, median) and tokens/s for
// the tiny and small GPT-2 shapes, beside PyTorch on the same model, batch, optimizer and thread count
// in the same run (scripts/bench/torch_train.py, when python3 has torch): eager with each allocator
// setting found here (PyTorch's CPU memory comes from malloc; the fastest setting is compared) and
// torch.compile with that one; and peak step memory, ours with and without activation recomputation
// and PyTorch's (tensor bytes above the resident parameters and state); model GFLOP/s of each beside
// the machine's FMA peak measured in the same run (lib/bench/gemm.ts measureFmaPeak).
// With --layout it measures a data-parallel layout instead (lib/bench/layout.ts). With --cpu-time both
// sides run on one thread and each step is timed by the process's CPU time, against one thread's FMA
// peak per CPU-second: a comparison that other processes loading the machine leave nearly intact.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { tensor } from '../creation.js';
import { ArgumentError } from '../errors.js';
import { info } from '../info.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { cpu, packageRoot } from '../native.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { AdamW } from '../optim/adamw.js';
import { trainStep } from '../step.js';
import { gptFlopsPerToken } from '../train/progress.js';
import { measureFmaPeak } from './gemm.js';
import { CUDA_USAGE, cudaTrainBench, GPT2_124M } from './train-cuda.js';
import { gptConfigOf, selectConfigs, type TrainBenchConfig } from './configs.js';
import { median, runTorchPeer, TORCH_ALLOCATORS } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';


interface Measurement { msPerStep: number; meanMsPerStep: number; tokensPerSec: number; peakStepBytes: number; loss: number; stepsMs: number[] }


/** Milliseconds of this process's CPU time (user + system). */
const cpuMs = (): number => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };

/** Times `steps` training steps after `warmup` (median ms per step; by `clock`) and records the highest allocation above the resident set. */
function measure(c: TrainBenchConfig, recompute: boolean, warmup: number, steps: number, clock: () => number = () => performance.now()): Measurement {
  const config: GPTConfig = gptConfigOf(c, { recompute });
  const model = new GPT(config, { seed: 0 });
  const opt = new AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
  let x = 12345;
  const ids = () => Int32Array.from({ length: c.batch * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; });
  const inputs = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' }), targets = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' });
  const stepsMs: number[] = [];
  let loss = NaN, peakStepBytes = 0;
  try {
    for (let i = 0; i < warmup + steps; i++) {
      // After the first step the optimizer state exists, so the resident set is parameters + state.
      const resident = memoryStats().allocated;
      resetPeakMemory();
      const t0 = clock();
      loss = trainStep(model, opt, inputs, targets).loss;
      const dt = clock() - t0;
      if (i >= warmup) { stepsMs.push(dt); peakStepBytes = Math.max(peakStepBytes, memoryStats().peak - resident); }
    }
  } finally {
    inputs.dispose(); targets.dispose(); opt.dispose(); model.dispose();
  }
  const msPerStep = median(stepsMs);
  return { msPerStep, meanMsPerStep: stepsMs.reduce((a, b) => a + b, 0) / steps, tokensPerSec: (c.batch * c.ctx) / (msPerStep / 1000), peakStepBytes, loss, stepsMs };
}

/** What the PyTorch peer printed (scripts/bench/torch_train.py). */
interface PeerResult {
  impl: string; torch: string; threads: number; compileMode: string | null; mkldnn: boolean; allocatorEnv: Record<string, string>;
  msPerStep: number; meanMsPerStep: number; tokensPerSec: number; peakStepBytes: number | null; peakKind: string | null; firstStepSeconds: number | null;
  maxRssBytes: number | null; loss: number; params: number;
}
type Peer = (PeerResult & { allocator: string }) | { allocator: string; error: string };

function torchPeer(c: TrainBenchConfig, warmup: number, steps: number, threads: number, allocator: string, compile?: string, cpuTime = false): Peer {
  const script = join(packageRoot, 'scripts', 'bench', 'torch_train.py');
  const args = [script, '--layers', c.layers, '--heads', c.heads, '--width', c.width, '--ctx', c.ctx, '--batch', c.batch, '--vocab', c.vocab,
    '--steps', steps, '--warmup', warmup, '--threads', threads, ...(compile ? ['--compile', compile] : []), ...(cpuTime ? ['--cpu-time'] : [])].map(String);
  const r = runTorchPeer(args, allocator, compile ? 30 * 60_000 : 10 * 60_000);
  return 'error' in r ? { allocator, error: r.error } : { allocator, ...(r.result as unknown as PeerResult) };
}

const ok = (p: Peer | undefined): p is PeerResult & { allocator: string } => p !== undefined && !('error' in p);

/** How model FLOPs per step are counted (printed and written to the JSON with the numbers). */
export const STEP_FLOPS_FORMULA = 'B·T·(6·(N − T·C) + 12·L·C·T): N all parameters (the tied LM head V·C counted once, so 6·N covers the head\'s ' +
  '6·C·V), minus the position table (a lookup), 12·L·C·T for attention\'s two matrix products; forward + backward, recomputation not counted';

/** Model FLOPs of one training step of `c` (STEP_FLOPS_FORMULA, as gptFlopsPerToken counts them for progress lines). */
export function stepFlops(c: TrainBenchConfig): number {
  return c.batch * c.ctx * gptFlopsPerToken(gptConfigOf(c), c.ctx);
}

const usage = `usage: nodetron bench train [--config tiny|small|all] [--steps N (7)] [--warmup N (3)] [--no-torch] [--cpu-time]
         [--torch-alloc auto|default|glibc-kept|jemalloc|tcmalloc (auto)] [--torch-compile MODE|off (default)] [--json F]
         PyTorch eager runs with every allocator setting installed here (auto) and the fastest is compared;
         torch.compile (MODE: default, max-autotune-no-cudagraphs, ...) runs with that allocator;
         --cpu-time: both sides on one thread, steps timed by process CPU time (for a loaded machine)
       nodetron bench train --layout dp=N[,zero=S|A..B] [--config tiny|small|all] [--overlap on|off|both] [--bucket-mb M (25)] [--steps N (4)] [--warmup N (1)] [--json F]
         launches N ranks; per rank and ZeRO stage: bytes of parameters, gradients and optimizer state beside the
         ZeRO formula, and ms/step with data-parallel gradient communication overlapped with backward and not`;

export async function main(argv: string[]): Promise<number> {
  if (argv.some((a) => a === '--layout' || a.startsWith('--layout='))) {
    if (argv.includes('--help')) { console.log(usage); return 0; }
    return (await import('./layout.js')).layoutMain(argv);
  }
  const o = parseOptions(argv, {
    device: { kind: 'string', choices: ['cpu', 'cuda'] }, batch: { kind: 'positive', max: 4096 }, 'no-kernels': 'boolean',
    json: 'outfile', config: { kind: 'string', choices: ['tiny', 'small', 'all', 'gpt2'] }, steps: { kind: 'positive', max: 1e6 }, warmup: { kind: 'count', max: 1e6 }, 'no-torch': 'boolean', help: 'boolean',
    'torch-alloc': 'string', 'torch-compile': 'string', 'cpu-time': 'boolean',
  }, { h: 'help' });
  if (o.help) {
    console.log(`${usage}\n       ${CUDA_USAGE.replace(/^usage: /, '')}`);
    return 0;
  }
  expectPositionals(o, 'nothing', 0);
  if (o.device === 'cuda') {
    const which = (o.config as string | undefined) ?? 'gpt2';
    const base = which === 'gpt2' ? [GPT2_124M] : selectConfigs(which);
    const batch = o.batch as number | undefined;
    const tc = (o['torch-compile'] as string | undefined) ?? 'on';
    if (tc !== 'on' && tc !== 'off') throw new ArgumentError(`bench train --device cuda: --torch-compile is on or off, got ${tc}`);
    return cudaTrainBench({ configs: base.map((c) => (batch ? { ...c, batch } : c)), steps: (o.steps as number | undefined) ?? 10, warmup: (o.warmup as number | undefined) ?? 3,
      torch: !o['no-torch'], compile: tc === 'on', kernels: !o['no-kernels'], json: o.json as string | undefined });
  }
  if (o['cpu-time'] && o.device === 'cuda') throw new ArgumentError('bench train: --cpu-time goes with the cpu device');
  if (o.config === 'gpt2' || o.batch !== undefined || o['no-kernels']) throw new ArgumentError('bench train: --config gpt2, --batch and --no-kernels go with --device cuda');
  const configs = selectConfigs(o.config as string | undefined);
  const steps = (o.steps as number | undefined) ?? 7, warmup = (o.warmup as number | undefined) ?? 3;
  const alloc = (o['torch-alloc'] as string | undefined) ?? 'auto';
  const names = TORCH_ALLOCATORS.map((a) => a.name);
  if (alloc !== 'auto' && !names.includes(alloc)) throw new ArgumentError(`bench train: unknown --torch-alloc ${alloc} (auto, ${names.join(', ')})`);
  const compileMode = (o['torch-compile'] as string | undefined) ?? 'default';
  const cpuTime = o['cpu-time'] === true;
  if (cpuTime) { cpu().setKernelThreads(1); cpu().setBlasThreads(1); }
  const clock = cpuTime ? cpuMs : () => performance.now();
  const threads = cpuTime ? 1 : info().backends.cpu.blasThreads as number;
  const torchOn = !o['no-torch'];
  const cpuIsa = info().cpu.isa;
  const measured = measureFmaPeak('auto', 0.6);
  // --cpu-time compares with one thread's rate per second of its own CPU time.
  const peak = cpuTime ? { ...measured, gflops: measured.gflopsOneThreadCpuTime } : measured;
  console.log(`# nodetron bench train — ${warmup} warm-up + ${steps} timed steps (median), f32 on cpu, ${threads} BLAS threads (PyTorch gets the same)` +
    `${cpuTime ? '; ms are milliseconds of process CPU time, % peak is of one thread\'s FMA peak per CPU-second' : ''}`);
  console.log(`# FMA peak measured here: ${peak.gflops.toFixed(1)} GFLOP/s (${peak.isa}, ${peak.threads} threads: all together ${peak.gflopsAllThreads.toFixed(1)}, ` +
    `one alone ${peak.gflopsOneThread.toFixed(1)}); nodetron's cpu kernels run at ${cpuIsa.active}` +
    `${cpuIsa.env ? ` (NODETRON_CPU_ISA=${cpuIsa.env})` : ''}\n# model FLOPs per step: ${STEP_FLOPS_FORMULA}`);
  if (torchOn) {
    console.log(`# PyTorch peer: the same model, batch and AdamW; eager with ${alloc === 'auto' ? `each allocator setting found here (${names.join(', ')}), the fastest compared` : `allocator ${alloc}`}` +
      `${compileMode === 'off' ? '' : `; torch.compile (mode ${compileMode}) with that allocator`}\n`);
  }
  const rows: (string | number)[][] = [];
  const results: Record<string, unknown>[] = [];
  const notes: string[] = [];
  const mib = (b: number | null | undefined) => (b === null || b === undefined ? '-' : (b / 2 ** 20).toFixed(1));
  const ms = (p: Peer | undefined) => (ok(p) ? p.msPerStep.toFixed(1) : '-');
  const ratio = (p: Peer | undefined, mine: number) => (ok(p) ? (p.msPerStep / mine).toFixed(2) : '-');
  const gflops = (flops: number, msPerStep: number) => flops / (msPerStep / 1e3) / 1e9;
  const pct = (g: number) => (100 * g) / peak.gflops;
  for (const c of configs) {
    const flops = stepFlops(c);
    const plain = measure(c, false, warmup, steps, clock);
    const recomputed = measure(c, true, warmup, steps, clock);
    let eager: Peer[] = [], compiled: Peer | undefined;
    let best: (PeerResult & { allocator: string }) | undefined;
    const mine = gflops(flops, plain.msPerStep);
    const ours = [c.name, plain.msPerStep.toFixed(1), Math.round(plain.tokensPerSec), mine.toFixed(1), `${pct(mine).toFixed(1)}%`];
    if (torchOn) {
      eager = (alloc === 'auto' ? names : [alloc]).map((a) => torchPeer(c, warmup, steps, threads, a, undefined, cpuTime));
      const runs = eager.filter(ok);
      best = runs.length ? runs.reduce((a, b) => (b.msPerStep < a.msPerStep ? b : a)) : undefined;
      if (compileMode !== 'off') compiled = torchPeer(c, warmup, steps, threads, best?.allocator ?? (alloc === 'auto' ? 'glibc-kept' : alloc), compileMode, cpuTime);
      const eg = best ? gflops(flops, best.msPerStep) : null;
      rows.push([...ours, ms(best), eg === null ? '-' : eg.toFixed(1), eg === null ? '-' : `${pct(eg).toFixed(1)}%`, ratio(best, plain.msPerStep), ms(compiled), ratio(compiled, plain.msPerStep),
        recomputed.msPerStep.toFixed(1), mib(plain.peakStepBytes), mib(best ? best.peakStepBytes : null), mib(recomputed.peakStepBytes)]);
      if (best) {
        const env = Object.entries(best.allocatorEnv).map(([k, v]) => `${k}=${v}`).join(' ') || 'none';
        notes.push(`# ${c.name}: PyTorch ${best.torch}, ${best.threads} threads, oneDNN ${best.mkldnn ? 'on' : 'off'}, fastest eager allocator ${best.allocator} (env: ${env}); ` +
          `eager medians: ${eager.map((p) => `${p.allocator} ${ok(p) ? `${p.msPerStep.toFixed(1)} ms` : `(${p.error})`}`).join(', ')}`);
      } else notes.push(`# ${c.name}: PyTorch eager failed: ${eager.map((p) => `${p.allocator}: ${'error' in p ? p.error : ''}`).join('; ')}`);
      if (compiled) {
        notes.push(ok(compiled)
          ? `# ${c.name}: torch.compile mode ${compiled.compileMode}, allocator ${compiled.allocator}: first step (compilation, or a hit in inductor's cache) ${compiled.firstStepSeconds?.toFixed(1)} s`
          : `# ${c.name}: torch.compile failed: ${compiled.error}`);
      }
    } else {
      rows.push([...ours, '-', '-', '-', '-', '-', '-', recomputed.msPerStep.toFixed(1), mib(plain.peakStepBytes), '-', mib(recomputed.peakStepBytes)]);
    }
    const theirs = best ? gflops(flops, best.msPerStep) : null;
    results.push({ config: c, nodetron: plain, nodetronRecompute: recomputed, pytorch: eager, pytorchCompile: compiled ?? null,
      modelFlopsPerStep: flops, nodetronGflops: mine, nodetronPeakPercent: pct(mine),
      pytorchEagerGflops: theirs, pytorchEagerPeakPercent: theirs === null ? null : pct(theirs) });
  }
  printTable(['config', 'ms/step', 'tok/s', 'GFLOP/s', '% peak', 'torch eager ms', 'eager GFLOP/s', 'eager % peak', 'eager/ours', 'torch.compile ms', 'compile/ours',
    'recompute ms/step', 'peak MiB', 'torch peak MiB', 'recompute peak MiB'], rows);
  for (const n of notes) console.log(n);
  console.log('# peak MiB: tensor bytes allocated above parameters + AdamW state during one step (nodetron: memoryStats; PyTorch: the profiler\'s memory events of an extra untimed step)');
  console.log(`# GFLOP/s: model FLOPs per step / median step time; % peak: of the FMA peak above (${peak.gflops.toFixed(1)} GFLOP/s, measured on a machine that may be loaded)`);
  writeJson(o.json as string | undefined, { bench: 'train', machine: machineRecord(), warmup, steps, threads, clock: cpuTime ? 'process CPU time, one thread' : 'wall', torchAllocators: TORCH_ALLOCATORS, torchCompileMode: compileMode, results,
    fmaPeak: peak, cpuIsa, flopsFormula: STEP_FLOPS_FORMULA });
  return 0;
}
