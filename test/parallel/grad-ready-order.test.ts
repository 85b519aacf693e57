// GPTStage.gradientReadyOrder (lib/parallel/pipeline/gpt-stage.ts): the order ZeRO 1/2 lay their fixed
// gradient buckets out in. Reversed, it must start with the chunk whose backward synchronizes (chunk 0,
// the last backward of interleaved 1F1B and zb-v), so the first buckets fill, and their reduce-scatters
// start, during that pass; with one chunk it is the parameters' own order.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { GPTStage } from '../../lib/parallel/pipeline/gpt-stage.js';

const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 16, nLayer: 4, nHead: 2, nEmbd: 16, dropout: 0, bias: true };

function names(stage: GPTStage, params: readonly nt.Tensor[]): string[] {
  const byTensor = new Map<nt.Tensor, string>(stage.namedParameters().map(([n, p]) => [p, n]));
  return params.map((p) => byTensor.get(p)!);
}

describe('GPTStage.gradientReadyOrder', () => {
  it('one chunk: the parameters in their own order', () => {
    const stage = new GPTStage(new nt.nn.GPT(config, { seed: 1 }), 0, 2);
    try {
      expect(stage.gradientReadyOrder()).toEqual(stage.parameters());
    } finally { stage.dispose(); }
  });

  for (const [placement, stageIndex] of [['loop', 0], ['loop', 1], ['v', 0], ['v', 1]] as const) {
    it(`two chunks (${placement === 'loop' ? 'interleaved' : 'zb-v'}), stage ${stageIndex}: every parameter once, chunk 0's blocks last (first when reversed)`, () => {
      const stage = new GPTStage(new nt.nn.GPT(config, { seed: 1 }), stageIndex, 2, 2, placement);
      try {
        const order = stage.gradientReadyOrder();
        expect(new Set(order)).toEqual(new Set(stage.parameters()));
        expect(order.length).toBe(stage.parameters().length);
        const named = names(stage, order);
        const [start, end] = stage.chunkLayers[0]!;
        const chunk0 = new Set(Array.from({ length: end - start }, (_, i) => `h.${start + i}.`));
        const isChunk0 = (n: string) => [...chunk0].some((prefix) => n.startsWith(prefix));
        const count0 = named.filter(isChunk0).length;
        expect(count0).toBeGreaterThan(0);
        // The last count0 names are chunk 0's blocks.
        expect(named.slice(named.length - count0).every(isChunk0)).toBe(true);
      } finally { stage.dispose(); }
    });
  }
});
