// nt.train.setup under context parallelism (--cp, --cp-mode from the command line and NODETRON_CP*):
// a checkpoint saved under cp resumes under other layouts (one process, DP2, the other cp mode) and
// one saved by one process resumes under cp, each continuing with the uninterrupted run's losses; a
// run under cp samples the same tokens as one process.
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const script = join(root, 'test', 'fixtures', 'train', 'cp-ckpt.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-cp-ckpt-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const pool = new JobPool();

interface Result { rank: number; layout: nt.parallel.TrainingLayout; start: number; losses: number[]; sample: number[] | null }

function launch(name: string, nproc: number, args: string[], env: NodeJS.ProcessEnv = {}) {
  const out = join(work, name);
  return pool.run(async () => {
    const r = await runProcess(process.execPath, [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(script), '--out', out, ...args],
      { cwd: root, limitMs: 240_000, env: { ...process.env, ...env } });
    const results: Result[] = r.code !== 0 ? [] : Array.from({ length: nproc }, (_, k) => JSON.parse(readFileSync(join(out, `result-${k}.json`), 'utf8')) as Result);
    return { ...r, results };
  });
}

/** Losses agree to float32 rounding (the layouts sum in different orders). */
function expectLosses(got: number[], want: number[]): void {
  expect(got).toHaveLength(want.length);
  got.forEach((l, i) => expect(Math.abs(l - want[i]!) / Math.abs(want[i]!), `step ${i}: ${l} vs ${want[i]}`).toBeLessThan(1e-5));
}

describe('nt.train.setup under context parallelism', () => {
  it('checkpoints saved under cp resume under other layouts and back, with the uninterrupted run\'s losses', async () => {
    const dirCp = join(work, 'ckpt-cp'), dirSingle = join(work, 'ckpt-single');
    const [whole, cpFirst, singleFirst] = await Promise.all([
      launch('whole', 1, ['--dir', join(work, 'ckpt-whole')]),
      // The layout from the command line and from the environment.
      launch('cp-first', 2, ['--dir', dirCp, '--stop-at', '2', '--cp', '2']),
      launch('single-first', 1, ['--dir', dirSingle, '--stop-at', '2']),
    ]);
    for (const r of [whole, cpFirst, singleFirst]) expect(r.code, r.output).toBe(0);
    const expected = whole.results[0]!.losses;
    expect(expected).toHaveLength(4);
    expect(cpFirst.results[0]!.layout).toMatchObject({ cp: 2, cpMode: 'ring', dp: 1 });
    for (const r of cpFirst.results) expectLosses(r.losses, expected.slice(0, 2));
    expect(nt.ckpt.listCheckpoints(dirCp).map((c) => c.step)).toEqual([2]);
    // Each resumed run gets its own copy of the checkpoints (it saves its own step 4 beside them).
    const copy = (from: string, name: string) => { const to = join(work, name); cpSync(from, to, { recursive: true }); return to; };
    const resumed = await Promise.all([
      launch('cp-to-single', 1, ['--dir', copy(dirCp, 'c1'), '--resume']),
      launch('cp-to-dp2', 2, ['--dir', copy(dirCp, 'c2'), '--resume', '--dp', '2']),
      launch('cp-to-ulysses', 2, ['--dir', copy(dirCp, 'c3'), '--resume'], { NODETRON_CP: '2', NODETRON_CP_MODE: 'ulysses' }),
      launch('single-to-cp', 2, ['--dir', copy(dirSingle, 'c4'), '--resume', '--cp', '2']),
    ]);
    for (const run of resumed) {
      expect(run.code, run.output).toBe(0);
      for (const r of run.results) {
        expect(r.start).toBe(2);
        expectLosses(r.losses, expected.slice(2));
      }
    }
    expect(resumed[2]!.results[1]!.layout).toMatchObject({ cp: 2, cpMode: 'ulysses' });
    // Sampling under cp (rank 0 samples from a copy without context parallelism) gives the tokens one process gives.
    expect(resumed[3]!.results[0]!.sample).toEqual(resumed[0]!.results[0]!.sample);
    expect(resumed[3]!.results[0]!.sample).toHaveLength(7);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('--cp and --cp-mode are layout flags (command line over NODETRON_CP, NODETRON_CP_MODE)', () => {
    expect(nt.train.layoutFromArgs(['--cp', '2', '--cp-mode', 'ulysses'], {})).toEqual({ cp: 2, cpMode: 'ulysses' });
    expect(nt.train.layoutFromArgs(['--cp', '4'], { NODETRON_CP: '2', NODETRON_CP_MODE: 'ring' })).toEqual({ cp: 4, cpMode: 'ring' });
    expect(() => nt.train.layoutFromArgs(['--cp-mode', 'zigzag'], {})).toThrow(/--cp-mode must be ring or ulysses, got "zigzag"/);
    expect(() => nt.train.layoutFromArgs(['--cp', '0'], {})).toThrow(/--cp must be an integer >= 1/);
  });
});
