// `nodetron plan`: ranked training layouts for a model on N devices (per-rank memory, fit, predicted
// step time, the launch command), and `--calibrate`: predicted against measured peak memory on this machine.
import { cpus } from 'node:os';
import { ArgumentError, UsageError } from '../errors.js';
import { printTable, writeJson, machineRecord } from '../cmdline/report.js';
import { expectPositionals, parseBytes, parseOptions } from '../cmdline/args.js';
import { matmul } from '../ops/index.js';
import { randn } from '../creation.js';
import { scope } from '../memory.js';
import { activeParams, expertParams, moeLayerCount, resolveModel, totalParams } from '../plan/models.js';
import { planLayouts, type PlanCandidate } from '../plan/planner.js';
import { busBwFromJson, gemmFlopsFromJson, resolveDevice, type PlanDevice } from '../plan/time.js';
import { calibrateLayout, checkCalibrationLayout, DEFAULT_CALIBRATION_LAYOUTS, CALIBRATION_SHAPE, parseLayoutSpec } from '../plan/calibrate.js';

/** The most ranks one `--calibrate` layout may start on this machine. */
const MAX_CALIBRATION_RANKS = 16;

const usage = `usage: nodetron plan --model gpt2|gpt2-medium|gpt2-large|gpt2-xl|7b|13b|70b|config.json --gpus N [options]
  --gpu-memory M       memory per device: 80G, 40GiB, 24000M (default: the --gpu's)
  --nodes K            nodes (default 1; --gpus is the total)
  --seq S              sequence length (default the model's)
  --batch B            global batch in sequences (default 8 per device)
  --micro-batch-size b fix the micro-batch size (default: try 1, 2, 4, 8)
  --dtype bf16|f32     bf16 autocast (default) or f32 (nodetron on CPU)
  --memory-model megatron|nodetron  whose bf16 memory: the published recipe (default) or nodetron's own
                       autocast, measured on its CPU backend (plan --calibrate --dtype bf16)
  --bf16-path native|widen  nodetron's model with --gpu cpu: bf16 GEMMs on the AVX512_BF16 kernel or
                       widened to f32 (the fallback); default what this machine runs (nodetron info)
  --gpu NAME           h100 (default), h200, a100, a100-40g, l40s or cpu (a quick GEMM probe here)
  --gemm-json F        GEMM FLOP/s from \`nodetron bench gemm --json\`;  --comm-json F  bus bandwidth from \`bench comm --json\`
  --top K              layouts printed (default 10);  --json F  write every candidate
  --calibrate [--layouts a;b] [--dtype f32|bf16]  run small layouts here (CPU; f32 by default, bf16 under
                       autocast, on the bf16 GEMM path this machine runs: NODETRON_BF16_GEMM=fallback
                       and NODETRON_CPU_ISA=avx2 take the widening one) and print predicted vs measured
                       peak per rank`;

/** Reads 80G, 80GB, 80GiB, 40000M, 1.5T (powers of 1024). */
export function parseMemory(text: string): number {
  let bytes: number;
  try { bytes = parseBytes(text, '--gpu-memory'); } catch { throw new ArgumentError(`plan: cannot read --gpu-memory ${JSON.stringify(text)} (e.g. 80G, 40GiB, 24000M)`); }
  if (!(bytes >= 2 ** 20) || bytes > 2 ** 50) throw new ArgumentError(`plan: --gpu-memory ${JSON.stringify(text)} is not a device's memory (1M to 1024T)`);
  return bytes;
}

const gib = (b: number) => (b / 2 ** 30).toFixed(2);
const mib = (b: number) => (b / 2 ** 20).toFixed(1);

/** GEMM FLOP/s of this machine: a few 512³ f32 matmuls. */
function probeCpuFlops(): number {
  return scope(() => {
    const n = 512, a = randn([n, n]), b = randn([n, n]);
    matmul(a, b).dispose();
    const t0 = performance.now();
    const reps = 8;
    for (let i = 0; i < reps; i++) matmul(a, b).dispose();
    return (2 * n ** 3 * reps) / ((performance.now() - t0) / 1000);
  });
}

function cpuDevice(o: Record<string, unknown>): PlanDevice {
  const flops = o['gemm-json'] ? gemmFlopsFromJson(o['gemm-json'] as string) : probeCpuFlops();
  // Shared-memory allreduce busbw measured on this project's 2-core machine (README: ~5 GB/s); --comm-json replaces it.
  const bus = o['comm-json'] ? busBwFromJson(o['comm-json'] as string) : 5e9;
  return { name: 'cpu', peakFlops: { bf16: flops, f32: flops }, efficiency: 1 / Math.max(1, cpus().length), intraNodeBusBw: bus, interNodeBusBw: 1e9, memoryBytes: 16 * 2 ** 30 };
}

