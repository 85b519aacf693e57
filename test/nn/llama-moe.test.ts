// nt.nn.Llama with mixture-of-experts blocks (Mixtral, Qwen2-MoE): the config (MixtralConfig's and
// Qwen2MoeConfig's snake_case, defaults, typed errors), which blocks hold nt.nn.MoE (decoderSparseStep,
// mlpOnlyLayers), the parameter names, the objective's gradient (LM loss + every MoE block's auxiliary
// loss, as the training step differentiates it) against a directional finite difference of that
// objective, the auxiliary loss reaching the router, recomputation, and training with nt.trainStep.
// Logits against transformers' Mixtral and Qwen2-MoE: test/interop/moe.test.ts; the MoE layer's own
// math (the sigmoid-gated shared expert included) against float64: test/nn/moe.test.ts.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const mixtral: nt.nn.LlamaConfig = {
  vocabSize: 29, hiddenSize: 16, intermediateSize: 12, numHiddenLayers: 2, numAttentionHeads: 4, numKeyValueHeads: 2,
  maxPositionEmbeddings: 12, ropeTheta: 500, rmsNormEps: 1e-5, initializerRange: 0.2, numLocalExperts: 4, numExpertsPerTok: 2, routerAuxLossCoef: 0.5,
};
const qwen: nt.nn.LlamaConfig = {
  ...mixtral, numHiddenLayers: 3, intermediateSize: 20, moeIntermediateSize: 8, sharedExpertIntermediateSize: 10, mlpOnlyLayers: [1],
  normTopkProb: false, qkvBias: true, routerZLossCoef: 0.05,
};
const ids = (seed: number) => nt.tensor(Int32Array.from({ length: 2 * 12 }, (_, i) => (i * 13 + seed * 5 + ((i * i) % 7)) % 29), [2, 12]);

function relErr(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let err = 0, scale = 1e-12;
  for (let i = 0; i < b.length; i++) { err = Math.max(err, Math.abs(a[i]! - b[i]!)); scale = Math.max(scale, Math.abs(b[i]!)); }
  return err / scale;
}

describe('Llama + MoE config', () => {
  it('reads MixtralConfig\'s and Qwen2MoeConfig\'s snake_case and fills the defaults', () => {
    const m = nt.nn.llamaConfig({
      vocab_size: 32, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 2, num_attention_heads: 4, max_position_embeddings: 8,
      num_local_experts: 8, num_experts_per_tok: 2, router_aux_loss_coef: 0.02, router_jitter_noise: 0, output_router_logits: false,
    });
    expect(m).toMatchObject({
      numLocalExperts: 8, numExpertsPerTok: 2, moeIntermediateSize: 24, sharedExpertIntermediateSize: 0, decoderSparseStep: 1, mlpOnlyLayers: [],
      normTopkProb: true, routerAuxLossCoef: 0.02, routerZLossCoef: 0, qkvBias: false,
    });
    const q = nt.nn.llamaConfig({
      vocab_size: 32, hidden_size: 16, intermediate_size: 24, num_hidden_layers: 4, num_attention_heads: 4, max_position_embeddings: 8,
      num_experts: 6, num_experts_per_tok: 4, moe_intermediate_size: 8, shared_expert_intermediate_size: 12, decoder_sparse_step: 2,
      mlp_only_layers: [3, 1], norm_topk_prob: false, qkv_bias: true,
    });
    expect(q).toMatchObject({ numLocalExperts: 6, numExpertsPerTok: 4, moeIntermediateSize: 8, sharedExpertIntermediateSize: 12, decoderSparseStep: 2, mlpOnlyLayers: [1, 3], normTopkProb: false, qkvBias: true });
    expect([0, 1, 2, 3].map((i) => nt.nn.isLlamaMoEBlock(q, i))).toEqual([false, false, false, false]);
    const q2 = nt.nn.llamaConfig({ ...q, mlpOnlyLayers: [] });
    expect([0, 1, 2, 3].map((i) => nt.nn.isLlamaMoEBlock(q2, i))).toEqual([false, true, false, true]);
    expect(nt.nn.llamaMoEConfig(q)).toEqual({ experts: 6, topK: 4, hidden: 8, normalizeTopK: false, auxLossCoef: 0.001, zLossCoef: 0, sharedExperts: 1, sharedHidden: 12, sharedGate: true });
    expect(nt.nn.llamaMoEConfig(nt.nn.llamaConfig({ ...mixtral, numLocalExperts: 0 }))).toBeNull();
  });

  it('bad MoE settings are one ArgumentError naming each', () => {
    expect(() => nt.nn.llamaConfig({ ...mixtral, numExpertsPerTok: 5 })).toThrow(/numExpertsPerTok \(5\) must not exceed numLocalExperts \(4\)/);
    expect(() => nt.nn.llamaConfig({ ...mixtral, routerJitterNoise: 0.01 })).toThrow(/routerJitterNoise 0\.01 is not computed/);
    expect(() => nt.nn.llamaConfig({ ...mixtral, decoderSparseStep: 3 })).toThrow(/decoderSparseStep \(3\) exceeds numHiddenLayers \(2\)/);
    expect(() => nt.nn.llamaConfig({ ...mixtral, mlpOnlyLayers: [2] })).toThrow(/mlpOnlyLayers must be an array of block indices 0\.\.1/);
    expect(() => nt.nn.llamaConfig({ ...mixtral, numLocalExperts: -1, routerAuxLossCoef: -1 })).toThrow(/numLocalExperts must be an integer >= 0.*routerAuxLossCoef must be a finite number >= 0/);
    expect(() => nt.nn.llamaConfig({ ...mixtral, qkvBias: 1 } as unknown as nt.nn.LlamaConfig)).toThrow(nt.ArgumentError);
  });
});

