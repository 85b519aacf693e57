// `bench ops` times one AdamW step over the tiny GPT's parameters: the count it uses is the one a
// real tiny GPT (as `bench train` builds it) has, not a number typed in by hand.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { ADAM_PARAMS } from '../../lib/bench/ops.js';
import { TRAIN_CONFIGS } from '../../lib/bench/configs.js';

describe('bench ops: AdamW over the tiny GPT', () => {
  it('steps exactly as many parameters as the tiny GPT of bench train holds', () => {
    const c = TRAIN_CONFIGS.find((t) => t.name === 'tiny')!;
    const model = new nt.nn.GPT({ vocabSize: c.vocab, blockSize: c.ctx, nLayer: c.layers, nHead: c.heads, nEmbd: c.width, dropout: 0, bias: true }, { seed: 0 });
    const held = model.parameters().reduce((n, p) => n + p.size, 0);
    expect(ADAM_PARAMS).toBe(held);
    for (const p of model.parameters()) p.dispose();
  });
});
