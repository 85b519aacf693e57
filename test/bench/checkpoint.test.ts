// `nodetron bench checkpoint` end to end on the tiny config: one process, and both 2-rank layouts; every timed
// synchronous save has a dd of the same bytes beside it, and the JSON holds what the table prints.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const work = mkdtempSync(join(tmpdir(), 'nt-bench-ckpt-test-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Row { layout: string; bytes: number; syncMs: number[]; ddMs: number[]; saveBytesPerS: number; ddBytesPerS: number; saveOverDd: number; saveOverDdBest: number; loadMs: number }

describe('nodetron bench checkpoint', () => {
  it('saves in one process, under dp2 and zero3 beside dd, round by round, and writes its JSON', async () => {
    const json = join(work, 'out.json');
    const { code, output } = await new JobPool().run(() => runProcess(process.execPath, [join(root, 'bin', 'nodetron.js'), 'bench', 'checkpoint',
      '--config', 'tiny', '--saves', '1', '--rounds', '3', '--dir', work, '--json', json], { cwd: root, limitMs: 300_000 }));
    expect(code, output).toBe(0);
    expect(output).toMatch(/save\/dd \(median; best\)/);
    const { results } = JSON.parse(readFileSync(json, 'utf8')) as { results: Row[] };
    expect(results.map((r) => r.layout)).toEqual(['one', 'dp2', 'zero3']);
    for (const r of results) {
      // Weights + AdamW's two moments of the tiny GPT in f32, plus the safetensors headers.
      expect(r.bytes).toBeGreaterThan(3 * 4 * 7e6);
      expect(r.syncMs.length).toBe(3);
      expect(r.ddMs.length).toBe(3);
      expect(r.saveOverDd).toBeCloseTo(r.saveBytesPerS / r.ddBytesPerS, 6);
      expect(r.saveOverDdBest).toBeGreaterThan(0);
      expect(r.loadMs).toBeGreaterThan(0);
    }
  }, QUEUED_TEST_TIMEOUT_MS);
});
