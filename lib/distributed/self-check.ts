// The pre-flight self-check (`nodetron launch --self-check`, NODETRON_SELF_CHECK=1|strict): before
// init() returns, the world runs a short allreduce, then an exchange (send and recv at once, a few
// MB) between every pair of ranks, pairs scheduled in rounds as a round-robin tournament (each rank
// in one pair per round). Each link's median time is compared with the others: a rank whose links
// are slower than the links that do not touch it (by `threshold`, default 2) is named, as is a slow
// link whose ranks are not, and a link that fails. Rank 0 prints one summary; a failed link fails
// init() on every rank (CommError, so the launcher stops the job with a non-zero exit); a slow rank
// or link is a warning, or a CommError too in strict mode. MegaScale's pre-flight network tests are
// the model. The results meet through the rendezvous store, so a broken link cannot hide them.
// NODETRON_DEBUG_SLOW_RANK=R[:F] delays rank R's sends by F times the link's longest exchange, and
// NODETRON_DEBUG_SELF_CHECK_DROP=A-B makes rank A never send to B (tests).
import { hostname } from 'node:os';
import { zeros } from '../creation.js';
import { ArgumentError, CommError } from '../errors.js';
import type { Store } from './store-api.js';
import type { ProcessGroup } from './group.js';
import { debugSlowdown, lowerMedian } from '../observe/metrics.js';

/** Options of {@link selfCheck}. */
export interface SelfCheckOptions {
  /** Bytes each rank sends per exchange and reduces in the allreduce (default 4 MiB). */
  bytes?: number;
  /** Timed repetitions per link (default 5, after one warm-up). */
  reps?: number;
  /** A rank or link this many times slower than its reference is named (default 2). */
  threshold?: number;
  /** Fail (CommError) on slow ranks or links too, not only on failed links (default false: warn). */
  strict?: boolean;
  /** Timeout of each exchange (ms; default 60 000). */
  timeoutMs?: number;
  /** Where the summary goes on rank 0 (default: stderr). */
  log?: (text: string) => void;
}

/** One link's result. */
export interface SelfCheckLink {
  /** The lower rank. */
  a: number;
  /** The higher rank. */
  b: number;
  /** Median exchange time over the reps, the slower of the two ends (ms); NaN when failed. */
  ms: number;
  /** Bytes moved per direction / time (GB/s). */
  gbps: number;
  /** ms / the median link's ms. */
  ratio: number;
  /** Why the link failed (its ranks' errors). */
  error?: string;
  /** Neither rank got to it: the check stopped after another failure. */
  untested?: boolean;
  /** Named slow (and not explained by a slow rank). */
  slow: boolean;
}

/** One rank's result. */
export interface SelfCheckRank {
  /** Global rank. */
  rank: number;
  /** Its host name. */
  host: string;
  /** Median time of its links / median time of the links not touching it (NaN with fewer than 3 ranks). */
  score: number;
  /** Named slow. */
  slow: boolean;
}

/** What the self-check found (the same on every rank). */
export interface SelfCheckReport {
  /** Ranks in the world. */
  worldSize: number;
  /** Bytes per exchange. */
  bytes: number;
  /** The allreduce over the world. */
  allReduce: {
    /** Median time (ms). */
    ms: number;
    /** Bus bandwidth, 2(n-1)/n · bytes / time (GB/s). */
    busGbps: number;
    /** Why it failed. */
    error?: string;
  };
  /** Every pair of ranks. */
  links: SelfCheckLink[];
  /** Every rank. */
  ranks: SelfCheckRank[];
  /** Ranks that stopped early because another rank gave up (after a failure elsewhere). */
  stoppedRanks: number[];
  /** Ranks named slow, slowest first. */
  slowRanks: number[];
  /** Hosts all of whose ranks are slow (jobs over more than one host). */
  slowHosts: string[];
  /** ok: nothing named; slow: something slow; failed: a link or the allreduce failed. */
  verdict: 'ok' | 'slow' | 'failed';
  /** The whole check (ms). */
  elapsedMs: number;
}

/** NODETRON_DEBUG_SELF_CHECK_DROP=A-B: rank A never sends to rank B in the self-check (a failed link, for tests); the peer A drops, or -1. */
function debugDroppedPeer(rank: number): number {
  const v = process.env.NODETRON_DEBUG_SELF_CHECK_DROP;
  if (!v) return -1;
  const m = /^(\d+)-(\d+)$/.exec(v.trim());
  if (!m) throw new ArgumentError(`NODETRON_DEBUG_SELF_CHECK_DROP must be A-B (rank A never sends to rank B), got ${JSON.stringify(v)}`);
  return Number(m[1]) === rank ? Number(m[2]) : -1;
}

