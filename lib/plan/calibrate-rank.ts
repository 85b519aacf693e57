// One rank of `nodetron plan --calibrate` (run under the launcher): builds the example's GPT (GPT-2
// blocks, tied head) at a small size with the public pieces (initParallelTraining, GPTStage,
// ParallelTrainer), trains a few steps of one layout on random tokens, and writes what the allocator
// saw to <out>/rank-<rank>.json: the peak of the steps after the first (the first creates the
// optimizer state) and the bytes held between steps. A rank that fails writes its error to
// <out>/rank-<rank>.error.json (read by calibrateLayout) and exits at once with code 1: the runtime
// keeps the process alive once distributed.init() ran, so leaving through process.exitCode would
// hang the job (the launcher stops the other ranks when one exits non-zero).
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseOptions } from '../cmdline/args.js';
import { tensor } from '../creation.js';
import { destroy } from '../distributed/init.js';
import { ArgumentError, NodetronError, StateError } from '../errors.js';
import { memoryStats, resetPeakMemory } from '../memory.js';
import { cpu } from '../native.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { AdamW, type AdamWOptions } from '../optim/adamw.js';
import { batchSlice, initParallelTraining } from '../parallel/layout.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { schedulePlacement } from '../parallel/pipeline/schedules.js';
import { tensorParallelGPTOptions } from '../parallel/tensor-parallel/gpt.js';
import { contextParallelLayout } from '../parallel/context-parallel/gpt.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import { cpuBf16Path, type Bf16GemmPath } from './memory.js';

/** What one calibration rank measured. */
export interface CalibrationRankResult {
  /** World rank. */
  rank: number;
  /** Tensor-parallel rank. */
  tpRank: number;
  /** Pipeline stage. */
  ppRank: number;
  /** Data-parallel rank. */
  dpRank: number;
  /** memoryStats().peak over the measured steps (bytes, the allocator's size classes). */
  peak: number;
  /** memoryStats().allocated after the last step (parameters, gradients, optimizer state). */
  allocated: number;
  /** Parameters this rank's stage holds (its tensor-parallel slices, before ZeRO sharding). */
  numParams: number;
  /** How this rank's bf16 GEMMs ran: on the AVX512_BF16 kernel ('native') or widened to f32 for sgemm ('widen'). */
  bf16Path: Bf16GemmPath;
}

/** What a failed calibration rank writes to <out>/rank-<rank>.error.json. */
export interface CalibrationRankError {
  /** World rank. */
  rank: number;
  /** The error's class name (ArgumentError, CommError, ..., or Error). */
  name: string;
  /** NodetronError's stable code (ERR_ARGUMENT, ...), absent for other errors. */
  code?: string;
  /** The error's message. */
  message: string;
  /** When it failed (Date.now()): the first failure caused the others (a peer's closed connection). */
  time: number;
}

let outDir: string | undefined;

