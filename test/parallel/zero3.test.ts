// ZeRO stage 3: a tiny GPT trained 3 AdamW steps as DP2 and DP4 over Gloo (± offload, ± recompute)
// matches the single-process run in losses, gradient norms and final parameters; gathers are
// prefetched; each rank holds about Ψ/N of the parameters between steps; misuse fails clearly.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { fileWorld, runLocalRanks } from '../../lib/testing/index.js';
import { ZeroOptimizer, ZeroStage12Optimizer, zeroMemoryFormula } from '../../lib/parallel/zero/optimizer.js';
import { trainStep } from '../../lib/step.js';
import { runRanks, type RankResult } from '../distributed/spawn-ranks.js';
import {
  zero3Batch, zero3Config, zero3Lr, zero3ParamGroups, ZERO3_GLOBAL_BATCH, ZERO3_MAX_GRAD_NORM, ZERO3_SEED, ZERO3_STEPS,
} from '../fixtures/parallel/zero3-setup.js';

// Each gradient entry sums per-token terms over the global batch's 32 rows: the single process in
// one order, DP2/DP4 per rank (16 or 8 rows) and then over the ranks (the f32 all-reduce). Reordering
// an f32 sum of n terms moves it by at most γ_n·Σ|terms|, γ_32 = 32·2⁻²⁴ ≈ 1.9e-6. Losses and gradient
// norms sum terms of one sign (Σ|terms| = |sum|): ≤ 1.9e-6 of their value. AdamW's step
// lr·m̂/(√v̂ + eps) does not depend on a gradient's scale, so a relative change ε of an entry's
// gradients changes its step by at most about 2ε·lr; over the 3 steps (Σ lr = 0.04) a parameter
// moves by ≤ 0.08·γ_32·κ ≈ 1.5e-7·κ, κ = Σ|terms|/|sum| its cancellation. At the parameters' scale
// (~1: the LayerNorm weights) 1e-5 admits κ up to ~65 (measured at every x86-64 level: ≤ 1.5e-6).
// The one sum that cancels completely, the attention key bias's, is checked apart (keyBiasReach).
const TOLERANCE = 1e-5;
const work = mkdtempSync(join(tmpdir(), 'nt-zero3-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Largest |a - b| over the largest |b|. */
function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) { diff = Math.max(diff, Math.abs(a[i]! - b[i]!)); scale = Math.max(scale, Math.abs(b[i]!)); }
  return diff / scale;
}

/**
 * The largest |m̂_t/√v̂_t| AdamW can reach at step t (1-based) for any gradient sequence: by
 * Cauchy–Schwarz on m_t = (1−β1)Σβ1^(t−i)g_i against v_t = (1−β2)Σβ2^(t−i)g_i², with both bias
 * corrections, (1−β1)/(1−β1^t)·√((1−β2^t)/(1−β2))·√(Σ_{k<t}(β1²/β2)^k); eps only makes it smaller.
 */
function adamRatioBound(t: number, b1: number, b2: number): number {
  let s = 0;
  for (let k = 0; k < t; k++) s += (b1 * b1 / b2) ** k;
  return (1 - b1) / (1 - b1 ** t) * Math.sqrt((1 - b2 ** t) / (1 - b2)) * Math.sqrt(s);
}
/**
 * How far apart two runs may leave an entry whose gradient is zero in exact arithmetic: the attention
 * key bias (softmax ignores a shift shared by every key, so Σ_j dS_ij = 0). Its f32 gradient is
 * rounding noise of the backward's summation order, which AdamW (no weight decay on biases) turns
 * into a step anywhere in ±lr_t·adamRatioBound(t): two runs differ by at most Σ_t 2·lr_t·bound.
 */
const keyBiasReach = Array.from({ length: ZERO3_STEPS }, (_, t) => 2 * zero3Lr(t) * adamRatioBound(t + 1, 0.9, 0.95)).reduce((a, b) => a + b, 0);

/** Flat indices (in zero3ParamGroups' order) of every block's attention key bias: qkv.bias[h, 2h). */
function keyBiasIndices(model: nt.nn.GPT): Set<number> {
  const names = new Map(model.namedParameters().map(([n, p]) => [p as nt.Tensor, n]));
  const out = new Set<number>();
  let offset = 0;
  for (const p of zero3ParamGroups(model).flatMap((g) => g.params)) {
    if (/attn\.qkv\.bias$/.test(names.get(p)!)) {
      const h = p.size / 3;
      for (let i = h; i < 2 * h; i++) out.add(offset + i);
    }
    offset += p.size;
  }
  return out;
}

