// `nodetron trace merge DIR [--out F]`: joins the per-rank traces NODETRON_TRACE=DIR wrote
// (lib/distributed/trace.ts) into one Chrome trace-event file for Perfetto / chrome://tracing, each
// rank shifted by the clock offset it measured at init, one process per rank, named tracks.
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { TRACKS } from '../distributed/trace.js';

interface RankTrace {
  traceEvents: Array<{ ts: number; pid: number; tid: number; ph: string; [k: string]: unknown }>;
  otherData: { rank: number; clockOffsetUs: number; coords?: Record<string, number> };
}

/** The merged trace of every `rank-R.trace.json` in `dir`. */
export function mergeTraces(dir: string): { traceEvents: RankTrace['traceEvents']; displayTimeUnit: string; otherData: Record<string, unknown> } {
  const files = readdirSync(dir).filter((f) => /^rank-\d+\.trace\.json$/.test(f));
  if (files.length === 0) throw new Error(`no rank-R.trace.json in ${dir} (run the job with NODETRON_TRACE=${dir})`);
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

export async function main(argv: string[]): Promise<number> {
  const [sub, dir, ...rest] = argv;
  if (sub !== 'merge' || !dir || argv.includes('--help')) {
    console.log('usage: nodetron trace merge DIR [--out FILE (DIR/merged.trace.json)]\n  joins the per-rank traces a job run with NODETRON_TRACE=DIR wrote into one file for Perfetto or chrome://tracing');
    return argv.includes('--help') ? 0 : 2;
  }
  const o = rest.indexOf('--out');
  const file = o >= 0 && rest[o + 1] ? rest[o + 1]! : join(dir, 'merged.trace.json');
  const merged = mergeTraces(dir);
  writeFileSync(file, JSON.stringify(merged));
  console.log(`${file}: ${merged.traceEvents.length} events from rank(s) ${(merged.otherData.ranks as number[]).join(', ')}`);
  return 0;
}
