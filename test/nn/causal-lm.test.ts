// The CausalLM contract's counts: every family's parameterCounts equals what the built model holds
// (numParameters), its active count leaves out exactly the experts a token does not go through, and
// flopsPerToken is 6 per active parameter that is not a lookup plus attention's two products.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const C = 16, L = 4, V = 40, T = 24;

/** Builds each model, checks it against its counts, disposes it. */
function check(build: () => nt.nn.CausalLM, lookups: (m: nt.nn.CausalLM) => number, idleExperts: (m: nt.nn.CausalLM) => number): void {
  const m = build();
  try {
    const { total, active } = m.parameterCounts;
    expect(total).toBe(m.numParameters());
    expect(total - active).toBe(idleExperts(m));
    // Attention's two products, 2·2·3 FLOPs per channel per attended position per layer (forward + backward).
    expect(m.flopsPerToken(T)).toBe(6 * (active - lookups(m)) + 12 * L * C * T);
  } finally { m.dispose(); }
}

describe('CausalLM counts', () => {
  it('a GPT, dense and with experts (a shared expert of its own width with a gate): counts equal the built model', () => {
    const base = { vocabSize: V, blockSize: T, nLayer: L, nHead: 2, nEmbd: C, dropout: 0, bias: true };
    // The position table is a lookup; the tied token table is the head's weight, so it is counted.
    const positions = (m: nt.nn.CausalLM) => m.shape.blockSize * C;
    check(() => new nt.nn.GPT(base, { seed: 1 }), positions, () => 0);
    const moe = { experts: 4, topK: 2, every: 2, hidden: 8, sharedExperts: 1, sharedHidden: 12, sharedGate: true };
    // Two MoE blocks (every 2nd of 4), each leaving 4 − 2 experts of 3·C·8 idle per token.
    check(() => new nt.nn.GPT({ ...base, moe }, { seed: 1 }), positions, () => 2 * (4 - 2) * 3 * C * 8);
  });

  it('a Llama, dense and as Qwen2-MoE (gated shared expert): counts equal the built model', () => {
    const base = { vocabSize: V, hiddenSize: C, intermediateSize: 24, numHiddenLayers: L, numAttentionHeads: 4, numKeyValueHeads: 2, maxPositionEmbeddings: T };
    // The untied token table is a lookup (the head holds its own).
    const table = () => V * C;
    check(() => new nt.nn.Llama(base, { seed: 2 }), table, () => 0);
    const qwen = { ...base, numLocalExperts: 4, numExpertsPerTok: 2, moeIntermediateSize: 8, sharedExpertIntermediateSize: 12, qkvBias: true, normTopkProb: false };
    check(() => new nt.nn.Llama(qwen, { seed: 2 }), table, () => L * (4 - 2) * 3 * C * 8);
  });
});
