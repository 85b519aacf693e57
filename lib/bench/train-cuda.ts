// `nodetron bench train --device cuda`: a GPT training step (forward + backward + AdamW) on one GPU
// under bf16 autocast, in tokens/s, MFU (model FLOPs per step, as `bench train` counts them, over the
// GPU's dense bf16 peak) and peak memory, beside PyTorch eager (bf16 autocast, SDPA) and
// torch.compile on the same model, batch, optimizer and GPU in the same run
// (scripts/bench/torch_train.py --device cuda), and a table of where one step's GPU time goes: every
// call of the cuda addon's kernels (gemm, gemm_epilogue, flash_attention_backward, ...) bracketed by
// CUDA events in one extra profiled step, summed per kernel.
import { join } from 'node:path';
import { autocast } from '../amp.js';
import { tensor } from '../creation.js';
import * as cudaApi from '../cuda/index.js';
import { Event } from '../cuda/streams.js';
import { BackendUnavailableError } from '../errors.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { BACKEND_KERNELS, cuda, packageRoot } from '../native.js';
import { GPT } from '../nn/gpt.js';
import { AdamW } from '../optim/adamw.js';
import { trainStep } from '../step.js';
import { gptConfigOf, type TrainBenchConfig } from './configs.js';
import { median, runTorchPeer } from './util.js';
import { printTable, writeJson, machineRecord } from '../cmdline/report.js';
import { gptFlopsPerToken } from '../train/progress.js';

/** GPT-2 124M at T 1024 (the batch from --batch, default 8), beside the cpu bench's configs. */
export const GPT2_124M: TrainBenchConfig = { name: 'gpt2', layers: 12, heads: 12, width: 768, ctx: 1024, batch: 8, vocab: 50257 };

/** Dense bf16 tensor-core peak TFLOP/s by GPU name (the MFU denominator; null for a GPU not listed). */
export const BF16_PEAK_TFLOPS: [RegExp, number][] = [[/H200/, 989], [/H100.*PCIe/, 756], [/H100/, 989], [/A100/, 312], [/L40S/, 362], [/A10G?\b/, 125]];

/** The dense bf16 peak of a GPU named `name`, or null. */
export function bf16PeakTflops(name: string): number | null {
  return BF16_PEAK_TFLOPS.find(([re]) => re.test(name))?.[1] ?? null;
}

/** One kernel's share of a profiled step: calls, summed event-bracketed milliseconds. */
export interface KernelTime { kernel: string; calls: number; ms: number }

/**
 * Runs `fn` with every kernel call of the cuda addon bracketed by timing events on the current
 * stream; returns the summed GPU milliseconds per kernel, largest first. An event pair measures from
 * the end of the previous work on the stream to the end of the call's kernels, so host gaps (launch
 * overhead when the GPU runs ahead of the host) count toward the kernel that waited for them.
 */
export function profileKernels(device: number, fn: () => void): KernelTime[] {
  const addon = cuda() as unknown as Record<string, unknown>;
  const marks: [string, Event, Event][] = [];
  const saved = new Map<string, unknown>();
  for (const k of BACKEND_KERNELS) {
    const f = addon[k];
    if (typeof f !== 'function' || k === 'Storage' || k === 'read' || k === 'write') continue;
    saved.set(k, f);
    addon[k] = function (this: unknown, ...args: unknown[]) {
      const a = new Event(device, { timing: true }).record();
      try {
        return (f as (...x: unknown[]) => unknown).apply(this, args);
      } finally {
        marks.push([k, a, new Event(device, { timing: true }).record()]);
      }
    };
  }
  try {
    fn();
    cudaApi.synchronize(`cuda:${device}`);
  } finally {
    for (const [k, f] of saved) addon[k] = f;
  }
  const byKernel = new Map<string, KernelTime>();
  for (const [k, a, b] of marks) {
    const t = byKernel.get(k) ?? { kernel: k, calls: 0, ms: 0 };
    t.calls++;
    t.ms += a.elapsedMs(b);
    byKernel.set(k, t);
    a.destroy(); b.destroy();
  }
  return [...byKernel.values()].sort((x, y) => y.ms - x.ms);
}

interface CudaMeasurement { msPerStep: number; tokensPerSec: number; peakBytes: number; losses: number[]; stepsMs: number[] }

/** Times `steps` bf16-autocast steps after `warmup` (median, each step synchronized); peak = the allocator's peak over the timed steps. */
function measureCuda(c: TrainBenchConfig, warmup: number, steps: number, kernels: boolean): { m: CudaMeasurement; table: KernelTime[] } {
  const device = 'cuda:0';
  const model = new GPT(gptConfigOf(c), { seed: 0, device });
  const opt = new AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
  let x = 12345;
  const ids = () => Int32Array.from({ length: c.batch * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; });
  const inputs = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32', device }), targets = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32', device });
  const step = () => autocast({ dtype: 'bf16' }, () => trainStep(model, opt, inputs, targets));
  const stepsMs: number[] = [], losses: number[] = [];
  let table: KernelTime[] = [];
  try {
    for (let i = 0; i < warmup + steps; i++) {
      if (i === warmup) resetPeakMemory(device);
      cudaApi.synchronize(device);
      const t0 = performance.now();
      losses.push(step().loss);
      cudaApi.synchronize(device);
      if (i >= warmup) stepsMs.push(performance.now() - t0);
    }
    if (kernels) table = profileKernels(0, () => { step(); });
  } finally {
    inputs.dispose(); targets.dispose(); opt.dispose(); model.dispose();
  }
  const msPerStep = median(stepsMs);
  return { m: { msPerStep, tokensPerSec: (c.batch * c.ctx) / (msPerStep / 1000), peakBytes: memoryStats(device).peak, losses, stepsMs }, table };
}

