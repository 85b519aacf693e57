// Candidate layouts for a model on N devices: every TP × CP (ring, Ulysses) × PP × DP split (× EP for MoE models), ZeRO stage, offload,
// recomputation, sequence parallelism and micro-batch size, each with its per-rank memory, whether it
// fits, its predicted step time and the `nodetron launch` command that runs it; ranked.
import { join, relative, sep } from 'node:path';
import { ArgumentError } from '../errors.js';
import { layoutProblems, type LayoutShape } from '../parallel/layout.js';
import { packageRoot } from '../native.js';
import { estimateMemory, type Bf16GemmPath, type MemoryEstimate, type PlanDType, type PlanLayout, type Recompute } from './memory.js';
import type { PlanModel } from './models.js';
import { predictStepTime, type PlanDevice, type StepTime } from './time.js';

/** Options of {@link planLayouts}. */
export interface PlanOptions {
  /** Number of devices. */
  gpus: number;
  /** Number of nodes (default 1); the devices split evenly over them. */
  nodes?: number;
  /** Bytes of memory per device. */
  gpuMemory: number;
  /** Sequence length. */
  seq: number;
  /** Sequences per step over all replicas. */
  globalBatch: number;
  /** Fix the micro-batch size (default: try 1, 2, 4, 8). */
  microBatchSize?: number;
  /** Training precision. */
  dtype: PlanDType;
  /** The device's compute, links and memory. */
  device: PlanDevice;
  /** On a GPU: factor on the memory total for allocator fragmentation and workspaces (default 1.1). */
  overhead?: number;
  /** Whose bf16 training the memory follows (default 'megatron', the published recipe; 'nodetron': nodetron's own, see MemoryOptions.model). */
  memoryModel?: 'nodetron' | 'megatron';
  /** How bf16 GEMMs run on the cpu device for nodetron's model (default: what this machine's addon runs; see MemoryOptions.bf16Path). */
  bf16Path?: Bf16GemmPath;
}

/** One candidate: its layout, memory, time and command, or why it was skipped. */
export interface PlanCandidate {
  /** The layout. */
  layout: PlanLayout;
  /** Sequences per micro-batch on one data-parallel replica. */
  microBatchSize: number;
  /** Set when the layout cannot run this model; nothing else but the layout is then meaningful. */
  skipped?: string;
  /** Per-rank memory at the peak (absent when skipped). */
  memory?: MemoryEstimate;
  /** Whether the memory total fits gpuMemory (absent when skipped). */
  fits?: boolean;
  /** Predicted step time (absent when skipped). */
  time?: StepTime;
  /** The `nodetron launch` command that trains this layout with the shipped example (absent when skipped, or when the example cannot train this model: see commandNote). */
  command?: string;
  /** Why there is no command for a layout that was not skipped. */
  commandNote?: string;
}

const divisors = (n: number) => Array.from({ length: n }, (_, i) => i + 1).filter((d) => n % d === 0);

/** The facts nodetron's layout rules ({@link layoutProblems}) read of a plan model, sequence and batch. */
export function planShape(m: PlanModel, seq: number, globalBatch: number, microBatchSize: number, gpus?: number): LayoutShape {
  return { nLayer: m.nLayer, nHead: m.nHead, nKvHead: m.nKvHead ?? m.nHead, nEmbd: m.nEmbd, ffn: m.ffn, vocabSize: m.vocabSize, seqLen: seq,
    globalBatch, microBatchSize, ...(m.moe ? { moeExperts: m.moe.experts } : {}), ...(gpus !== undefined ? { worldSize: gpus } : {}) };
}

/**
 * Why a layout cannot run the model (heads, width, vocabulary, layers, batch, schedule, context and
 * expert parallelism), or null: the first of nodetron's own refusals (layoutProblems, the rules the
 * trainer and the command-line flags check).
 */
export function layoutProblem(m: PlanModel, l: PlanLayout, seq: number, globalBatch: number, b: number): string | null {
  return layoutProblems(planShape(m, seq, globalBatch, b), l)[0] ?? null;
}

/** The shipped example that trains the plan's models (GPT-2 or Llama blocks, MoE in GPT blocks), as the package installs it. */
export const EXAMPLE_SCRIPT = join(packageRoot, 'examples', 'gpt', 'train.ts');

/**
 * The example script as a command names it from `cwd`: `examples/gpt/train.ts` in the repository,
 * `node_modules/nodetron/examples/gpt/train.ts` in a project that installed the package.
 */
export function exampleScriptPath(cwd = process.cwd()): string {
  const rel = relative(cwd, EXAMPLE_SCRIPT);
  return rel.startsWith('..') ? EXAMPLE_SCRIPT : rel.split(sep).join('/');
}

