// lib/distributed/agree.ts: the one way ranks decide together (all succeed, or all throw naming the
// failed ranks; settings compared by digest; the largest of a few integers). On a cpu-only group (the
// in-process test groups), on an NCCL-only group (NcclBackend over the fake NCCL, filed under cpu, and
// under cuda:0 where the agreement tensor must go to the cuda device) and on a mixed group (cpu and
// cuda:0 communicators: the agreement goes through the cpu one). References are computed here from
// every rank's inputs.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { agree, agreeAll, agreeMax, agreementDevice, formatRanks, rangeAcrossRanks, settingsDigest } from '../../lib/distributed/agree.js';
import type { CollectiveGroup } from '../../lib/distributed/group.js';
import { localWorld } from '../../lib/testing/index.js';
import { ncclRanksClosedAfterEach } from './fake-nccl.js';

const ncclRanks = ncclRanksClosedAfterEach();

/** Runs fn on every member concurrently; each member's result, or the error it threw. */
function onEvery<T>(groups: readonly CollectiveGroup[], fn: (g: CollectiveGroup) => Promise<T>): Promise<Array<T | Error>> {
  return Promise.all(groups.map((g) => fn(g).catch((e: unknown) => e as Error)));
}
const localGroups = (n: number): Promise<CollectiveGroup[]> => localWorld(n);

/** The checks every kind of group must pass (n members). */
async function agreementChecks(groups: readonly CollectiveGroup[]): Promise<void> {
  const n = groups.length;
  // agreeMax: elementwise max against a reference over every rank's values.
  const inputs = groups.map((_, r) => [r * 7 - 5, -3 * r - 1, 2 ** 30 - r, (r * 13) % 5]);
  const want = inputs[0]!.map((_, i) => Math.max(...inputs.map((v) => v[i]!)));
  expect(await onEvery(groups, (g) => agreeMax(g, inputs[g.rank]!))).toEqual(groups.map(() => want));

  // agree: which ranks failed, whether settings differ, and the largest values, the same on every rank.
  const failing = new Set([0, n - 1]);
  const outcomes = await onEvery(groups, (g) => agree(g, failing.has(g.rank), { settings: 'same', values: [g.rank * 3] }));
  expect(outcomes).toEqual(groups.map(() => ({ failed: [...failing].sort((a, b) => a - b), settingsDiffer: false, max: [(n - 1) * 3] })));
  const differ = await onEvery(groups, (g) => agree(g, false, { settings: g.rank === 1 ? 'dp=2' : 'dp=4' }));
  expect(differ).toEqual(groups.map(() => ({ failed: [], settingsDiffer: true, max: [] })));

  // agreeAll: nothing fails → every rank returns (with the values' max).
  expect(await onEvery(groups, (g) => agreeAll(g, null, { failedElsewhere: (r) => new nt.StateError(r), values: [g.rank] })))
    .toEqual(groups.map(() => ({ failed: [], settingsDiffer: false, max: [n - 1] })));
  // Rank 1 fails: it throws its own error, every other rank the same typed error naming rank 1.
  const own = new nt.ArgumentError('rank 1 rejected its flags');
  const errs = await onEvery(groups, (g) => agreeAll(g, g.rank === 1 ? own : null, {
    failedElsewhere: (ranks) => new nt.ArgumentError(`setup rejected on ${ranks}; every rank stops`),
  }));
  expect(errs[1]).toBe(own);
  for (const [r, e] of errs.entries()) {
    if (r === 1) continue;
    expect(e).toBeInstanceOf(nt.ArgumentError);
    expect((e as Error).message).toBe('setup rejected on rank 1; every rank stops');
  }
  // Settings differ and nobody failed: every rank throws the mismatch error.
  const mism = await onEvery(groups, (g) => agreeAll(g, null, {
    failedElsewhere: (ranks) => new nt.ArgumentError(ranks), settings: `batch ${g.rank === 0 ? 8 : 4}`,
    mismatch: () => new nt.ArgumentError('different settings'),
  }));
  for (const e of mism) expect(e).toEqual(new nt.ArgumentError('different settings'));

  // rangeAcrossRanks: null when all equal, else min and max.
  expect(await onEvery(groups, (g) => rangeAcrossRanks(g, [4, -9]))).toEqual(groups.map(() => null));
  expect(await onEvery(groups, (g) => rangeAcrossRanks(g, [g.rank, 5]))).toEqual(groups.map(() => ({ min: [0, 5], max: [n - 1, 5] })));
}

