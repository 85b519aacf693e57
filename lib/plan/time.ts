// Predicted step time of a layout: GEMM throughput (named GPUs' dense peak × an achievable
// fraction, or a measured figure) and bus bandwidth for the tensor-, pipeline- and data-parallel traffic.
import { readFileSync } from 'node:fs';
import { ArgumentError } from '../errors.js';
import type { PlanLayout, PlanDType } from './memory.js';
import { moeSlotParameters } from '../nn/counts.js';
import { decoderShape, moeLayerCount, stageExpertParams, stageLayers, stageParams, type PlanModel } from './models.js';
import { checkSchedule, schedulePlacement, scheduleTables, simulateSchedule } from '../parallel/pipeline/schedules.js';

/** A device's compute and links: FLOP/s achieved in GEMMs, bytes/s of bus bandwidth inside and between nodes. */
export interface PlanDevice {
  /** The device's name (the --gpu value). */
  name: string;
  /** Dense peak FLOP/s per dtype. */
  peakFlops: Record<PlanDType, number>;
  /** Fraction of the peak a training step's GEMMs achieve (model FLOPs utilization). */
  efficiency: number;
  /** Bus bandwidth (nccl-tests' busbw, bytes/s) of a collective inside one node. */
  intraNodeBusBw: number;
  /** Bus bandwidth per GPU between nodes. */
  interNodeBusBw: number;
  /** Memory per device in bytes (the default --gpu-memory). */
  memoryBytes: number;
}

const G = 1e9, T = 1e12, GiB = 2 ** 30;
/**
 * Vendor datasheet peaks (dense, no sparsity): H100 SXM 989 TFLOP/s bf16 and 67 fp32, NVLink 4 900 GB/s
 * (busbw ~360 GB/s achieved), 400 Gb/s InfiniBand per GPU; A100 SXM 312 / 19.5, NVLink 3 600 GB/s
 * (~230 GB/s busbw), 200 Gb/s per GPU. The 0.45 efficiency is a typical large-model MFU, an assumption.
 */
export const PLAN_DEVICES: Readonly<Record<string, PlanDevice>> = {
  h100: { name: 'h100', peakFlops: { bf16: 989 * T, f32: 67 * T }, efficiency: 0.45, intraNodeBusBw: 360 * G, interNodeBusBw: 45 * G, memoryBytes: 80 * GiB },
  h200: { name: 'h200', peakFlops: { bf16: 989 * T, f32: 67 * T }, efficiency: 0.45, intraNodeBusBw: 360 * G, interNodeBusBw: 45 * G, memoryBytes: 141 * GiB },
  a100: { name: 'a100', peakFlops: { bf16: 312 * T, f32: 19.5 * T }, efficiency: 0.45, intraNodeBusBw: 230 * G, interNodeBusBw: 22 * G, memoryBytes: 80 * GiB },
  'a100-40g': { name: 'a100-40g', peakFlops: { bf16: 312 * T, f32: 19.5 * T }, efficiency: 0.45, intraNodeBusBw: 230 * G, interNodeBusBw: 22 * G, memoryBytes: 40 * GiB },
  l40s: { name: 'l40s', peakFlops: { bf16: 362 * T, f32: 91.6 * T }, efficiency: 0.4, intraNodeBusBw: 20 * G, interNodeBusBw: 10 * G, memoryBytes: 48 * GiB },
};

/** A named device (an unknown name is an ArgumentError listing the choices). */
export function resolveDevice(name: string): PlanDevice {
  const d = typeof name === 'string' && Object.hasOwn(PLAN_DEVICES, name) ? PLAN_DEVICES[name] : undefined;
  if (!d) throw new ArgumentError(`plan: unknown --gpu ${JSON.stringify(name)} (${Object.keys(PLAN_DEVICES).join(', ')}, cpu)`);
  return { ...d, peakFlops: { ...d.peakFlops } };
}

