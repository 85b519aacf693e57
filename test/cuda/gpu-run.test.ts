// scripts/gpu/run.mjs, the staged device run: without a GPU every stage records "skipped" with the
// reason (exit 0, never "passed"); each stage is its own process with its own limit, so a stage that
// hangs is killed at its limit and one that crashes is recorded, and the next stage still runs.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const work = mkdtempSync(join(tmpdir(), 'nt-gpu-run-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

function runStages(name: string, stages: string, env: Record<string, string> = {}) {
  const out = join(work, name);
  const r = spawnSync(process.execPath, [join(root, 'scripts', 'gpu', 'run.mjs'), '--stage', stages, '--out', out],
    { cwd: root, encoding: 'utf8', timeout: 120_000, env: { ...process.env, ...env } });
  const results = JSON.parse(readFileSync(join(out, 'results.json'), 'utf8'));
  const lines = readFileSync(join(out, 'runs.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  return { code: r.status, output: r.stdout + r.stderr, results, lines };
}

describe.skipIf(nt.cuda.isAvailable())('scripts/gpu/run.mjs without a GPU', () => {
  it('runs every stage and records each as skipped with "no GPU: <reason>", exit 0', () => {
    const { code, output, results } = runStages('skip', '0,1,2,3');
    expect(code, output).toBe(0);
    expect(results.stages.map((s: { stage: number }) => s.stage)).toEqual([0, 1, 2, 3]);
    for (const s of results.stages) {
      expect(s.status).toBe('skipped');
      expect(s.reason).toMatch(/^no GPU: \S/);
      expect(s.exitCode).toBe(0);
      expect(s.checksPassed).toBe(0);
    }
    expect(results.checks).toEqual([]);
    expect(results.commit).toMatch(/^[0-9a-f]{7,}|unknown$/);
    expect(output).toMatch(/0 preflight\s+skipped/);
  }, 180_000);

  it('kills a hanging stage at its limit, records a crashing one, and the next stages still run', () => {
    const { code, results, lines } = runStages('isolation', '1,2,3', { NODETRON_GPU_RUN_SIMULATE: '1:hang,2:crash', NODETRON_GPU_RUN_LIMIT_S: '1:3' });
    expect(code).toBe(1);
    const [hang, crash, next] = results.stages;
    expect(hang).toMatchObject({ stage: 1, status: 'timeout', timedOut: true, limitS: 3 });
    expect(hang.wallS).toBeLessThan(30);
    expect(crash).toMatchObject({ stage: 2, status: 'crashed', signal: 'SIGSEGV' });
    expect(next).toMatchObject({ stage: 3, status: 'skipped' });
    // What a stage recorded before it hung or crashed is kept, line by line as each stage ended.
    expect(results.checks.filter((c: { stage: number }) => c.stage === 1)).toHaveLength(1);
    expect(results.checks.filter((c: { stage: number }) => c.stage === 2)).toHaveLength(1);
    expect(lines.map((l) => l.stage)).toEqual([1, 2, 3]);
  }, 180_000);

  it('a later command adds its stages to the same results; an unknown stage is refused', () => {
    runStages('merge', '0');
    const { results } = runStages('merge', '3');
    expect(results.stages.map((s: { stage: number }) => s.stage)).toEqual([0, 3]);
    const bad = spawnSync(process.execPath, [join(root, 'scripts', 'gpu', 'run.mjs'), '--stage', '7', '--out', join(work, 'bad')], { encoding: 'utf8' });
    expect(bad.status).toBe(2);
  }, 180_000);
});
