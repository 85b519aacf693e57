// The planner pinned to published formulas: the ZeRO paper's split, Korthikanti et al.'s activations,
// DeepSpeed's model-state estimates, Megatron's theoretical memory, the 7B figures; and the CLI's errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { main } from '../../lib/cli.js';

const GB = 1e9, GiB = 2 ** 30;
const base: plan.PlanLayout = { dp: 1, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };

describe('published formulas', () => {
  it('DeepSpeed zero2 as since 0.14.3 (t5-3b, 2851M params, 8 GPUs: 5.31 GB per GPU offloaded, 2Ψ + 18Ψ/N = 11.28 GB not, 127.48 GB per CPU)', () => {
    const off = plan.deepspeedZero2Estimate(2851e6, 8, 1, true), on = plan.deepspeedZero2Estimate(2851e6, 8, 1, false);
    expect((off.gpu / GiB).toFixed(2)).toBe('5.31');
    // DeepSpeed's memory.rst still prints 15.93 here: the pre-0.14.3 formula 4Ψ + 16Ψ/N.
    expect((on.gpu / GiB).toFixed(2)).toBe('11.28');
    expect(on.gpu).toBe(2 * 2851e6 + Math.trunc(18 * 2851e6 / 8));
    expect(Math.abs(off.cpu / GiB - 127.48)).toBeLessThan(0.1);
    expect(on.cpu).toBe(Math.trunc(2851e6 * 4 * 8 * 1.5));
  });
  it('the planner\'s ZeRO-2 model states are DeepSpeed\'s (2Ψ + 18Ψ/N) less its fp32 gradient partition (4Ψ/N)', () => {
    const m = plan.PLAN_MODELS['7b']!, N = 8, psi = plan.totalParams(m);
    const e = plan.estimateMemory(m, { ...base, dp: N, zero: 2 }, { seq: 4096, microBatchSize: 1, dtype: 'bf16' });
    const ds = plan.deepspeedZero2Estimate(psi, N, 1, false);
    expect(e.params + e.grads + e.optimizerState).toBeCloseTo(ds.gpu - 4 * psi / N, -3);
  });
  it('DeepSpeed zero3 (t5-small: 60506624 params, largest layer 16449536, 1 GPU): 0.06 / 0.17 / 1.08 GB per GPU', () => {
    const f = (o: object) => plan.deepspeedZero3Estimate(60506624, 16449536, 1, 1, o);
    expect((f({ cpuOffload: true, cpuOffloadParams: true }).gpu / GiB).toFixed(2)).toBe('0.06');
    expect((f({ cpuOffload: true, cpuOffloadParams: false }).gpu / GiB).toFixed(2)).toBe('0.17');
    expect((f({ cpuOffload: false }).gpu / GiB).toFixed(2)).toBe('1.08');
    expect((f({ cpuOffload: true, cpuOffloadParams: true }).cpu / GiB).toFixed(2)).toBe('1.52');
    expect((f({ cpuOffload: false }).cpu / GiB).toFixed(2)).toBe('0.09');
    expect(f({}).largest).toBe(4 * 16449536);
  });
  it('DeepSpeed zero3 (its memory.rst: t5-3b cold, 2851M params, 32M largest layer, 8 GPUs): 0.12 / 0.78 / 6.09 GB per GPU', () => {
    const f = (o: object) => plan.deepspeedZero3Estimate(2851e6, 32e6, 8, 1, o);
    expect((f({ cpuOffload: true, cpuOffloadParams: true }).gpu / GiB).toFixed(2)).toBe('0.12');
    expect((f({ cpuOffload: true, cpuOffloadParams: false }).gpu / GiB).toFixed(2)).toBe('0.78');
    expect((f({ cpuOffload: false }).gpu / GiB).toFixed(2)).toBe('6.09');
    expect((f({ cpuOffload: true, cpuOffloadParams: true }).cpu / GiB).toFixed(2)).toBe('71.69');
    expect((f({ cpuOffload: true, cpuOffloadParams: false, zeroInit: false }).cpu / GiB).toFixed(2)).toBe('127.45');
    expect((f({ cpuOffload: false }).cpu / GiB).toFixed(2)).toBe('1.43');
  });
  it('the planner\'s ZeRO-3 model states are DeepSpeed\'s less its fp32 gradient partition (2Ψ/N) and gathered layer', () => {
    const m = plan.PLAN_MODELS['7b']!, N = 8, psi = plan.totalParams(m);
    const e = plan.estimateMemory(m, { ...base, dp: N, zero: 3 }, { seq: 4096, microBatchSize: 1, dtype: 'bf16' });
    const ds = plan.deepspeedZero3Estimate(psi, plan.largestLayerParams(m), N, 1, { cpuOffload: false });
    expect(e.params + e.grads + e.optimizerState).toBeCloseTo(ds.gpu - 4 * plan.largestLayerParams(m) - 2 * psi / N, -3);
  });
  it('ZeRO paper split (2 + 2 + 12)Ψ by stage, and f32 (4 + 4 + 8)Ψ equal to zeroMemoryFormula', () => {
    const m = plan.PLAN_MODELS.gpt2!, psi = plan.totalParams(m), o = { seq: 1024, microBatchSize: 1 };
    for (const zero of [0, 1, 2, 3] as const) {
      const e = plan.estimateMemory(m, { ...base, dp: 4, zero }, { ...o, dtype: 'bf16' });
      const sh = Math.ceil(psi / 4);
      expect([e.params, e.grads, e.optimizerState]).toEqual([2 * (zero === 3 ? sh : psi), 2 * (zero >= 2 ? sh : psi), 12 * (zero >= 1 ? sh : psi)]);
      const f = plan.estimateMemory(m, { ...base, dp: 4, zero }, { ...o, dtype: 'f32' });
      const z = nt.parallel.zero.zeroMemoryFormula(psi, 4, zero);
      expect([f.params, f.optimizerState]).toEqual([z.params, z.optimizerState]);
    }
  });
  it('7B: 14 GB of bf16 weights, 56 GB of Adam moments (2 × fp32), 84 GB with the fp32 master (12 bytes/param)', () => {
    const psi = 7e9;
    const m = { ...plan.PLAN_MODELS['7b']! };
    const e = plan.estimateMemory(m, base, { seq: 1, microBatchSize: 1, dtype: 'bf16', optimizerBytesPerParam: 12 });
    const real = plan.totalParams(m);
    expect(e.params).toBe(2 * real);
    expect(2 * psi / GB).toBe(14);
    expect(8 * psi / GB).toBe(56); // the moments alone: K = 8 (what "56 GB of Adam state" counts)
    expect(12 * psi / GB).toBe(84); // K = 12: master weights + moments (the ZeRO paper's K)
    expect(e.optimizerState).toBe(12 * real);
    expect(real / 1e9).toBeCloseTo(6.74, 2);
  });
  it('Korthikanti et al. Table 2 per layer', () => {
    const m = plan.PLAN_MODELS['7b']!, s = 2048, b = 1, h = 4096, a = 32, t = 8;
    expect(plan.korthikantiLayerBytes({ ...m, ffn: 4 * h, gated: false }, s, b, 1, false, 'none')).toBeCloseTo(s * b * h * (34 + 5 * a * s / h));
    expect(plan.korthikantiLayerBytes({ ...m, ffn: 4 * h, gated: false }, s, b, t, false, 'none')).toBeCloseTo(s * b * h * (10 + 24 / t + 5 * a * s / (h * t)));
    expect(plan.korthikantiLayerBytes({ ...m, ffn: 4 * h, gated: false }, s, b, t, true, 'none')).toBeCloseTo(s * b * h * (34 / t + 5 * a * s / (h * t)));
    expect(plan.korthikantiLayerBytes({ ...m, ffn: 4 * h, gated: false }, s, b, t, true, 'selective')).toBeCloseTo(s * b * h * 34 / t);
    expect(plan.korthikantiLayerBytes({ ...m, ffn: 4 * h, gated: false }, s, b, 1, false, 'full')).toBeCloseTo(2 * s * b * h);
  });
  it('Megatron theoretical memory (GPT-3 175B, Korthikanti et al.: t8 p8, s2048, b1, SP + selective)', () => {
    const args: plan.MegatronArgs = { numLayers: 96, hiddenSize: 12288, numAttentionHeads: 96, ffnHiddenSize: 4 * 12288, paddedVocabSize: 51200,
      seqLength: 2048, microBatchSize: 1, tensorParallel: 8, pipelineParallel: 8, dataParallel: 1, useDistributedOptimizer: false };
    const m: plan.PlanModel = { name: 'gpt3', nLayer: 96, nHead: 96, nEmbd: 12288, ffn: 4 * 12288, vocabSize: 51200, gated: false, tied: true, bias: true, positions: 2048, seqLen: 2048 };
    // Weights + optimizer: the most loaded shard × 18 bytes = 2 + 4 + 12 (Megatron keeps fp32 grads: the planner's bf16 grads + 2 bytes).
    const shard = (plan.stageParams(m, 8, 8, 0).layerParams + 51200 * 12288 / 8);
    expect(plan.megatronWeightAndOptimizerBytes(args) / shard).toBeCloseTo(18, 1);
    // Megatron since PR #4687: 12 layers of attention (4h²) and MLP (8h²) plus the embedding, over tp 8;
    // the 12 layers' LayerNorms (4h each) replicated. 175B at t8 p8: 2.80e9 parameters on the first stage.
    const h = 12288, firstStage = (12 * 12 * h * h + 51200 * h) / 8 + 12 * 4 * h;
    expect(plan.megatronWeightAndOptimizerBytes(args)).toBeCloseTo(18 * firstStage, -3);
    expect(plan.megatronWeightAndOptimizerBytes({ ...args, useDistributedOptimizer: true, dataParallel: 4 })).toBeCloseTo(9 * firstStage, -3);
    // Activations: the planner's first stage (8 in flight under 1F1B) per layer = Megatron's per layer (34 sbh/t).
    const e = plan.estimateStageMemory(m, { ...base, tp: 8, pp: 8, sequenceParallel: true, recompute: 'selective', microBatches: 64 }, { seq: 2048, microBatchSize: 1, dtype: 'bf16' }, 0);
    const megatron = plan.megatronActivationBytes(args, 64);
    expect(Math.abs(e.activations - megatron) / megatron).toBeLessThan(0.01);
  });
});