async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    layers: 'number', heads: 'number', width: 'number', ctx: 'number', batch: 'number', vocab: 'number',
    tp: 'number', pp: 'number', dp: 'number', zero: 'number', sp: 'boolean', recompute: 'boolean',
    'micro-batches': 'number', schedule: 'string', 'virtual-stages': 'number', steps: 'number', out: 'string', 'fail-at': 'string', cp: 'number', 'cp-mode': 'string', precision: 'string',
  });
  outDir = o.out as string | undefined;
  // --fail-at RANK:STEP (fault injection for tests): that rank throws at the start of that step, while
  // the other ranks go on into it and wait for it in the pipeline or the gradient collectives.
  const failAt = o['fail-at'] === undefined ? undefined : /^(\d+):(\d+)$/.exec(o['fail-at'] as string);
  if (o['fail-at'] !== undefined && !failAt) throw new ArgumentError(`calibrate-rank: --fail-at takes RANK:STEP, got ${JSON.stringify(o['fail-at'])}`);
  const n = (k: string, d: number) => (o[k] as number | undefined) ?? d;
  const ctx = n('ctx', 64), batch = n('batch', 8), steps = Math.max(2, n('steps', 3));
  const config: GPTConfig = {
    vocabSize: n('vocab', 50304), blockSize: ctx, nLayer: n('layers', 2), nHead: n('heads', 4), nEmbd: n('width', 128),
    dropout: 0, bias: true, recompute: Boolean(o.recompute),
  };
  const localWorld = Number(process.env.LOCAL_WORLD_SIZE ?? 1);
  cpu().setBlasThreads(Math.max(1, Math.floor(cpus().length / localWorld)));
  const par = await initParallelTraining({
    tp: o.tp as number | undefined, pp: o.pp as number | undefined, dp: o.dp as number | undefined, zero: o.zero as number | undefined,
    sequenceParallel: o.sp as boolean | undefined, microBatches: o['micro-batches'] as number | undefined, schedule: o.schedule as string | undefined,
    cp: o.cp as number | undefined, cpMode: o['cp-mode'] as string | undefined,
    virtualStages: o['virtual-stages'] as number | undefined,
  }, config, batch);
  const { layout, mesh } = par;
  const tensorParallel = mesh && layout.tp > 1 ? tensorParallelGPTOptions(mesh.tpGroup, { sequenceParallel: layout.sequenceParallel }) : {};
  const context = mesh && mesh.cpSize > 1 ? { contextLayout: contextParallelLayout(mesh.cpGroup, layout.cpMode) } : {};
  const model = new GPTStage(new GPT(config, { seed: 1, ...tensorParallel, ...context }), mesh?.ppRank ?? 0, layout.pp, layout.virtualStages, schedulePlacement(layout.schedule));
  const trainer = await ParallelTrainer.create<AdamWOptions>(model, [{ params: model.parameters() }], {
    mesh, zero: layout.zero, ...(layout.cpMode ? { cpMode: layout.cpMode } : {}), microBatches: layout.microBatches, schedule: layout.schedule, maxGradNorm: 1,
    precision: (o.precision as 'f32' | 'bf16' | undefined) ?? 'f32',
    createOptimizer: (groups) => new AdamW(groups, { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 }),
  });
  const slice = batchSlice(batch, mesh?.dpRank ?? 0, layout.dp);
  let x = 12345 + (mesh?.dpRank ?? 0);
  const ids = () => Int32Array.from({ length: slice.count * ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % config.vocabSize; });
  for (let step = 0; step < steps; step++) {
    if (step === 1) resetPeakMemory();
    if (failAt && Number(failAt[1]) === par.rank && Number(failAt[2]) === step) throw new StateError(`calibrate-rank: injected failure of rank ${par.rank} at step ${step} (--fail-at)`);
    const inputs = tensor(ids(), [slice.count, ctx], { dtype: 'i32' }), targets = tensor(ids(), [slice.count, ctx], { dtype: 'i32' });
    await trainer.step(inputs, targets);
    inputs.dispose(); targets.dispose();
  }
  const mem = memoryStats();
  const result: CalibrationRankResult = {
    rank: par.rank, tpRank: mesh?.tpRank ?? 0, ppRank: mesh?.ppRank ?? 0, dpRank: mesh?.dpRank ?? 0,
    peak: mem.peak, allocated: mem.allocated, numParams: model.numParameters(), bf16Path: cpuBf16Path(),
  };
  writeFileSync(join(o.out as string, `rank-${par.rank}.json`), JSON.stringify(result));
  trainer.dispose();
  model.dispose();
  if (mesh) await destroy();
  return 0;
}

function fail(e: unknown): never {
  console.error(e);
  const rank = Number(process.env.RANK ?? 0);
  if (outDir !== undefined) {
    const err = e instanceof Error ? e : new Error(String(e));
    const record: CalibrationRankError = { rank, name: err.name, message: err.message, time: Date.now(), ...(e instanceof NodetronError ? { code: e.code } : {}) };
    try { writeFileSync(join(outDir, `rank-${rank}.error.json`), JSON.stringify(record)); } catch { /* the message is on stderr too */ }
  }
  process.exit(1);
}

main(process.argv.slice(2)).then((code) => process.exit(code), fail);