/** Why the shipped example cannot train a model of this shape, or null. */
export function exampleProblem(m: PlanModel): string | null {
  if (m.moe && m.moe.sharedFfn % m.moe.ffn) return `the shipped example's shared experts are whole experts of width ${m.moe.ffn}, not a shared width of ${m.moe.sharedFfn}`;
  return null;
}

/**
 * The `nodetron launch` command that trains a layout with the shipped example (examples/gpt/train.ts:
 * GPT-2 blocks, Llama blocks with --model llama, MoE layers with --moe-experts: in GPT blocks, or in
 * Llama blocks as a Mixtral, or a Qwen2-MoE whose gated shared expert is --moe-shared experts wide). The
 * script is named as it lies from `o.cwd` (default: the working directory), so the command runs as
 * printed in the repository and, through npx, in a project that installed the package.
 */
export function launchCommand(m: PlanModel, l: PlanLayout, o: { seq: number; globalBatch: number; nodes: number; gpusPerNode: number; cpu: boolean; cwd?: string }): string {
  const script = exampleScriptPath(o.cwd);
  // Installed in a project (under node_modules): its bin runs through npx.
  const installed = EXAMPLE_SCRIPT.split(sep).includes('node_modules');
  const parts = [`${installed ? 'npx ' : ''}nodetron launch --nproc-per-node ${o.gpusPerNode}`];
  if (o.nodes > 1) parts.push(`--nnodes ${o.nodes} --node-rank R --master-addr HOST`);
  parts.push(`${script} --layers ${m.nLayer} --heads ${m.nHead} --width ${m.nEmbd} --ctx ${o.seq} --batch ${o.globalBatch}`);
  // A gated (Llama-shaped) model trains Llama blocks: --model llama with its key/value heads and MLP width.
  if (m.gated) parts.push(`--model llama --kv-heads ${m.nKvHead ?? m.nHead} --ffn ${m.ffn}`);
  if (m.moe) {
    const e = m.moe;
    parts.push(`--moe-experts ${e.experts} --moe-top-k ${e.topK} --moe-hidden ${e.ffn}`);
    if (e.sharedFfn > 0) parts.push(`--moe-shared ${Math.round(e.sharedFfn / e.ffn)}`);
    if (e.every > 1) parts.push(`--moe-every ${e.every}`);
  }
  parts.push(`--tp ${l.tp} --pp ${l.pp} --dp ${l.dp} --zero ${l.zero}`);
  if ((l.ep ?? 1) > 1) parts.push(`--ep ${l.ep}`);
  if (l.offload) parts.push('--offload');
  if (l.sequenceParallel) parts.push('--sp');
  if ((l.cp ?? 1) > 1) parts.push(`--cp ${l.cp} --cp-mode ${l.cpMode ?? 'ring'}`);
  if (l.recompute === 'full') parts.push('--recompute');
  if (l.microBatches > 1) parts.push(`--micro-batches ${l.microBatches}`);
  if (l.pp > 1) parts.push(`--schedule ${l.schedule}`);
  if ((l.virtualStages ?? 1) > 1 && l.schedule !== 'zb-v') parts.push(`--virtual-stages ${l.virtualStages}`);
  if (!o.cpu) parts.push('--device cuda');
  return parts.join(' ');
}

/**
 * Every candidate layout, ranked: those that fit first, then by predicted step time (skipped ones
 * last). Bad input (devices not a multiple of nodes, non-positive sizes) is an ArgumentError.
 */
