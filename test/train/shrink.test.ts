// In-job recovery's shrink and grow back (`nodetron launch --spares 0 --shrink`, issue #37 item 4), end to
// end through the real launcher: a rank is lost with no hot spare free, the intact data-parallel
// replicas go on at once under a smaller layout (the same global batch in more micro-batches, the state
// resharded from the images in memory), the lost replica's processes start anew, and the job grows back
// to its own layout once they are ready. Every step's loss stays within the layout-equivalence
// tolerance of the failure-free run (a shrunk layout sums in another order), with no restart and no
// checkpoint read; a job that ends while shrunk ends cleanly; a layout that cannot shrink is replaced
// as before.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';
import { root } from '../helpers/equivalence.js';

const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-shrink-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const pool = new JobPool();
const LIMIT_MS = 300_000;
// The layout-equivalence tests' loss tolerance (test/parallel/gpt-equivalence.test.ts) is 1e-5 after 3
// steps; here the shrunk steps sum in another order and 20 more AdamW steps follow them, which carry
// the difference on (it stays near f32's rounding in these runs: about 2e-7), so the bound is 1e-4.
const LOSS_RTOL = 1e-4;

interface Outcome { code: number | null; output: string; train: Array<[number, number]>; worldSize: number; events: Array<Record<string, unknown>> }