describe('pipeline schedules in the planner', () => {
  const m = plan.calibrationModel({ ...plan.CALIBRATION_SHAPE, layers: 8 });
  const opts = { seq: 64, microBatchSize: 2, dtype: 'f32' as const };
  const pp4 = { ...base, pp: 4, microBatches: 8 };
  it('predicts each schedule\'s bubble from its table: the formulas when m >= p, none without a pipeline', () => {
    expect(plan.predictBubble(base)).toBe(0);
    expect(plan.predictBubble(pp4)).toBeCloseTo(3 / 11, 12);
    expect(plan.predictBubble({ ...pp4, schedule: 'gpipe' })).toBeCloseTo(3 / 11, 12);
    expect(plan.predictBubble({ ...pp4, schedule: 'interleaved', virtualStages: 2 })).toBeCloseTo(3 / 19, 12);
    expect(plan.predictBubble({ ...pp4, schedule: 'zb-h1' })).toBeCloseTo(3 / 27, 12);
    // ZB-V: 6m chunk units of work, p − 1 idle per rank.
    expect(plan.predictBubble({ ...pp4, schedule: 'zb-v', virtualStages: 2 })).toBeCloseTo(3 / 51, 12);
    // The step time's bubble term is the idle time relative to the work: (p - 1)/m for 1F1B.
    const dev = plan.resolveDevice('h100');
    const t = plan.predictStepTime(m, pp4, dev, { seq: 64, microBatchSize: 2, dtype: 'bf16', gpusPerNode: 8 });
    expect(t.bubble / t.compute).toBeCloseTo(3 / 8, 10);
    const zb = plan.predictStepTime(m, { ...pp4, schedule: 'zb-h1' }, dev, { seq: 64, microBatchSize: 2, dtype: 'bf16', gpusPerNode: 8 });
    expect(zb.bubble / zb.compute).toBeCloseTo(3 / 24, 10);
    expect(() => plan.predictBubble({ ...pp4, microBatches: 6, schedule: 'interleaved', virtualStages: 2 })).toThrow(nt.ArgumentError);
  });
  it('holds Megatron\'s interleaved in-flight chunks and ZB-H1\'s deferred micro-batches per stage', () => {
    const inter = { ...pp4, schedule: 'interleaved' as const, virtualStages: 2 };
    // Rank r: 2(p - r - 1) + (v - 1)p + 1 chunks of 1/v of its layers.
    expect([0, 1, 2, 3].map((s) => plan.inFlightMicroBatches(inter, s))).toEqual([0, 1, 2, 3].map((r) => (2 * (3 - r) + 4 + 1) / 2));
    expect([0, 1, 2, 3].map((s) => plan.inFlightMicroBatches({ ...pp4, schedule: 'zb-h1' }, s))).toEqual([4, 3, 2, 1]);
    // ZB-H1 rank r lags r weight passes: the micro-batches between B and W cost memory beside 1F1B's.
    const deferred = (s: number) => Math.max(...plan.scheduleStates({ ...pp4, schedule: 'zb-h1' }, s).map((x) => x.deferred));
    expect([0, 1, 2, 3].map(deferred)).toEqual([0, 1, 2, 3]);
    for (const s of [1, 2]) {
      expect(plan.estimateStageMemory(m, { ...pp4, schedule: 'zb-h1' }, opts, s).activations).toBeGreaterThan(plan.estimateStageMemory(m, pp4, opts, s).activations);
    }
    // ZB-V: every rank holds up to p whole-stage micro-batches (2p chunks of half a stage), 1F1B's first-stage peak;
    // the first rank holds both ends of the model (embeddings and head), the last only layers.
    const zbv = { ...pp4, schedule: 'zb-v' as const, virtualStages: 2 };
    expect([0, 1, 2, 3].map((s) => plan.inFlightMicroBatches(zbv, s)).every((x) => x <= 4)).toBe(true);
    const v0 = plan.estimateStageMemory(m, zbv, opts, 0), v3 = plan.estimateStageMemory(m, zbv, opts, 3);
    expect(v0.numParams).toBe(plan.stageParams(m, 1, 4, 0, 1, 'v').total);
    expect(plan.stageParams(m, 1, 4, 0, 1, 'v').head).toBeGreaterThan(0);
    expect(plan.stageParams(m, 1, 4, 3, 1, 'v')).toMatchObject({ embedding: 0, head: 0, layers: 2 });
    expect(v0.numParams).toBeGreaterThan(v3.numParams);
    // Interleaving's first stage holds more than 1F1B's (p·(1 + (p - 1)/(p·v)) micro-batches) and its posted receives.
    expect(plan.estimateStageMemory(m, inter, opts, 0).total).toBeGreaterThan(plan.estimateStageMemory(m, pp4, opts, 0).total);
  });
  it('reads vN and the new schedules in layout specs; ranks interleaved and zb-h1 candidates with their flags', () => {
    expect(plan.parseLayoutSpec('pp2,mb4,v2')).toMatchObject({ pp: 2, microBatches: 4, virtualStages: 2, schedule: 'interleaved' });
    expect(plan.parseLayoutSpec('pp2,mb4,zb-h1')).toMatchObject({ pp: 2, schedule: 'zb-h1' });
    expect(() => plan.parseLayoutSpec('pp2,zigzag')).toThrow(/cannot read "zigzag"/);
    expect(() => plan.checkCalibrationLayout('pp2,mb3,v2', { ...plan.CALIBRATION_SHAPE, batch: 6 })).toThrow(/multiple of --pp/);
    const c = plan.planLayouts(plan.PLAN_MODELS['gpt2-xl']!, { gpus: 8, gpuMemory: 80 * GiB, seq: 1024, globalBatch: 64, dtype: 'bf16', device: plan.resolveDevice('h100') });
    const inter = c.find((x) => !x.skipped && x.layout.schedule === 'interleaved');
    expect(inter!.command).toMatch(/--schedule interleaved --virtual-stages 2/);
    expect(c.some((x) => !x.skipped && x.layout.schedule === 'zb-h1')).toBe(true);
    // The zero-bubble schedules run under every ZeRO stage (ZeRO 2/3 reduce after each W): ranked, never skipped for it.
    for (const schedule of ['zb-h1', 'zb-v'] as const) {
      for (const zero of [2, 3]) expect(c.some((x) => !x.skipped && x.layout.schedule === schedule && x.layout.zero === zero), `${schedule} ZeRO ${zero}`).toBe(true);
    }
    expect(c.filter((x) => x.layout.schedule.startsWith('zb') && x.skipped?.match(/ZeRO/))).toEqual([]);
    const zbv = c.find((x) => !x.skipped && x.layout.schedule === 'zb-v')!;
    expect(zbv.layout.virtualStages).toBe(2);
    expect(zbv.command).toMatch(/--schedule zb-v/);
    expect(zbv.command).not.toMatch(/--virtual-stages/);
    // Same layout otherwise: interleaving and ZB-H1 predict a shorter step than 1F1B.
    const same = (s: string) => c.find((x) => !x.skipped && x.layout.pp === 4 && x.layout.tp === 1 && x.layout.zero === 1 && !x.layout.offload && x.layout.recompute === 'none' && x.microBatchSize === 1 && x.layout.schedule === s)!;
    expect(same('interleaved').time!.total).toBeLessThan(same('1f1b').time!.total);
    expect(same('zb-h1').time!.total).toBeLessThan(same('1f1b').time!.total);
  });
});