/** A JSON object from a file a flag names; ArgumentError when it cannot be read or is not an object. */
function readJson(path: string, flag: string): Record<string, unknown> {
  let j: unknown;
  try { j = JSON.parse(readFileSync(path, 'utf8')); } catch (e) { throw new ArgumentError(`plan: cannot read ${flag} ${path}: ${(e as Error).message}`); }
  if (j === null || typeof j !== 'object' || Array.isArray(j)) throw new ArgumentError(`plan: ${flag} ${path} is not a JSON object`);
  return j as Record<string, unknown>;
}

/** The highest GFLOP/s in a `nodetron bench gemm --json` file (any row field whose name mentions gflops). */
export function gemmFlopsFromJson(path: string): number {
  const j = readJson(path, '--gemm-json') as { rows?: Record<string, unknown>[] };
  if (!Array.isArray(j.rows)) throw new ArgumentError(`plan: ${path} has no rows (expected \`nodetron bench gemm --json\` output)`);
  let best = 0;
  for (const r of j.rows ?? []) for (const [k, v] of Object.entries(r)) if (/gflops/i.test(k) && typeof v === 'number' && v > best) best = v;
  if (!(best > 0)) throw new ArgumentError(`plan: ${path} holds no GFLOP/s rows (expected \`nodetron bench gemm --json\` output)`);
  return best * G;
}

/** The average bus bandwidth (GB/s → bytes/s) of a `nodetron bench comm --json` file. */
export function busBwFromJson(path: string): number {
  const j = readJson(path, '--comm-json') as { avgBusbw?: number };
  if (!(typeof j.avgBusbw === 'number' && j.avgBusbw > 0)) throw new ArgumentError(`plan: ${path} has no avgBusbw (expected \`nodetron bench comm --json\` output)`);
  return j.avgBusbw * G;
}

/** Options of {@link predictStepTime}. */
export interface TimeOptions {
  /** Sequence length. */
  seq: number;
  /** Sequences per micro-batch on one data-parallel replica. */
  microBatchSize: number;
  /** Training precision. */
  dtype: PlanDType;
  /** Devices per node (groups spanning more use the inter-node bandwidth). */
  gpusPerNode: number;
}

/** The parts of a predicted step time, in seconds. */
export interface StepTime {
  /** GEMM time: the step's FLOPs over every device's achieved FLOP/s. */
  compute: number;
  /** Pipeline bubble: compute × (pp − 1) / micro-batches. */
  bubble: number;
  /** Tensor-parallel all-reduces. */
  tensorParallel: number;
  /** Pipeline activation sends. */
  pipeline: number;
  /** Context-parallel attention traffic (ring send/recv or Ulysses all-to-all; 0 without cp). */
  contextParallel?: number;
  /** Expert parallelism's all-to-alls (tokens to their experts' ranks and back, forward and backward; absent without ep). */
  expertParallel?: number;
  /** Data-parallel gradient traffic not hidden behind backward. */
  dataParallel: number;
  /** Host transfers and the host optimizer step under offload. */
  offload: number;
  /** The sum of the above. */
  total: number;
  /** Training FLOPs of the step (not seconds). */
  flops: number;
}

/**
 * Narayanan et al. 2021 (eq. 3): training FLOPs of one step, 72·B·s·L·h²·(1 + s/(6h) + V/(12hL)) with
 * full recomputation's extra forward (96 instead of 72 on the layer part); the MLP term scaled by ffn/(4h)
 * (MoE layers: by the parameters a token goes through, its topK experts, the shared experts and the router, over a dense MLP's 8h²).
 */
export function stepFlops(m: PlanModel, globalBatch: number, seq: number, recompute: 'none' | 'selective' | 'full'): number {
  const h = m.nEmbd, L = m.nLayer;
  const dense = (m.ffn / (4 * h)) * (m.gated ? 1.5 : 1);
  const share = moeLayerCount(m) / L;
  // An MoE layer's MLP slot as a dense one's multiple: the parameters a token goes through over 8h².
  const moeScale = m.moe ? moeSlotParameters(decoderShape(m), 1, true) / (8 * h * h) : 0;
  const mlpScale = (1 - share) * dense + share * moeScale;
  const layer = 24 * globalBatch * seq * L * h * h * ((1 + 2 * mlpScale) / 3 + seq / (6 * h));
  const head = 6 * globalBatch * seq * h * m.vocabSize;
  return layer * (recompute === 'full' ? 4 : 3) + head;
}

