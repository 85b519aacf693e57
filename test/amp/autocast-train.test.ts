// Training under autocast on the cpu backend: a tiny GPT's 200 bf16 steps against the f32 run's losses
// (the tolerance measured below), trainStep inside an autocast region with backward inside or outside
// it, recomputation, the trainer's and nt.train's `precision` option, and f16 with GradScaler.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runRanks } from '../distributed/spawn-ranks.js';
import { lcgGlobalBatch } from '../helpers/token-batch.js';

const CFG = { vocabSize: 64, blockSize: 32, nLayer: 2, nHead: 2, nEmbd: 48, dropout: 0, bias: true };
const BATCH = 8, CTX = 32;
// Weights a step casts: the tied head's table, and per block the QKV, projection and two MLP layers' weight and bias.
const CASTS_PER_STEP = 1 + CFG.nLayer * 8;

type Mode = 'f32' | 'bf16' | 'bf16-backward-outside';

/** Losses of `steps` AdamW steps (lr 5e-4, clip 1) over 8 repeating batches. */
function train(mode: Mode, steps: number, opts: { seed?: number; recompute?: boolean } = {}): number[] {
  const model = new nt.nn.GPT({ ...CFG, recompute: opts.recompute ?? false }, { seed: opts.seed ?? 1 });
  const opt = new nt.optim.AdamW(model.parameters(), { lr: 5e-4, weightDecay: 0 });
  const losses: number[] = [];
  try {
    for (let s = 0; s < steps; s++) {
      const { x, y } = lcgGlobalBatch(s % 8, BATCH, CTX, CFG.vocabSize);
      using xt = nt.tensor(x, [BATCH, CTX]), yt = nt.tensor(y, [BATCH, CTX]);
      if (mode === 'f32') losses.push(nt.trainStep(model, opt, xt, yt, { maxGradNorm: 1 }).loss);
      else if (mode === 'bf16') losses.push(nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, xt, yt, { maxGradNorm: 1 })).loss);
      else {
        nt.scope(() => {
          const { loss } = nt.autocast({ dtype: 'bf16' }, () => model.forward(xt, yt));
          expect(loss!.dtype).toBe('f32');
          loss!.backward();
          losses.push(loss!.item());
          nt.optim.clipGradNorm(model.parameters(), 1);
          opt.step();
          opt.zeroGrad();
        });
      }
    }
  } finally {
    opt.dispose();
    model.dispose();
  }
  return losses;
}

const window10 = (u: number[]) => Array.from({ length: Math.floor(u.length / 10) }, (_, w) => u.slice(w * 10, w * 10 + 10).reduce((a, b) => a + b) / 10);
const maxAbsDiff = (a: number[], b: number[]) => Math.max(...a.map((v, i) => Math.abs(v - b[i]!)));