describe('planner', () => {
  const dev = plan.resolveDevice('h100');
  it('ranks fitting layouts first by step time, skips heads not divisible by tp with a reason', () => {
    const c = plan.planLayouts(plan.PLAN_MODELS['gpt2-xl']!, { gpus: 8, gpuMemory: 80 * GiB, seq: 1024, globalBatch: 64, dtype: 'bf16', device: dev });
    const ok = c.filter((x) => !x.skipped);
    expect(ok[0]!.fits).toBe(true);
    for (let i = 1; i < ok.length && ok[i]!.fits; i++) expect(ok[i]!.time!.total).toBeGreaterThanOrEqual(ok[i - 1]!.time!.total);
    expect(c.some((x) => x.skipped?.includes('--tp 2: tensor parallelism over 2 ranks must divide the 25 attention heads'))).toBe(true);
    expect(ok[0]!.command).toMatch(/^nodetron launch --nproc-per-node 8 examples\/gpt\/train\.ts .*--tp \d+ --pp \d+ --dp \d+ --zero \d/);
  });
  it('70B does not fit one 80G GPU; fits 64 with sharding', () => {
    const m = plan.PLAN_MODELS['70b']!;
    expect(plan.planLayouts(m, { gpus: 1, gpuMemory: 80 * GiB, seq: 4096, globalBatch: 8, dtype: 'bf16', device: dev }).some((c) => c.fits)).toBe(false);
    expect(plan.planLayouts(m, { gpus: 64, nodes: 8, gpuMemory: 80 * GiB, seq: 4096, globalBatch: 512, microBatchSize: 1, dtype: 'bf16', device: dev })[0]!.fits).toBe(true);
  });
  it('errors: unknown model, gpus not divisible by nodes, unparsable memory', async () => {
    expect(() => plan.resolveModel('gpt5')).toThrow(/unknown model "gpt5"/);
    expect(() => plan.planLayouts(plan.PLAN_MODELS.gpt2!, { gpus: 6, nodes: 4, gpuMemory: 1, seq: 8, globalBatch: 8, dtype: 'bf16', device: dev })).toThrow(/does not divide over --nodes 4/);
    const err: string[] = [];
    const orig = console.error;
    console.error = (s: string) => err.push(s);
    try {
      expect(await main(['plan', '--model', 'gpt2', '--gpus', '8', '--gpu-memory', 'lots'])).toBe(2);
      expect(await main(['plan', '--model', 'nope', '--gpus', '8'])).toBe(2);
    } finally { console.error = orig; }
    expect(err.join('\n')).toMatch(/cannot read --gpu-memory "lots"/);
    expect(err.join('\n')).toMatch(/unknown model "nope"/);
  });
});

