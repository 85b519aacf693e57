// Shared benchmark plumbing: option parsing, timing, tables and the JSON record every bench writes.
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { info } from '../info.js';

// Option parsing is shared with every CLI command: lib/cli/args.ts.
export { parseOptions, parseBytes, type Options, type ArgKind, type ArgSpec } from '../cli/args.js';

/** Seconds per call of fn: runs for at least minSeconds after warm-up, returns the median of rounds. */
export function timeIt(fn: () => void, opts: { minSeconds?: number; rounds?: number; warmup?: number } = {}): number {
  const { minSeconds = 0.3, rounds = 5, warmup = 1 } = opts;
  for (let i = 0; i < warmup; i++) fn();
  // Calibrate the number of calls per round.
  let calls = 1;
  for (;;) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) fn();
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt * rounds >= minSeconds || calls > 1e7) break;
    calls *= dt > 0 ? Math.min(10, Math.max(2, Math.ceil(minSeconds / rounds / dt))) : 10;
  }
  const per: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) fn();
    per.push(Number(process.hrtime.bigint() - t0) / 1e9 / calls);
  }
  per.sort((a, b) => a - b);
  return per[Math.floor(per.length / 2)]!;
}

/** Prints rows as an aligned table under a header. */
export function printTable(header: string[], rows: (string | number)[][], out: (s: string) => void = console.log): void {
  const cells = [header, ...rows.map((r) => r.map(String))];
  const widths = header.map((_, c) => Math.max(...cells.map((r) => (r[c] ?? '').length)));
  for (const [i, r] of cells.entries()) {
    out(r.map((x, c) => (c === 0 ? x.padEnd(widths[c]!) : x.padStart(widths[c]!))).join('  '));
    if (i === 0) out(widths.map((w) => '-'.repeat(w)).join('  '));
  }
}

/** The machine facts stamped into every benchmark's JSON. */
export function machineRecord(): Record<string, unknown> {
  const i = info();
  return {
    date: new Date().toISOString(),
    nodetron: i.version,
    node: i.node,
    cpu: i.cpu.model,
    cores: cpus().length,
    blas: i.backends.cpu.blasConfig,
    blasCoreType: i.backends.cpu.blasCoreType,
  };
}

export function writeJson(path: string | undefined, record: unknown): void {
  if (!path) return;
  if (path === '-') { console.log(JSON.stringify(record, null, 2)); return; }
  writeFileSync(path, `${JSON.stringify(record, null, 2)}\n`);
  console.log(`wrote ${path}`);
}