/**
 * Trained parameters against the reference's: the key biases (keyBiasIndices) within keyBiasReach,
 * every other entry within TOLERANCE of the largest reference parameter.
 */
function expectParamsMatch(got: ArrayLike<number>, want: { params: number[]; keyBias: Set<number> }): void {
  expect(got.length).toBe(want.params.length);
  const rest: number[] = [], restWant: number[] = [];
  let keyBiasDiff = 0;
  for (let i = 0; i < got.length; i++) {
    if (want.keyBias.has(i)) keyBiasDiff = Math.max(keyBiasDiff, Math.abs(got[i]! - want.params[i]!));
    else { rest.push(got[i]!); restWant.push(want.params[i]!); }
  }
  expect(relDiff(rest, restWant)).toBeLessThan(TOLERANCE);
  expect(keyBiasDiff).toBeLessThanOrEqual(keyBiasReach);
}

const adamw = (groups: Array<{ params: Iterable<nt.Tensor> }>) => new nt.optim.AdamW(groups, { lr: zero3Lr(0), betas: [0.9, 0.95], weightDecay: 0.1 });

/** The single-process run: the whole global batch, plain AdamW, the same clipping and schedule. */
function reference(recompute: boolean): { losses: number[]; gradNorms: number[]; params: number[]; initial: number[]; keyBias: Set<number> } {
  const config = zero3Config(recompute);
  const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
  const groups = zero3ParamGroups(model);
  const ordered = groups.flatMap((g) => g.params);
  const initial = ordered.flatMap((p) => Array.from(p.toArraySync()));
  const opt = adamw(groups) as unknown as nt.optim.Optimizer<{ lr: number }>;
  const losses: number[] = [], gradNorms: number[] = [];
  for (let step = 0; step < ZERO3_STEPS; step++) {
    const { x, y } = zero3Batch(step, config.blockSize);
    using inputs = nt.tensor(x, [ZERO3_GLOBAL_BATCH, config.blockSize]);
    using targets = nt.tensor(y, [ZERO3_GLOBAL_BATCH, config.blockSize]);
    const r = trainStep(model, opt, inputs, targets, { maxGradNorm: ZERO3_MAX_GRAD_NORM, lr: zero3Lr(step) });
    losses.push(r.loss); gradNorms.push(r.gradNorm!);
  }
  const params = ordered.flatMap((p) => Array.from(p.toArraySync()));
  const keyBias = keyBiasIndices(model);
  opt.dispose();
  model.dispose();
  return { losses, gradNorms, params, initial, keyBias };
}

interface ScenarioResult {
  losses: number[]; gradNorms: number[]; params: number[]; readBetweenSteps: string;
  gathers: { prefetched: number; onDemand: number; unused: number; reduceScatters: number }[];
  memory: nt.parallel.zero.ZeroMemoryBytes; allocatedModel: number; allocatedSharded: number; peakGatheredBytes: number;
}

// Both layouts start at once (mostly process start-up); each rank runs its scenarios in sequence.
const runs: Record<number, Promise<RankResult[]>> = {
  2: runRanks('../parallel/zero3-rank.ts', 2, ['plain,offload,recompute'], {}, 150_000),
  4: runRanks('../parallel/zero3-rank.ts', 4, ['plain,offload'], {}, 150_000),
};
const references = { plain: reference(false), recompute: reference(true) };

/** Parameter counts of the root unit (embeddings, final norm) and of one block, and their padded per-rank chunks. */
function unitSizes(ranks: number): { psi: number; root: number; block: number; blockChunks: number } {
  const model = new nt.nn.GPT(zero3Config(), { seed: ZERO3_SEED });
  const size = (ps: nt.Tensor[]) => ps.reduce((s, p) => s + p.size, 0);
  const blockParams = model.h[0]!.parameters();
  const out = {
    psi: model.numParameters(), block: size(blockParams), root: model.numParameters() - model.h.length * size(blockParams),
    blockChunks: blockParams.reduce((s, p) => s + Math.ceil(p.size / ranks), 0),
  };
  model.dispose();
  return out;
}

