// lib/distributed/totals.ts (reduceTotals: the f32 totals a training step reduces — loss, counted
// tokens, a gradient norm's sums of squares — on each group's agreement device) and the one global
// gradient norm built on it (lib/optim/clip.ts's globalGradNorm), on NCCL-only groups (NcclBackend
// over the fake NCCL): filed under cpu they reduce through NCCL; filed under cuda:0 the total must go
// to cuda:0, never a host tensor the group would refuse. The trainer's files are checked to make no
// tensors of their own for collectives (every total goes through reduceTotals).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { reduceTotals } from '../../lib/distributed/totals.js';
import { globalGradNorm } from '../../lib/optim/clip.js';
import { exchangeCounts, expertParallel } from '../../lib/parallel/expert-parallel.js';
import type { CollectiveGroup } from '../../lib/distributed/group.js';
import { root } from '../helpers/equivalence.js';
import { ncclRanksClosedAfterEach } from './fake-nccl.js';

const ncclRanks = ncclRanksClosedAfterEach();
const f32 = (v: number) => Math.fround(v);

/** Runs fn on every member concurrently; each member's result, or the error it threw. */
function onEvery<T>(groups: readonly CollectiveGroup[], fn: (g: CollectiveGroup, i: number) => Promise<T>): Promise<Array<T | Error>> {
  return Promise.all(groups.map((g, i) => fn(g, i).catch((e: unknown) => e as Error)));
}

describe('reduceTotals on an NCCL-only group (fake NCCL filed under cpu)', () => {
  it('sums, then averages over a chain of groups, the same bits on every rank', async () => {
    const { groups, fake } = await ncclRanks(3);
    const mine = [[0.1, 7, -2.5], [0.2, 11, 4.25], [0.3, 13, 1]];
    fake.calls.length = 0;
    const out = await onEvery(groups, (g, i) => reduceTotals(mine[i]!, [{ group: g }, { group: g, op: 'avg' }]));
    // The fake reduces in float64 and rounds once per collective: sum, then the mean of three equal sums.
    const want = [0, 1, 2].map((k) => f32(f32(f32(mine[0]![k]!) + f32(mine[1]![k]!) + f32(mine[2]![k]!)) * 3 / 3));
    expect(out).toEqual([want, want, want]);
    // One all-reduce per group of the chain, on every rank (all values in one tensor).
    expect(fake.calls.filter((c) => c === 'allReduce')).toHaveLength(2 * 3);
  });

  it('a chain with no group of more than one rank returns the values as given (no f32 rounding, no collective)', async () => {
    const { groups, fake } = await ncclRanks(2);
    fake.calls.length = 0;
    expect(await reduceTotals([0.1, 1 / 3], [{ group: null }, { group: undefined }])).toEqual([0.1, 1 / 3]);
    expect(await reduceTotals([], [{ group: groups[0]! }])).toEqual([]);
    expect(fake.calls).toEqual([]);
  });
});

describe('globalGradNorm on an NCCL-only group', () => {
  it('each part summed over its groups, the parts added, the total summed over the outer groups', async () => {
    const { groups } = await ncclRanks(2);
    // Rank r: a sharded part (summed over the group), a part it holds whole (counted once), and an
    // outer sum over the same group (as a model-parallel group would).
    const sharded = [2.5, 1.25], whole = [0.75, 0.5];
    const out = await onEvery(groups, (g, i) => globalGradNorm([{ sumSquares: sharded[i]!, groups: [g] }, { sumSquares: whole[i]! }], [g]));
    const perRank = [0, 1].map((i) => f32(sharded[0]! + sharded[1]!) + whole[i]!);
    const want = Math.sqrt(f32(f32(perRank[0]!) + f32(perRank[1]!)));
    expect(out).toEqual([want, want]);
    // One process: the parts' plain sum, in float64.
    expect(await globalGradNorm([{ sumSquares: 0.1 }, { sumSquares: 0.2, groups: [] }])).toBe(Math.sqrt(0.1 + 0.2));
  });
});

describe('totals on a group that communicates only on cuda:0', () => {
  it('go to cuda:0: without a GPU, making the cuda tensor fails (BackendUnavailableError), not the group refusing a host tensor', async () => {
    const { groups } = await ncclRanks(2, { deviceKey: 'cuda:0' });
    // A host total is what the group refuses (what the trainer built before):
    expect(() => groups[0]!.allReduce(nt.zeros([1]))).toThrow(/tensor is on cpu but group 'world' communicates on cuda:0/);
    if (nt.cuda.isAvailable()) {
      const out = await onEvery(groups, (g, i) => reduceTotals([i + 1], [{ group: g }]));
      expect(out).toEqual([[3], [3]]);
    } else {
      const errs = await onEvery(groups, (g, i) => reduceTotals([i + 1], [{ group: g }]));
      for (const e of errs) expect(e).toBeInstanceOf(nt.BackendUnavailableError);
      const norms = await onEvery(groups, (g) => globalGradNorm([{ sumSquares: 1, groups: [g] }]));
      for (const e of norms) expect(e).toBeInstanceOf(nt.BackendUnavailableError);
    }
    await Promise.all(groups.map((g) => (g as nt.distributed.ProcessGroup).barrier()));
  });
});

describe('expert parallelism\'s router counts on a group that communicates only on cuda:0', () => {
  // exchangeCounts and sumCounts finish their collective synchronously (inside the MoE layer's
  // forward), which the in-process fake can complete only once every rank has posted: ranks of one
  // process run one after the other, so only the failure before any collective is checked here (the
  // NCCL path itself runs in test/parallel/nccl-only-equivalence.test.ts, ranks in separate processes).
  // On a GPU machine the fake, which moves host memory, cannot stand in for cuda storages: skipped there.
  it.skipIf(nt.cuda.isAvailable())('get cuda counts: without a GPU making them fails (BackendUnavailableError), not the group refusing host tensors', async () => {
    const { groups } = await ncclRanks(2, { deviceKey: 'cuda:0' });
    const mine = [[1, 2], [3, 4]];
    const exchange = (g: CollectiveGroup, i: number) => Promise.resolve().then(() => exchangeCounts(mine[i]!, 1, g));
    const sum = (g: CollectiveGroup, i: number) => Promise.resolve().then(() => expertParallel({ experts: 2, epGroup: null, countGroup: g }).sumCounts!(mine[i]!));
    for (const e of await onEvery(groups, exchange)) expect(e).toBeInstanceOf(nt.BackendUnavailableError);
    for (const e of await onEvery(groups, sum)) expect(e).toBeInstanceOf(nt.BackendUnavailableError);
    await Promise.all(groups.map((g) => (g as nt.distributed.ProcessGroup).barrier()));
  });
});

describe('the trainer makes no tensors of its own for collectives', () => {
  it('trainer.ts, families.ts and trainer-checks.ts import no tensor factory (totals go through reduceTotals, gradients are the parameters\')', () => {
    for (const file of ['trainer.ts', 'families.ts', 'trainer-checks.ts']) {
      const text = readFileSync(join(root, 'lib', 'parallel', file), 'utf8');
      expect(text, file).not.toMatch(/from '\.\.\/creation\.js'/);
      expect(text, file).not.toMatch(/new Float32Array\(\[/);
    }
  });
});
