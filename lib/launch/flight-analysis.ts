// Reads the flight recorder dumps of a failed or hung job (lib/distributed/flight.ts) and says, per
// group, how far each rank got and who the others are waiting for: "rank 1 never reached
// allReduce(sum) #5 in group 'world' (ranks 0, 2 wait in it)". A rank without a dump (frozen by
// SIGSTOP, or dead) is named from the others' progress.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { FlightDump } from '../distributed/flight.js';

type Op = FlightDump['ops'][number];

/** Reads every `rank-R.json` in `dir`. */
export function readFlightDumps(dir: string): Map<number, FlightDump> {
  const dumps = new Map<number, FlightDump>();
  if (!existsSync(dir)) return dumps;
  for (const f of readdirSync(dir)) {
    const m = /^rank-(\d+)\.json$/.exec(f);
    if (!m) continue;
    try {
      const d = JSON.parse(readFileSync(join(dir, f), 'utf8')) as FlightDump;
      if (d.version === 1) dumps.set(Number(m[1]), d);
    } catch { /* a torn or foreign file: skip it */ }
  }
  return dumps;
}

export interface FlightAnalysisOptions {
  worldSize: number;
  /** Ranks run by this node; a missing dump of another node's rank is not evidence of a freeze. */
  localRanks?: readonly number[];
  /** Ranks whose process the launcher saw stopped (state T). */
  stopped?: ReadonlySet<number>;
}

const list = (rs: readonly number[]) => rs.join(', ');
const secs = (ms: number) => `${(ms / 1000).toFixed(1)} s`;