async function calibrate(o: Record<string, unknown>): Promise<number> {
  const layouts = o.layouts ? String(o.layouts).split(';').map((l) => l.trim()).filter(Boolean) : DEFAULT_CALIBRATION_LAYOUTS;
  if (layouts.length === 0) throw new UsageError('--layouts needs at least one layout, e.g. "dp2;tp2,sp"');
  // Every layout is checked before the first one runs (each starts its ranks as processes on this
  // machine): one the calibration model cannot train is an error naming it and why, not a job whose
  // ranks all reject it.
  for (const l of layouts) {
    const p = parseLayoutSpec(l);
    const ranks = p.dp * p.tp * p.pp * (p.cp ?? 1);
    if (ranks > MAX_CALIBRATION_RANKS) throw new UsageError(`--layouts ${JSON.stringify(l)} needs ${ranks} ranks; calibration runs them as processes here, at most ${MAX_CALIBRATION_RANKS}`);
    checkCalibrationLayout(l);
  }
  const rows = [];
  const dtype = ((o.dtype as string | undefined) ?? 'f32') as 'bf16' | 'f32';
  for (const l of layouts) rows.push(await calibrateLayout(l, CALIBRATION_SHAPE, { dtype }));
  const bf16Path = rows[0]?.ranks[0]?.bf16Path;
  const precision = dtype === 'bf16' ? `bf16 autocast, ${bf16Path === 'widen' ? 'GEMMs widened to f32' : 'AVX512_BF16 GEMMs'}` : 'f32';
  console.log(`\ncalibration: GPT ${CALIBRATION_SHAPE.layers} layers, width ${CALIBRATION_SHAPE.width}, ${CALIBRATION_SHAPE.heads} heads, ctx ${CALIBRATION_SHAPE.ctx}, batch ${CALIBRATION_SHAPE.batch}, vocab ${CALIBRATION_SHAPE.vocab} (${precision}, cpu)`);
  printTable(['layout', 'rank', 'stage', 'predicted MiB', 'measured MiB', 'error'],
    rows.flatMap((r) => r.ranks.map((k) => [r.layout, k.rank, k.ppRank, mib(k.predicted), mib(k.peak), `${(100 * k.error).toFixed(1)}%`])));
  const worst = Math.max(...rows.map((r) => r.maxError));
  console.log(`largest error ${(100 * worst).toFixed(1)}% over ${rows.length} layouts`);
  writeJson(o.json as string | undefined, { bench: 'plan-calibration', machine: machineRecord(), shape: CALIBRATION_SHAPE, dtype, ...(dtype === 'bf16' ? { bf16Path } : {}), rows });
  return 0;
}

