// `nodetron bench train --device cuda` (lib/bench/train-cuda.ts): on a machine without a usable GPU it
// says so with a typed error naming the reason; the MFU denominators by GPU name; with a GPU, the
// per-kernel table of one step accounts for the kernels a GPT step must call.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { bf16PeakTflops, cudaTrainBench, GPT2_124M, profileKernels } from '../../lib/bench/train-cuda.js';
import { TRAIN_CONFIGS } from '../../lib/bench/configs.js';

const hasGpu = nt.cuda.isAvailable();

describe('bench train --device cuda', () => {
  it.skipIf(hasGpu)('without a usable GPU: BackendUnavailableError saying there is no GPU and why', () => {
    let err: unknown;
    try {
      cudaTrainBench({ configs: [GPT2_124M], steps: 1, warmup: 0, torch: false, compile: false, kernels: false });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(nt.BackendUnavailableError);
    expect(String((err as Error).message)).toMatch(/no usable GPU on this machine \(.+\)/);
    expect(String((err as Error).message)).toContain(nt.cuda.unavailableReason());
  });

  it('MFU denominators: dense bf16 peaks by GPU name, null for an unknown GPU', () => {
    expect(bf16PeakTflops('NVIDIA H100 80GB HBM3')).toBe(989);
    expect(bf16PeakTflops('NVIDIA H100 PCIe')).toBe(756);
    expect(bf16PeakTflops('NVIDIA H200')).toBe(989);
    expect(bf16PeakTflops('NVIDIA A100-SXM4-80GB')).toBe(312);
    expect(bf16PeakTflops('Some Other GPU')).toBeNull();
    expect(GPT2_124M).toMatchObject({ layers: 12, heads: 12, width: 768, ctx: 1024, vocab: 50257 });
  });

  it.skipIf(!hasGpu)('per-kernel table of a tiny GPT step names the GEMM, attention and optimizer kernels', () => {
    const c = TRAIN_CONFIGS.find((t) => t.name === 'tiny')!;
    const model = new nt.nn.GPT({ vocabSize: c.vocab, blockSize: c.ctx, nLayer: 2, nHead: c.heads, nEmbd: c.width, dropout: 0, bias: true }, { seed: 0, device: 'cuda' });
    const opt = new nt.optim.AdamW(model.parameters());
    const x = nt.tensor(Int32Array.from({ length: 2 * c.ctx }, (_, i) => i % c.vocab), [2, c.ctx], { dtype: 'i32', device: 'cuda' });
    try {
      const table = profileKernels(0, () => { nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, x)); });
      const names = table.map((t) => t.kernel);
      for (const k of ['gemm_epilogue', 'flash_attention_forward', 'flash_attention_backward', 'adamw_step']) expect(names).toContain(k);
      expect(table.every((t) => t.ms >= 0 && t.calls > 0)).toBe(true);
    } finally {
      x.dispose(); opt.dispose(); model.dispose();
    }
  });
});