describe('agreement helpers in one process', () => {
  it('without a group (or a group of one) decide alone: the own problem is thrown, values come back', async () => {
    const own = new nt.StateError('mine');
    await expect(agreeAll(null, own, { failedElsewhere: () => new nt.StateError('x') })).rejects.toBe(own);
    await expect(agreeAll(null, null, { failedElsewhere: () => new nt.StateError('x'), values: [3, 4] })).resolves.toEqual({ failed: [], settingsDiffer: false, max: [3, 4] });
    expect(await agreeMax(null, [5, -2])).toEqual([5, -2]);
    expect(await agree(null, true)).toEqual({ failed: [0], settingsDiffer: false, max: [] });
    const [one] = await localGroups(1);
    expect(await agree(one!, false, { settings: 'a', values: [1] })).toEqual({ failed: [], settingsDiffer: false, max: [1] });
  });

  it('refuses values that are not 32-bit integers, and settings without a mismatch error', async () => {
    await expect(agreeMax(null, [0.5])).rejects.toThrow(nt.ArgumentError);
    await expect(agreeMax(null, [2 ** 31])).rejects.toThrow(/32-bit integers/);
    await expect(agreeAll(null, null, { failedElsewhere: () => new Error('x'), settings: 's' })).rejects.toThrow(/mismatch/);
  });

  it('digests settings into 31 bits (so a digest and its negation are i32) and names ranks readably', () => {
    for (const s of ['', 'dp=2', 'tp·pp·dp = 2·1·2; batch 8', 'x'.repeat(1000)]) {
      const d = settingsDigest(s);
      expect(Number.isInteger(d) && d >= 0 && d <= 0x7fffffff).toBe(true);
    }
    expect(settingsDigest('dp=2')).not.toBe(settingsDigest('dp=4'));
    expect(formatRanks([3])).toBe('rank 3');
    expect(formatRanks([1, 3])).toBe('ranks 1 and 3');
    expect(formatRanks([0, 2, 5])).toBe('ranks 0, 2 and 5');
  });
});

describe('agreement on a cpu-only group (in-process ranks)', () => {
  it('goes on cpu and decides the same on every rank', async () => {
    const groups = await localGroups(3);
    expect(groups.map(agreementDevice)).toEqual(['cpu', 'cpu', 'cpu']);
    await agreementChecks(groups);
  });

  it('names failed ranks by their world rank in a subgroup', async () => {
    const worlds = await localWorld(4);
    // Subgroup of world ranks 1 and 3 (every world rank calls newGroup; 0 and 2 get non-members).
    const subs = await Promise.all(worlds.map((w) => w.newGroup([1, 3])));
    const members = [subs[1]!, subs[3]!];
    const out = await onEvery(members, (g) => agree(g, g.rank === 1));
    expect(out).toEqual([{ failed: [3], settingsDiffer: false, max: [] }, { failed: [3], settingsDiffer: false, max: [] }]);
  });
});

describe('agreement on an NCCL-only group (NcclBackend over the fake NCCL)', () => {
  it('decides through NCCL, one max all-reduce per decision', async () => {
    const { groups, fake } = await ncclRanks(3);
    fake.calls.length = 0;
    await agreementChecks(groups);
    // agreeMax 1 + agree 2 + agreeAll 3 + rangeAcrossRanks 2, on each of 3 ranks.
    expect(fake.calls.filter((c) => c === 'allReduce')).toHaveLength(8 * 3);
  });

  it('on a group that communicates only on cuda:0 the agreement tensor goes to cuda:0, not cpu', async () => {
    const { groups } = await ncclRanks(2, { deviceKey: 'cuda:0' });
    expect(groups.map(agreementDevice)).toEqual(['cuda:0', 'cuda:0']);
    // A cpu tensor is refused by such a group (what the four copies of this logic used to build):
    expect(() => groups[0]!.allReduce(nt.zeros([1]))).toThrow(/tensor is on cpu but group 'world' communicates on cuda:0/);
    if (!nt.cuda.isAvailable()) {
      // Without a GPU the helper fails making its cuda tensor (before any collective), not with the group's refusal of cpu.
      const errs = await onEvery(groups, (g) => agreeMax(g, [1]));
      for (const e of errs) expect(e).toBeInstanceOf(nt.BackendUnavailableError);
    }
    await Promise.all(groups.map((g) => (g as nt.distributed.ProcessGroup).barrier()));
  });
});

describe('agreement on a mixed group (a cpu and a cuda:0 communicator)', () => {
  it('goes through the cpu communicator and decides the same on every rank', async () => {
    const { groups, fakes } = await ncclRanks(3, { deviceKeys: ['cuda:0', 'cpu'] });
    expect(groups.map(agreementDevice)).toEqual(['cpu', 'cpu', 'cpu']);
    const [cudaFake, cpuFake] = fakes;
    cudaFake!.calls.length = 0;
    cpuFake!.calls.length = 0;
    await agreementChecks(groups);
    expect(cpuFake!.calls.filter((c) => c === 'allReduce')).toHaveLength(8 * 3);
    expect(cudaFake!.calls.filter((c) => c === 'allReduce')).toHaveLength(0);
  });
});
