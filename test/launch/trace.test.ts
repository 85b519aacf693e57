// Timelines through the launcher: a 4-rank job with NODETRON_TRACE writes one trace per rank;
// `nodetron trace merge` joins them into one file holding every collective on every rank with the
// same sequence numbers, and a flow from each send to its recv. A data-parallel GPT job (with and
// without recomputation) traces forward and backward per transformer block, data loading and the
// checkpoint's stages on their tracks, and writes one metrics line per step.
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { main as traceMain } from '../../lib/cli/trace.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';
import { readMetrics } from '../../lib/observe/metrics.js';
import { TRACKS } from '../../lib/observe/trace.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const dir = mkdtempSync(join(tmpdir(), 'nodetron-trace-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Ev = { name: string; ph: string; pid: number; tid: number; ts: number; dur?: number; id?: string; args?: Record<string, unknown> };
const pool = new JobPool();

describe('nodetron trace', () => {
  it('merges a 4-rank job into one timeline with every collective on every rank and send→recv flows', async () => {
    const r = await runProcess(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', '4', scriptPath(join(fixtures, 'trace.ts'))],
      { cwd: root, limitMs: 120_000, env: { ...process.env, NODETRON_TRACE: dir } });
    expect(r.code, r.output).toBe(0);
    expect(await traceMain(['merge', dir])).toBe(0);
    const merged = JSON.parse(readFileSync(join(dir, 'merged.trace.json'), 'utf8')) as { traceEvents: Ev[] };
    const ev = merged.traceEvents;
    expect(ev.filter((e) => e.name === 'process_name').map((e) => e.pid).sort()).toEqual([0, 1, 2, 3]);
    // Every collective of the world on every rank, with the same sequence numbers: 3 allReduces + the barrier.
    const worldSeqs = (pid: number) => ev.filter((e) => e.pid === pid && e.ph === 'b' && e.args?.group === 'world').map((e) => `${e.name}#${String(e.args!.seq)}`);
    const seqs0 = worldSeqs(0);
    expect(seqs0.length).toBe(4);
    expect(seqs0.at(-1)).toMatch(/^barrier#/);
    for (const pid of [1, 2, 3]) expect(worldSeqs(pid)).toEqual(seqs0);
    // Each pair's broadcasts, both members.
    for (const [a, b] of [[0, 1], [2, 3]]) {
      const bc = (pid: number) => ev.filter((e) => e.pid === pid && e.ph === 'b' && e.name === 'broadcast').map((e) => e.args!.seq);
      expect(bc(a)).toEqual([0, 1, 2]);
      expect(bc(b)).toEqual(bc(a));
    }
    // Every 'b' has its 'e', not before it.
    for (const b of ev.filter((e) => e.ph === 'b')) {
      const e = ev.find((x) => x.ph === 'e' && x.id === b.id);
      expect(e && e.ts >= b.ts).toBe(true);
    }
    // 12 sends (3 steps x 4 ranks), each flowing into the recv of the next rank.
    const starts = ev.filter((e) => e.ph === 's'), ends = ev.filter((e) => e.ph === 'f');
    expect(starts.length).toBe(12);
    expect(ends.map((e) => e.id).sort()).toEqual(starts.map((e) => e.id).sort());
    for (const s of starts) {
      const f = ends.find((e) => e.id === s.id)!;
      expect(f.pid).toBe((s.pid + 1) % 4);
      expect(f.tid).not.toBe(s.tid);
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each([false, true])('traces forward and backward per block (recompute %s), data loading, checkpoint stages, and per-step metrics', async (recompute) => {
    const job = join(dir, `gpt-${recompute}`);
    const traceDir = join(job, 'trace'), layers = 3, steps = 3;
    const r = await pool.run(() => runProcess(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', '2', scriptPath(join(fixtures, 'train-metrics.ts')),
      '--data', join(job, 'data'), '--ckpt', join(job, 'ckpt'), '--steps', String(steps), '--layers', String(layers), ...(recompute ? ['--recompute'] : [])],
    { cwd: root, limitMs: 180_000, env: { ...process.env, NODETRON_TRACE: traceDir } }));
    expect(r.code, r.output).toBe(0);
    for (const rank of [0, 1]) {
      const ev = (JSON.parse(readFileSync(join(traceDir, `rank-${rank}.trace.json`), 'utf8')) as { traceEvents: Ev[] }).traceEvents;
      const slices = (name: string, tid = TRACKS.compute) => ev.filter((e) => e.ph === 'X' && e.name === name && e.tid === tid);
      const within = (inner: Ev, outer: Ev) => inner.ts >= outer.ts && inner.ts + inner.dur! <= outer.ts + outer.dur! + 1;
      const forwards = slices('forward'), backwards = slices('backward');
      expect(forwards.length).toBe(steps);
      expect(backwards.length).toBe(steps);
      for (let b = 0; b < layers; b++) {
        const fwd = slices(`forward block ${b}`), bwd = slices(`backward block ${b}`);
        // One forward per step (eval does not run), each inside that step's forward; one backward span per step inside its backward.
        expect(fwd.length, `rank ${rank} forward block ${b}`).toBe(steps);
        expect(bwd.length, `rank ${rank} backward block ${b}`).toBe(steps);
        fwd.forEach((f, i) => expect(within(f, forwards[i]!)).toBe(true));
        bwd.forEach((f, i) => expect(within(f, backwards[i]!)).toBe(true));
      }
      // Blocks run forward in order and backward in reverse.
      for (let i = 0; i < steps; i++) {
        const at = (name: string) => slices(name)[i]!.ts;
        for (let b = 1; b < layers; b++) {
          expect(at(`forward block ${b}`)).toBeGreaterThan(at(`forward block ${b - 1}`));
          expect(at(`backward block ${b - 1}`)).toBeGreaterThan(at(`backward block ${b}`));
        }
      }
      expect(slices('load batch', TRACKS.data).length).toBe(steps);
      expect(slices('checkpoint snapshot', TRACKS.checkpoint).length).toBe(1);
      expect(slices('checkpoint write', TRACKS.checkpoint).length).toBe(1);
      // Rank 0 commits.
      expect(slices('checkpoint commit', TRACKS.checkpoint).length).toBe(rank === 0 ? 1 : 0);
    }
    const metrics = readMetrics(traceDir);
    expect([...metrics.keys()]).toEqual([0, 1]);
    for (const [rank, rows] of metrics) {
      expect(rows.map((m) => m.step)).toEqual([1, 2, 3]);
      for (const m of rows) {
        expect(m.rank).toBe(rank);
        expect(m.computeMs).toBeGreaterThan(0);
        expect(m.computeMs).toBeLessThanOrEqual(m.stepMs);
        expect(m.tokens).toBe(8 * 64);
        expect(m.tokensPerSec).toBeCloseTo(m.tokens / (m.stepMs / 1000), 6);
        expect(m.peakBytes).toBeGreaterThanOrEqual(m.allocatedBytes);
        expect(m.rssBytes).toBeGreaterThan(m.peakBytes);
        expect(Number.isFinite(m.loss)).toBe(true);
      }
    }
    // The loss is the global batch's: equal on both ranks.
    expect(metrics.get(1)!.map((m) => m.loss)).toEqual(metrics.get(0)!.map((m) => m.loss));
    expect(readdirSync(traceDir).filter((f) => f.endsWith('.metrics.jsonl')).length).toBe(2);
  }, QUEUED_TEST_TIMEOUT_MS);
});
