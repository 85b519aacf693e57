// `nodetron launch --self-check` through the launcher: a healthy 4-rank job passes init after rank 0
// prints the summary; with rank 2's sends delayed (NODETRON_DEBUG_SLOW_RANK=2:3, its links about 4x
// as long) the summary names rank 2 and only it, as a warning; --self-check=strict stops the job with
// a non-zero exit and a CommError naming rank 2; a link that fails (rank 1 never sends to rank 3,
// NODETRON_DEBUG_SELF_CHECK_DROP=1-3) stops the job before training with a CommError naming it.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseLaunchArgs } from '../../lib/launch/cli.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const pool = new JobPool();
const launch = (flag: string, env: Record<string, string> = {}) => pool.run(() => runProcess(process.execPath,
  [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', '4', flag, scriptPath(join(fixtures, 'self-check.ts'))],
  { cwd: root, limitMs: 180_000, env: { ...process.env, NODETRON_DEBUG_SLOW_RANK: '', ...env } }));
const slowRanks = (out: string) => [...out.matchAll(/^\[rank 0\]\s+(\d+)\s+\S+\s+[\d.]+\s+SLOW$/gm)].map((m) => Number(m[1]));

describe('nodetron launch --self-check', () => {
  it('parses --self-check and --self-check=strict', () => {
    expect((parseLaunchArgs(['--self-check', 'x.ts']) as { selfCheck?: string }).selfCheck).toBe('1');
    expect((parseLaunchArgs(['--self-check=strict', 'x.ts']) as { selfCheck?: string }).selfCheck).toBe('strict');
    expect(() => parseLaunchArgs(['--self-check=loud', 'x.ts'])).toThrow(/--self-check takes no value or =strict/);
  });

  it('passes a healthy 4-rank job, rank 0 printing the summary', async () => {
    const r = await launch('--self-check');
    expect(r.code, r.output).toBe(0);
    expect(r.output).toMatch(/\[rank 0\] nodetron self-check: 4 ranks, 4\.0 MiB per exchange, 6 links/);
    expect(r.output).toMatch(/allreduce: [\d.]+ ms, bus [\d.]+ GB\/s/);
    expect(r.output).not.toMatch(/FAILED/);
    for (let k = 0; k < 4; k++) expect(r.output).toContain(`[rank ${k}] rank ${k} past init`);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('names an injected slow rank (a warning), and stops the job in strict mode', async () => {
    const env = { NODETRON_DEBUG_SLOW_RANK: '2:3' };
    const [warn, strict] = await Promise.all([launch('--self-check', env), launch('--self-check=strict', env)]);
    expect(warn.code, warn.output).toBe(0);
    expect(slowRanks(warn.output), warn.output).toEqual([2]);
    expect(warn.output).toMatch(/verdict: SLOW: rank 2 \(\S+\) is slow: its links take [\d.]+x as long as the others/);
    expect(warn.output).toContain('[rank 3] rank 3 past init');
    expect(strict.code, strict.output).not.toBe(0);
    expect(strict.output).toMatch(/CommError: self-check: rank 2 \(\S+\) is slow/);
    expect(strict.output).not.toContain('past init');
  }, QUEUED_TEST_TIMEOUT_MS);

  it('stops the job on a failed link, naming it', async () => {
    const r = await launch('--self-check', { NODETRON_DEBUG_SELF_CHECK_DROP: '1-3', NODETRON_SELF_CHECK_TIMEOUT_MS: '3000' });
    expect(r.code, r.output).not.toBe(0);
    expect(r.output).toMatch(/\[rank 0\]   1-3\s+FAILED: rank 1: recv from rank 3/);
    expect(r.output).toMatch(/CommError: self-check: link 1-3 failed \(rank 1: recv from rank 3 .*timed out/i);
    expect(r.output).not.toContain('past init');
  }, QUEUED_TEST_TIMEOUT_MS);
});