/** `nodetron plan ...`; returns the exit code (usage errors are thrown as UsageError). */
export async function main(argv: string[]): Promise<number> {
  // Counts have generous but finite bounds: a typo (--gpus 80000000) is an error, not an hours-long enumeration.
  const o = parseOptions(argv, {
    model: 'string', gpus: { kind: 'positive', max: 1 << 20 }, 'gpu-memory': 'string', nodes: { kind: 'positive', max: 1 << 16 }, seq: { kind: 'positive', max: 1 << 24 },
    batch: { kind: 'positive', max: 1 << 30 }, 'micro-batch-size': { kind: 'positive', max: 1 << 20 }, dtype: { kind: 'string', choices: ['bf16', 'f32'] }, gpu: 'string',
    'gemm-json': 'infile', 'comm-json': 'infile', top: 'positive', json: 'outfile', calibrate: 'boolean', layouts: 'string', help: 'boolean',
    'memory-model': { kind: 'string', choices: ['nodetron', 'megatron'] }, 'bf16-path': { kind: 'string', choices: ['native', 'widen'] },
  }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  expectPositionals(o, 'nothing', 0);
  if (o.calibrate) return calibrate(o);
  if (!o.model) throw new UsageError('give --model (gpt2, gpt2-medium, gpt2-large, gpt2-xl, 7b, 13b, 70b or a config.json)');
  if (o.gpus === undefined) throw new UsageError('give --gpus N, the total number of devices');
  if (o.nodes !== undefined && (o.gpus as number) % (o.nodes as number) !== 0) throw new UsageError(`--gpus ${o.gpus} must be a multiple of --nodes ${o.nodes}`);
  const model = resolveModel(o.model as string);
  const dtype = ((o.dtype as string | undefined) ?? 'bf16') as 'bf16' | 'f32';
  const gpuName = (o.gpu as string | undefined) ?? 'h100';
  const device = gpuName === 'cpu' ? cpuDevice(o) : resolveDevice(gpuName);
  if (gpuName !== 'cpu' && o['gemm-json']) device.peakFlops[dtype] = gemmFlopsFromJson(o['gemm-json'] as string), device.efficiency = 1;
  if (gpuName !== 'cpu' && o['comm-json']) device.intraNodeBusBw = busBwFromJson(o['comm-json'] as string);
  const gpus = o.gpus as number;
  const gpuMemory = o['gpu-memory'] ? parseMemory(o['gpu-memory'] as string) : device.memoryBytes;
  const seq = (o.seq as number | undefined) ?? model.seqLen;
  const globalBatch = (o.batch as number | undefined) ?? 8 * gpus;
  const memoryModel = o['memory-model'] as 'nodetron' | 'megatron' | undefined;
  if (memoryModel === 'megatron' && dtype === 'f32') throw new UsageError('--memory-model megatron is the published bf16 recipe: use it with --dtype bf16');
  const bf16Path = o['bf16-path'] as 'native' | 'widen' | undefined;
  if (bf16Path === 'widen' && gpuName !== 'cpu') throw new UsageError('--bf16-path widen is the cpu backend\'s fallback: use it with --gpu cpu');
  const candidates = planLayouts(model, { gpus, nodes: o.nodes as number | undefined, gpuMemory, seq, globalBatch, microBatchSize: o['micro-batch-size'] as number | undefined, dtype, device, ...(memoryModel ? { memoryModel } : {}), ...(bf16Path ? { bf16Path } : {}) });
  const ok = candidates.filter((c) => !c.skipped);
  const top = ok.slice(0, (o.top as number | undefined) ?? 10);
  console.log(`${model.name}: ${(totalParams(model) / 1e9).toFixed(2)}B parameters, ${model.nLayer} layers, width ${model.nEmbd}, ${model.nHead} heads, vocab ${model.vocabSize}; ` +
    `${gpus} × ${device.name} (${gib(gpuMemory)} GiB) on ${(o.nodes as number | undefined) ?? 1} node(s), ${dtype}, seq ${seq}, global batch ${globalBatch}`);
  if (model.moe) {
    const e = model.moe;
    console.log(`MoE: ${moeLayerCount(model)} layers of ${e.experts} experts (top-${e.topK}, expert width ${e.ffn}${e.sharedFfn ? `, shared width ${e.sharedFfn}` : ''}): ` +
      `${(expertParams(model) / 1e9).toFixed(2)}B parameters in routed experts, ${(activeParams(model) / 1e9).toFixed(2)}B active per token; ` +
      `layouts with epN split each layer's routed experts over N data-parallel ranks (ZeRO shards them over the dp/N ranks holding the same experts; the all-to-all buffers count in buffers)`);
  }
  console.log(`${ok.filter((c) => c.fits).length} of ${ok.length} layouts fit (${candidates.length - ok.length} skipped: see --json)\n`);
  const desc = (c: PlanCandidate) => `dp${c.layout.dp} tp${c.layout.tp}${c.layout.sequenceParallel ? '+sp' : ''}${(c.layout.cp ?? 1) > 1 ? ` cp${c.layout.cp}${c.layout.cpMode === 'ulysses' ? '+uly' : ''}` : ''} pp${c.layout.pp}${(c.layout.ep ?? 1) > 1 ? ` ep${c.layout.ep}` : ''} z${c.layout.zero}${c.layout.offload ? '+off' : ''} ${c.layout.recompute === 'none' ? '' : `rc:${c.layout.recompute} `}` +
    `b${c.microBatchSize}×${c.layout.microBatches}${c.layout.pp > 1 ? ` ${c.layout.schedule}` : ''}`;
  printTable(['#', 'layout', 'params', 'grads', 'optim', 'activ', 'logits', 'buffers', 'total GiB', 'fits', 'step s'],
    top.map((c, i) => { const m = c.memory!; return [i + 1, desc(c), gib(m.params), gib(m.grads), gib(m.optimizerState), gib(m.activations), gib(m.logits), gib(m.buffers + m.overhead), gib(m.total), c.fits ? 'yes' : 'NO', c.time!.total.toFixed(3)]; }));
  if (top[0]) console.log(top[0].command ? `\nbest: ${top[0].command}` : `\nno launch command: ${top[0].commandNote}`);
  writeJson(o.json as string | undefined, { command: 'plan', model, gpus, gpuMemory, dtype, device, seq, globalBatch, candidates });
  return 0;
}