describe('Llama + MoE model', () => {
  it('the blocks the config names hold nt.nn.MoE (with the gated shared expert), named as HF\'s layers', () => {
    const m = new nt.nn.Llama(qwen, { seed: 3 });
    try {
      expect(m.layers.map((b) => b.mlp instanceof nt.nn.MoE)).toEqual([true, false, true]);
      const moe = m.layers[0]!.mlp as nt.nn.MoE;
      expect(moe.experts.length).toBe(4);
      expect(moe.shared!.gate.shape).toEqual([10, 16]);
      expect(moe.sharedGate!.shape).toEqual([1, 16]);
      expect(moe.config).toMatchObject({ topK: 2, hidden: 8, normalizeTopK: false, auxLossCoef: 0.5, zLossCoef: 0.05 });
      const names = m.namedParameters().map(([n]) => n);
      for (const n of ['layers.0.mlp.router', 'layers.0.mlp.experts.3.down', 'layers.2.mlp.sharedGate', 'layers.2.mlp.shared.up', 'layers.1.mlp.gateProj.weight', 'layers.0.selfAttn.kProj.bias']) expect(names).toContain(n);
      expect(names).not.toContain('layers.0.selfAttn.oProj.bias');
    } finally { m.dispose(); }
  });

  // Large auxiliary coefficients, so that the objective's gradient differs from the LM loss's alone.
  for (const [name, config] of [['Mixtral', { ...mixtral, routerAuxLossCoef: 4 }], ['Qwen2-MoE', { ...qwen, routerAuxLossCoef: 2, routerZLossCoef: 0.2 }]] as const) {
    it(`${name}: the gradient of loss + auxiliary losses matches a directional finite difference of that objective`, () => {
      const model = new nt.nn.Llama(config, { seed: 11 });
      try {
        const objective = () => nt.scope(() => nt.noGrad(() => model.forward(ids(1), ids(2)).loss!.item())) + model.takeMoEStats()!.auxLoss;
        const named = model.namedParameters();
        const theta = named.map(([, p]) => Float64Array.from(p.toArraySync()));
        const grads = nt.scope(() => {
          model.forward(ids(1), ids(2)).loss!.backward();
          return named.map(([, p]) => Float64Array.from(p.grad!.toArraySync()));
        });
        model.takeMoEStats();
        const norm = Math.sqrt(grads.reduce((a, g) => a + g.reduce((s, v) => s + v * v, 0), 0));
        const set = (t: number) => model.loadStateDict(Object.fromEntries(named.map(([n, p], i) => [n, nt.tensor(Float32Array.from(theta[i]!, (v, j) => v + t * grads[i]![j]! / norm), p.shape)])));
        const eps = 2e-3;
        set(eps); const up = objective();
        set(-eps); const down = objective();
        set(0);
        const fd = (up - down) / (2 * eps);
        expect(Math.abs(fd - norm) / norm).toBeLessThan(1e-2);
      } finally { model.dispose(); }
    });
  }

  it('the auxiliary loss reaches the router (and the blocks before it) but not the reported loss', () => {
    const run = (coef: number) => {
      const model = new nt.nn.Llama({ ...mixtral, routerAuxLossCoef: coef }, { seed: 5 });
      try {
        return nt.scope(() => {
          const loss = model.forward(ids(1), ids(2)).loss!;
          loss.backward();
          const g = (n: string) => Float64Array.from(model.stateDict()[n]!.grad!.toArraySync());
          return { loss: loss.item(), router: g('layers.1.mlp.router'), q0: g('layers.0.selfAttn.qProj.weight'), head: g('lmHead.weight'), stats: model.takeMoEStats()! };
        });
      } finally { model.dispose(); }
    };
    const a = run(0.5), b = run(0);
    expect(a.loss).toBe(b.loss);
    expect(relErr(a.router, b.router)).toBeGreaterThan(1e-3);
    expect(relErr(a.q0, b.q0)).toBeGreaterThan(1e-4);
    expect(relErr(a.head, b.head)).toBeLessThan(1e-6);
    // Two MoE blocks, 24 tokens, top-2.
    expect(a.stats.forwards).toBe(2);
    expect(a.stats.tokensPerExpert.reduce((s, v) => s + v, 0)).toBe(2 * 24 * 2);
    expect(a.stats.auxLoss).toBeGreaterThan(0);
  });

  it('recomputed blocks give the same loss and gradients, the auxiliary losses\' included', () => {
    const run = (recompute: boolean) => {
      const model = new nt.nn.Llama({ ...qwen, recompute }, { seed: 9 });
      try {
        return nt.scope(() => {
          const loss = model.forward(ids(3), ids(4)).loss!;
          loss.backward();
          return { loss: loss.item(), grads: new Map(model.namedParameters().map(([n, p]) => [n, Float64Array.from(p.grad!.toArraySync())])), stats: model.takeMoEStats()! };
        });
      } finally { model.dispose(); }
    };
    const plain = run(false), again = run(true);
    expect(again.loss).toBe(plain.loss);
    for (const [n, g] of plain.grads) expect(relErr(again.grads.get(n)!, g), n).toBeLessThan(1e-6);
    expect(again.stats.forwards).toBe(plain.stats.forwards);
  });

  it('trains through nt.trainStep (loss falls)', () => {
    const model = new nt.nn.Llama(qwen, { seed: 7 });
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-2 });
    try {
      const losses = Array.from({ length: 8 }, () => nt.trainStep(model, opt, ids(1), ids(2)).loss);
      expect(losses.at(-1)!).toBeLessThan(losses[0]! - 0.1);
      expect(model.takeMoEStats()!.forwards).toBe(8 * 2);
    } finally { model.dispose(); opt.dispose(); }
  });
});