describe('plan: Llama-shaped models', () => {
  const llama = plan.resolveModel('70b');
  it('launch commands train Llama blocks with the model\'s key/value heads and MLP width; GPT-2 shapes train the GPT', () => {
    const o = { seq: 4096, globalBatch: 64, nodes: 1, gpusPerNode: 8, cpu: false };
    expect(plan.launchCommand(llama, { ...base, tp: 8 }, o)).toMatch(/--layers 80 --heads 64 --width 8192 .* --model llama --kv-heads 8 --ffn 28672 --tp 8/);
    expect(plan.launchCommand(plan.resolveModel('gpt2'), base, o)).not.toMatch(/--model/);
  });
  it('key/value parameters per rank: split when tp divides the kv heads, whole when the ranks outnumber them', () => {
    const h = 8192, kv = 8 * (h / 64);
    const attnAt = (tp: number) => plan.layerParams(llama, tp) - (h * 28672 * 3) / tp - 2 * h;
    expect(attnAt(8)).toBe((h * h + 2 * h * kv + h * h) / 8);
    expect(attnAt(16)).toBe((h * h + h * h) / 16 + 2 * h * kv);
    expect(plan.layoutProblem(llama, { ...base, tp: 3 }, 4096, 64, 1)).toMatch(/heads/);
    // 8 key/value heads over 16 ranks: each pair of ranks shares one.
    expect(plan.layoutProblem(llama, { ...base, tp: 16, dp: 4 }, 4096, 64, 1)).toBeNull();
  });
});