/** The rounds of a round-robin tournament over n ranks: each round, pairs [a, b] with every rank in at most one. */
export function tournamentRounds(n: number): Array<Array<[number, number]>> {
  const m = n % 2 === 0 ? n : n + 1; // with a bye (rank n) when n is odd
  const rounds: Array<Array<[number, number]>> = [];
  const ring = Array.from({ length: m - 1 }, (_, i) => i + 1);
  for (let r = 0; r < m - 1; r++) {
    const order = [0, ...ring];
    const pairs: Array<[number, number]> = [];
    for (let i = 0; i < m / 2; i++) {
      const x = order[i]!, y = order[m - 1 - i]!;
      if (x < n && y < n) pairs.push(x < y ? [x, y] : [y, x]);
    }
    rounds.push(pairs);
    ring.unshift(ring.pop()!);
  }
  return rounds;
}

/** What one rank measured (shared through the store; the input of {@link analyzeSelfCheck}). */
export interface SelfCheckRankRecord {
  /** Global rank. */
  rank: number;
  /** Its host name. */
  host: string;
  /** Median allreduce time (ms; NaN when it failed). */
  allReduceMs: number;
  /** Why the allreduce failed. */
  allReduceError?: string;
  /** Why this rank stopped between rounds (a barrier failed: another rank gave up). */
  stopped?: string;
  /** Per link `a-b` (a < b) this rank took part in: median exchange time (ms), or the error. */
  links: Record<string, { ms: number; error?: string }>;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Runs the self-check over `world` (collective: every rank calls it) and returns the report; throws
 * CommError on every rank when a link failed (or, when strict, when anything is slow).
 */
export async function selfCheck(world: ProcessGroup, store: Store, opts: SelfCheckOptions = {}): Promise<SelfCheckReport> {
  const t0 = performance.now();
  const bytes = opts.bytes ?? 4 * 2 ** 20, reps = opts.reps ?? 5, threshold = opts.threshold ?? 2, timeoutMs = opts.timeoutMs ?? 60_000;
  const n = world.size, me = world.rank;
  const slowdown = debugSlowdown(me);
  const drop = debugDroppedPeer(me);
  const count = Math.max(1, Math.floor(bytes / 4));
  const record: SelfCheckRankRecord = { rank: me, host: hostname(), allReduceMs: NaN, links: {} };
  using buf = zeros([count]);
  using out = zeros([count]);
  using inb = zeros([count]);
  // The allreduce: one warm-up, then the median of the reps.
  try {
    const times: number[] = [];
    for (let i = 0; i <= reps; i++) {
      await world.barrier({ timeoutMs });
      const s = performance.now();
      await world.allReduce(buf, { op: 'sum', timeoutMs });
      if (i > 0) times.push(performance.now() - s);
    }
    record.allReduceMs = lowerMedian(times);
  } catch (e) {
    record.allReduceError = (e as Error).message;
  }
  // The pairs, round by round; after a failure this rank stops exchanging (its peers time out and say so).
  let broken = record.allReduceError !== undefined;
  for (const round of tournamentRounds(n)) {
    if (broken) break;
    try { await world.barrier({ timeoutMs }); } catch (e) { broken = true; record.stopped = `a barrier between rounds failed: ${(e as Error).message}`; break; }
    const pair = round.find(([a, b]) => a === me || b === me);
    if (!pair) continue;
    const peer = pair[0] === me ? pair[1] : pair[0];
    const times: number[] = [];
    let longest = 0;
    try {
      for (let i = 0; i <= reps; i++) {
        const s = performance.now();
        const recv = world.recv(inb, peer, { timeoutMs });
        // The debug slowdown: this rank's sends leave late (by F times the longest exchange so far, the delays left out).
        const slept = slowdown > 0 && i > 0 ? slowdown * longest : 0;
        if (slept > 0) await sleep(slept);
        // The debug failure: this rank never sends to that peer (its recv there times out).
        await Promise.all([drop === peer ? undefined : world.send(out, peer, { timeoutMs }), recv]);
        const dt = performance.now() - s;
        longest = Math.max(longest, dt - slept);
        if (i > 0) times.push(dt);
      }
      record.links[`${pair[0]}-${pair[1]}`] = { ms: lowerMedian(times) };
    } catch (e) {
      record.links[`${pair[0]}-${pair[1]}`] = { ms: NaN, error: (e as Error).message };
      broken = true;
    }
  }
  // Results through the store: rank 0 reads every rank's, decides, publishes the report.
  const key = (r: number) => `self-check/rank-${r}`;
  await store.set(key(me), JSON.stringify(record));
  let report: SelfCheckReport;
  if (me === 0) {
    const records: SelfCheckRankRecord[] = [];
    for (let r = 0; r < n; r++) records.push(JSON.parse(await store.getString(key(r), { timeoutMs: timeoutMs * (n + 2) })) as SelfCheckRankRecord);
    report = analyzeSelfCheck(records, { bytes: count * 4, threshold, elapsedMs: performance.now() - t0 });
    await store.set('self-check/report', JSON.stringify(report));
    (opts.log ?? ((s: string) => process.stderr.write(`${s}\n`)))(formatSelfCheck(report, threshold));
  } else {
    report = JSON.parse(await store.getString('self-check/report', { timeoutMs: timeoutMs * (n + 2) })) as SelfCheckReport;
  }
  if (report.verdict === 'failed' || (opts.strict && report.verdict === 'slow')) throw new CommError(`self-check: ${verdictLine(report, threshold)}`);
  return report;
}

/** The report from every rank's measurements (exported for tests). */
export function analyzeSelfCheck(records: SelfCheckRankRecord[], o: { bytes: number; threshold: number; elapsedMs: number }): SelfCheckReport {
  const n = records.length;
  const arMs = lowerMedian(records.map((r) => r.allReduceMs).filter((x) => Number.isFinite(x)));
  const arError = records.find((r) => r.allReduceError)?.allReduceError;
  const links: SelfCheckLink[] = [];
  for (let a = 0; a < n; a++) {
    for (let b = a + 1; b < n; b++) {
      const ends = [records[a]!.links[`${a}-${b}`], records[b]!.links[`${a}-${b}`]];
      if (ends[0] === undefined && ends[1] === undefined) { links.push({ a, b, ms: NaN, gbps: 0, ratio: NaN, untested: true, slow: false }); continue; }
      const errors = ends.map((e, i) => (e === undefined ? `rank ${i === 0 ? a : b} did not get to it` : e.error ? `rank ${i === 0 ? a : b}: ${e.error}` : '')).filter(Boolean);
      const ms = errors.length ? NaN : Math.max(ends[0]!.ms, ends[1]!.ms);
      links.push({ a, b, ms, gbps: errors.length ? 0 : o.bytes / (ms / 1000) / 1e9, ratio: NaN, ...(errors.length ? { error: errors.join('; ') } : {}), slow: false });
    }
  }
  const okLinks = links.filter((l) => !l.error && !l.untested);
  const med = lowerMedian(okLinks.map((l) => l.ms));
  for (const l of okLinks) l.ratio = l.ms / med;
  const ranks: SelfCheckRank[] = records.map((r) => {
    const mine = okLinks.filter((l) => l.a === r.rank || l.b === r.rank).map((l) => l.ms);
    const others = okLinks.filter((l) => l.a !== r.rank && l.b !== r.rank).map((l) => l.ms);
    const score = mine.length && others.length ? lowerMedian(mine) / lowerMedian(others) : NaN;
    return { rank: r.rank, host: r.host, score, slow: score >= o.threshold };
  });
  const slowSet = new Set(ranks.filter((r) => r.slow).map((r) => r.rank));
  for (const l of okLinks) l.slow = l.ratio >= o.threshold && !slowSet.has(l.a) && !slowSet.has(l.b);
  const hosts = [...new Set(ranks.map((r) => r.host))];
  const slowHosts = hosts.length > 1 ? hosts.filter((h) => ranks.filter((r) => r.host === h).every((r) => r.slow)) : [];
  const stopped = records.filter((r) => r.stopped).map((r) => r.rank);
  const failed = arError !== undefined || links.some((l) => l.error) || stopped.length > 0;
  const slow = slowSet.size > 0 || okLinks.some((l) => l.slow);
  return {
    worldSize: n, bytes: o.bytes,
    allReduce: { ms: arMs, busGbps: n > 1 && arMs > 0 ? ((2 * (n - 1)) / n) * o.bytes / (arMs / 1000) / 1e9 : 0, ...(arError ? { error: arError } : {}) },
    links, ranks, stoppedRanks: stopped, slowRanks: ranks.filter((r) => r.slow).sort((x, y) => y.score - x.score).map((r) => r.rank), slowHosts,
    verdict: failed ? 'failed' : slow ? 'slow' : 'ok', elapsedMs: o.elapsedMs,
  };
}

function verdictLine(r: SelfCheckReport, threshold: number): string {
  const parts: string[] = [];
  if (r.allReduce.error) parts.push(`the allreduce failed (${r.allReduce.error})`);
  for (const l of r.links.filter((x) => x.error)) parts.push(`link ${l.a}-${l.b} failed (${l.error})`);
  const untested = r.links.filter((x) => x.untested).length;
  if (untested > 0) parts.push(`${untested} link(s) untested: the check stopped after the failure`);
  if (r.stoppedRanks.length > 0 && !r.links.some((x) => x.error)) parts.push(`rank(s) ${r.stoppedRanks.join(', ')} stopped: another rank gave up`);
  for (const h of r.slowHosts) parts.push(`host ${h} is slow (all its ranks)`);
  for (const k of r.slowRanks) {
    const x = r.ranks.find((y) => y.rank === k)!;
    parts.push(`rank ${k} (${x.host}) is slow: its links take ${x.score.toFixed(2)}x as long as the others`);
  }
  for (const l of r.links.filter((x) => x.slow)) parts.push(`link ${l.a}-${l.b} is slow: ${l.ratio.toFixed(2)}x the median link (${l.gbps.toFixed(2)} GB/s)`);
  if (parts.length === 0) return `ok: ${r.worldSize} ranks, ${r.links.length} links, none ${threshold}x slower than the others`;
  return parts.join('; ');
}

/** The summary rank 0 prints: the allreduce, every rank's score, the slowest links, the verdict. */
export function formatSelfCheck(r: SelfCheckReport, threshold = 2): string {
  const lines = [`nodetron self-check: ${r.worldSize} ranks, ${(r.bytes / 2 ** 20).toFixed(1)} MiB per exchange, ${r.links.length} links in ${(r.elapsedMs / 1000).toFixed(1)} s`];
  lines.push(`  allreduce: ${r.allReduce.error ? `FAILED (${r.allReduce.error})` : `${r.allReduce.ms.toFixed(2)} ms, bus ${r.allReduce.busGbps.toFixed(2)} GB/s`}`);
  lines.push('  rank  host                  score  (its links / the others\')');
  for (const x of r.ranks) lines.push(`  ${String(x.rank).padStart(4)}  ${x.host.slice(0, 20).padEnd(20)}  ${Number.isFinite(x.score) ? x.score.toFixed(2).padStart(5) : '    -'}${x.slow ? '  SLOW' : ''}`);
  const rankOf = (l: SelfCheckLink) => (l.error ? Infinity : l.untested ? -Infinity : l.ratio);
  const shown = [...r.links].sort((x, y) => rankOf(y) - rankOf(x)).slice(0, Math.max(6, r.links.filter((l) => l.slow || l.error).length));
  lines.push('  link      ms     GB/s   x median');
  for (const l of shown) {
    lines.push(`  ${`${l.a}-${l.b}`.padEnd(6)} ${l.error ? `FAILED: ${l.error}` : l.untested ? 'not tested' : `${l.ms.toFixed(2).padStart(7)}  ${l.gbps.toFixed(2).padStart(7)}  ${l.ratio.toFixed(2).padStart(8)}${l.slow ? '  SLOW' : ''}`}`);
  }
  if (shown.length < r.links.length) lines.push(`  (${r.links.length - shown.length} faster links not shown)`);
  lines.push(`  verdict: ${r.verdict.toUpperCase()}: ${verdictLine(r, threshold)}`);
  return lines.join('\n');
}

/**
 * The self-check init() runs when NODETRON_SELF_CHECK is set (1: warn on slow ranks and links;
 * strict: fail on them too). NODETRON_SELF_CHECK_MB sets the bytes per exchange,
 * NODETRON_SELF_CHECK_THRESHOLD the threshold, NODETRON_SELF_CHECK_TIMEOUT_MS each exchange's timeout.
 */
export async function selfCheckFromEnv(world: ProcessGroup, store: Store): Promise<SelfCheckReport | undefined> {
  const v = process.env.NODETRON_SELF_CHECK;
  if (!v || v === '0') return undefined;
  if (v !== '1' && v !== 'strict') throw new ArgumentError(`NODETRON_SELF_CHECK must be 1 or strict, got ${JSON.stringify(v)}`);
  const mb = Number(process.env.NODETRON_SELF_CHECK_MB ?? 4), threshold = Number(process.env.NODETRON_SELF_CHECK_THRESHOLD ?? 2);
  const timeoutMs = Number(process.env.NODETRON_SELF_CHECK_TIMEOUT_MS ?? 60_000);
  if (!(mb > 0) || !(threshold > 1) || !(timeoutMs >= 1)) {
    throw new ArgumentError(`NODETRON_SELF_CHECK_MB must be > 0, NODETRON_SELF_CHECK_THRESHOLD > 1 and NODETRON_SELF_CHECK_TIMEOUT_MS >= 1; got ${mb}, ${threshold} and ${timeoutMs}`);
  }
  return selfCheck(world, store, { bytes: Math.round(mb * 2 ** 20), threshold, strict: v === 'strict', timeoutMs });
}