function launch(name: string, launchFlags: string[], scriptFlags: string[], steps: number, env: NodeJS.ProcessEnv = {}): Promise<Outcome> {
  return pool.run(async () => {
    const out = join(work, `${name}.json`), events = join(work, `${name}.events.jsonl`);
    writeFileSync(events, '');
    const args = [...nodeArgs(launcher), '--nproc-per-node', '4', ...launchFlags, scriptPath('test/fixtures/recovery/train.ts'), '--steps', String(steps), '--out', out, ...scriptFlags];
    const r = await runProcess(process.execPath, args, { cwd: root, limitMs: LIMIT_MS, env: { ...process.env, ...env, NODETRON_RECOVERY_EVENTS: events } });
    let parsed: { train: Array<[number, number]>; worldSize: number } = { train: [], worldSize: 0 };
    try { parsed = JSON.parse(readFileSync(out, 'utf8')) as typeof parsed; } catch { /* reported by the test */ }
    const lines = readFileSync(events, 'utf8').split('\n').filter((l) => l.trim() !== '');
    return { code: r.code, output: r.output, ...parsed, events: lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
  });
}

function expectClose(chaos: Outcome, reference: Outcome, steps: number): void {
  expect(reference.train.map(([s]) => s)).toEqual(Array.from({ length: steps }, (_, i) => i + 1));
  expect(chaos.train.map(([s]) => s)).toEqual(reference.train.map(([s]) => s));
  for (let i = 0; i < steps; i++) {
    const [, a] = reference.train[i]!, [, b] = chaos.train[i]!;
    expect(Math.abs(a - b) / Math.abs(a), `step ${i + 1}: ${b} against ${a}`).toBeLessThan(LOSS_RTOL);
  }
  expect(chaos.events.some((e) => e.event === 'fallback-disk' || e.event === 'fallback-restart')).toBe(false);
  expect(chaos.output).not.toMatch(/restarting the group/);
}

/** The failure-free run and the run with a kill under `--spares 0 --shrink`, side by side; both must succeed. */
async function pair(name: string, layout: string[], chaosFlags: string[], steps: number, env: NodeJS.ProcessEnv = {}): Promise<[Outcome, Outcome]> {
  const [reference, chaos] = await Promise.all([
    launch(`${name}-ref`, [], layout, steps),
    launch(`${name}-chaos`, ['--spares', '0', '--shrink'], [...layout, '--recover', 'memory', ...chaosFlags], steps, env),
  ]);
  expect(reference.code, reference.output).toBe(0);
  expect(chaos.code, chaos.output).toBe(0);
  return [reference, chaos];
}

const cases = [
  { name: 'dp2-tp2-zero3, SIGKILL of rank 3: one replica of TP2 goes on (zero 0), then grows back', layout: ['--dp', '2', '--tp', '2', '--zero', '3'], kill: 3, members: [0, 1], out: [2, 3] },
  { name: 'pp2-dp2 1f1b, SIGKILL of rank 0: the other replica goes on with 4 micro-batches', layout: ['--pp', '2', '--dp', '2', '--micro-batches', '2', '--schedule', '1f1b'], kill: 0, members: [2, 3], out: [0, 1] },
  // Three intact replicas, but 4 micro-batches split over 2: two go on, the third waits with the lost one.
  { name: 'dp4 zero1, SIGKILL of rank 1: two of the three intact replicas go on', layout: ['--dp', '4', '--zero', '1'], kill: 1, members: [0, 2], out: [1, 3] },
];

describe('in-job recovery: shrink without a spare, then grow back', () => {
  for (const c of cases) {
    it(`${c.name}; losses within the layout tolerance of the failure-free run`, async () => {
      const steps = 24, slug = c.name.replace(/[^a-z0-9]+/gi, '-').slice(0, 40);
      const [reference, chaos] = await pair(slug, c.layout, ['--kill-rank', String(c.kill), '--kill-after', '3', '--step-delay-ms', '150'], steps);
      expectClose(chaos, reference, steps);
      const shrink = chaos.events.find((e) => e.event === 'shrink');
      expect(shrink, chaos.output).toMatchObject({ generation: 1, members: c.members, out: c.out });
      const grow = chaos.events.find((e) => e.event === 'grow');
      expect(grow, chaos.output).toMatchObject({ generation: 2, from: { epoch: 1, worldSize: c.members.length } });
      // The shrunk world trained (its first step), and every job rank took part in the grow back.
      const shrunkFirst = chaos.events.filter((e) => e.event === 'first-step' && e.generation === 1);
      expect(shrunkFirst.map((e) => e.rank).sort()).toEqual([...c.members].sort());
      const grown = chaos.events.filter((e) => e.event === 'recovered' && e.generation === 2);
      expect(grown.map((e) => e.rank).sort()).toEqual([0, 1, 2, 3]);
      for (const e of chaos.events.filter((x) => x.event === 'recovered' && !x.joined)) expect(e.stepsLost as number).toBeLessThanOrEqual(2);
      expect(chaos.worldSize).toBe(4);
    }, QUEUED_TEST_TIMEOUT_MS);
  }

  it('a job that ends while shrunk ends cleanly: the waiting processes are stopped as done', async () => {
    const steps = 8, layout = ['--dp', '4', '--zero', '2'];
    const [reference, chaos] = await pair('end-shrunk', layout, ['--kill-rank', '1', '--kill-after', '3', '--grow-delay-ms', '600000'], steps);
    expectClose(chaos, reference, steps);
    expect(chaos.events.find((e) => e.event === 'shrink')).toMatchObject({ members: [0, 2], out: [1, 3] });
    expect(chaos.events.some((e) => e.event === 'grow')).toBe(false);
    expect(chaos.worldSize).toBe(2);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a layout that cannot shrink (dp 1) replaces the lost rank as without --shrink', async () => {
    const steps = 6, layout = ['--tp', '2', '--pp', '2'];
    const [reference, chaos] = await pair('no-shrink', layout, ['--kill-rank', '2', '--kill-after', '2'], steps);
    // Nothing reshaped: the same layout, bit for bit.
    expect(chaos.train).toEqual(reference.train);
    expect(chaos.output).toMatch(/no shrink \(the layout has one data-parallel replica/);
    expect(chaos.events.some((e) => e.event === 'shrink')).toBe(false);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a second loss while the first one\'s replacement joins: the replacement follows the survivors into the next generation, its plan included', async () => {
    // tp2 x pp2 cannot shrink, so the first loss (rank 2) gets a new process; rank 1 is lost while that
    // process has not joined yet (it waits for generation 2's fault), so it meets the survivors in a
    // --shrink generation, where every survivor, it included, says what memory it has.
    const steps = 6, layout = ['--tp', '2', '--pp', '2'];
    const [reference, chaos] = await pair('join-then-loss', layout, ['--kill-rank', '2', '--kill-after', '2', '--kill-on-replacement', '1', '--join-wait-generation', '2'], steps);
    expect(chaos.train).toEqual(reference.train);
    expect(chaos.events.some((e) => e.event === 'fallback-disk' || e.event === 'fallback-restart'), chaos.output).toBe(false);
    // Both losses found no spare (a --shrink generation each, which the survivors and the joiner plan together).
    const faults = chaos.events.filter((e) => e.src === 'agent' && e.event === 'fault');
    expect(faults.map((e) => [e.generation, e.lost, e.shrink]), chaos.output).toEqual([[1, [2], true], [2, [1], true]]);
    // The first replacement (job rank 2) restored its rank's state in generation 2, with the survivors,
    // within seconds of that fault (before, the survivors waited 300 s for it to say what memory it has).
    const joined = chaos.events.filter((e) => e.event === 'recovered' && e.joined);
    expect(joined.map((e) => [e.rank, e.generation]).sort(), chaos.output).toEqual([[1, 2], [2, 2]]);
    const second = faults[1]!, restored = joined.find((e) => e.rank === 2)!;
    expect((restored.t as number) - (second.t as number)).toBeLessThan(60_000);
    expect(chaos.events.some((e) => e.event === 'shrink')).toBe(false);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a smaller world that would not fit in memory (NODETRON_SHRINK_MEMORY_LIMIT) is not chosen: the lost rank is replaced as without --shrink', async () => {
    const steps = 6, layout = ['--dp', '2', '--tp', '2', '--zero', '3'];
    const [reference, chaos] = await pair('no-room', layout, ['--kill-rank', '3', '--kill-after', '2'], steps, { NODETRON_SHRINK_MEMORY_LIMIT: '1K' });
    expect(chaos.train).toEqual(reference.train);
    expect(chaos.output).toMatch(/no shrink \(no smaller data-parallel layout fits \(dp 1: job rank [01] would need about [\d.]+ MiB, above its device's 0\.0 MiB\)\)/);
    expect(chaos.events.some((e) => e.event === 'shrink')).toBe(false);
  }, QUEUED_TEST_TIMEOUT_MS);
});