describe('plan: nodetron\'s bf16 model (--memory-model nodetron)', () => {
  const m = plan.PLAN_MODELS.gpt2!, psi = plan.totalParams(m);
  const o = { seq: 1024, microBatchSize: 4, dtype: 'bf16' as const, model: 'nodetron' as const };
  it('f32 weights, gradients and Adam moments (4 + 4 + 8)Ψ split by ZeRO stage, as in f32', () => {
    for (const zero of [0, 1, 2, 3] as const) {
      const e = plan.estimateMemory(m, { ...base, dp: 4, zero }, { ...o, backend: 'cpu' });
      const f = plan.estimateMemory(m, { ...base, dp: 4, zero }, { ...o, dtype: 'f32' });
      expect([e.params, e.optimizerState]).toEqual([f.params, f.optimizerState]);
      const z = nt.parallel.zero.zeroMemoryFormula(psi, 4, zero);
      expect([e.params, e.optimizerState]).toEqual([z.params, z.optimizerState]);
    }
  });
  it('each micro-batch in flight holds its own 16-bit copies of the stage\'s layer weights (not under full recomputation)', () => {
    const pp4 = { ...base, pp: 4, microBatches: 8 };
    const stage0 = (l: plan.PlanLayout) => plan.estimateStageMemory(m, l, { ...o, backend: 'cpu' }, 0);
    const copies = 2 * plan.stageParams(m, 1, 4, 0).layerParams;
    // 1F1B's first stage holds 4 micro-batches, GPipe's all 8: four more copies beside four more micro-batches' tensors.
    const more = stage0({ ...pp4, schedule: 'gpipe' }).activations - stage0(pp4).activations;
    const perMicroBatch = stage0(pp4).activations / 4;
    expect(more).toBeCloseTo(4 * perMicroBatch, -2);
    expect(perMicroBatch).toBeGreaterThan(copies);
    // Under full recomputation a micro-batch keeps its blocks' f32 inputs only (the copies are made again in backward).
    // That is what f32 training keeps (the same f32 residual stream), with no 16-bit copies.
    const rcMore = (opts: plan.MemoryOptions) => plan.estimateStageMemory(m, { ...pp4, schedule: 'gpipe', recompute: 'full' }, opts, 0).activations
      - plan.estimateStageMemory(m, { ...pp4, recompute: 'full' }, opts, 0).activations;
    expect(rcMore({ ...o, backend: 'cpu' })).toBe(rcMore({ seq: o.seq, microBatchSize: o.microBatchSize, dtype: 'f32' }));
  });
  it('the head\'s chunks follow the backend (64 MiB on cpu, 1 GiB on cuda); cuda adds the allocator factor', () => {
    const cpu = plan.estimateMemory(m, base, { ...o, backend: 'cpu' }), gpu = plan.estimateMemory(m, base, { ...o, backend: 'cuda' });
    expect(gpu.logits).toBeGreaterThan(cpu.logits);
    expect(gpu.overhead).toBeGreaterThan(0.09 * (gpu.total - gpu.overhead));
    expect(cpu.overhead).toBeLessThan(0.01 * cpu.total);
  });
  it('bad options are errors: megatron with f32, unknown models and backends', () => {
    expect(() => plan.estimateMemory(m, base, { seq: 8, microBatchSize: 1, dtype: 'f32', model: 'megatron' })).toThrow(/published bf16 recipe/);
    expect(() => plan.estimateMemory(m, base, { seq: 8, microBatchSize: 1, dtype: 'bf16', model: 'deepspeed' as never })).toThrow(/model must be/);
    expect(() => plan.estimateMemory(m, base, { seq: 8, microBatchSize: 1, dtype: 'bf16', backend: 'tpu' as never })).toThrow(/backend must be/);
  });
  it('the planner offers selective recomputation only for the published recipe', () => {
    const dev = plan.resolveDevice('h100');
    const rc = (memoryModel?: 'nodetron' | 'megatron') => new Set(plan.planLayouts(m, { gpus: 2, gpuMemory: 80 * GiB, seq: 1024, globalBatch: 8, dtype: 'bf16', device: dev, ...(memoryModel ? { memoryModel } : {}) }).map((c) => c.layout.recompute));
    expect(rc()).toContain('selective');
    expect(rc('nodetron')).not.toContain('selective');
  });
});
