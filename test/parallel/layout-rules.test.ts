// One layout rule book (layoutProblems in lib/parallel/layout.ts) for the command-line flags, the
// trainer and the planner: every layout the planner proposes passes the trainer's layout checks with
// the flags its launch command sets, and over a grid of layouts the planner accepts only what the
// trainer accepts (so what the trainer refuses, the planner refuses).
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { layoutProblems, type LayoutFlags, type LayoutModelShape, type TrainingLayout } from '../../lib/parallel/layout.js';
import { checkTrainerSetup } from '../../lib/parallel/trainer-checks.js';
import type { PlanLayout, PlanModel } from '../../lib/plan/index.js';

const GiB = 2 ** 30;

/** The flags a `nodetron launch` of this layout sets (as launchCommand writes them). */
function flagsOf(l: PlanLayout): LayoutFlags {
  return { tp: l.tp, pp: l.pp, dp: l.dp, zero: l.zero, offload: l.offload, sequenceParallel: l.sequenceParallel, microBatches: l.microBatches,
    schedule: l.schedule, ...(l.schedule === 'interleaved' ? { virtualStages: l.virtualStages ?? 1 } : {}),
    ...((l.cp ?? 1) > 1 ? { cp: l.cp, cpMode: l.cpMode ?? 'ring' } : {}), ...((l.ep ?? 1) > 1 ? { ep: l.ep } : {}) };
}

/** What the flags path knows of a plan model trained at sequence length `seq`. */
const shapeOf = (m: PlanModel, seq: number): LayoutModelShape => ({ nLayer: m.nLayer, nHead: m.nHead, nEmbd: m.nEmbd, vocabSize: m.vocabSize, blockSize: seq,
  ...(m.moe ? { moeExperts: m.moe.experts } : {}) });

/** The trainer's verdict: the resolved layout, or the ArgumentError's message. */
function trainer(l: PlanLayout, m: PlanModel, seq: number, world: number, batch: number): TrainingLayout | string {
  try { return nt.parallel.resolveTrainingLayout(flagsOf(l), shapeOf(m, seq), world, batch); } catch (e) {
    if (!(e instanceof nt.ArgumentError)) throw e;
    return e.message;
  }
}

const base = plan.PLAN_MODELS.gpt2!;
/** The rules whose facts the flags path does not have (the model builder checks the first two; the third is the planner's choice). */
const PLANNER_ONLY = /key\/value heads|MLP width|micro-batch size/;
// Small shapes whose divisibility differs: 6 layers, 6 heads and an odd vocabulary; 4 layers of 4
// heads (1 key/value head, Llama-shaped, an MLP width of 686 that tp 4 does not divide); an MoE of 4 experts; 8 layers of 12 heads.
const tiny: PlanModel[] = [
  { ...base, name: 'odd', nLayer: 6, nHead: 6, nEmbd: 384, ffn: 1536, vocabSize: 50257 },
  { ...base, name: 'gqa', nLayer: 4, nHead: 4, nKvHead: 1, nEmbd: 256, ffn: 686, vocabSize: 32000, gated: true, tied: false, bias: false, positions: 0 },
  { ...base, name: 'moe', nLayer: 4, nHead: 4, nEmbd: 256, ffn: 1024, vocabSize: 512, moe: { experts: 4, topK: 2, ffn: 512, sharedFfn: 0, every: 1 } },
  { ...base, name: 'deep', nLayer: 8, nHead: 12, nEmbd: 768, ffn: 3072 },
];

