// Timelines through the launcher: a 4-rank job with NODETRON_TRACE writes one trace per rank;
// `nodetron trace merge` joins them into one file holding every collective on every rank with the
// same sequence numbers, and a flow from each send to its recv.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { main as traceMain } from '../../lib/cli/trace.js';
import { QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const dir = mkdtempSync(join(tmpdir(), 'nodetron-trace-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

type Ev = { name: string; ph: string; pid: number; tid: number; ts: number; id?: string; args?: Record<string, unknown> };

describe('nodetron trace', () => {
  it('merges a 4-rank job into one timeline with every collective on every rank and send→recv flows', async () => {
    const r = await runProcess(process.execPath, ['--import', 'tsx', join(fixtures, 'launcher.ts'), '--nproc-per-node', '4', join(fixtures, 'trace.ts')],
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
});
