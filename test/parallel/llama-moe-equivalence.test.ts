// A Llama with MoE blocks trained through the real launcher and Gloo under expert parallelism: a tiny
// Qwen2-MoE (4 experts, top-2 not renormalized, the sigmoid-gated shared expert, q/k/v biases, load-
// balancing and z-losses in the objective) trained 3 SGD steps under EP2 and EP2×DP2 matches the single
// process step by step (losses, gradient norms, the router's tokens per expert) and in its final
// parameters, compared per parameter on the ranks that hold it (experts by their global index). The
// fixture is the MoE GPT's (test/fixtures/parallel/moe-train.ts --llama); the GPT's layouts are in
// moe-equivalence.test.ts.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { type RankResult as BaseRankResult, equivalenceRunner, maxAbs, maxDiff, relDiff, root } from '../helpers/equivalence.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

const script = join(root, 'test', 'fixtures', 'parallel', 'moe-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-llama-moe-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface RankResult extends BaseRankResult { tokensPerExpert: number[][] }
const launchRun = equivalenceRunner<RankResult>({ script, work });

const ref = launchRun('ref', 0, ['--reference', '--llama', '--shared']);
const layouts = {
  'EP2': launchRun('ep2', 2, ['--ep', '2', '--llama', '--shared']),
  'EP2×DP2 (expert-data-parallel replicas)': launchRun('ep2-dp2', 4, ['--ep', '2', '--llama', '--shared']),
};
const TOLERANCE = 1e-5, PARAM_TOLERANCE = 5e-5;

describe('Llama + MoE (Qwen2-MoE) equivalence under expert parallelism (launcher + Gloo)', () => {
  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const [expectedRun, run] = await Promise.all([ref, layouts[name as keyof typeof layouts]]);
    expect(expectedRun.code, expectedRun.output).toBe(0);
    expect(run.code, run.output).toBe(0);
    const expected = expectedRun.ranks[0]!;
    expect(expected.losses[2]!).toBeLessThan(expected.losses[0]!);
    // 2 MoE layers × 64 tokens × top-2 rows a step.
    for (const t of expected.tokensPerExpert) expect(t.reduce((a, b) => a + b, 0)).toBe(256);
    const scale = Math.max(...[...expected.params.values()].map(maxAbs));
    const held = new Set<string>();
    const ep = 2;
    expect(run.ranks.length).toBe(name === 'EP2' ? 2 : 4);
    for (const r of run.ranks) {
      expect(relDiff(r.losses, expected.losses)).toBeLessThan(TOLERANCE);
      expect(relDiff(r.gradNorms, expected.gradNorms)).toBeLessThan(TOLERANCE);
      expect(r.tokensPerExpert).toEqual(expected.tokensPerExpert);
      // Rank i of each expert-parallel group holds experts [2i, 2i + 2) of each layer.
      const mine = [...new Set([...r.params.keys()].map((n) => /^layers\.0\.mlp\.experts\.(\d+)\./.exec(n)?.[1]).filter((x) => x !== undefined))];
      expect(mine).toEqual([String(2 * (r.rank % ep)), String(2 * (r.rank % ep) + 1)]);
      for (const [n, values] of r.params) {
        const want = expected.params.get(n);
        expect(want, `${n} on rank ${r.rank}`).toBeDefined();
        held.add(n);
        expect(maxDiff(values, want!) / scale, `${n} on rank ${r.rank}`).toBeLessThan(PARAM_TOLERANCE);
      }
    }
    // Every parameter (each expert, the shared expert and its gate, the biases) is held somewhere.
    for (const n of expected.params.keys()) expect(held.has(n), n).toBe(true);
    expect([...expected.params.keys()].filter((n) => /mlp\.sharedGate$|selfAttn\.qProj\.bias$/.test(n)).length).toBe(4);
    expect(expected.paramChange).toBeGreaterThan(100 * PARAM_TOLERANCE);
  }, QUEUED_TEST_TIMEOUT_MS);
});
