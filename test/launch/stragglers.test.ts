// The straggler detector on a real job: a 4-rank data-parallel GPT run where rank 2 computes twice as
// long (NODETRON_DEBUG_SLOW_RANK=2:1, a busy wait after each backward) writes per-step metrics
// (NODETRON_METRICS); stragglerScores and `nodetron trace stragglers` name rank 2 and only it, the
// other ranks scoring near 1 — while every rank's step time is about the same (the job is synchronous).
// On cpu the score uses CPU time (wall time on a loaded machine measures the OS's sharing of the
// cores); one BLAS thread and one kernel thread per rank, as ranks sharing a machine's cores should have
// (the score reads the main thread's CPU time: with a kernel pool, part of the compute would run on its
// workers, uncounted, and the main thread's waits for them, counted).
// Why 2x and a threshold of 1.4: with 4 ranks on 2 cores beside other jobs, a healthy rank's CPU time per
// step still moves with what shares its core (caches refilled after every switch, page faults, the JIT's
// background thread): healthy ranks scored 0.95 to 1.02 over about 50 runs here (load averages 20 to 240,
// some with a busy loop per core beside), and 1.16 once (issue #36, with the earlier whole-run statistic)
// — too close to a 30% slowdown and the default 1.15 to test against. A 2x slowdown scored against 1.4
// (about sqrt 2, midway on a log scale) leaves a factor 1.4 either way: a healthy rank is named only if
// it uses 40% more CPU than the step's typical rank in most steps, and rank 2 is missed only if it uses
// 29% less than twice as much.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { main as traceMain } from '../../lib/cli/trace.js';
import { readMetrics, stragglerScores } from '../../lib/observe/metrics.js';
import { QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const dir = mkdtempSync(join(tmpdir(), 'nodetron-stragglers-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('straggler scores', () => {
  it('name the rank made twice as slow, and only it', async () => {
    const metrics = join(dir, 'metrics');
    const r = await runProcess(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', '4', scriptPath(join(fixtures, 'train-metrics.ts')),
      '--data', join(dir, 'data'), '--steps', '16', '--layers', '4', '--width', '128', '--ctx', '128'],
    { cwd: root, limitMs: 300_000, env: { ...process.env, NODETRON_METRICS: metrics, NODETRON_DEBUG_SLOW_RANK: '2:1', OPENBLAS_NUM_THREADS: '1', NODETRON_KERNEL_THREADS: '1' } });
    expect(r.code, r.output).toBe(0);
    const m = readMetrics(metrics);
    expect([...m.keys()]).toEqual([0, 1, 2, 3]);
    for (const rows of m.values()) expect(rows.length).toBe(16);
    // Two warm-up steps left out (allocation and first-touch on a loaded machine).
    const report = stragglerScores(m, { skip: 2, threshold: 1.4 });
    expect(report.metric).toBe('cpuMs');
    const scores = report.ranks.map((x) => x.score.toFixed(2)).join(', ');
    console.log(`straggler scores (CPU time per step, rank 0..3): ${scores}`);
    expect(report.stragglers, scores).toEqual([2]);
    // Twice the compute (the busy wait adds this rank's own compute CPU time of the step): a score
    // near 2, and near 1 for the others, each within the factor 1.4 either way.
    expect(report.ranks[2]!.score, scores).toBeGreaterThan(2 / 1.4);
    expect(report.ranks[2]!.score, scores).toBeLessThan(2 * 1.4);
    for (const k of [0, 1, 3]) {
      expect(report.ranks[k]!.score, scores).toBeGreaterThan(1 / 1.4);
      expect(report.ranks[k]!.score, scores).toBeLessThan(1.4);
    }
    // Step time cannot tell: every rank waits for the slowest at the gradient allreduce, so scored by
    // step time every rank (rank 2 included) sits near 1 and none is named. (Each rank's median step
    // time alone differed by up to 23% between ranks under load: a rank woken late after a step's
    // last collective starts its next step late and records it shorter; the per-step score cancels it.)
    const byStep = stragglerScores(m, { skip: 2, threshold: 1.4, metric: 'stepMs' });
    const stepScores = byStep.ranks.map((x) => x.score.toFixed(2)).join(', ');
    expect(byStep.stragglers, stepScores).toEqual([]);
    for (const x of byStep.ranks) expect(x.score, stepScores).toBeGreaterThan(1 / 1.4);
    const log = vi.spyOn(console, 'log').mockImplementation(() => {});
    try {
      expect(await traceMain(['stragglers', metrics, '--skip', '2', '--threshold', '1.4'])).toBe(0);
      const table = log.mock.calls.map((c) => String(c[0])).join('\n');
      expect(table).toMatch(/^\s+2\s+14\s.*STRAGGLER$/m);
      expect(table.match(/STRAGGLER/g)!.length).toBe(1);
      expect(table).toContain('straggler(s): rank 2 (score');
    } finally {
      log.mockRestore();
    }
  }, QUEUED_TEST_TIMEOUT_MS);
});
