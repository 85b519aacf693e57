// `nodetron trace merge DIR [--out F]`: joins the per-rank traces NODETRON_TRACE=DIR wrote
// (lib/observe/trace.ts) into one Chrome trace-event file for Perfetto / chrome://tracing, each
// rank shifted by the clock offset it measured at init, one process per rank, named tracks.
// `nodetron trace stragglers DIR`: the straggler score of every rank from the per-step metrics the
// job wrote there (lib/observe/metrics.ts), as a table.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { existsSync, statSync } from 'node:fs';
import { TRACKS } from '../observe/trace.js';
import { formatStragglers, readMetrics, stragglerScores, type StragglerOptions } from '../observe/metrics.js';
import { ArgumentError, UsageError } from '../errors.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';

interface RankTrace {
  traceEvents: Array<{ ts: number; pid: number; tid: number; ph: string; [k: string]: unknown }>;
  otherData: { rank: number; clockOffsetUs: number; coords?: Record<string, number> };
}

/** The merged trace of every `rank-R.trace.json` in `dir`. */
export function mergeTraces(dir: string): { traceEvents: RankTrace['traceEvents']; displayTimeUnit: string; otherData: Record<string, unknown> } {
  if (!existsSync(dir) || !statSync(dir).isDirectory()) throw new ArgumentError(`${dir} is not a directory (give the NODETRON_TRACE=DIR of a traced job)`);
  const files = readdirSync(dir).filter((f) => /^rank-\d+\.trace\.json$/.test(f));
  if (files.length === 0) throw new ArgumentError(`no rank-R.trace.json in ${dir} (run the job with NODETRON_TRACE=${dir})`);
  const traces = files.map((f) => {
    let t: RankTrace;
    try { t = JSON.parse(readFileSync(join(dir, f), 'utf8')) as RankTrace; } catch (e) { throw new ArgumentError(`${join(dir, f)} is not a trace: ${(e as Error).message}`); }
    if (!t || !Array.isArray(t.traceEvents) || typeof t.otherData?.rank !== 'number' || typeof t.otherData.clockOffsetUs !== 'number') {
      throw new ArgumentError(`${join(dir, f)} is not a nodetron rank trace (traceEvents and otherData.rank, clockOffsetUs)`);
    }
    return t;
  }).sort((a, b) => a.otherData.rank - b.otherData.rank);
  let t0 = Infinity;
  for (const t of traces) for (const e of t.traceEvents) t0 = Math.min(t0, e.ts + t.otherData.clockOffsetUs);
  const out: RankTrace['traceEvents'] = [];
  for (const t of traces) {
    const { rank, clockOffsetUs, coords } = t.otherData;
    const label = coords ? ` (tp ${coords.tp}, pp ${coords.pp}, dp ${coords.dp})` : '';
    out.push({ name: 'process_name', ph: 'M', ts: 0, pid: rank, tid: 0, args: { name: `rank ${rank}${label}` } });
    out.push({ name: 'process_sort_index', ph: 'M', ts: 0, pid: rank, tid: 0, args: { sort_index: rank } });
    for (const [name, tid] of Object.entries(TRACKS)) out.push({ name: 'thread_name', ph: 'M', ts: 0, pid: rank, tid, args: { name } });
    for (const e of t.traceEvents) out.push({ ...e, ts: e.ts + clockOffsetUs - t0 });
  }
  return {
    traceEvents: out,
    displayTimeUnit: 'ms',
    otherData: { ranks: traces.map((t) => t.otherData.rank), clockOffsetsUs: traces.map((t) => t.otherData.clockOffsetUs), epochUs: t0 },
  };
}

const usage = `usage: nodetron trace merge DIR [--out FILE (DIR/merged.trace.json)]
         joins the per-rank traces a job run with NODETRON_TRACE=DIR wrote into one file for Perfetto or chrome://tracing
       nodetron trace stragglers DIR [--threshold X (1.15)] [--skip N (1)] [--metric auto|cpu|compute|step] [--json]
         each rank's median over steps of its compute time (without waits in collectives; auto: CPU time on cpu
         devices, wall time on GPUs) against the same step's median rank,
         from the metrics a job run with NODETRON_TRACE=DIR or NODETRON_METRICS=DIR wrote; names ranks at or above X`;

/** Runs `nodetron trace merge|stragglers`; returns the exit code (usage errors are thrown as UsageError). */
export async function main(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === '--help' || sub === '-h') { console.log(usage); return 0; }
  if (sub === undefined) throw new UsageError('missing subcommand (merge, stragglers)');
  if (sub !== 'merge' && sub !== 'stragglers') throw new UsageError(`unknown subcommand ${JSON.stringify(sub)} (merge, stragglers)`);
  if (sub === 'stragglers') return stragglersMain(rest);
  const o = parseOptions(rest, { out: 'outfile', help: 'boolean' }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  const [dir] = expectPositionals(o, 'the trace directory DIR', 1) as [string];
  const file = (o.out as string | undefined) ?? join(dir, 'merged.trace.json');
  const merged = mergeTraces(dir);
  writeFileSync(file, JSON.stringify(merged));
  console.log(`${file}: ${merged.traceEvents.length} events from rank(s) ${(merged.otherData.ranks as number[]).join(', ')}`);
  return 0;
}

function stragglersMain(argv: string[]): number {
  const o = parseOptions(argv, {
    threshold: { kind: 'number', min: 1 }, skip: 'count', metric: { kind: 'string', choices: ['auto', 'cpu', 'compute', 'step'] }, json: 'boolean', help: 'boolean',
  }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  const [dir] = expectPositionals(o, 'the metrics directory DIR', 1) as [string];
  const opts: StragglerOptions = {};
  if (o.threshold !== undefined) opts.threshold = o.threshold as number;
  if (o.skip !== undefined) opts.skip = o.skip as number;
  if (o.metric !== undefined) opts.metric = ({ auto: 'auto', cpu: 'cpuMs', compute: 'computeMs', step: 'stepMs' } as const)[o.metric as 'auto'];
  const json = o.json === true;
  const metrics = readMetrics(dir);
  if (metrics.size === 0) throw new ArgumentError(`trace stragglers: no rank-R.metrics.jsonl in ${dir} (run the job with NODETRON_TRACE=${dir} or NODETRON_METRICS=${dir})`);
  const report = stragglerScores(metrics, opts);
  console.log(json ? JSON.stringify(report, null, 2) : formatStragglers(report));
  return 0;
}
