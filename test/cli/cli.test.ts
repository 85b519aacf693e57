// The `nodetron` command: info (text and JSON) and a quick `bench gemm` writing JSON.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const bin = join(__dirname, '..', '..', 'bin', 'nodetron.js');
const run = (...args: string[]) => spawnSync(process.execPath, [bin, ...args], { encoding: 'utf8' });

describe('nodetron CLI', () => {
  it('info --json reports the cpu backend and exactly why cuda is unavailable', () => {
    const r = run('info', '--json');
    expect(r.status, r.stderr).toBe(0);
    const info = JSON.parse(r.stdout);
    expect(info.version).toMatch(/^\d+\.\d+\.\d+/);
    expect(info.backends.cpu.available).toBe(true);
    expect(info.backends.cpu.blasConfig).toMatch(/OpenBLAS/);
    expect(info.cpu.cores).toBeGreaterThan(0);
    if (!info.backends.cuda.available) expect(info.backends.cuda.reason.length).toBeGreaterThan(20);
    if (info.cpu.avx512) expect(info.backends.cpu.blasCoreType).toBe('SkylakeX');
  });

  it('info prints a readable summary', () => {
    const r = run('info');
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^nodetron \d/);
    expect(r.stdout).toMatch(/blas:\s+OpenBLAS/);
    expect(r.stdout).toMatch(/cuda:\s+(available|unavailable)/);
  });

  it('unknown commands and benchmarks fail with a usage message', () => {
    const r = run('frobnicate');
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(/unknown command/);
    const b = run('bench', 'nope');
    expect(b.status).toBe(2);
    expect(b.stderr).toMatch(/unknown benchmark/);
  });

  it('bench gemm --quick prints a table and writes JSON', () => {
    const out = join(mkdtempSync(join(tmpdir(), 'nt-')), 'gemm.json');
    const r = run('bench', 'gemm', '--quick', '--json', out);
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/nodetron GFLOP\/s/);
    const j = JSON.parse(readFileSync(out, 'utf8'));
    expect(j.rows[0].nodetronGflops).toBeGreaterThan(0);
    expect(j.rows[0].cblasGflops).toBeGreaterThan(0);
    expect(j.dispatchMicroseconds['native no-op call']).toBeGreaterThan(0);
  }, 120_000);
});