describe('ZeRO stage 3 across processes (Gloo)', () => {
  const cases: [number, string][] = [[2, 'plain'], [2, 'offload'], [2, 'recompute'], [4, 'plain'], [4, 'offload']];
  it.each(cases)('DP%d %s: losses, gradient norms and final parameters match the single process', async (world, scenario) => {
    const ranks = await runs[world]!;
    for (const r of ranks) expect(r.code, r.stderr).toBe(0);
    const expected = references[scenario === 'recompute' ? 'recompute' : 'plain'];
    const first = ranks[0]!.result.results[scenario] as ScenarioResult;
    for (const r of ranks) {
      const got = r.result.results[scenario] as ScenarioResult;
      expect(relDiff(got.losses, expected.losses)).toBeLessThan(TOLERANCE);
      expect(relDiff(got.gradNorms, expected.gradNorms)).toBeLessThan(TOLERANCE);
      expectParamsMatch(got.params, expected);
      // Every rank gathers the same shards, so the gathered parameters agree bit for bit.
      expect(relDiff(got.params, first.params)).toBe(0);
    }
    // Training moved the parameters far beyond the tolerance.
    expect(relDiff(expected.params, expected.initial)).toBeGreaterThan(100 * TOLERANCE);
  }, 180_000);

  it.each(cases)('DP%d %s: every block gather after the first unit is prefetched; one reduce-scatter per unit', async (world, scenario) => {
    const ranks = await runs[world]!;
    const layers = zero3Config().nLayer;
    for (const r of ranks) {
      expect(r.code, r.stderr).toBe(0);
      const got = r.result.results[scenario] as ScenarioResult;
      // Forward: the root unit on demand, each block prefetched by the unit before it. Backward:
      // the last block is still gathered; every other block is prefetched by the block after it.
      for (const g of got.gathers) expect(g).toEqual({ prefetched: 2 * layers - 1, onDemand: 1, unused: 0, reduceScatters: layers + 1 });
      expect(got.readBetweenSteps).toMatch(/^StateError: parameter 'lnF.weight' is sharded by ZeRO stage 3/);
    }
  }, 180_000);

  it.each(cases)('DP%d %s: between steps a rank holds Ψ/N of the parameters, within 10 percent of the formula', async (world, scenario) => {
    const ranks = await runs[world]!;
    const { psi, root, block, blockChunks } = unitSizes(world);
    const formula = zeroMemoryFormula(psi, world, 3);
    for (const r of ranks) {
      expect(r.code, r.stderr).toBe(0);
      const got = r.result.results[scenario] as ScenarioResult;
      for (const k of ['params', 'grads', 'optimizerState'] as const) {
        expect(Math.abs(got.memory[k] - formula[k]) / formula[k], k).toBeLessThan(0.1);
      }
      expect(got.memory.masterShard).toBe(0);
      // The allocator agrees: building the optimizer freed all but this rank's chunks.
      expect(got.allocatedModel).toBeGreaterThanOrEqual(4 * psi);
      expect(Math.abs(got.allocatedSharded - formula.params) / formula.params).toBeLessThan(0.1);
      // Transient: the root unit, the block running and the next block's receive buffer.
      expect(got.peakGatheredBytes).toBeLessThanOrEqual(4 * (root + block + world * blockChunks));
      expect(got.peakGatheredBytes).toBeGreaterThanOrEqual(4 * (root + block));
    }
  }, 180_000);
});

describe('StorageRef.evict / restore (what ZeRO-3 releases parameters with)', () => {
  it('frees the bytes under every tensor sharing the storage and gives them new ones on restore', () => {
    const t = nt.tensor(new Float32Array(1000).fill(3), [10, 100]);
    const view = t.reshape([1000]);
    const before = nt.memoryStats().allocated;
    t.storageRef.evict('held elsewhere for the test');
    expect(nt.memoryStats().allocated).toBeLessThanOrEqual(before - 4000);
    expect(t.storageRef.bytes).toBe(0);
    for (const x of [t, view]) {
      expect(() => x.toArraySync()).toThrow(nt.StateError);
      expect(() => x.toArraySync()).toThrow('held elsewhere for the test');
    }
    expect(() => nt.add(view, view)).toThrow(nt.StateError);
    t.storageRef.restore(4000);
    expect(nt.memoryStats().allocated).toBeGreaterThanOrEqual(before);
    t.backend.write(t.storage, 0, new Uint8Array(new Float32Array(1000).fill(2).buffer));
    expect(Array.from(view.toArraySync()).every((v) => v === 2)).toBe(true);
    expect(() => t.storageRef.restore(4000)).toThrow(nt.StateError);
    view.dispose();
    t.dispose();
    expect(nt.ones([1]).item()).toBe(1);
  });
});