/**
 * The pipeline bubble of a layout's schedule as a fraction of the step: its table (the one the
 * trainer runs) simulated with equal forward, input-gradient and weight-gradient times and no
 * communication time — (p − 1)/(m + p − 1) for GPipe and 1F1B, (p − 1)/(v·m + p − 1) for Megatron's
 * interleaving, (p − 1)/(3m + p − 1) for ZB-H1 when m ≥ p; 0 without a pipeline.
 */
export function predictBubble(l: PlanLayout): number {
  if (l.pp === 1) return 0;
  const v = l.virtualStages ?? 1;
  checkSchedule(l.schedule, { stages: l.pp, microBatches: l.microBatches, chunks: v }, 'predictBubble');
  const key = `${l.schedule}/${l.pp}/${l.microBatches}/${v}`;
  let bubble = bubbleCache.get(key);
  if (bubble === undefined) {
    bubble = simulateSchedule(scheduleTables(l.schedule, { stages: l.pp, microBatches: l.microBatches, chunks: v }), v, { F: 1, B: 1, W: 1 }, schedulePlacement(l.schedule)).bubble;
    if (bubbleCache.size > 4096) bubbleCache.clear();
    bubbleCache.set(key, bubble);
  }
  return bubble;
}

// The planner asks for the same few schedules for many candidates.
const bubbleCache = new Map<string, number>();

/** Predicted time of one step: compute / (devices · FLOP/s) with the pipeline bubble, plus the communication not hidden behind it. */
export function predictStepTime(m: PlanModel, l: PlanLayout, dev: PlanDevice, o: TimeOptions): StepTime {
  const cp = l.cp ?? 1;
  const world = l.dp * l.tp * l.pp * cp;
  const globalBatch = o.microBatchSize * l.microBatches * l.dp;
  const flops = stepFlops(m, globalBatch, o.seq, l.recompute);
  const compute = flops / (world * dev.peakFlops[o.dtype] * dev.efficiency);
  // The schedule's idle time relative to the work: (p − 1)/m for GPipe and 1F1B, less when interleaved or zero-bubble.
  const idle = predictBubble(l);
  const bubble = compute * (idle / (1 - idle));
  const w = o.dtype === 'f32' ? 4 : 2;
  // Ranks are placed tp fastest, then pp, then dp (nodetron's mesh order): a group stays in one node when its span fits.
  const bw = (span: number) => (span <= o.gpusPerNode ? dev.intraNodeBusBw : dev.interNodeBusBw);
  const act = o.seq * o.microBatchSize * m.nEmbd * w;
  const layers = stageLayers(m.nLayer, l.pp)[0]!;
  // Megatron TP: 2 all-reduces in forward and 2 in backward per layer (+2 when recomputing); ring cost 2(t−1)/t per byte.
  const tpCalls = l.recompute === 'full' ? 6 : 4;
  // Under context parallelism a rank's tensor-parallel and pipeline traffic covers its seq/cp tokens.
  const tensorParallel = l.tp > 1 ? (l.microBatches * layers * tpCalls * (act / cp) * (2 * (l.tp - 1)) / l.tp) / bw(l.tp) : 0;
  const pipeline = l.pp > 1 ? (2 * l.microBatches * (act / cp)) / bw(l.tp * cp * l.pp) : 0;
  // Gradients all-reduced (or reduce-scattered + all-gathered) over dp; ZeRO 3 gathers the weights once more in backward.
  const ep = l.ep ?? 1;
  // MoE models: the routed experts this rank holds (1/ep of them) average over their dp/ep copies only,
  // the rest over dp; a dense model's layers are 12h² each.
  const expertBytes = m.moe ? stageExpertParams(m, l.pp, 0, ep) * w : 0;
  const gradBytes = m.moe ? (stageParams(m, l.tp, l.pp, 0, ep).total * w - expertBytes)
    : ((m.nLayer * 12 * m.nEmbd * m.nEmbd) / (l.tp * l.pp) + (m.vocabSize * m.nEmbd) / l.tp) * w;
  const copies = l.dp / ep;
  const ring = (bytes: number, n: number) => (n > 1 ? (bytes * 2 * (n - 1)) / n : 0);
  const dpVolume = (ring(gradBytes, l.dp) + ring(expertBytes, copies)) * (l.zero === 3 ? 1.5 : 1);
  // Backward (two thirds of the compute) hides the bucketed data-parallel traffic; what exceeds it shows.
  // The last bucket's collective always shows (25 MiB).
  const dataParallel = l.dp > 1 ? Math.max(dpVolume / bw(world) - (2 / 3) * compute, (25 * 2 ** 20 * (l.zero === 3 ? 3 : 2)) / bw(world)) : 0;
  const contextParallel = contextParallelSeconds(l, act, layers, bw(l.tp * cp));
  // The ep ranks of an expert-parallel group are consecutive data-parallel ranks: they span tp · cp · pp · ep ranks.
  const expertParallel = expertParallelSeconds(m, l, act, layers, bw(l.tp * cp * l.pp * ep));
  // Offload: the gradient shard goes to the host and the updated weight shard comes back over PCIe
  // (~25 GB/s, PCIe 4/5 x16 achieved), and the host runs Adam over the shard (~2 GB/s of state per device, an assumption).
  const shard = gradBytes / l.dp + expertBytes / copies;
  const offload = l.offload ? (2 * shard) / 25e9 + (shard * (o.dtype === 'f32' ? 3 : 6)) / 2e9 : 0;
  const total = compute + bubble + tensorParallel + pipeline + dataParallel + offload + contextParallel + expertParallel;
  return { compute, bubble, tensorParallel, pipeline, ...(cp > 1 ? { contextParallel } : {}), ...(ep > 1 ? { expertParallel } : {}), dataParallel, offload, total, flops };
}