/** The analysis, as report lines (the first ones are the verdicts). */
export function analyzeFlight(dumps: ReadonlyMap<number, FlightDump>, opts: FlightAnalysisOptions): string[] {
  const verdicts: string[] = [];
  const details: string[] = [];
  const local = new Set(opts.localRanks ?? Array.from({ length: opts.worldSize }, (_, r) => r));
  const absentWhy = (r: number): string => {
    if (!local.has(r)) return 'no dump here: it runs on another node, see that launcher\'s report';
    if (opts.stopped?.has(r)) return 'frozen: its process is stopped (SIGSTOP), no dump';
    return 'frozen or dead: no dump';
  };
  const coordOf = (r: number): string => {
    const c = dumps.get(r)?.coords ?? [...dumps.values()].find((d) => d.meshCoords)?.meshCoords?.[r];
    return c ? ` (tp ${c.tp}, pp ${c.pp}, dp ${c.dp})` : '';
  };
  const present = [...dumps.keys()].sort((a, b) => a - b);
  const absent = Array.from({ length: opts.worldSize }, (_, r) => r).filter((r) => !dumps.has(r));
  details.push(`dumps from rank(s) ${list(present) || 'none'} of ${opts.worldSize}${absent.length ? `; none from ${list(absent)}` : ''}`);
  for (const r of present) {
    const d = dumps.get(r)!;
    details.push(`rank ${r}${coordOf(r)}, pid ${d.pid}: dumped because ${d.reason}`);
  }

  // Every group any dump knows, with its members.
  const groups = new Map<string, { ranks: number[]; dim?: string }>();
  for (const d of dumps.values()) {
    for (const [name, g] of Object.entries(d.groups)) {
      const known = groups.get(name);
      if (!known) groups.set(name, { ranks: g.ranks, ...(g.dim ? { dim: g.dim } : {}) });
      else {
        if (known.ranks.length === 0) known.ranks = g.ranks;
        if (!known.dim && g.dim) known.dim = g.dim;
      }
    }
  }
  const opIn = (r: number, group: string, seq: number): Op | undefined =>
    dumps.get(r)?.ops.find((o) => !o.p2p && o.group === group && o.seq === seq);

  for (const [name, g] of groups) {
    if (g.ranks.length < 2) continue;
    const label = `group '${name}'${g.dim ? ` (${g.dim})` : ''} [ranks ${list(g.ranks)}]`;
    const progress = g.ranks.map((r) => {
      const info = dumps.get(r)?.groups[name];
      return info ? `rank ${r} entered #${info.entered} completed #${info.completed}` : `rank ${r} -`;
    });
    // The lowest collective some rank entered and has not completed: the one that hangs.
    let k = Infinity;
    for (const r of g.ranks) {
      const info = dumps.get(r)?.groups[name];
      if (info && info.entered > info.completed) k = Math.min(k, info.completed + 1);
    }
    if (k === Infinity) continue;
    const waiting = g.ranks.filter((r) => {
      const info = dumps.get(r)?.groups[name];
      return info !== undefined && info.entered >= k && info.completed < k;
    });
    const holder = waiting.find((r) => opIn(r, name, k) !== undefined);
    const stuck = holder === undefined ? undefined : opIn(holder, name, k);
    const what = `${stuck?.op ?? 'collective'} #${k}`;
    const waited = stuck ? (stuck.endedAt ?? dumps.get(holder!)!.dumpedAt) - stuck.issuedAt : 0;
    const since = stuck ? ` (rank ${holder} waited ${secs(waited)}${stuck.error ? `, then: ${stuck.error}` : ''})` : '';
    details.push(`${label}: rank(s) ${list(waiting)} wait in ${what}${since}; ${progress.join(', ')}`);
    if (stuck?.stack?.length) details.push(`  ${what} was issued at: ${stuck.stack.slice(0, 4).join(' <- ')}`);
    for (const r of g.ranks) {
      if (waiting.includes(r)) continue;
      const d = dumps.get(r);
      const info = d?.groups[name];
      if (!d) {
        verdicts.push(`rank ${r}${coordOf(r)} never reached ${what} in group '${name}' that rank(s) ${list(waiting)} wait in (${absentWhy(r)})`);
        continue;
      }
      if (info && info.entered >= k) continue;  // it has been through #k (and failed it, or it completed elsewhere)
      const last = info && info.entered >= 0 ? `its last op in this group was #${info.entered}${info.lastOp ? ` ${info.lastOp}` : ''}` : 'it never ran an op in this group';
      const pending = [...d.ops].reverse().find((o) => o.state === 'issued' || o.state === 'started');
      const latest = pending ?? d.ops[d.ops.length - 1];
      const doing = pending
        ? `; it is waiting in ${describe(pending)}`
        : latest ? `; its latest op, ${describe(latest)}, ${latest.state}` : '';
      verdicts.push(`rank ${r}${coordOf(r)} never reached ${what} in group '${name}' that rank(s) ${list(waiting)} wait in: ${last}${doing} (alive: it dumped)`);
      if (latest?.stack?.length) details.push(`  rank ${r}'s latest op was issued at: ${latest.stack.slice(0, 4).join(' <- ')}`);
    }
  }

  // Point-to-point: a pending recv/send whose peer never posted the matching op.
  for (const r of present) {
    for (const o of dumps.get(r)!.ops) {
      if (!o.p2p || o.state === 'completed' || o.peer === undefined) continue;
      const peer = dumps.get(o.peer);
      const want = o.op === 'recv' ? 'send' : 'recv';
      const match = peer?.ops.find((p) => p.p2p && p.op === want && p.group === o.group && p.peer === r && p.seq === o.seq && p.tag === o.tag);
      if (match) continue;
      const who = peer ? `rank ${o.peer} never posted the matching ${want} (alive: it dumped)` : `rank ${o.peer} never posted the matching ${want} (${absentWhy(o.peer)})`;
      verdicts.push(`rank ${r} waits in ${describe(o)}: ${who}`);
    }
  }
  if (verdicts.length === 0) verdicts.push('no rank is behind the others in any group');
  return [...verdicts, ...details];
}

function describe(o: Op): string {
  if (o.p2p) return `${o.op} #${o.seq} ${o.op === 'send' ? 'to' : 'from'} rank ${o.peer} (group '${o.group}', tag ${o.tag ?? 0}, ${o.bytes} bytes)`;
  return `${o.op} #${o.seq} in group '${o.group}' (${o.bytes} bytes ${o.dtype})`;
}
