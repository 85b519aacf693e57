// The flight recorder through the launcher: a rank that skips a collective, and a rank frozen with
// SIGSTOP, are named by the launcher's analysis from the other ranks' dumps (and the absent one).
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const pool = new JobPool();
// The ranks run compiled JavaScript where it is fresh: with source maps, the stacks that issued a
// collective name the .ts sources, as under tsx.
const SOURCE_MAPS = { NODE_OPTIONS: [process.env.NODE_OPTIONS, '--enable-source-maps'].filter(Boolean).join(' ') };
const dirs: string[] = [];
afterAll(() => { for (const d of dirs) rmSync(d, { recursive: true, force: true }); });

function launch(nproc: number, env: NodeJS.ProcessEnv, flags: string[] = []) {
  const dir = mkdtempSync(join(tmpdir(), 'nodetron-flight-test-'));
  dirs.push(dir);
  return pool.run(async () => {
    const r = await runProcess(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', String(nproc), '--stop-grace-ms', '2000', ...flags,
      scriptPath(join(fixtures, 'flight.ts'))], { cwd: root, limitMs: 120_000, env: { ...process.env, NODETRON_FLIGHT_DIR: dir, ...SOURCE_MAPS, ...env } });
    return { ...r, dir };
  });
}

describe('flight recorder', () => {
  it('names the rank that skipped a collective, with the collective and the stack that issued it', async () => {
    const r = await launch(3, { FLIGHT_MODE: 'skip', BAD_RANK: '1', BAD_STEP: '5' });
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    // barrier #0, then one allReduce per step: step 5 is #6.
    expect(r.output).toMatch(/rank 1 never reached allReduce\(sum\) #6 in group 'world' that rank\(s\) 0, 2 wait in: its last op in this group was #5 .*\(alive: it dumped\)/);
    expect(r.output).toMatch(/allReduce\(sum\) #6 was issued at: .*flight\.ts:\d+/);
    expect(r.output).toContain("rank 0 entered #6 completed #5, rank 1 entered #5 completed #5, rank 2 entered #6 completed #5");
    // Every rank wrote a dump: the two that timed out by themselves, rank 1 on the launcher's SIGUSR2.
    const attempt = join(r.dir, 'node0-attempt0');
    expect(readdirSync(attempt).filter((f) => f.endsWith('.json')).sort()).toEqual(['rank-0.json', 'rank-1.json', 'rank-2.json']);
    // No --hang-timeout-ms: nothing reads progress files, so the ranks write none.
    expect(readdirSync(attempt).filter((f) => f.endsWith('.progress'))).toEqual([]);
    const dump = JSON.parse(readFileSync(join(attempt, 'rank-1.json'), 'utf8'));
    expect(dump.reason).toContain('SIGUSR2');
    expect(dump.ops.at(-1)).toMatchObject({ op: 'allReduce(sum)', group: 'world', seq: 5, state: 'completed', bytes: 1024, dtype: 'f32' });
  }, QUEUED_TEST_TIMEOUT_MS);

  it('names a rank frozen with SIGSTOP as never reaching the collective, with its mesh coordinates', async () => {
    const r = await launch(3, { FLIGHT_MODE: 'stop', BAD_RANK: '2', BAD_STEP: '3', MESH: 'dp' });
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    expect(r.output).toMatch(/rank 2 \(tp 0, pp 0, dp 2\) never reached allReduce\(sum\) #3 in group '\w+' that rank\(s\) 0, 1 wait in \(frozen: its process is stopped \(SIGSTOP\), no dump\)/);
    expect(r.output).toMatch(/group '\w+' \(dp\) \[ranks 0, 1, 2\]: rank\(s\) 0, 1 wait in allReduce\(sum\) #3/);
    expect(r.output).toContain('dumps from rank(s) 0, 1 of 3; none from 2');
  }, QUEUED_TEST_TIMEOUT_MS);

  it('--hang-timeout-ms: a job that stops progressing is stopped long before the collective timeout, the frozen rank named', async () => {
    // The ranks' own timeout is 10 minutes: only the launcher's hang check can end this job in time.
    const r = await launch(3, { FLIGHT_MODE: 'stop', BAD_RANK: '2', BAD_STEP: '3', OP_TIMEOUT_MS: '600000' }, ['--hang-timeout-ms', '4000']);
    expect(r.timedOut).toBe(false);
    expect(r.code).toBe(1);
    expect(r.output).toMatch(/attempt 0 failed: the job stopped progressing: no rank of this node completed a collective for \d+ ms \(--hang-timeout-ms 4000\)/);
    // The waiting ranks answered SIGUSR2 from inside their pending allReduce.
    expect(r.output).toMatch(/rank 2 never reached allReduce\(sum\) #4 in group 'world' that rank\(s\) 0, 1 wait in \(frozen: its process is stopped \(SIGSTOP\), no dump\)/);
    expect(r.output).toMatch(/rank 0, pid \d+: dumped because requested by the launcher \(SIGUSR2\)/);
    // The hang check read the progress files of the ranks that completed collectives (all three, before rank 2 froze).
    expect(readdirSync(join(r.dir, 'node0-attempt0')).filter((f) => f.endsWith('.progress')).sort()).toEqual(['rank-0.progress', 'rank-1.progress', 'rank-2.progress']);
  }, QUEUED_TEST_TIMEOUT_MS);
});
