// Straggler scores from per-step metrics (lib/observe/metrics.ts): each step is scored against the
// lower median rank of the same step, warm-up steps are skipped, the threshold names ranks, bad options
// are ArgumentErrors; the debug slow-rank variable is parsed strictly.
import { afterEach, describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { debugSlowdown, formatStragglers, lowerMedian, stragglerScores, type StepMetrics } from '../../lib/observe/metrics.js';

function rows(rank: number, compute: number[], step = 100): StepMetrics[] {
  return compute.map((c, i) => ({
    step: i + 1, rank, time: i, stepMs: step, computeMs: c, cpuMs: c / 2, loss: 1, tokens: 10, tokensPerSec: 100, allocatedBytes: 1, peakBytes: 2, rssBytes: 3, device: 'cpu',
  }));
}

describe('stragglerScores', () => {
  it('lowerMedian takes the lower middle element', () => {
    expect(lowerMedian([3, 1, 2])).toBe(2);
    expect(lowerMedian([4, 1, 3, 2])).toBe(2);
    expect(lowerMedian([])).toBeNaN();
  });

  it('scores each rank against the lower median of the ranks and names the slow one', () => {
    // Rank 2 computes 30% longer; the first step (warm-up, huge) is skipped by default.
    const m = new Map([[0, rows(0, [900, 50, 52, 48])], [1, rows(1, [10, 51, 49, 50])], [2, rows(2, [10, 65, 66, 64])], [3, rows(3, [10, 50, 50, 50])]]);
    const r = stragglerScores(m, { metric: 'computeMs' });
    expect(r.referenceMs).toBe(50);
    expect(r.ranks.map((x) => x.medianMs)).toEqual([50, 50, 65, 50]);
    expect(r.ranks.map((x) => x.score)).toEqual([1, 1, 1.3, 1]);
    expect(r.stragglers).toEqual([2]);
    expect(formatStragglers(r)).toMatch(/\n\s+2\s+3\s+65\.0\s+100\.0\s+1\.30\s+STRAGGLER\n/);
    expect(formatStragglers(r)).toContain('straggler(s): rank 2 (score 1.30)');
    // Without skipping, rank 0's warm-up step does not move its median (median of 4 = 50).
    expect(stragglerScores(m, { skip: 0, metric: 'computeMs' }).stragglers).toEqual([2]);
    // On cpu records, 'auto' scores CPU time (here half the wall time: the same scores).
    const auto = stragglerScores(m);
    expect(auto.metric).toBe('cpuMs');
    expect(auto.referenceMs).toBe(25);
    expect(auto.ranks.map((x) => x.score)).toEqual([1, 1, 1.3, 1]);
    // Records from a GPU: wall time.
    const gpu = new Map([...m].map(([k, v]) => [k, v.map((x) => ({ ...x, device: 'cuda:0' }))]));
    expect(stragglerScores(gpu).metric).toBe('computeMs');
    // A higher threshold names nobody; step time (equal on every rank) names nobody either.
    expect(stragglerScores(m, { threshold: 1.5 }).stragglers).toEqual([]);
    expect(stragglerScores(m, { metric: 'stepMs' }).ranks.every((x) => x.score === 1)).toBe(true);
  });

  it('with two ranks the faster is the reference; slowest straggler first', () => {
    expect(stragglerScores({ 0: rows(0, [0, 10, 10]), 1: rows(1, [0, 20, 20]) }).ranks.map((x) => x.score)).toEqual([1, 2]);
    const r = stragglerScores({ 0: rows(0, [0, 10]), 1: rows(1, [0, 13]), 2: rows(2, [0, 10]), 3: rows(3, [0, 20]), 4: rows(4, [0, 10]) });
    expect(r.stragglers).toEqual([3, 1]);
  });

  it('scores each step against the same step of the other ranks', () => {
    // Every rank speeds up as it warms (40, 30, then 20 ms); rank 3 has written only its first two
    // steps when the metrics are read (a live dashboard): its median (30) against the others' (20)
    // would be 1.5, but step for step it is as fast as they are.
    const warm = [40, 30, 20, 20, 20];
    const m = { 0: rows(0, warm), 1: rows(1, warm), 2: rows(2, warm.map((x) => x * 1.3)), 3: rows(3, warm.slice(0, 2)) };
    const r = stragglerScores(m, { metric: 'computeMs' });
    expect(r.ranks.map((x) => x.score)).toEqual([1, 1, 1.3, 1]);
    expect(r.stragglers).toEqual([2]);
    // A step only a minority of the ranks recorded has no reference: rank 2 ahead by five slow steps
    // (its median 100 ms) is scored on the steps the others recorded too.
    const ahead = stragglerScores({ ...m, 2: rows(2, [...warm, 100, 100, 100, 100, 100]) }, { metric: 'computeMs' });
    expect(ahead.ranks[2]!.score).toBe(1);
  });

  it('rejects bad options', () => {
    expect(() => stragglerScores({}, { threshold: 0 })).toThrow(ArgumentError);
    expect(() => stragglerScores({}, { skip: -1 })).toThrow(ArgumentError);
    expect(() => stragglerScores({}, { metric: 'x' as 'stepMs' })).toThrow(/cpuMs/);
  });
});

describe('NODETRON_DEBUG_SLOW_RANK', () => {
  const saved = process.env.NODETRON_DEBUG_SLOW_RANK;
  afterEach(() => { if (saved === undefined) delete process.env.NODETRON_DEBUG_SLOW_RANK; else process.env.NODETRON_DEBUG_SLOW_RANK = saved; });
  it('names one rank and a fraction (default 0.3)', () => {
    process.env.NODETRON_DEBUG_SLOW_RANK = '2';
    expect([debugSlowdown(1), debugSlowdown(2)]).toEqual([0, 0.3]);
    process.env.NODETRON_DEBUG_SLOW_RANK = '1:0.5';
    expect([debugSlowdown(1), debugSlowdown(2)]).toEqual([0.5, 0]);
    process.env.NODETRON_DEBUG_SLOW_RANK = 'two';
    expect(() => debugSlowdown(0)).toThrow(/RANK:FRACTION/);
  });
});
