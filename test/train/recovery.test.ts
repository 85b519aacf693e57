// In-job recovery from peers' memory, end to end through the real launcher (`--spares N`) and
// nt.train.setup's `--recover memory`: a rank of a 4-rank job is lost mid-run (SIGKILL, SIGSTOP, with a
// hot spare or a process started anew), the job goes on without a restart, and every step's loss equals
// the failure-free run's bit for bit, under each layout family (DP × TP with ZeRO-3, PP × DP with 1F1B,
// CP × DP with ZeRO-1, expert parallelism with ZeRO-2). The failure-free reference runs without
// recovery at all, so the copies, regrouping and rollback are shown to change no number.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';
import { root } from '../helpers/equivalence.js';

const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-recovery-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const pool = new JobPool();
const LIMIT_MS = 300_000;
const STEPS = 8;

interface Outcome { code: number | null; output: string; train: Array<[number, number]>; own: number[]; events: Array<Record<string, unknown>> }

function launch(name: string, launchFlags: string[], scriptFlags: string[]): Promise<Outcome> {
  return pool.run(async () => {
    const out = join(work, `${name}.json`), events = join(work, `${name}.events.jsonl`);
    writeFileSync(events, '');
    const args = [...nodeArgs(launcher), '--nproc-per-node', '4', ...launchFlags, scriptPath('test/fixtures/recovery/train.ts'), '--steps', String(STEPS), '--out', out, ...scriptFlags];
    const r = await runProcess(process.execPath, args, { cwd: root, limitMs: LIMIT_MS, env: { ...process.env, NODETRON_RECOVERY_EVENTS: events } });
    let parsed: { train: Array<[number, number]>; own: number[] } = { train: [], own: [] };
    try { parsed = JSON.parse(readFileSync(out, 'utf8')) as typeof parsed; } catch { /* reported by the test */ }
    const lines = readFileSync(events, 'utf8').split('\n').filter((l) => l.trim() !== '');
    return { code: r.code, output: r.output, ...parsed, events: lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
  });
}

const cases: Array<{ name: string; layout: string[]; kill: string[]; spares: number; save?: boolean; every?: number }> = [
  { name: 'dp2-tp2-zero3, SIGKILL of rank 1, hot spare, checkpoints every 2 steps', layout: ['--dp', '2', '--tp', '2', '--zero', '3'], kill: ['--kill-rank', '1', '--kill-after', '3'], spares: 1, save: true },
  { name: 'pp2-dp2 1f1b, SIGKILL of rank 0, a process started anew', layout: ['--pp', '2', '--dp', '2', '--micro-batches', '2', '--schedule', '1f1b'], kill: ['--kill-rank', '0', '--kill-after', '4'], spares: 0 },
  { name: 'cp2-dp2-zero1, SIGSTOP of rank 3, hot spare, a copy every 2 steps', layout: ['--cp', '2', '--dp', '2', '--zero', '1', '--recover-every', '2'], kill: ['--kill-rank', '3', '--kill-after', '3', '--kill-signal', 'SIGSTOP'], spares: 1, every: 2 },
  { name: 'dp4 ep2 (MoE) zero2, SIGKILL of rank 2, hot spare', layout: ['--dp', '4', '--ep', '2', '--zero', '2', '--experts', '4'], kill: ['--kill-rank', '2', '--kill-after', '5'], spares: 1 },
];

describe('in-job recovery from peers\' memory', () => {
  for (const c of cases) {
    it(`${c.name}: the job goes on and every loss equals the failure-free run's`, async () => {
      const slug = c.name.replace(/[^a-z0-9]+/gi, '-');
      const [reference, chaos] = await Promise.all([
        launch(`${slug}-ref`, [], c.layout),
        launch(`${slug}-chaos`, ['--spares', String(c.spares)], [...c.layout, '--recover', 'memory', ...c.kill, ...(c.save ? ['--save', join(work, `${slug}-ckpt`)] : [])]),
      ]);
      expect(reference.code, reference.output).toBe(0);
      expect(chaos.code, chaos.output).toBe(0);
      expect(reference.train.map(([s]) => s)).toEqual(Array.from({ length: STEPS }, (_, i) => i + 1));
      // Bit-exact: the same numbers, step for step.
      expect(chaos.train).toEqual(reference.train);
      // It recovered in the job: a fault, a new generation, a rollback from memory, no restart and no disk.
      const fault = chaos.events.find((e) => e.event === 'fault');
      expect(fault, chaos.output).toBeDefined();
      const recovered = chaos.events.filter((e) => e.event === 'recovered');
      expect(recovered.length).toBeGreaterThanOrEqual(4);
      // The step in progress, and the one whose copy may still have been on its way; with a copy every N steps, up to N more.
      for (const e of recovered.filter((x) => !x.joined)) expect(e.stepsLost as number).toBeLessThanOrEqual((c.every ?? 1) + 1);
      expect(chaos.events.some((e) => e.event === 'fallback-disk' || e.event === 'fallback-restart')).toBe(false);
      expect(chaos.output).not.toMatch(/restarting the group/);
      if (c.save) {
        // Saves went on through the rollback (the redone steps save as their numbers say): the last is complete.
        expect(readdirSync(join(work, `${slug}-ckpt`)).filter((d) => /^step-\d+$/.test(d)).length).toBeGreaterThan(0);
        expect(readdirSync(join(work, `${slug}-ckpt`))).toContain(`step-${String(STEPS).padStart(8, '0')}`);
      }
      if (c.kill[1] === '0') {
        // Rank 0's replacement wrote the record: it holds the whole run's history, though it did only the last steps itself.
        expect(chaos.own[0]).toBeGreaterThan(1);
      }
    }, QUEUED_TEST_TIMEOUT_MS);
  }
});