describe('training a tiny GPT under bf16 autocast', () => {
  it('200 steps stay within the measured tolerance of the f32 run', () => {
    // Measured with flash attention and the widening bf16 GEMM (this config, seeds 1-12): the largest
    // per-step difference 0.005-0.040, of 10-step means 0.0010-0.0057, the loss falling from 3.5 to
    // about 0.18; except seed 1, whose bf16 run has a transient loss spike at steps 110-120 (10-step
    // mean 0.262 against 0.230, back within 0.005 by step 130: a trajectory event, not a drift). The
    // materializing attention gave 0.0013-0.0095 over the same seeds (seed 1: 0.0055). With the
    // AVX512_BF16 GEMM (native/cpu/kernels/gemm_bf16.cc; the sums in another order), seeds 1-7: per
    // step 0.0046-0.0372, 10-step means 0.0010-0.0100 (seed 2: 0.032 and 0.0100; the widening path
    // gave seed 2 0.013 and 0.0013 in the same measurement). Seed 2 here; the bounds leave 2-3x room.
    const f32 = train('f32', 200, { seed: 2 });
    nt.resetAutocastStats();
    const bf16 = train('bf16', 200, { seed: 2 });
    // every weight cast once per step (the step's optimizer update makes the next step re-cast it)
    expect(nt.autocastStats().weightCasts).toBe(200 * CASTS_PER_STEP);
    expect(maxAbsDiff(f32, bf16)).toBeLessThan(0.1);
    expect(maxAbsDiff(window10(f32), window10(bf16))).toBeLessThan(0.02);
    expect(Math.abs(f32[0]! - bf16[0]!)).toBeLessThan(0.01);
    expect(window10(bf16).at(-1)!).toBeLessThan(0.5);
    // bf16 is really in use: the runs are not the same
    expect(maxAbsDiff(f32, bf16)).toBeGreaterThan(1e-4);
    // 400 training steps: 99 s measured with a busy loop on each core of this 2-core machine (60 s was too short).
  }, 240_000);

  it('backward inside or outside the region, and recomputation, give the same steps', () => {
    const inside = train('bf16', 10), outside = train('bf16-backward-outside', 10);
    expect(outside).toEqual(inside);
    const recomputed = train('bf16', 10, { recompute: true });
    // the re-run in backward re-enters the forward's autocast state: the same bf16 products
    expect(recomputed).toEqual(inside);
    expect(train('bf16-backward-outside', 10, { recompute: true })).toEqual(inside);
  }, 120_000);
});

describe('the trainer\'s precision option', () => {
  const run = async (precision: 'f32' | 'bf16' | undefined, steps = 6) => {
    const t = await nt.train.setup({
      model: (shard) => new nt.nn.GPT(CFG, shard), optimizer: (groups) => new nt.optim.AdamW(groups, { lr: 5e-4 }),
      batchSize: BATCH, seed: 1, layout: precision ? { precision } : {},
    });
    const losses: number[] = [];
    try {
      for (let s = 0; s < steps; s++) {
        const { x, y } = lcgGlobalBatch(s, BATCH, CTX, CFG.vocabSize);
        using inputs = nt.tensor(x, [BATCH, CTX]), targets = nt.tensor(y, [BATCH, CTX]);
        losses.push((await t.step({ inputs, targets })).loss);
      }
    } finally {
      await t.close();
    }
    return losses;
  };

  it('precision bf16 runs the forward under autocast; f32 (the default) does not', async () => {
    nt.resetAutocastStats();
    const f32 = await run(undefined);
    expect(nt.autocastStats().weightCasts).toBe(0);
    const bf16 = await run('bf16');
    expect(nt.autocastStats().weightCasts).toBe(6 * CASTS_PER_STEP);
    expect(maxAbsDiff(f32, bf16)).toBeGreaterThan(1e-5);
    expect(maxAbsDiff(f32, bf16)).toBeLessThan(0.05);
    await expect(run('f16' as 'bf16')).rejects.toThrow(/precision must be 'f32' or 'bf16'.*GradScaler/);
  }, 120_000);

  it('--precision and NODETRON_PRECISION parse; other values are ArgumentErrors', () => {
    expect(nt.train.layoutFromArgs(['--precision', 'bf16'], {})).toEqual({ precision: 'bf16' });
    expect(nt.train.layoutFromArgs([], { NODETRON_PRECISION: 'bf16' })).toEqual({ precision: 'bf16' });
    expect(nt.train.layoutFromArgs(['--precision=f32'], { NODETRON_PRECISION: 'bf16' })).toEqual({ precision: 'f32' });
    expect(() => nt.train.layoutFromArgs(['--precision', 'f16'], {})).toThrow(/--precision must be f32 or bf16.*GradScaler/);
    expect(() => nt.train.layoutFromArgs(['--precision', 'fp8'], {})).toThrow(nt.ArgumentError);
  });
});

