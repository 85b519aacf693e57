// The planner's MoE shapes: Mixtral and Qwen2-MoE configs read from their Hugging Face keys, total
// and active parameters against the published counts (Mixtral 8x7B: 46.7B and 12.9B), the routed
// experts split by expert parallelism, FLOPs from the active parameters, and the GPT's own config.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';

const mixtral = {
  model_type: 'mixtral', hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32, num_attention_heads: 32, num_key_value_heads: 8,
  vocab_size: 32000, num_local_experts: 8, num_experts_per_tok: 2, max_position_embeddings: 4096, tie_word_embeddings: false,
};

describe('nodetron plan with MoE models', () => {
  it('Mixtral 8x7B: 46.7B parameters, 12.9B active per token (Jiang et al. 2024)', () => {
    const m = plan.modelFromConfig(mixtral, 'mixtral');
    expect(m.moe).toEqual({ experts: 8, topK: 2, ffn: 14336, sharedFfn: 0, every: 1 });
    expect(plan.totalParams(m) / 1e9).toBeCloseTo(46.7, 1);
    expect(plan.activeParams(m) / 1e9).toBeCloseTo(12.9, 1);
    expect(plan.expertParams(m)).toBe(32 * 8 * 3 * 4096 * 14336);
  });

  it('expert parallelism divides the routed experts of a layer, not the router or attention', () => {
    const m = plan.modelFromConfig(mixtral, 'mixtral');
    const perExpert = 3 * 4096 * 14336;
    expect(plan.layerParams(m, 1, 1) - plan.layerParams(m, 1, 4)).toBe(8 * perExpert - 2 * perExpert);
    const dense = plan.modelFromConfig({ ...mixtral, num_local_experts: undefined, model_type: 'llama' }, 'dense');
    expect(dense.moe).toBeUndefined();
    // The dense twin's MLP is one expert without the router: each MoE layer adds 7 experts and the router.
    expect(plan.layerParams(m) - plan.layerParams(dense)).toBe(7 * perExpert + 8 * 4096);
  });

  it('FLOPs per step count the active experts only', () => {
    const m = plan.modelFromConfig(mixtral, 'mixtral');
    const dense = plan.modelFromConfig({ ...mixtral, num_local_experts: undefined, model_type: 'llama' }, 'dense');
    const moe = plan.stepFlops(m, 8, 4096, 'none'), one = plan.stepFlops(dense, 8, 4096, 'none');
    // Top-2 is about one more expert's MLP per token than the dense model: between 1x and 2x the FLOPs.
    expect(moe / one).toBeGreaterThan(1.4);
    expect(moe / one).toBeLessThan(1.9);
  });

  it('Qwen2-MoE keys (shared experts, sparse step) and a GPTConfig moe object', () => {
    const q = plan.modelFromConfig({ hidden_size: 2048, intermediate_size: 5632, num_hidden_layers: 24, num_attention_heads: 16, vocab_size: 151936,
      num_experts: 60, num_experts_per_tok: 4, moe_intermediate_size: 1408, shared_expert_intermediate_size: 5632, decoder_sparse_step: 1 }, 'qwen');
    expect(q.moe).toEqual({ experts: 60, topK: 4, ffn: 1408, sharedFfn: 5632, every: 1 });
    const g = plan.modelFromConfig({ nLayer: 4, nHead: 4, nEmbd: 64, vocabSize: 256, moe: { experts: 8, topK: 2, hidden: 128, every: 2 } }, 'gpt');
    expect(g.moe).toEqual({ experts: 8, topK: 2, ffn: 128, sharedFfn: 0, every: 2 });
    expect(plan.moeLayerCount(g)).toBe(2);
    expect(() => plan.modelFromConfig({ ...mixtral, num_experts_per_tok: 9 }, 'bad')).toThrow(/1 <= top-k <= experts/);
  });
});

