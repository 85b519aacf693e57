// Training layouts: checking a TP × PP × DP (+ ZeRO, offload, micro-batches) request against a model,
// a world and a batch before anything trains, and joining the job with the checked layout's mesh.
// The training step of one rank of any layout is ParallelTrainer (trainer.ts).
import * as dist from '../distributed/init.js';
import { readLaunchEnv } from '../distributed/env.js';
import { ArgumentError } from '../errors.js';
import { initializeParallel, type ParallelState } from './mesh.js';
import { agreeAll } from '../distributed/agree.js';
import type { WorldGroup } from '../distributed/group.js';
import { checkTensorParallelConfig } from './tensor-parallel/gpt.js';
import { SCHEDULE_KINDS, type ScheduleKind } from './pipeline/schedules.js';

/**
 * The pipeline schedules: GPipe (all forwards, then all backwards), 1F1B (one forward, one
 * backward), interleaved 1F1B (virtual stages: each rank holds several non-adjacent chunks of
 * layers), ZB-H1 (zero bubble: backwards split into input and weight gradients) or ZB-V (zero
 * bubble on 2 chunks per rank placed in a V).
 */
export type PipelineScheduleName = ScheduleKind;

/** How context parallelism splits attention: ring attention (Megatron) or Ulysses' all-to-all (DeepSpeed). */
export type ContextParallelMode = 'ring' | 'ulysses';

/**
 * A checked training layout: how the world splits into tensor-, pipeline- and data-parallel ranks, and how each rank
 * trains.
 */
export interface TrainingLayout {
  /** Tensor-parallel ranks. */
  tp: number;
  /** Pipeline stages. */
  pp: number;
  /** Data-parallel ranks. */
  dp: number;
  /** Sequence parallelism: the regions between tensor-parallel layers hold 1/tp of the sequence (needs tp > 1). */
  sequenceParallel: boolean;
  /** ZeRO stage: 0 (replicated optimizer state), 1 (sharded state), 2 (and gradients) or 3 (and parameters). */
  zero: 0 | 1 | 2 | 3;
  /** Keep ZeRO shards and their update in host memory. */
  offload: boolean;
  /** Micro-batches each rank's batch is split into per step (pipeline schedule, gradient accumulation). */
  microBatches: number;
  /** The pipeline schedule. */
  schedule: PipelineScheduleName;
  /** Context-parallel ranks: the sequence split over them; present only when > 1 (read `cp ?? 1`). */
  cp?: number;
  /** How attention runs over the context-parallel ranks; present only with cp. */
  cpMode?: ContextParallelMode;
  /** Model chunks per pipeline rank (interleaved 1F1B's virtual stages; 2 under zb-v; 1 otherwise). */
  virtualStages: number;
  /** Expert-parallel ranks (a divisor of dp), present when > 1: the MoE experts split over ep data-parallel ranks. */
  ep?: number;
}