export function planLayouts(m: PlanModel, o: PlanOptions): PlanCandidate[] {
  const nodes = o.nodes ?? 1;
  const bad: string[] = [];
  if (!Number.isInteger(o.gpus) || o.gpus < 1) bad.push(`--gpus must be an integer >= 1, got ${o.gpus}`);
  if (!Number.isInteger(nodes) || nodes < 1) bad.push(`--nodes must be an integer >= 1, got ${nodes}`);
  else if (o.gpus % nodes) bad.push(`--gpus ${o.gpus} does not divide over --nodes ${nodes}`);
  if (!(o.gpuMemory > 0)) bad.push('--gpu-memory must be > 0');
  if (!Number.isInteger(o.seq) || o.seq < 1) bad.push(`--seq must be an integer >= 1, got ${o.seq}`);
  if (!Number.isInteger(o.globalBatch) || o.globalBatch < 1) bad.push(`--batch must be an integer >= 1, got ${o.globalBatch}`);
  if (o.microBatchSize !== undefined && (!Number.isInteger(o.microBatchSize) || o.microBatchSize < 1)) bad.push(`--micro-batch-size must be an integer >= 1, got ${o.microBatchSize}`);
  if (bad.length) throw new ArgumentError(`plan: ${bad.join('; ')}`);
  const gpusPerNode = o.gpus / nodes;
  const cpu = o.device.name === 'cpu';
  const sizes = o.microBatchSize ? [o.microBatchSize] : [1, 2, 4, 8];
  // nodetron recomputes whole blocks; selective recomputation is Megatron's (the published model only).
  const recomputes: Recompute[] = o.dtype === 'bf16' && (o.memoryModel ?? 'megatron') === 'megatron' ? ['none', 'selective', 'full'] : ['none', 'full'];
  const out: PlanCandidate[] = [];
  // Context parallelism (cp > 1, ring or Ulysses) splits each sequence; like tp it stays inside a node.
  const cps = (tp: number, pp: number) => divisors(o.gpus / (tp * pp)).filter((c) => c === 1 || tp * c <= gpusPerNode);
  // Expert parallelism (MoE models): ep divides dp and the experts.
  const eps = (dp: number) => (m.moe ? divisors(dp).filter((e) => m.moe!.experts % e === 0) : [1]);
  const noCommand = exampleProblem(m);
  for (const tp of divisors(gpusPerNode)) for (const pp of divisors(o.gpus / tp)) for (const cp of cps(tp, pp)) for (const cpMode of cp > 1 ? ['ring', 'ulysses'] as const : [null]) {
    const dp = o.gpus / (tp * pp * cp);
    for (const ep of eps(dp)) for (const b of sizes) for (const zero of [0, 1, 2, 3] as const) for (const offload of zero > 0 ? [false, true] : [false]) {
      // (The rules refuse ZeRO without data-parallel ranks; such layouts are not even listed as skipped.)
      if (zero > 0 && dp * cp === 1) continue;
      for (const recompute of recomputes) for (const sequenceParallel of tp > 1 ? [false, true] : [false]) for (const schedule of pp > 1 ? ['1f1b', 'gpipe', 'interleaved', 'zb-h1', 'zb-v'] as const : ['1f1b'] as const) {
        const microBatches = o.globalBatch % (dp * b) === 0 ? o.globalBatch / (dp * b) : 1;
        // Interleaving with 2 chunks per rank (Megatron's usual choice when the layers allow it).
        const layout: PlanLayout = { dp, tp, pp, zero, offload, recompute, sequenceParallel, microBatches, schedule,
          ...(schedule === 'interleaved' || schedule === 'zb-v' ? { virtualStages: 2 } : {}), ...(cpMode ? { cp, cpMode } : {}), ...(ep > 1 ? { ep } : {}) };
        const problem = layoutProblems(planShape(m, o.seq, o.globalBatch, b, o.gpus), layout)[0];
        if (problem) { out.push({ layout, microBatchSize: b, skipped: problem }); continue; }
        const memory = estimateMemory(m, layout, { seq: o.seq, microBatchSize: b, dtype: o.dtype, overhead: o.overhead, backend: cpu ? 'cpu' : 'cuda', ...(o.memoryModel ? { model: o.memoryModel } : {}), ...(o.bf16Path ? { bf16Path: o.bf16Path } : {}) });
        const time = predictStepTime(m, layout, o.device, { seq: o.seq, microBatchSize: b, dtype: o.dtype, gpusPerNode });
        out.push({ layout, microBatchSize: b, memory, fits: memory.total <= o.gpuMemory, time,
          ...(noCommand ? { commandNote: noCommand } : { command: launchCommand(m, layout, { seq: o.seq, globalBatch: o.globalBatch, nodes, gpusPerNode, cpu }) }) });
      }
    }
  }
  // Skipped layouts repeat per micro-batch size and ZeRO stage: keep one of each reason per mesh.
  const seen = new Set<string>();
  const kept = out.filter((c) => {
    if (!c.skipped) return true;
    const key = `${c.layout.tp}/${c.layout.cp ?? 1}/${c.layout.pp}/${c.layout.dp}/${c.layout.ep ?? 1}/${c.microBatchSize}/${c.skipped}`;
    if (seen.has(key)) return false;
    seen.add(key); return true;
  });
  const rank = (c: PlanCandidate) => (c.skipped ? 2 : c.fits ? 0 : 1);
  return kept.sort((a, b) => rank(a) - rank(b) || (a.time?.total ?? 0) - (b.time?.total ?? 0) || (a.memory?.total ?? 0) - (b.memory?.total ?? 0));
}