describe('Llama + MoE parameter counts', () => {
  it('nt.nn.llamaParameterCount counts the built model; active counts only top-k experts', () => {
    for (const config of [mixtral, qwen]) {
      const m = new nt.nn.Llama(config, { seed: 1 });
      try {
        expect(m.numParameters()).toBe(nt.nn.llamaParameterCount(m.config));
        const perExpert = 3 * 16 * (m.config.moeIntermediateSize);
        const moeBlocks = m.layers.filter((b) => b.mlp instanceof nt.nn.MoE).length;
        expect(nt.nn.llamaParameterCount(m.config) - nt.nn.llamaParameterCount(m.config, true)).toBe(moeBlocks * (4 - 2) * perExpert);
      } finally { m.dispose(); }
    }
  });
});

describe('Llama + MoE checkpoints', () => {
  it('a dense Llama\'s checkpoint loaded into a Mixtral is refused naming both; a Mixtral\'s loads back', async () => {
    const { mkdtempSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const root = mkdtempSync(join(tmpdir(), 'nt-llama-moe-ckpt-'));
    const dense = new nt.nn.Llama({ ...mixtral, numLocalExperts: 0 }, { seed: 1 }), a = new nt.nn.Llama(mixtral, { seed: 1 }), b = new nt.nn.Llama(mixtral, { seed: 2 });
    try {
      await nt.ckpt.save(join(root, 'dense'), 1, { model: dense });
      await expect(nt.ckpt.load(join(root, 'dense'), { model: a })).rejects.toThrow(/it holds a Llama model, and the model loading it is a Llama with mixture-of-experts blocks/);
      await nt.ckpt.save(join(root, 'moe'), 1, { model: a });
      await nt.ckpt.load(join(root, 'moe'), { model: b });
      const pa = new Map(a.namedParameters());
      for (const [n, p] of b.namedParameters()) expect(Array.from(p.toArraySync()), n).toEqual(Array.from(pa.get(n)!.toArraySync()));
    } finally { for (const m of [dense, a, b]) m.dispose(); rmSync(root, { recursive: true, force: true }); }
  });
});
