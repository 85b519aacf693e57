// `nodetron bench train`: ms per GPT training step (forward + backward + AdamW) and tokens/s for the
// tiny and small GPT-2 shapes, beside PyTorch eager on the same model with the same thread count in the
// same run (scripts/bench/torch_train.py, when python3 has torch), and peak step memory with and
// without activation recomputation (memoryStats peak above the resident parameters and state).
// With --layout it measures a data-parallel layout instead (lib/bench/layout.ts).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { tensor } from '../creation.js';
import { info } from '../info.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { packageRoot } from '../native.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { AdamW } from '../optim/adamw.js';
import { trainStep } from '../training.js';
import { selectConfigs, type TrainBenchConfig } from './configs.js';
import { machineRecord, parseOptions, printTable, writeJson } from './util.js';
import { expectPositionals } from '../cli/args.js';


interface Measurement { msPerStep: number; tokensPerSec: number; peakStepBytes: number; loss: number }

/** Times `steps` training steps after `warmup` and records the highest allocation above the resident set. */
function measure(c: TrainBenchConfig, recompute: boolean, warmup: number, steps: number): Measurement {
  const config: GPTConfig = { vocabSize: c.vocab, blockSize: c.ctx, nLayer: c.layers, nHead: c.heads, nEmbd: c.width, dropout: 0, bias: true, recompute };
  const model = new GPT(config, { seed: 0 });
  const opt = new AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
  let x = 12345;
  const ids = () => Int32Array.from({ length: c.batch * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; });
  const inputs = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' }), targets = tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' });
  let total = 0, loss = NaN, peakStepBytes = 0;
  try {
    for (let i = 0; i < warmup + steps; i++) {
      // After the first step the optimizer state exists, so the resident set is parameters + state.
      const resident = memoryStats().allocated;
      resetPeakMemory();
      const t0 = performance.now();
      loss = trainStep(model, opt, inputs, targets).loss;
      const dt = performance.now() - t0;
      if (i >= warmup) { total += dt; peakStepBytes = Math.max(peakStepBytes, memoryStats().peak - resident); }
    }
  } finally {
    inputs.dispose(); targets.dispose(); opt.dispose(); model.dispose();
  }
  const msPerStep = total / steps;
  return { msPerStep, tokensPerSec: (c.batch * c.ctx) / (msPerStep / 1000), peakStepBytes, loss };
}

function torchPeer(c: TrainBenchConfig, warmup: number, steps: number, threads: number): { msPerStep: number; tokensPerSec: number; torch: string } | { error: string } {
  const script = join(packageRoot, 'scripts', 'bench', 'torch_train.py');
  const args = [script, '--layers', c.layers, '--heads', c.heads, '--width', c.width, '--ctx', c.ctx, '--batch', c.batch, '--vocab', c.vocab,
    '--steps', steps, '--warmup', warmup, '--threads', threads].map(String);
  const r = spawnSync('python3', args, { encoding: 'utf8' });
  if (r.error) return { error: `python3 not runnable: ${r.error.message}` };
  if (r.status !== 0) return { error: (r.stderr || '').trim().split('\n').at(-1) ?? `exit ${r.status}` };
  return JSON.parse(r.stdout.trim().split('\n').at(-1)!);
}

const usage = `usage: nodetron bench train [--config tiny|small|all] [--steps N (5)] [--warmup N (2)] [--no-torch] [--json F]
       nodetron bench train --layout dp=N[,zero=S|A..B] [--config tiny|small|all] [--overlap on|off|both] [--bucket-mb M (25)] [--steps N (4)] [--warmup N (1)] [--json F]
         launches N ranks; per rank and ZeRO stage: bytes of parameters, gradients and optimizer state beside the
         ZeRO formula, and ms/step with data-parallel gradient communication overlapped with backward and not`;

export async function main(argv: string[]): Promise<number> {
  if (argv.some((a) => a === '--layout' || a.startsWith('--layout='))) {
    if (argv.includes('--help')) { console.log(usage); return 0; }
    return (await import('./layout.js')).layoutMain(argv);
  }
  const o = parseOptions(argv, {
    json: 'outfile', config: { kind: 'string', choices: ['tiny', 'small', 'all'] }, steps: { kind: 'positive', max: 1e6 }, warmup: { kind: 'count', max: 1e6 }, 'no-torch': 'boolean', help: 'boolean',
  }, { h: 'help' });
  if (o.help) {
    console.log(usage);
    return 0;
  }
  expectPositionals(o, 'nothing', 0);
  const configs = selectConfigs(o.config as string | undefined);
  const steps = (o.steps as number | undefined) ?? 5, warmup = (o.warmup as number | undefined) ?? 2;
  const threads = info().backends.cpu.blasThreads as number;
  console.log(`# nodetron bench train — ${warmup} warm-up + ${steps} timed steps, f32 on cpu, ${threads} BLAS threads (PyTorch gets the same)\n`);
  const rows: (string | number)[][] = [];
  const results: Record<string, unknown>[] = [];
  const mib = (b: number) => (b / 2 ** 20).toFixed(1);
  for (const c of configs) {
    const plain = measure(c, false, warmup, steps);
    const recomputed = measure(c, true, warmup, steps);
    const peer = o['no-torch'] ? { error: 'skipped (--no-torch)' } : torchPeer(c, warmup, steps, threads);
    const torchMs = 'msPerStep' in peer ? peer.msPerStep : NaN;
    rows.push([c.name, plain.msPerStep.toFixed(1), Math.round(plain.tokensPerSec), Number.isNaN(torchMs) ? '-' : torchMs.toFixed(1),
      Number.isNaN(torchMs) ? '-' : (torchMs / plain.msPerStep).toFixed(2), recomputed.msPerStep.toFixed(1), mib(plain.peakStepBytes), mib(recomputed.peakStepBytes)]);
    results.push({ config: c, nodetron: plain, nodetronRecompute: recomputed, pytorch: peer });
  }
  printTable(['config', 'ms/step', 'tok/s', 'torch ms/step', 'torch/ours', 'recompute ms/step', 'peak MiB', 'recompute peak MiB'], rows);
  for (const r of results) if ('error' in (r.pytorch as object)) console.log(`# PyTorch peer for ${(r.config as TrainBenchConfig).name}: ${(r.pytorch as { error: string }).error}`);
  writeJson(o.json as string | undefined, { bench: 'train', machine: machineRecord(), warmup, steps, threads, results });
  return 0;
}