describe('nodetron plan with expert parallelism (--ep)', () => {
  const base: plan.PlanLayout = { dp: 8, tp: 1, pp: 1, zero: 0, offload: false, recompute: 'none', sequenceParallel: false, microBatches: 1, schedule: '1f1b' };
  const m = plan.modelFromConfig(mixtral, 'mixtral');
  const opts = { seq: 4096, microBatchSize: 1, dtype: 'bf16' as const };
  const routed = (ep: number) => (32 * 8 * 3 * 4096 * 14336) / ep;

  it('a rank holds 1/ep of the routed experts; ZeRO shards them over the dp/ep ranks holding the same experts, the rest over dp', () => {
    expect(plan.stageExpertParams(m, 1, 0, 1)).toBe(routed(1));
    expect(plan.stageExpertParams(m, 1, 0, 4)).toBe(routed(4));
    expect(plan.stageExpertParams(m, 2, 1, 4)).toBe(routed(4) / 2);
    const one = plan.estimateMemory(m, base, opts), four = plan.estimateMemory(m, { ...base, ep: 4 }, opts);
    expect(one.numParams - four.numParams).toBe(routed(1) - routed(4));
    expect(four.expertParams).toBe(routed(4));
    for (const zero of [1, 2, 3] as const) {
      const e = plan.estimateMemory(m, { ...base, ep: 4, zero }, opts);
      const shard = Math.ceil((e.numParams - routed(4)) / 8) + Math.ceil(routed(4) / 2);
      expect(e.optimizerState).toBe(12 * shard);
      if (zero >= 2) expect(e.grads).toBe(2 * shard);
      if (zero === 3) expect(e.params).toBe(2 * shard);
    }
    // ep = dp: one copy of each expert, nothing to shard it over.
    const z1 = plan.estimateMemory(m, { ...base, ep: 8, zero: 1 }, opts);
    expect(z1.optimizerState).toBe(12 * (Math.ceil((z1.numParams - routed(8)) / 8) + routed(8)));
  });

  it('the all-to-all buffers: the running layer\'s routed rows sent and received, in the buffers; none without ep', () => {
    for (const dtype of ['bf16', 'f32'] as const) {
      const w = dtype === 'f32' ? 4 : 2;
      const o = { ...opts, dtype, microBatchSize: 2 };
      const one = plan.estimateMemory(m, base, o), two = plan.estimateMemory(m, { ...base, ep: 2 }, o);
      expect(one.allToAll).toBe(0);
      expect(two.allToAll).toBe(2 * 4096 * 2 * 2 * 4096 * w);
      expect(two.buffers).toBeGreaterThanOrEqual(two.allToAll!);
      // bf16: the same buffers otherwise (no ZeRO: the buckets do not depend on ep; f32's peak phase moves with the gradients).
      if (dtype === 'bf16') expect(two.buffers - one.buffers).toBeCloseTo(two.allToAll!, 0);
    }
    expect(plan.estimateMemory(plan.PLAN_MODELS.gpt2!, { ...base, dp: 1 }, opts).allToAll).toBeUndefined();
  });

  it('step time: the all-to-alls of every MoE layer, four per micro-batch (six recomputing), (ep-1)/ep of the routed bytes', () => {
    const dev = plan.resolveDevice('h100');
    const t = (l: plan.PlanLayout) => plan.predictStepTime(m, l, dev, { seq: 4096, microBatchSize: 1, dtype: 'bf16', gpusPerNode: 8 });
    expect(t(base).expertParallel).toBeUndefined();
    const act = 4096 * 1 * 4096 * 2;
    const l4 = { ...base, ep: 4, microBatches: 2 };
    expect(t(l4).expertParallel).toBeCloseTo((2 * 32 * 4 * act * 2 * (3 / 4)) / dev.intraNodeBusBw, 12);
    expect(t({ ...l4, recompute: 'full' }).expertParallel! / t(l4).expertParallel!).toBeCloseTo(1.5, 12);
    expect(t(l4).total - t({ ...base, microBatches: 2 }).total).toBeCloseTo(t(l4).expertParallel!, 12);
  });

  it('data-parallel traffic: the experts average over their dp/ep copies only, so across nodes EP hides what ZeRO-3 over all 16 ranks cannot', () => {
    const dev = plan.resolveDevice('h100');
    const l = { ...base, dp: 16, zero: 3 as const, recompute: 'selective' as const, microBatches: 4 };
    const t = (ep: number) => plan.predictStepTime(m, { ...l, ep }, dev, { seq: 4096, microBatchSize: 1, dtype: 'bf16', gpusPerNode: 8 });
    // ep 1: all 46.7B parameters' gradients over 16 ranks (inter-node); ep 8: the experts' over 2 copies.
    const w = 2, expertBytes = (e: number) => plan.stageExpertParams(m, 1, 0, e) * w, dense = plan.stageParams(m, 1, 1, 0, 1).total * w - expertBytes(1);
    const volume = (e: number) => 1.5 * (dense * 2 * 15 / 16 + (16 / e > 1 ? expertBytes(e) * 2 * (16 / e - 1) / (16 / e) : 0));
    const shown = (e: number) => Math.max(volume(e) / dev.interNodeBusBw - (2 / 3) * t(e).compute, (25 * 2 ** 20 * 3) / dev.interNodeBusBw);
    for (const e of [1, 2, 8]) expect(t(e).dataParallel).toBeCloseTo(shown(e), 9);
    expect(t(8).dataParallel).toBeLessThan(t(2).dataParallel);
    expect(t(2).dataParallel).toBeLessThan(t(1).dataParallel);
    // A dense model keeps the 12h²-per-layer count.
    const d = plan.predictStepTime(plan.PLAN_MODELS['7b']!, { ...l, dp: 8 }, dev, { seq: 4096, microBatchSize: 1, dtype: 'bf16', gpusPerNode: 8 });
    expect(d.expertParallel).toBeUndefined();
  });

  it('candidates: ep dividing dp and the experts, no cp or sp with MoE layers; commands train the MoE GPT with --ep', () => {
    const g = plan.modelFromConfig({ nLayer: 4, nHead: 4, nEmbd: 256, vocabSize: 50304, moe: { experts: 4, topK: 2, hidden: 512, sharedExperts: 1 } }, 'moe-gpt');
    const c = plan.planLayouts(g, { gpus: 8, gpuMemory: 80 * 2 ** 30, seq: 256, globalBatch: 64, dtype: 'bf16', device: plan.resolveDevice('h100') });
    const ok = c.filter((x) => !x.skipped);
    const eps = new Set(ok.map((x) => x.layout.ep ?? 1));
    expect([...eps].sort()).toEqual([1, 2, 4]);
    for (const x of ok) {
      const ep = x.layout.ep ?? 1;
      expect(x.layout.dp % ep).toBe(0);
      expect(x.layout.cp ?? 1).toBe(1);
      expect(x.layout.sequenceParallel).toBe(false);
      expect(x.command).toMatch(/--moe-experts 4 --moe-top-k 2 --moe-hidden 512 --moe-shared 1 /);
      expect(x.command!.includes('--ep ')).toBe(ep > 1);
      if (ep > 1) expect(x.command).toContain(`--ep ${ep}`);
    }
    expect(c.some((x) => x.skipped?.includes('with MoE layers is not supported'))).toBe(true);
    expect(plan.layoutProblem(g, { ...base, dp: 8, ep: 8 }, 256, 64, 1)).toMatch(/--ep 8 must divide the model's 4 experts/);
    expect(plan.layoutProblem(plan.PLAN_MODELS.gpt2!, { ...base, ep: 2 }, 256, 64, 1)).toMatch(/--ep 2 splits MoE experts over ranks, but the model has no MoE layers/);
  });

  it('a Mixtral-shaped model gets the example\'s Llama command with its experts (the example trains Llama blocks with MoE layers)', () => {
    const c = plan.planLayouts(m, { gpus: 8, gpuMemory: 80 * 2 ** 30, seq: 4096, globalBatch: 64, microBatchSize: 1, dtype: 'bf16', device: plan.resolveDevice('h100') });
    const ok = c.filter((x) => !x.skipped);
    expect(ok.length).toBeGreaterThan(0);
    for (const x of ok) {
      expect(x.commandNote).toBeUndefined();
      expect(x.command).toMatch(/--model llama --kv-heads 8 --ffn 14336 --moe-experts 8 --moe-top-k 2 --moe-hidden 14336 /);
      expect(x.command!.includes('--moe-shared')).toBe(false);
      expect(x.command!.includes('--ep ')).toBe((x.layout.ep ?? 1) > 1);
    }
    expect(ok.some((x) => (x.layout.ep ?? 1) === 8 && x.fits)).toBe(true);
  });
});
