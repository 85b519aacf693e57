// MoE GPT training through the real launcher and Gloo: a tiny GPT whose blocks hold 4 experts (top-2,
// load-balancing and z-losses) trained 3 steps under expert parallelism (EP2, EP4, EP2×DP2 with the
// experts replicated over the expert-data-parallel ranks), plain DP, EP with TP and with PP (micro-
// batches, recomputation), a shared expert, a capacity factor, EP2×DP2 under ZeRO 1, 2 and 3 (experts
// sharded over the expert-data-parallel group) and EP2×PP2 under ZeRO 3, matches the single process step by
// step (losses, gradient norms, the router's tokens per expert) and in its final parameters, compared
// per parameter on the ranks that hold it (experts by their global index); bad layouts fail on every rank.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type RankResult as BaseRankResult, type Trained as BaseTrained, equivalenceRunner, gptTensorParallelSlice, maxAbs, maxDiff, relDiff, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const script = join(root, 'test', 'fixtures', 'parallel', 'moe-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-moe-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface RankResult extends BaseRankResult { tokensPerExpert: number[][] }
type Trained = BaseTrained<RankResult>;

// nproc 0: the reference runs as a plain process, without the launcher.
const launchRun = equivalenceRunner<RankResult>({ script, work });


type Ref = 'plain' | 'm2' | 'm2dp2' | 'shared' | 'capacityM2' | 'm2l4';
const refs: Record<Ref, Promise<Trained>> = {
  plain: launchRun('ref', 0, ['--reference']),
  m2: launchRun('ref-m2', 0, ['--reference', '--micro-batches', '2']),
  m2dp2: launchRun('ref-m2-dp2', 0, ['--reference', '--micro-batches', '2', '--ref-dp', '2']),
  shared: launchRun('ref-shared', 0, ['--reference', '--shared']),
  capacityM2: launchRun('ref-capacity-m2', 0, ['--reference', '--capacity', '1', '--micro-batches', '2']),
  // 4 layers, for interleaved 1F1B's 2 stages × 2 model chunks.
  m2l4: launchRun('ref-m2-l4', 0, ['--reference', '--micro-batches', '2', '--layers', '4']),
};
/** Layers of each reference's model (2 unless --layers). */
const LAYERS: Partial<Record<Ref, number>> = { m2l4: 4 };
const layouts: Record<string, [Ref, Promise<Trained>]> = {
  'DP2 (experts replicated, router counts summed)': ['plain', launchRun('dp2', 2, ['--dp', '2'])],
  'EP2': ['plain', launchRun('ep2', 2, ['--ep', '2'])],
  'EP4': ['plain', launchRun('ep4', 4, ['--ep', '4'])],
  'EP2×DP2 (expert-data-parallel replicas)': ['plain', launchRun('ep2-dp2', 4, ['--ep', '2', '--dp', '4'])],
  'EP2×DP2 with a shared expert': ['shared', launchRun('ep2-dp2-shared', 4, ['--ep', '2', '--shared'])],
  'EP2 with TP2 attention': ['plain', launchRun('ep2-tp2', 4, ['--ep', '2', '--tp', '2'])],
  'PP2 1F1B, 2 micro-batches, recompute': ['m2', launchRun('pp2', 2, ['--pp', '2', '--micro-batches', '2', '--recompute'])],
  'EP2×PP2 GPipe, 2 micro-batches, recompute': ['m2dp2', launchRun('ep2-pp2', 4, ['--ep', '2', '--pp', '2', '--micro-batches', '2', '--schedule', 'gpipe', '--recompute'])],
  'PP2 with a capacity factor (drops), 2 micro-batches': ['capacityM2', launchRun('pp2-capacity', 2, ['--pp', '2', '--micro-batches', '2', '--capacity', '1'])],
  // The other schedules: interleaved 1F1B (each rank two non-adjacent MoE blocks) and ZB-H1 (the experts'
  // weight GEMMs deferred to the W pass; under EP their 1/ep gradient scale sits between GEMM and weight).
  'PP2 interleaved (2 virtual stages), 4 layers, 2 micro-batches': ['m2l4', launchRun('pp2-interleaved', 2, ['--pp', '2', '--virtual-stages', '2', '--layers', '4', '--micro-batches', '2'])],
  'EP2×PP2 ZB-H1, 2 micro-batches': ['m2dp2', launchRun('ep2-pp2-zb', 4, ['--ep', '2', '--pp', '2', '--micro-batches', '2', '--schedule', 'zb-h1'])],
  // ZeRO: the experts sharded over their expert-data-parallel pair, everything else over the four data-parallel ranks.
  'EP2×DP2 ZeRO 1': ['plain', launchRun('ep2-dp2-zero1', 4, ['--ep', '2', '--dp', '4', '--zero', '1'])],
  'EP2×DP2 ZeRO 2': ['plain', launchRun('ep2-dp2-zero2', 4, ['--ep', '2', '--dp', '4', '--zero', '2'])],
  'EP2×DP2 ZeRO 3': ['plain', launchRun('ep2-dp2-zero3', 4, ['--ep', '2', '--dp', '4', '--zero', '3'])],
  'EP2×PP2 ZeRO 3, 1F1B, 2 micro-batches': ['m2dp2', launchRun('ep2-pp2-zero3', 4, ['--ep', '2', '--pp', '2', '--micro-batches', '2', '--zero', '3'])],
  // ep = dp: no copies of an expert, so the experts keep a plain optimizer beside ZeRO's shards of the rest.
  'EP2 ZeRO 2 (experts unsharded, one copy each)': ['plain', launchRun('ep2-zero2', 2, ['--ep', '2', '--zero', '2'])],
};
const errors = {
  'ep not dividing dp': [launchRun('bad-ep-dp', 4, ['--ep', '3', '--dp', '4']), /--ep 3 must divide the data-parallel size dp = 4/],
  'ep not dividing the experts': [launchRun('bad-ep-experts', 4, ['--ep', '4', '--experts', '6']), /--ep 4 must divide the model's 6 experts/],
  'top-k above the experts': [launchRun('bad-topk', 2, ['--ep', '2', '--top-k', '5']), /topK \(5\) must not exceed the number of experts \(4\)/],
} as const;
const TOLERANCE = 1e-5, PARAM_TOLERANCE = 5e-5;

describe('MoE equivalence (launcher + Gloo)', () => {
  it('the single-process references train and route', async () => {
    for (const [name, ref] of Object.entries(refs)) {
      const r = await ref;
      expect(r.code, r.output).toBe(0);
      const { losses, tokensPerExpert } = r.ranks[0]!;
      expect(losses[2]!).toBeLessThan(losses[0]!);
      // layers × 64 tokens × top-2 rows a step; the initial router spreads them over all 4 experts (the
      // large learning rate may starve an expert later, which the layouts then handle too).
      for (const t of tokensPerExpert) expect(t.reduce((a, b) => a + b, 0)).toBe((LAYERS[name as Ref] ?? 2) * 128);
      expect(tokensPerExpert[0]!.every((v) => v > 0)).toBe(true);
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const [refName, pending] = layouts[name]!;
    const [ref, run] = await Promise.all([refs[refName], pending]);
    expect(run.code, run.output).toBe(0);
    const expected = ref.ranks[0]!;
    const scale = Math.max(...[...expected.params.values()].map(maxAbs));
    const tp = Math.max(...run.ranks.map((r) => r.coords.tp)) + 1;
    const held = new Set<string>();
    for (const r of run.ranks) {
      expect(relDiff(r.losses, expected.losses)).toBeLessThan(TOLERANCE);
      expect(relDiff(r.gradNorms, expected.gradNorms)).toBeLessThan(TOLERANCE);
      // Router counts summed over the data-parallel ranks: the whole batch's (a pipeline stage counts its own layer).
      if (run.ranks.every((x) => x.coords.pp === 0)) expect(r.tokensPerExpert).toEqual(expected.tokensPerExpert);
      for (const [n, values] of r.params) {
        const full = expected.params.get(n);
        expect(full, `${n} on rank ${r.rank}`).toBeDefined();
        const want = gptTensorParallelSlice(n, full!, expected.shapes.get(n)!, tp, r.coords.tp);
        held.add(want.length < full!.length ? `${n} [tp ${r.coords.tp}]` : n);
        expect(maxDiff(values, want) / scale, `${n} on rank ${r.rank}`).toBeLessThan(PARAM_TOLERANCE);
      }
    }
    // Every expert of every layer is held somewhere.
    const experts = [...expected.params.keys()].filter((n) => /experts\.\d+\./.test(n));
    expect(experts.length).toBe((LAYERS[refName] ?? 2) * 4 * 3);
    for (const n of experts) expect(held.has(n), n).toBe(true);
    expect(expected.paramChange).toBeGreaterThan(100 * PARAM_TOLERANCE);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('under EP each rank holds only its experts, named by their global index', async () => {
    const run = await layouts['EP2×DP2 (expert-data-parallel replicas)']![1];
    expect(run.code, run.output).toBe(0);
    const expertsOf = (r: RankResult) => [...new Set([...r.params.keys()].map((n) => /^h\.0\.mlp\.experts\.(\d+)\./.exec(n)?.[1]).filter((x) => x !== undefined))];
    // dp ranks 0, 1 form an expert-parallel group, 2, 3 another; ranks 0 and 2 (and 1 and 3) are replicas.
    expect(expertsOf(run.ranks[0]!)).toEqual(['0', '1']);
    expect(expertsOf(run.ranks[1]!)).toEqual(['2', '3']);
    expect(expertsOf(run.ranks[2]!)).toEqual(['0', '1']);
    expect(expertsOf(run.ranks[3]!)).toEqual(['2', '3']);
    for (const [n, v] of run.ranks[0]!.params) expect(maxDiff(v, run.ranks[2]!.params.get(n)!), n).toBe(0);
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(errors))('%s: every rank stops with a clear ArgumentError', async (name) => {
    const [pending, message] = errors[name as keyof typeof errors];
    const run = await pending;
    expect(run.code, run.output).not.toBe(0);
    expect(run.output).toMatch(/error: ArgumentError/);
    expect(run.output).toMatch(message);
  }, QUEUED_TEST_TIMEOUT_MS);
});
