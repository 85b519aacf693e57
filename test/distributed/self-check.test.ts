// The self-check's arithmetic: the tournament schedule meets every pair exactly once with each rank
// in at most one pair per round, and the analysis names a slow rank (its links against the links
// that do not touch it), a slow link between healthy ranks, and a failed link.
import { describe, expect, it } from 'vitest';
import { analyzeSelfCheck, formatSelfCheck, tournamentRounds } from '../../lib/distributed/self-check.js';

describe('self-check', () => {
  it('tournament rounds: every pair once, disjoint pairs per round', () => {
    for (let n = 1; n <= 9; n++) {
      const rounds = tournamentRounds(n);
      const seen = new Set<string>();
      for (const round of rounds) {
        const busy = new Set<number>();
        for (const [a, b] of round) {
          expect(a).toBeLessThan(b);
          expect(busy.has(a) || busy.has(b)).toBe(false);
          busy.add(a); busy.add(b);
          expect(seen.has(`${a}-${b}`)).toBe(false);
          seen.add(`${a}-${b}`);
        }
      }
      expect(seen.size).toBe((n * (n - 1)) / 2);
      expect(rounds.length).toBe(n % 2 === 0 ? n - 1 : n);
    }
  });

  type Rec = Parameters<typeof analyzeSelfCheck>[0][number];
  function records(n: number, ms: (a: number, b: number) => number, fail?: [number, number]): Rec[] {
    return Array.from({ length: n }, (_, r) => {
      const links: Rec['links'] = {};
      for (let p = 0; p < n; p++) {
        if (p === r) continue;
        const [a, b] = r < p ? [r, p] : [p, r];
        links[`${a}-${b}`] = fail && fail[0] === a && fail[1] === b ? { ms: NaN, error: 'timed out' } : { ms: ms(a, b) };
      }
      return { rank: r, host: `h${r >> 1}`, allReduceMs: 2, links };
    });
  }
  const opts = { bytes: 4 * 2 ** 20, threshold: 2, elapsedMs: 10 };

  it('passes a healthy world', () => {
    const r = analyzeSelfCheck(records(4, () => 5), opts);
    expect(r.verdict).toBe('ok');
    expect(r.ranks.every((x) => x.score === 1)).toBe(true);
    expect(r.links[0]!.gbps).toBeCloseTo(4 * 2 ** 20 / 0.005 / 1e9, 6);
    expect(r.allReduce.busGbps).toBeCloseTo(1.5 * 4 * 2 ** 20 / 0.002 / 1e9, 6);
    expect(formatSelfCheck(r)).toMatch(/verdict: OK/);
  });

  it.each([3, 4, 6])('names a slow rank among %i (its links 4x as long)', (n) => {
    const r = analyzeSelfCheck(records(n, (a, b) => (a === 2 || b === 2 ? 20 : 5)), opts);
    expect(r.verdict).toBe('slow');
    expect(r.slowRanks).toEqual([2]);
    expect(r.ranks[2]!.score).toBe(4);
    // The slow rank explains its links: none is named on its own.
    expect(r.links.filter((l) => l.slow)).toEqual([]);
    expect(formatSelfCheck(r)).toMatch(/rank 2 \(h1\) is slow: its links take 4\.00x as long as the others/);
  });

  it('names a slow link between healthy ranks, and a host all of whose ranks are slow', () => {
    const link = analyzeSelfCheck(records(4, (a, b) => (a === 0 && b === 3 ? 30 : 5)), opts);
    expect(link.slowRanks).toEqual([]);
    expect(link.links.filter((l) => l.slow).map((l) => `${l.a}-${l.b}`)).toEqual(['0-3']);
    // Hosts h0 = {0, 1}, h1 = {2, 3}, h2 = {4, 5}: every link of h1's ranks slow.
    const host = analyzeSelfCheck(records(6, (a, b) => ((a >> 1) === 1 || (b >> 1) === 1 ? 25 : 5)), opts);
    expect(host.slowRanks.sort()).toEqual([2, 3]);
    expect(host.slowHosts).toEqual(['h1']);
  });

  it('fails on a failed link, naming it; links nobody got to are untested, not failed', () => {
    const recs = records(4, () => 5, [1, 3]);
    delete recs[0]!.links['0-2']; delete recs[2]!.links['0-2'];
    recs[0]!.stopped = 'a barrier between rounds failed';
    const r = analyzeSelfCheck(recs, opts);
    expect(r.links.find((x) => x.a === 0 && x.b === 2)!.untested).toBe(true);
    expect(r.stoppedRanks).toEqual([0]);
    expect(formatSelfCheck(r)).toMatch(/1 link\(s\) untested/);
    expect(r.verdict).toBe('failed');
    const l = r.links.find((x) => x.a === 1 && x.b === 3)!;
    expect(l.error).toContain('timed out');
    expect(formatSelfCheck(r)).toMatch(/link 1-3 failed/);
  });
});