interface CudaPeer { msPerStep: number; tokensPerSec: number; peakStepBytes: number | null; torch: string; firstStepSeconds: number | null }

function torchCudaPeer(c: TrainBenchConfig, warmup: number, steps: number, compile: boolean): CudaPeer | { error: string } {
  const script = join(packageRoot, 'scripts', 'bench', 'torch_train.py');
  const args = [script, '--layers', c.layers, '--heads', c.heads, '--width', c.width, '--ctx', c.ctx, '--batch', c.batch, '--vocab', c.vocab,
    '--steps', steps, '--warmup', warmup, '--device', 'cuda', '--dtype', 'bf16', ...(compile ? ['--compile'] : [])].map(String);
  const r = runTorchPeer(args, 'default', compile ? 30 * 60_000 : 10 * 60_000);
  return 'error' in r ? { error: r.error } : (r.result as unknown as CudaPeer);
}

export const CUDA_USAGE = `usage: nodetron bench train --device cuda [--config gpt2|tiny|small (gpt2)] [--batch B (8)] [--steps N (10)] [--warmup N (3)]
         [--no-torch] [--torch-compile on|off (on)] [--no-kernels] [--json F]
         one GPU, bf16 autocast: tokens/s, MFU and peak memory beside PyTorch eager (bf16 autocast, SDPA) and
         torch.compile in the same run, and the GPU time of one step per cuda kernel (CUDA events)`;

/** Options of {@link cudaTrainBench} (parsed by `bench train`). */
export interface CudaTrainOptions { configs: TrainBenchConfig[]; steps: number; warmup: number; torch: boolean; compile: boolean; kernels: boolean; json?: string }

/** Runs the cuda training bench; throws BackendUnavailableError (with the reason) where no GPU is usable. */
export function cudaTrainBench(o: CudaTrainOptions): number {
  if (!cudaApi.isAvailable()) {
    throw new BackendUnavailableError(`bench train --device cuda: no usable GPU on this machine (${cudaApi.unavailableReason()}); ` +
      'run it where nvidia-smi lists a GPU, or drop --device cuda for the cpu bench');
  }
  const gpu = String((cuda().deviceInfo() as { name: string }[])[0]?.name ?? 'unknown GPU');
  const peakTf = bf16PeakTflops(gpu);
  console.log(`# nodetron bench train --device cuda — ${gpu}, bf16 autocast, ${o.warmup} warm-up + ${o.steps} timed steps (median, each synchronized)`);
  console.log(`# MFU: model FLOPs per step (as \`bench train\` counts them) / step time / ${peakTf === null ? 'unknown peak (GPU not in the table: no MFU)' : `${peakTf} TFLOP/s dense bf16`}`);
  const rows: (string | number)[][] = [];
  const results: Record<string, unknown>[] = [];
  const mib = (b: number | null | undefined) => (b === null || b === undefined ? '-' : (b / 2 ** 20).toFixed(0));
  for (const c of o.configs) {
    const flopsPerStep = c.batch * c.ctx * gptFlopsPerToken(gptConfigOf(c), c.ctx);
    const mfu = (tokS: number) => (peakTf === null ? '-' : `${((100 * tokS * (flopsPerStep / (c.batch * c.ctx))) / (peakTf * 1e12)).toFixed(1)}%`);
    const { m, table } = measureCuda(c, o.warmup, o.steps, o.kernels);
    rows.push([`${c.name} B${c.batch} T${c.ctx}`, 'nodetron', m.msPerStep.toFixed(1), Math.round(m.tokensPerSec), mfu(m.tokensPerSec), mib(m.peakBytes)]);
    const peers: Record<string, unknown> = {};
    for (const [label, compile] of [['torch eager', false], ['torch.compile', true]] as const) {
      if (!o.torch || (compile && !o.compile)) continue;
      const p = torchCudaPeer(c, o.warmup, o.steps, compile);
      peers[label] = p;
      if ('error' in p) rows.push([`${c.name} B${c.batch} T${c.ctx}`, `${label} (failed: ${p.error.slice(0, 80)})`, '-', '-', '-', '-']);
      else rows.push([`${c.name} B${c.batch} T${c.ctx}`, `${label} ${p.torch}`, p.msPerStep.toFixed(1), Math.round(p.tokensPerSec), mfu(p.tokensPerSec), mib(p.peakStepBytes)]);
    }
    results.push({ config: c, gpu, peakTflops: peakTf, modelFlopsPerStep: flopsPerStep, nodetron: m, torch: peers, kernels: table });
    if (table.length) {
      const total = table.reduce((s, t) => s + t.ms, 0);
      console.log(`\n# ${c.name}: GPU time of one profiled step per cuda kernel (event-bracketed calls; ${total.toFixed(1)} ms in all)`);
      printTable(['kernel', 'calls', 'ms', '% of step'], table.map((t) => [t.kernel, t.calls, t.ms.toFixed(2), `${((100 * t.ms) / total).toFixed(1)}%`]));
    }
  }
  console.log('');
  printTable(['config', 'impl', 'ms/step', 'tok/s', 'MFU', 'peak MiB'], rows);
  console.log('# peak MiB: nodetron: the caching allocator\'s peak over the timed steps (parameters and AdamW state included); PyTorch: torch.cuda.max_memory_allocated');
  writeJson(o.json, { bench: 'train', device: 'cuda', machine: machineRecord(), warmup: o.warmup, steps: o.steps, results });
  return 0;
}
