// `nodetron bench comm` end to end: it launches itself with 2 ranks, and every op's data check
// finds no wrong element (all_to_all_v: uneven blocks whose counts are exchanged first); plus the bus-bandwidth factors and the SVG plot.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { busFactor, plotSvg } from '../../lib/bench/comm.js';
import { nodeArgs } from '../helpers/node-script.js';

const bench = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'lib', 'bench', 'comm.ts');

describe('bench comm', () => {
  it('uses nccl-tests bus-bandwidth factors', () => {
    expect(busFactor('all_reduce', 4)).toBeCloseTo(1.5);
    expect(busFactor('all_gather', 4)).toBeCloseTo(0.75);
    expect(busFactor('reduce_scatter', 2)).toBeCloseTo(0.5);
    expect(busFactor('all_to_all', 8)).toBeCloseTo(0.875);
    expect(busFactor('all_to_all_v', 4)).toBeCloseTo(0.75);
    expect(busFactor('broadcast', 8)).toBe(1);
    expect(busFactor('sendrecv', 3)).toBe(1);
  });

  it('plots one polyline per series', () => {
    const svg = plotSvg('t', [{ name: 'a', points: [[8, 0.1], [1024, 1]] }, { name: 'b', points: [[8, 0.2], [1024, 2]] }]);
    expect(svg.startsWith('<svg')).toBe(true);
    expect(svg.match(/<polyline/g)).toHaveLength(2);
  });

  it('--transport both --repeat 2: interleaved runs over shared memory and tcp, medians per size, a plot', () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-bench-'));
    const json = join(dir, 'r.json'), plot = join(dir, 'r.svg');
    const r = spawnSync(process.execPath, [...nodeArgs(bench), '-b', '1K', '-e', '64K', '-f', '8', '-n', '2', '-w', '1', '--transport', 'both',
      '--repeat', '2', '--json', json, '--plot', plot], { encoding: 'utf8', env: { ...process.env, WORLD_SIZE: '' }, timeout: 120_000 });
    expect(r.status, r.stderr + r.stdout).toBe(0);
    expect(r.stdout).toMatch(/median in-place busbw \(GB\/s\) over 2 interleaved run/);
    expect(r.stdout).toMatch(/load average \(1 min\) before each run: nodetron [\d.]+, nodetron [\d.]+/);
    const rec = JSON.parse(readFileSync(json, 'utf8'));
    expect(rec.repetitions).toHaveLength(2);
    for (const rep of rec.repetitions) expect(rep.nodetron.map((sw: { transport: string; sharedMemory: boolean }) => [sw.transport, sw.sharedMemory])).toEqual([['shm', true], ['tcp', false]]);
    expect(rec.summary.map((row: { bytes: number }) => row.bytes)).toEqual([1024, 8192, 65536]);
    for (const row of rec.summary) expect(row.shmInPlaceBusbw > 0 && row.tcpInPlaceBusbw > 0).toBe(true);
    expect(readFileSync(plot, 'utf8').match(/<polyline/g)).toHaveLength(2);
  });

  for (const op of ['all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', 'all_to_all', 'all_to_all_v', 'sendrecv']) {
    it(`${op}: self-launched 2-rank sweep with no wrong elements`, () => {
      const dir = mkdtempSync(join(tmpdir(), 'nt-bench-'));
      const json = join(dir, 'r.json');
      const r = spawnSync(process.execPath, [...nodeArgs(bench), '--op', op, '-b', '8', '-e', '8K', '-f', '32', '-n', '2', '-w', '1',
        '-d', op === 'all_reduce' ? 'f16' : 'i32', '--json', json], { encoding: 'utf8', env: { ...process.env, WORLD_SIZE: '' }, timeout: 60_000 });
      expect(r.status, r.stderr + r.stdout).toBe(0);
      expect(r.stdout).toMatch(/# Out of bounds values : 0 OK/);
      const rec = JSON.parse(readFileSync(json, 'utf8'));
      expect(rec.np).toBe(2);
      const [sweep] = rec.repetitions[0].nodetron;
      expect(sweep.sharedMemory).toBe(true);
      expect(sweep.rows.length).toBeGreaterThanOrEqual(2);
      for (const row of sweep.rows) {
        expect(row.outOfPlace).not.toBeNull();
        // Every op has both columns but sendrecv and all_to_all_v (uneven blocks), which have no in-place form.
        if (op === 'sendrecv' || op === 'all_to_all_v') expect(row.inPlace).toBeNull();
        else expect(row.inPlace).not.toBeNull();
        for (const m of [row.outOfPlace, row.inPlace]) if (m) expect(m.wrong).toBe(0);
      }
    });
  }
});
