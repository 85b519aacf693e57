// What commands and benchmarks print and record: aligned tables, the machine facts stamped into every
// JSON record, and the record written to a file or standard output. Below bench/ and cli/, which both use it.
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { info } from '../info.js';

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
    // 1, 5 and 15-minute load averages when the record was made: above the core count, other work shared the CPUs.
    loadAverage: loadavg().map((l) => Number(l.toFixed(2))),
  };
}

/** Writes `record` as indented JSON to `path` (`-`: standard output; nothing without a path). */
export function writeJson(path: string | undefined, record: unknown): void {
  if (!path) return;
  if (path === '-') { console.log(JSON.stringify(record, null, 2)); return; }
  writeFileSync(path, `${JSON.stringify(record, null, 2)}\n`);
  console.log(`wrote ${path}`);
}