/**
 * Expert parallelism's all-to-alls per step, not overlapped (nodetron waits for each): every MoE
 * layer of a stage sends each micro-batch's routed rows (tokens · topK rows of width h, act · topK
 * bytes for `act` = one micro-batch's [s, b, h]) to the experts' ranks and takes the results back,
 * twice in forward and twice in backward (three times each way under full recomputation's extra
 * forward), each moving (ep − 1)/ep of its bytes with balanced routing. 0 without expert parallelism.
 */
export function expertParallelSeconds(m: PlanModel, l: PlanLayout, act: number, layers: number, bw: number): number {
  const ep = l.ep ?? 1;
  if (ep === 1 || !m.moe) return 0;
  const moeLayers = layers * (moeLayerCount(m) / m.nLayer);
  const exchanges = l.recompute === 'full' ? 6 : 4;
  return (l.microBatches * moeLayers * exchanges * ((act / (l.cp ?? 1)) * m.moe.topK) * ((ep - 1) / ep)) / bw;
}

/**
 * Context parallelism's attention traffic per step, not overlapped (nodetron waits for each ring step
 * and each all-to-all): `act` is one micro-batch's whole-sequence [s, b, h] bytes, so a rank's keys
 * and values are 2·act/(cp·tp). Ring, per layer: cp − 1 key/value shifts forward; in backward cp − 1
 * again and cp shifts of their gradients (each twice the block under full recomputation's extra
 * forward: + cp − 1). Ulysses, per layer: all-to-alls of q, k, v (3·act/(cp·tp)) and the output
 * (act/(cp·tp)) forward and the same backward, each moving (cp − 1)/cp of its bytes.
 */
export function contextParallelSeconds(l: PlanLayout, act: number, layers: number, bw: number): number {
  const cp = l.cp ?? 1;
  if (cp === 1) return 0;
  const kv = (2 * act) / (cp * l.tp);
  const perLayer = (l.cpMode ?? 'ring') === 'ring'
    ? kv * ((cp - 1) * (l.recompute === 'full' ? 2 : 1) + (cp - 1) + cp)
    : ((8 * act) / (cp * l.tp)) * ((cp - 1) / cp) * (l.recompute === 'full' ? 1.5 : 1);
  return (l.microBatches * layers * perLayer) / bw;
}
