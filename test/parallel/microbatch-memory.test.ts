// Micro-batches release what their forward does not save: a step split into 4 micro-batches holds
// one micro-batch's activations and head chunk at a time (one process, which runs the 1F1B schedule as a
// single stage), so its peak is far below the whole batch's. Before each micro-batch's forward
// released its unsaved intermediates, they lived until the step ended and the peak barely moved.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const config: nt.nn.GPTConfig = { vocabSize: 8192, blockSize: 32, nLayer: 2, nHead: 2, nEmbd: 64, dropout: 0, bias: true };
const B = 16, T = 32;

async function peakOfStep(microBatches: number): Promise<{ peak: number; loss: number }> {
  const model = new nt.parallel.pp.GPTStage(new nt.nn.GPT(config, { seed: 3 }), 0, 1);
  const trainer = await nt.parallel.ParallelTrainer.create<nt.optim.AdamWOptions>(model, [{ params: model.parameters() }], {
    mesh: null, microBatches, createOptimizer: (groups) => new nt.optim.AdamW(groups, { lr: 1e-3 }),
  });
  const ids = (k: number) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => (i * 7919 + k) % config.vocabSize), [B, T]);
  let loss = 0;
  try {
    for (let step = 0; step < 2; step++) {
      if (step === 1) nt.resetPeakMemory(); // the first step creates the optimizer state
      using x = ids(step), y = ids(step + 1);
      ({ loss } = await trainer.step(x, y));
    }
    return { peak: nt.memoryStats().peak - nt.memoryStats().allocated, loss };
  } finally {
    trainer.dispose();
    model.dispose();
  }
}

describe('micro-batch memory', () => {
  it('4 micro-batches peak at well under the whole batch, with the same loss', async () => {
    const whole = await peakOfStep(1);
    const split = await peakOfStep(4);
    expect(split.loss).toBeCloseTo(whole.loss, 4);
    // The activations dominate now that the fused head never holds the whole logits: a quarter of them
    // at a time (plus the accumulated gradients).
    expect(split.peak, `${split.peak} vs ${whole.peak}`).toBeLessThan(0.55 * whole.peak);
  }, 120_000);
});