describe('f16 autocast with GradScaler on the cpu backend', () => {
  it('trains like f32, and an overflowing scale skips the step and backs off', () => {
    const f32 = train('f32', 30);
    const model = new nt.nn.GPT(CFG, { seed: 1 });
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 5e-4, weightDecay: 0 });
    const scaler = new nt.GradScaler({ initScale: 2 ** 12 });
    const losses: number[] = [];
    let skipped = 0;
    for (let s = 0; s < 30; s++) {
      const { x, y } = lcgGlobalBatch(s % 8, BATCH, CTX, CFG.vocabSize);
      using xt = nt.tensor(x, [BATCH, CTX]), yt = nt.tensor(y, [BATCH, CTX]);
      nt.scope(() => {
        const { loss } = nt.autocast({ dtype: 'f16' }, () => model.forward(xt, yt));
        nt.mul(loss!, scaler.scale).backward();
        losses.push(loss!.item());
        const grads = model.parameters().map((p) => p.grad!);
        for (const g of grads) expect(g.dtype).toBe('f32');
        scaler.unscale(grads);
        nt.optim.clipGradNorm(model.parameters(), 1);
        if (!scaler.step(grads, () => opt.step())) skipped++;
        scaler.update();
        opt.zeroGrad();
      });
    }
    expect(skipped).toBe(0);
    // measured: the largest difference from f32 over these 30 steps is 1.4e-4 (f16 keeps 11 bits)
    expect(maxAbsDiff(f32, losses)).toBeLessThan(0.02);
    expect(maxAbsDiff(f32, losses)).toBeGreaterThan(0);
    nt.scope(() => nt.autocast({ dtype: 'f16' }, () => { expect(nt.linear(nt.ones([2, 4]), nt.ones([3, 4])).dtype).toBe('f16'); }));

    // A scale of 2^40 overflows f16 in backward: the step is skipped, the parameters are untouched.
    const big = new nt.GradScaler({ initScale: 2 ** 40 });
    const before = model.parameters().map((p) => Array.from(p.toArraySync()));
    const { x, y } = lcgGlobalBatch(0, BATCH, CTX, CFG.vocabSize);
    using xt = nt.tensor(x, [BATCH, CTX]), yt = nt.tensor(y, [BATCH, CTX]);
    nt.scope(() => {
      const { loss } = nt.autocast({ dtype: 'f16' }, () => model.forward(xt, yt));
      nt.mul(loss!, big.scale).backward();
      expect(big.step(model.parameters().map((p) => p.grad!), () => opt.step())).toBe(false);
      big.update();
      opt.zeroGrad();
    });
    expect(big.scale).toBe(2 ** 39);
    model.parameters().forEach((p, i) => expect(Array.from(p.toArraySync())).toEqual(before[i]));
    opt.dispose(); model.dispose();
  }, 120_000);
});

describe('tensor and sequence parallelism under bf16 autocast', () => {
  it('a TP2 + SP GPT step over 2 processes: loss and gradients close to the f32 step, gradients f32', async () => {
    const res = await runRanks('../amp/tp-sp-bf16-rank.ts', 2, [], { NODETRON_WARN_LEAKS: '0' }, 120_000);
    for (const r of res) {
      expect(r.code, r.stderr.slice(-3000)).toBe(0);
      const { f32Loss, bf16Loss, casts, gradDtypes, worst } = r.result as { f32Loss: number; bf16Loss: number; casts: number; gradDtypes: string[]; worst: number[] };
      expect(casts).toBeGreaterThan(0);
      expect(gradDtypes).toEqual(['f32']);
      expect(Math.abs(f32Loss - bf16Loss)).toBeLessThan(0.01);
      expect(Math.abs(f32Loss - bf16Loss)).toBeGreaterThan(0);
      // a few bf16 roundings on the way (relative 2^-8 each): within 5% of each tensor's largest gradient
      for (const w of worst) expect(w).toBeLessThan(0.05);
    }
  }, 150_000);
});
