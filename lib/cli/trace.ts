// `nodetron trace merge DIR [--out F]`: joins the per-rank traces NODETRON_TRACE=DIR wrote
// (lib/distributed/trace.ts) into one Chrome trace-event file for Perfetto / chrome://tracing, each
// rank shifted by the clock offset it measured at init, one process per rank, named tracks.
// `nodetron trace stragglers DIR`: the straggler score of every rank from the per-step metrics the
// job wrote there (lib/distributed/metrics.ts), as a table.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TRACKS } from '../distributed/trace.js';
import { formatStragglers, readMetrics, stragglerScores, type StragglerOptions } from '../distributed/metrics.js';
import { ArgumentError } from '../errors.js';

interface RankTrace {
  traceEvents: Array<{ ts: number; pid: number; tid: number; ph: string; [k: string]: unknown }>;
  otherData: { rank: number; clockOffsetUs: number; coords?: Record<string, number> };
}

/** The merged trace of every `rank-R.trace.json` in `dir`. */
export function mergeTraces(dir: string): { traceEvents: RankTrace['traceEvents']; displayTimeUnit: string; otherData: Record<string, unknown> } {
  const files = readdirSync(dir).filter((f) => /^rank-\d+\.trace\.json$/.test(f));
  if (files.length === 0) throw new ArgumentError(`no rank-R.trace.json in ${dir} (run the job with NODETRON_TRACE=${dir})`);
  const traces = files.map((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')) as RankTrace).sort((a, b) => a.otherData.rank - b.otherData.rank);
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
         each rank's median compute time per step (without waits in collectives; auto: CPU time on cpu devices,
         wall time on GPUs) against the ranks' median,
         from the metrics a job run with NODETRON_TRACE=DIR or NODETRON_METRICS=DIR wrote; names ranks at or above X`;

/** Runs `nodetron trace merge|stragglers`; returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const [sub, dir, ...rest] = argv;
  if (argv.includes('--help') || argv.includes('-h')) { console.log(usage); return 0; }
  if ((sub !== 'merge' && sub !== 'stragglers') || !dir) { console.error(usage); return 2; }
  if (sub === 'stragglers') return stragglersMain(dir, rest);
  const o = rest.indexOf('--out');
  const file = o >= 0 && rest[o + 1] ? rest[o + 1]! : join(dir, 'merged.trace.json');
  const merged = mergeTraces(dir);
  writeFileSync(file, JSON.stringify(merged));
  console.log(`${file}: ${merged.traceEvents.length} events from rank(s) ${(merged.otherData.ranks as number[]).join(', ')}`);
  return 0;
}

function stragglersMain(dir: string, rest: string[]): number {
  const opts: StragglerOptions = {};
  let json = false;
  for (let i = 0; i < rest.length; i++) {
    const a = rest[i]!, v = rest[i + 1];
    if (a === '--json') { json = true; continue; }
    if (v === undefined) throw new ArgumentError(`trace stragglers: ${a} needs a value`);
    i++;
    if (a === '--threshold') opts.threshold = Number(v);
    else if (a === '--skip') opts.skip = Number(v);
    else if (a === '--metric') {
      const metric = ({ auto: 'auto', cpu: 'cpuMs', compute: 'computeMs', step: 'stepMs' } as const)[v as 'auto'];
      if (!metric) throw new ArgumentError(`trace stragglers: --metric must be auto, cpu, compute or step, got ${JSON.stringify(v)}`);
      opts.metric = metric;
    } else throw new ArgumentError(`trace stragglers: unknown option ${a}`);
  }
  const metrics = readMetrics(dir);
  if (metrics.size === 0) throw new ArgumentError(`trace stragglers: no rank-R.metrics.jsonl in ${dir} (run the job with NODETRON_TRACE=${dir} or NODETRON_METRICS=${dir})`);
  const report = stragglerScores(metrics, opts);
  console.log(json ? JSON.stringify(report, null, 2) : formatStragglers(report));
  return 0;
}