describe('ZeRO stage 3 in one process (world of one, file-backed group)', () => {
  const group = () => fileWorld(mkdtempSync(join(work, 'w')), 0, 1);
  const config = zero3Config();
  const batch = (step: number, rows: [number, number]) => {
    const { x, y } = zero3Batch(step, config.blockSize);
    const slice = (a: Int32Array) => nt.tensor(a.slice(rows[0] * config.blockSize, rows[1] * config.blockSize), [rows[1] - rows[0], config.blockSize]);
    return { inputs: slice(x), targets: slice(y) };
  };

  it('accumulates two micro-batches per step like the full batch, releasing every block after each backward', async () => {
    const expected = reference(false);
    const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const zero = new ZeroOptimizer(zero3ParamGroups(model), adamw, { group: group(), stage: 3 }).attach(model);
    const shardBytes = zero.memoryBytes().params;
    const rootBytes = 4 * (model.numParameters() - config.nLayer * model.h[0]!.numParameters());
    const losses: number[] = [];
    for (let step = 0; step < ZERO3_STEPS; step++) {
      let loss = 0;
      const reduceScattersBefore = zero.gatherStats.reduceScatters;
      await nt.scope(async () => {
        for (const rows of [[0, 2], [2, 4]] as [number, number][]) {
          const { inputs, targets } = batch(step, rows);
          const out = model.forward(inputs, targets);
          // Each half's mean loss weighs half of the full batch's mean.
          nt.mul(out.loss!, 0.5).backward();
          loss += out.loss!.item() / 2;
          expect(zero.memoryBytes().params).toBe(shardBytes + rootBytes);
        }
        // Each micro-batch reduce-scatters every block; the root goes once, in step().
        expect(zero.gatherStats.reduceScatters - reduceScattersBefore).toBe(2 * config.nLayer);
        zero.inner.setLr(zero3Lr(step));
        await zero.step({ maxGradNorm: ZERO3_MAX_GRAD_NORM });
        zero.zeroGrad();
      });
      losses.push(loss);
    }
    expect(relDiff(losses, expected.losses)).toBeLessThan(TOLERANCE);
    const full = await zero.fullParameters();
    expectParamsMatch(full.flatMap((t) => Array.from(t.toArraySync())), expected);
    full.forEach((t) => t.dispose());
    zero.dispose();
  });

  it('a forward without a graph releases every gathered parameter; one with a graph keeps the root and the last block for backward', async () => {
    const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const zero = new ZeroOptimizer(model.parameters(), adamw, { group: group(), stage: 3 }).attach(model);
    const shardBytes = zero.memoryBytes().params;
    const { inputs, targets } = batch(0, [0, 2]);
    const evalLoss = nt.noGrad(() => nt.scope(() => model.forward(inputs, targets).loss!.item()));
    expect(zero.memoryBytes().params).toBe(shardBytes);
    const out = model.forward(inputs, targets);
    const rootAndLast = model.numParameters() - (config.nLayer - 1) * model.h[0]!.numParameters();
    expect(zero.memoryBytes().params).toBe(shardBytes + 4 * rootAndLast);
    expect(out.loss!.item()).toBeCloseTo(evalLoss, 6);
    out.loss!.backward();
    // Backward released every block as its gradients were reduce-scattered; the root waits for step.
    expect(zero.memoryBytes().params).toBe(shardBytes + 4 * (rootAndLast - model.h[0]!.numParameters()));
    await zero.step();
    expect(zero.memoryBytes().params).toBe(shardBytes);
    out.loss!.dispose();
    zero.dispose();
  });

  it('units listed out of order still train correctly; the mispredicted prefetches show as on-demand and unused gathers', async () => {
    const trainOnce = async (reversed: boolean) => {
      const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
      const zero = new ZeroOptimizer(model.parameters(), adamw, { group: group(), stage: 3 });
      zero.attach(model, { units: reversed ? [...model.h].reverse() : model.h });
      const { inputs, targets } = batch(0, [0, 4]);
      await nt.scope(async () => { model.forward(inputs, targets).loss!.backward(); await zero.step(); });
      const full = await zero.fullParameters();
      const values = full.flatMap((t) => Array.from(t.toArraySync()));
      full.forEach((t) => t.dispose());
      const stats = { ...zero.gatherStats };
      zero.dispose();
      return { values, stats };
    };
    const inOrder = await trainOnce(false), reversed = await trainOnce(true);
    expect(relDiff(reversed.values, inOrder.values)).toBe(0);
    expect(inOrder.stats).toMatchObject({ onDemand: 1, unused: 0 });
    expect(reversed.stats.onDemand).toBeGreaterThan(1);
    expect(reversed.stats.unused).toBeGreaterThan(0);
  });

  it('refuses a forward before attach, a step before attach, and parameters outside the partition', async () => {
    const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const zero = new ZeroOptimizer(model.parameters(), adamw, { group: group(), stage: 3 });
    const { inputs, targets } = batch(0, [0, 1]);
    expect(() => model.forward(inputs, targets)).toThrow(nt.StateError);
    expect(() => model.forward(inputs, targets)).toThrow(/call attach\(model\)/);
    await expect(zero.step()).rejects.toThrow(/not attached to a model/);
    expect(nt.add(nt.ones([2]), nt.ones([2])).toArraySync()).toEqual(new Float32Array([2, 2]));
    zero.dispose();

    // A model parameter the optimizer does not hold would never be gathered or updated.
    const model2 = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const partial = new ZeroOptimizer(model2.parameters().filter((p) => p !== model2.lnF.bias), adamw, { group: group(), stage: 3 });
    expect(() => partial.attach(model2)).toThrow(nt.ArgumentError);
    expect(() => partial.attach(model2)).toThrow(/model parameters not given to the optimizer: lnF.bias/);
    partial.dispose();

    // An optimizer parameter the model does not have.
    const model3 = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const stray = nt.zeros([3]);
    const extra = new ZeroOptimizer([...model3.parameters(), stray], adamw, { group: group(), stage: 3 });
    expect(() => extra.attach(model3)).toThrow(/optimizer parameters that are not the model's: \[3\] f32/);
    expect(() => extra.attach(model3, { units: [model3.h[0]!, model3.h[0]!.attn] })).toThrow(/nested inside unit 'h.0'/);
    expect(() => extra.attach(model3, { units: [new nt.nn.LayerNorm(4)] })).toThrow(/submodule of the model/);
    expect(() => extra.attach(model3, { entries: ['forwardStage'] })).toThrow(/no method forwardStage/);
    extra.dispose();

    // A refused inner optimizer leaves the parameters whole.
    const model5 = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    expect(() => new ZeroOptimizer(model5.parameters(), (gr) => new nt.optim.Lamb(gr), { group: group(), stage: 3 })).toThrow(/LAMB/);
    expect(() => new ZeroOptimizer(model5.parameters(), () => adamw([{ params: model5.parameters() }]), { group: group(), stage: 3 })).toThrow(/exactly the shard groups/);
    expect(Number.isFinite(model5.forward(inputs, targets).loss!.item())).toBe(true);

    const model4 = new nt.nn.GPT(config, { seed: ZERO3_SEED });
    const ok = new ZeroOptimizer(model4.parameters(), adamw, { group: group(), stage: 3 }).attach(model4);
    expect(() => ok.attach(model4)).toThrow(nt.StateError);
    ok.dispose();
    // A stage-2 optimizer has no attach at all: TypeScript refuses the call (test/parallel/zero-types.test.ts).
    const stage2 = new ZeroOptimizer([nt.zeros([4])], adamw, { group: group(), stage: 2 });
    expect(stage2).toBeInstanceOf(ZeroStage12Optimizer);
    expect('attach' in stage2).toBe(false);
    stage2.dispose();
    expect(nt.ones([1]).item()).toBe(1);
  });

  it('refuses a group that cannot finish a collective synchronously, on every rank', async () => {
    const errors = await runLocalRanks(2, async (g) => {
      const model = new nt.nn.GPT(config, { seed: ZERO3_SEED });
      const zero = new ZeroOptimizer(model.parameters(), adamw, { group: g, stage: 3 }).attach(model);
      const { inputs, targets } = batch(0, [0, 1]);
      let message = '';
      try { model.forward(inputs, targets); } catch (e) { message = `${(e as Error).name}: ${(e as Error).message}`; }
      // The refused gather was started on every rank; let it finish before the group goes.
      await new Promise((resolve) => setTimeout(resolve, 50));
      zero.dispose();
      return message;
    });
    for (const m of errors) expect(m).toMatch(/^StateError: .*cannot complete a collective synchronously/);
  });
});