/** The model dimensions a layout must divide. */
export interface LayoutModelShape {
  /** Transformer blocks. */
  nLayer: number;
  /** Attention heads. */
  nHead: number;
  /** Embedding width. */
  nEmbd: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** The sequence length trained on (a GPTConfig's context): sequence parallelism needs it to divide by tp. */
  blockSize?: number;
  /** Sliding-window attention (a GPTConfig's window): context parallelism refuses it. */
  window?: number;
  /** Dropout probability (a GPTConfig's dropout): context parallelism refuses a nonzero one. */
  dropout?: number;
  /** The MoE layers' routed experts (a GPTConfig's moe.experts): expert parallelism needs ep to divide them. */
  moeExperts?: number;
}

/** Layout flags as a command line gives them; unset ones take defaults (dp: whatever the world leaves). */
export interface LayoutFlags {
  /** Tensor-parallel ranks (`--tp`, default 1). */
  tp?: number;
  /** Pipeline stages (`--pp`, default 1). */
  pp?: number;
  /** Data-parallel ranks (`--dp`, default: the world size / (tp·pp)). */
  dp?: number;
  /** Sequence parallelism (`--sp`; needs tp > 1). */
  sequenceParallel?: boolean;
  /** ZeRO stage 0-3 (`--zero`, default 0). */
  zero?: number;
  /** ZeRO shards in host memory (`--offload`). */
  offload?: boolean;
  /** Micro-batches per step (`--micro-batches`, default 1). */
  microBatches?: number;
  /** Pipeline schedule, gpipe, 1f1b, interleaved, zb-h1 or zb-v (`--schedule`, default 1f1b; interleaved when virtualStages > 1). */
  schedule?: string;
  /** Context-parallel ranks (`--cp`, default 1): the sequence split over them. */
  cp?: number;
  /** ring or ulysses (`--cp-mode`, default ring). */
  cpMode?: string;
  /** Model chunks per pipeline rank (`--virtual-stages`, default 1; > 1 needs the interleaved schedule). */
  virtualStages?: number;
  /** Expert-parallel ranks (`--ep`, default 1): must divide dp and the model's experts. */
  ep?: number;
}

/**
 * Resolves and checks a layout by the rule book ({@link layoutProblems}). Every problem is listed in
 * one ArgumentError, so every rank (each runs the same check on the same inputs) fails the same way
 * before any communication.
 */
export function resolveTrainingLayout(flags: LayoutFlags, model: LayoutModelShape, worldSize: number, globalBatch: number): TrainingLayout {
  // Unset flags take their defaults; a set one goes to the rules as given (they report bad counts).
  const count = (v: number | undefined) => (v !== undefined && Number.isInteger(v) && v >= 1 ? v : 1);
  const tp = flags.tp ?? 1, pp = flags.pp ?? 1, cp = flags.cp ?? 1;
  const dp = flags.dp ?? Math.max(1, Math.floor(worldSize / (count(flags.tp) * count(flags.cp) * count(flags.pp))));
  const flagV = flags.virtualStages;
  const schedule = flags.schedule ?? ((flagV ?? 1) > 1 ? 'interleaved' : '1f1b');
  // zb-v: always 2 chunks per rank (the flag may say so, or nothing; 1 is taken as left out).
  const virtualStages = schedule === 'zb-v' && (flagV === undefined || flagV === 1) ? 2 : flagV ?? 1;
  const ep = flags.ep ?? 1, zero = flags.zero ?? 0, microBatches = flags.microBatches ?? 1;
  const cpMode = flags.cpMode ?? 'ring', sequenceParallel = flags.sequenceParallel ?? false, offload = flags.offload ?? false;
  // (Unchecked strings and numbers: the rules check them.)
  const layout = { tp, pp, dp, cp, ep, zero, offload, sequenceParallel, microBatches, schedule, virtualStages, cpMode } as LayoutRequest;
  const shape: LayoutShape = { nLayer: model.nLayer, nHead: model.nHead, nEmbd: model.nEmbd, vocabSize: model.vocabSize, worldSize, globalBatch,
    ...(model.blockSize !== undefined ? { seqLen: model.blockSize } : {}), ...(model.window !== undefined ? { window: model.window } : {}),
    ...(model.dropout !== undefined ? { dropout: model.dropout } : {}), ...(model.moeExperts !== undefined ? { moeExperts: model.moeExperts } : {}) };
  const problems = layoutProblems(shape, layout);
  // The flags are checked against a sequence length: without one, sp and cp cannot be.
  if (model.blockSize === undefined && sequenceParallel && Number.isInteger(tp) && tp > 1) problems.unshift('--sp needs the sequence length (the model shape\'s blockSize) to check that tp divides it');
  if (model.blockSize === undefined && Number.isInteger(cp) && cp > 1) problems.unshift('--cp needs the sequence length (the model shape\'s blockSize) to check that it splits');
  if (problems.length > 0) throw new ArgumentError(`training layout: ${problems.join('; ')}`);
  return { tp, pp, dp, sequenceParallel, zero: zero as 0 | 1 | 2 | 3, offload, microBatches, schedule: schedule as PipelineScheduleName, virtualStages,
    ...(ep > 1 ? { ep } : {}), ...(cp > 1 ? { cp, cpMode: cpMode as ContextParallelMode } : {}) };
}

/**
 * The model and batch facts the layout rules read. Every field is optional: a rule whose facts are
 * absent is not checked (the trainer, for one, sees pipeline stages and their layers, not the whole
 * model), except `moeExperts`, whose absence means the model has no MoE layers.
 */
export interface LayoutShape {
  /** Transformer blocks. */
  nLayer?: number;
  /** Attention heads. */
  nHead?: number;
  /** Key/value heads (grouped-query attention; default nHead). */
  nKvHead?: number;
  /** Embedding width. */
  nEmbd?: number;
  /** The MLP's hidden width. */
  ffn?: number;
  /** Vocabulary size. */
  vocabSize?: number;
  /** The sequence length trained on. */
  seqLen?: number;
  /** Sliding-window attention's window (context parallelism refuses it). */
  window?: number;
  /** Dropout probability (context parallelism refuses a nonzero one). */
  dropout?: number;
  /** The MoE layers' routed experts; absent: the model has no MoE layers. */
  moeExperts?: number;
  /** Processes in the job: tp·cp·pp·dp must equal it. */
  worldSize?: number;
  /** Sequences per step over all data-parallel replicas. */
  globalBatch?: number;
  /** Sequences per micro-batch on one replica (the planner's choice): dp × it must divide the global batch. */
  microBatchSize?: number;
}

/**
 * A layout to check: a TrainingLayout whose virtual stages may be left out (1, or 2 under zb-v).
 * The rules check its values at run time too (a schedule, ZeRO stage or cpMode from untyped input).
 */
export type LayoutRequest = Omit<TrainingLayout, 'virtualStages'> & {
  /** Model chunks per pipeline rank (default 1; 2 under zb-v). */
  virtualStages?: number;
};

/**
 * The layout rule book: every reason `layout` cannot train a model of `shape`, each a message naming
 * the rule (by the command-line flag that sets it) and the numbers; empty when it can. Pure. The
 * command-line flags (resolveTrainingLayout), the trainer (ParallelTrainer.create) and the planner
 * (nodetron plan's candidate filter) all refuse a layout by these rules, so they agree on what runs.
 * Counts that are not integers >= 1 (or a ZeRO stage outside 0-3) are reported alone: the other
 * rules would only repeat them.
 */
export function layoutProblems(shape: LayoutShape, layout: LayoutRequest): string[] {
  const { tp, pp, dp, microBatches: m } = layout, zero: number = layout.zero;
  const cp = layout.cp ?? 1, ep = layout.ep ?? 1, cpMode: string = layout.cpMode ?? 'ring', schedule: string = layout.schedule;
  const counts: [string, number][] = [['tp', tp], ['pp', pp], ['dp', dp], ['cp', cp], ['ep', ep], ['micro-batches', m]];
  if (layout.virtualStages !== undefined) counts.push(['virtual-stages', layout.virtualStages]);
  const bad = counts.filter(([, v]) => !Number.isInteger(v) || v < 1).map(([name, v]) => `--${name} must be an integer >= 1, got ${v}`);
  if (zero !== 0 && zero !== 1 && zero !== 2 && zero !== 3) bad.push(`--zero must be 0, 1, 2 or 3, got ${zero}`);
  if (bad.length) return bad;
  const problems: string[] = [];
  const { nLayer, seqLen, globalBatch } = shape, moe = shape.moeExperts !== undefined;
  // Tensor parallelism: whole heads, width and vocabulary per rank (the model's own check), key/value
  // heads split over tp or (more ranks than heads) whole on every rank, and the MLP's columns.
  if (shape.nHead !== undefined && shape.nEmbd !== undefined && shape.vocabSize !== undefined) {
    try { checkTensorParallelConfig({ nHead: shape.nHead, nEmbd: shape.nEmbd, vocabSize: shape.vocabSize }, tp); } catch (e) {
      if (!(e instanceof ArgumentError)) throw e;
      problems.push(`--tp ${tp}: ${e.message}`);
    }
  }
  const kv = shape.nKvHead ?? shape.nHead;
  if (kv !== undefined && kv % tp !== 0 && tp % kv !== 0) problems.push(`--tp ${tp}: the ${kv} key/value heads neither divide by tp nor divide it`);
  if (shape.ffn !== undefined && shape.ffn % tp !== 0) problems.push(`--tp ${tp}: the MLP width ${shape.ffn} is not a multiple of tp`);
  if (nLayer !== undefined && pp > nLayer) problems.push(`--pp ${pp} is more pipeline stages than the model's ${nLayer} layers`);
  // Sequence parallelism: the regions between tensor-parallel layers hold 1/tp of the sequence.
  if (layout.sequenceParallel) {
    if (tp === 1) problems.push('--sp splits the sequence over the tensor-parallel ranks, but tp = 1');
    else if (seqLen !== undefined && seqLen % tp !== 0) problems.push(`--sp: the sequence length ${seqLen} is not a multiple of --tp ${tp}`);
    if (moe) problems.push('--sp with MoE layers is not supported yet (each tensor-parallel rank would route a different chunk of the sequence)');
  }
  if (globalBatch !== undefined) {
    const b = shape.microBatchSize;
    if (b !== undefined && globalBatch % (dp * b) !== 0) problems.push(`the global batch of ${globalBatch} sequences does not divide into dp × micro-batch size = ${dp} × ${b}`);
    else if (globalBatch % (dp * m) !== 0) {
      problems.push(m === 1 ? `--dp ${dp} does not divide the global batch of ${globalBatch} sequences`
        : `dp·micro-batches = ${dp}·${m} does not divide the global batch of ${globalBatch} sequences`);
    }
  }
  if (shape.worldSize !== undefined && tp * cp * pp * dp !== shape.worldSize) {
    problems.push(cp === 1 ? `tp·pp·dp = ${tp}·${pp}·${dp} = ${tp * pp * dp} but the job has ${shape.worldSize} processes (launch with --nproc-per-node ${tp * pp * dp})`
      : `tp·cp·pp·dp = ${tp}·${cp}·${pp}·${dp} = ${tp * cp * pp * dp} but the job has ${shape.worldSize} processes (launch with --nproc-per-node ${tp * cp * pp * dp})`);
  }
  if (cpMode !== 'ring' && cpMode !== 'ulysses') problems.push(`--cp-mode must be ring or ulysses, got ${cpMode}`);
  else if (cp > 1) problems.push(...contextParallelProblems(cp, cpMode, tp, layout.sequenceParallel, shape));
  problems.push(...scheduleProblems(layout, nLayer));
  if (zero > 0 && dp * cp === 1) problems.push(`--zero ${zero} shards over the data-parallel ranks, but dp = 1`);
  if (layout.offload && zero === 0) problems.push('--offload moves ZeRO shards to host memory, so it needs --zero 1, 2 or 3');
  if (ep > 1) {
    if (dp % ep !== 0) problems.push(`--ep ${ep} must divide the data-parallel size dp = ${dp} (expert-parallel groups are carved out of the data-parallel ranks)`);
    if (!moe) problems.push(`--ep ${ep} splits MoE experts over ranks, but the model has no MoE layers (set moe in the model config)`);
    else if (shape.moeExperts! % ep !== 0) problems.push(`--ep ${ep} must divide the model's ${shape.moeExperts} experts`);
  }
  // The zero-bubble schedules hold the dense ZeRO 2/3 reductions back until each W; the experts' own
  // ZeRO (expert parallelism) does not do that yet.
  if ((schedule === 'zb-h1' || schedule === 'zb-v') && ep > 1 && zero >= 2) problems.push(`--schedule ${schedule} with --ep ${ep} and --zero ${zero} is not supported yet (the experts' ZeRO ${zero} would reduce before each W): use --zero 0 or 1 with expert parallelism`);
  return problems;
}

/** The pipeline schedule's rules: a known schedule, and the stages, chunks and micro-batches it needs. */
function scheduleProblems(layout: LayoutRequest, nLayer: number | undefined): string[] {
  const problems: string[] = [];
  const { pp, microBatches: m } = layout, schedule: string = layout.schedule;
  if (!(SCHEDULE_KINDS as readonly string[]).includes(schedule)) {
    problems.push(`--schedule must be ${SCHEDULE_KINDS.join(', ')}, got ${schedule}`);
    return problems;
  }
  if (schedule === 'zb-v') {
    // The V: always 2 chunks per rank.
    const v = layout.virtualStages ?? 2;
    if (v !== 2) problems.push(`--schedule zb-v holds exactly 2 model chunks per rank (a V), so --virtual-stages must be 2 or left out, got ${v}`);
    if (pp < 2) problems.push('--schedule zb-v needs --pp >= 2');
    else if (nLayer !== undefined && 2 * pp > nLayer) problems.push(`--schedule zb-v cuts the model into 2·pp = ${2 * pp} chunks, more than the model's ${nLayer} layers`);
    return problems;
  }
  const v = layout.virtualStages ?? 1;
  if (schedule === 'interleaved') {
    if (v < 2) problems.push('--schedule interleaved needs --virtual-stages >= 2 (model chunks per pipeline rank; with 1 it is 1f1b)');
    if (pp < 2) problems.push('--schedule interleaved needs --pp >= 2');
    else if (m % pp !== 0) problems.push(`--schedule interleaved needs --micro-batches to be a multiple of --pp (as Megatron-LM requires): ${m} micro-batches over ${pp} stages`);
    if (v > 1 && nLayer !== undefined && pp * v > nLayer) problems.push(`--pp ${pp} × --virtual-stages ${v} = ${pp * v} model chunks, more than the model's ${nLayer} layers`);
  } else if (v > 1) problems.push(`--virtual-stages ${v} needs --schedule interleaved, not ${schedule}`);
  return problems;
}

/**
 * What context parallelism over cp ranks needs of the model: a sequence split into 2·cp chunks
 * (ring) or cp chunks (Ulysses), each rank's seq/cp tokens divisible by tp under sequence
 * parallelism; for Ulysses, each tensor-parallel rank's heads divisible by cp; no sliding window (the
 * ring's blocks assume plain causal attention), no dropout (its masks are drawn per contiguous chunk
 * of the sequence) and no MoE layers.
 */
function contextParallelProblems(cp: number, mode: string, tp: number, sequenceParallel: boolean, shape: LayoutShape): string[] {
  const problems: string[] = [];
  const parts = mode === 'ulysses' ? cp : 2 * cp, seq = shape.seqLen;
  if (seq !== undefined && seq % parts !== 0) {
    problems.push(mode === 'ulysses' ? `--cp ${cp} --cp-mode ulysses: the sequence length ${seq} is not a multiple of cp = ${cp}`
      : `--cp ${cp}: ring attention splits the sequence into 2·cp = ${parts} chunks, but the sequence length ${seq} is not a multiple of ${parts}`);
  } else if (seq !== undefined && sequenceParallel && (seq / cp) % tp !== 0) problems.push(`--cp ${cp} --sp: each context-parallel rank's ${seq / cp} tokens are not a multiple of --tp ${tp}`);
  if (mode === 'ulysses' && shape.nHead !== undefined && (shape.nHead / tp) % cp !== 0) {
    problems.push(`--cp ${cp} --cp-mode ulysses: each tensor-parallel rank's ${shape.nHead / tp} heads are not divisible by cp = ${cp} (use --cp-mode ring)`);
  }
  if (shape.window) problems.push(`--cp ${cp}: sliding-window attention (window ${shape.window}) is not supported under context parallelism`);
  if (shape.dropout) problems.push(`--cp ${cp}: dropout ${shape.dropout} is not supported under context parallelism (train with dropout 0)`);
  if (shape.moeExperts !== undefined) problems.push(`--cp ${cp} with MoE layers is not supported yet (router counts, aux losses and expert gradients would need the data × context-parallel group)`);
  return problems;
}

/** The rows [start, start + count) of a global batch that data-parallel rank `dpRank` of `dpSize` trains on. */
export function batchSlice(globalBatch: number, dpRank: number, dpSize: number): {
  /** First row. */
  start: number;
  /** Number of rows (globalBatch / dpSize). */
  count: number;
} {
  if (!Number.isInteger(globalBatch) || globalBatch % dpSize !== 0) throw new ArgumentError(`batchSlice: the batch of ${globalBatch} does not split over ${dpSize} data-parallel ranks`);
  if (!Number.isInteger(dpRank) || dpRank < 0 || dpRank >= dpSize) throw new ArgumentError(`batchSlice: dpRank ${dpRank} is outside [0, ${dpSize})`);
  const count = globalBatch / dpSize;
  return { start: dpRank * count, count };
}

/** Short text of a layout for logs: `tp=2 sp pp=2 dp=1 zero=0 micro-batches=4 (1f1b)` (`cp=2 ring` after tp under context parallelism). */
export function describeLayout(l: TrainingLayout): string {
  return `tp=${l.tp}${l.sequenceParallel ? ' sp' : ''}${(l.cp ?? 1) > 1 ? ` cp=${l.cp} ${l.cpMode}` : ''} pp=${l.pp} dp=${l.dp}${(l.ep ?? 1) > 1 ? ` ep=${l.ep}` : ''} zero=${l.zero}${l.offload ? ' offload' : ''} micro-batches=${l.microBatches}${l.pp > 1 ? ` (${l.schedule}${l.virtualStages > 1 ? `, ${l.virtualStages} virtual stages` : ''})` : ''}`;
}

/** A joined training job: its layout, this rank and the mesh. */
export interface ParallelTraining {
  /** The checked layout. */
  layout: TrainingLayout;
  /** The world rank (0 without a launcher). */
  rank: number;
  /** The mesh, or null for a single process (no communication at all). */
  mesh: ParallelState | null;
}

/**
 * Checks the layout against the launch environment, then (for more than one process) joins the
 * job, checks that every rank resolved the same layout for the same model and batch, and builds the
 * mesh. A rank whose flags are rejected, or that disagrees with the others, makes every rank throw
 * an ArgumentError before any training communication (with more than one process, after joining
 * the job: a caller that catches it calls nt.distributed.destroy() before returning). With
 * `options.world` the mesh is built over that world (groups the caller made) instead of joining the job.
 */
export async function initParallelTraining(flags: LayoutFlags, model: LayoutModelShape, globalBatch: number, options: { world?: WorldGroup } = {}): Promise<ParallelTraining> {
  const env = readLaunchEnv();
  let layout: TrainingLayout | null = null, rejected: unknown = null;
  try { layout = resolveTrainingLayout(flags, model, env.worldSize, globalBatch); } catch (e) { rejected = e; }
  if (env.worldSize === 1) {
    if (rejected) throw rejected;
    return { layout: layout!, rank: 0, mesh: null };
  }
  if (!options.world) await dist.init();
  const world = options.world ?? dist.world();
  const { nLayer, nHead, nEmbd, vocabSize } = model;
  const mine = layout ? `${describeLayout(layout)}; model layers=${nLayer} heads=${nHead} width=${nEmbd} vocab=${vocabSize}; batch ${globalBatch}` : 'rejected';
  // The runtime stays up: the caller reports the error and leaves (nt.distributed.destroy(), or exit).
  await agreeAll(world, rejected as Error | null, {
    failedElsewhere: (ranks) => new ArgumentError(`training layout: layout flags rejected on ${ranks} (see the error there); every rank stops`),
    settings: mine,
    mismatch: () => new ArgumentError(`training layout: the ranks were started with different settings (this rank: ${mine})`),
  });
  const mesh = await initializeParallel({ tp: layout!.tp, pp: layout!.pp, dp: layout!.dp, ...(layout!.cp ? { cp: layout!.cp } : {}), ...(layout!.ep ? { ep: layout!.ep } : {}) }, options.world ? { world: options.world } : {});
  return { layout: layout!, rank: env.rank, mesh };
}