describe('one layout rule book', () => {
  it('every layout the planner proposes passes the trainer\'s checks, as the same layout', () => {
    let proposed = 0, skipped = 0;
    const models = [...tiny, plan.PLAN_MODELS['gpt2-xl']!, plan.PLAN_MODELS['70b']!];
    for (const m of models) for (const gpus of [2, 4, 8]) for (const seq of [256, 1000]) {
      const batch = 16;
      const c = plan.planLayouts(m, { gpus, gpuMemory: 80 * GiB, seq, globalBatch: batch, microBatchSize: 2, dtype: 'bf16', device: plan.resolveDevice('h100') });
      for (const x of c) {
        if (x.skipped) {
          skipped++;
          // A skip reason is one of the trainer's own refusals of that layout (or a planner-only fact: key/value heads, MLP width, micro-batch size).
          const t = trainer(x.layout, m, seq, gpus, batch);
          if (typeof t !== 'string') expect(x.skipped, `${m.name} ${JSON.stringify(x.layout)}`).toMatch(PLANNER_ONLY);
          else if (!PLANNER_ONLY.test(x.skipped)) expect(t).toContain(x.skipped);
          continue;
        }
        proposed++;
        const t = trainer(x.layout, m, seq, gpus, batch);
        expect(t, `${m.name} on ${gpus}, seq ${seq}: ${JSON.stringify(x.layout)}`).not.toBeTypeOf('string');
        const { recompute: _, ...layout } = x.layout;
        expect(t).toEqual({ virtualStages: 1, ...layout });
      }
    }
    // Not vacuous: both kinds, many of each.
    expect(proposed).toBeGreaterThan(1000);
    expect(skipped).toBeGreaterThan(50);
  });

  it('over a grid of layouts, planner acceptance implies trainer acceptance', () => {
    const seq = 96, batch = 16;
    let accepted = 0, refusedByBoth = 0, refusedByPlannerOnly = 0;
    // (zero, offload): ZeRO 0-2, and offload with and without ZeRO.
    const zeros = [[0, false], [1, true], [2, false], [0, true]] as const;
    for (const m of tiny) for (const tp of [1, 2, 3, 4]) for (const pp of [1, 2, 4]) for (const dp of [1, 2, 4]) for (const cp of [1, 2])
      for (const cpMode of cp > 1 ? ['ring', 'ulysses'] as const : [undefined]) for (const ep of [1, 2]) for (const [zero, offload] of zeros)
        for (const sequenceParallel of [false, true]) for (const schedule of ['1f1b', 'gpipe', 'interleaved', 'zb-h1', 'zb-v'] as const)
          for (const microBatches of [1, 2, 3]) {
            const l: PlanLayout = { tp, pp, dp, zero, offload, recompute: 'none', sequenceParallel, microBatches, schedule,
              ...(schedule === 'interleaved' || schedule === 'zb-v' ? { virtualStages: 2 } : {}), ...(cpMode ? { cp, cpMode } : {}), ...(ep > 1 ? { ep } : {}) };
            const b = batch % (dp * microBatches) === 0 ? batch / (dp * microBatches) : 1;
            const planner = plan.layoutProblem(m, l, seq, batch, b);
            const world = tp * pp * dp * cp;
            const t = trainer(l, m, seq, world, batch);
            if (planner === null) {
              accepted++;
              expect(t, `${m.name} ${JSON.stringify(l)}`).not.toBeTypeOf('string');
            } else if (typeof t === 'string') {
              refusedByBoth++;
              // The planner's first reason is among the trainer's, word for word (one rule book), unless
              // it is a fact only the planner knows (key/value heads, MLP width, micro-batch size).
              if (!PLANNER_ONLY.test(planner)) expect(t).toContain(planner);
            } else {
              refusedByPlannerOnly++;
              expect(planner).toMatch(PLANNER_ONLY);
            }
          }
    expect(accepted).toBeGreaterThan(1000);
    expect(refusedByBoth).toBeGreaterThan(1000);
    expect(refusedByPlannerOnly).toBeGreaterThan(0);
  });

  it('the rules name each problem once with its numbers, and report bad counts alone', () => {
    const shape = { nLayer: 4, nHead: 4, nEmbd: 64, vocabSize: 96, seqLen: 32, worldSize: 4, globalBatch: 8 };
    const l = { tp: 1, pp: 2, dp: 2, zero: 0, offload: false, sequenceParallel: false, microBatches: 3, schedule: 'interleaved', virtualStages: 2 } as const;
    expect(layoutProblems(shape, l)).toEqual([
      'dp·micro-batches = 2·3 does not divide the global batch of 8 sequences',
      '--schedule interleaved needs --micro-batches to be a multiple of --pp (as Megatron-LM requires): 3 micro-batches over 2 stages',
    ]);
    expect(layoutProblems(shape, { ...l, microBatches: 4 })).toEqual([]);
    expect(layoutProblems(shape, { ...l, tp: 0, microBatches: 1.5 })).toEqual(['--tp must be an integer >= 1, got 0', '--micro-batches must be an integer >= 1, got 1.5']);
    // Absent facts are not checked: no layers, no pipeline-depth rule.
    expect(layoutProblems({}, { ...l, pp: 8, dp: 1, microBatches: 8 })).toEqual([]);
    expect(layoutProblems({ nLayer: 4 }, { ...l, pp: 8, dp: 1, microBatches: 8 })).toEqual([
      '--pp 8 is more pipeline stages than the model\'s 4 layers', '--pp 8 × --virtual-stages 2 = 16 model chunks, more than the model\'s 4 layers']);
    // zero-bubble + expert parallelism + ZeRO >= 2: one rule, in the flags, the planner and the trainer alike.
    const { virtualStages: _, ...zb } = { ...l, pp: 2, dp: 2, ep: 2, zero: 2, schedule: 'zb-h1', microBatches: 2 } as const;
    expect(layoutProblems({ moeExperts: 4 }, zb)).toEqual(['--schedule zb-h1 with --ep 2 and --zero 2 is not supported yet (the experts\' ZeRO 2 would reduce before each W): use --zero 0 or 1 with expert parallelism']);
    expect(() => nt.parallel.resolveTrainingLayout(zb, { nLayer: 4, nHead: 4, nEmbd: 64, vocabSize: 96, moeExperts: 4 }, 8, 8)).toThrow(layoutProblems({ moeExperts: 4 }, zb)[0]!);
  });

  it('the trainer refuses by the same rules, in the same words', () => {
    const config = { vocabSize: 32, blockSize: 8, nLayer: 2, nHead: 2, nEmbd: 16, dropout: 0, bias: true };
    const check = (stage: nt.parallel.pp.GPTStage, options: Record<string, unknown>): string => {
      const params = stage.parameters();
      try { checkTrainerSetup(stage, [{ params, lr: 1e-3 }], { mesh: null, createOptimizer: () => { throw new Error('unused'); }, ...options } as never); } catch (e) {
        if (!(e instanceof nt.ArgumentError)) throw e;
        return e.message;
      }
      return '';
    };
    const stage = new nt.parallel.pp.GPTStage(new nt.nn.GPT(config), 0, 1);
    expect(check(stage, {})).toBe('');
    const flags = (f: LayoutFlags) => { try { nt.parallel.resolveTrainingLayout(f, config, 1, 4); } catch (e) { return (e as Error).message; } return ''; };
    for (const [options, f] of [[{ zero: 1 }, { zero: 1 }], [{ offload: true }, { offload: true }], [{ schedule: 'interleaved' }, { schedule: 'interleaved' }],
      [{ microBatches: 0 }, { microBatches: 0 }], [{ zero: 5 }, { zero: 5 }]] as const) {
      const rule = layoutProblems({}, { tp: 1, pp: 1, dp: 1, zero: 0, offload: false, sequenceParallel: false, microBatches: 1, schedule: '1f1b', ...options } as never)[0]!;
      expect(rule, JSON.stringify(options)).toBeTruthy();
      expect(check(stage, options)).toContain(rule);
      expect(flags(f)).toContain(rule);
    }
  });
});
