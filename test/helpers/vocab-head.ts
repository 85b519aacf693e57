// What test/parallel/vocab-head.test.ts and test/ops/pad-vocab-tp.test.ts share: the vocabulary-parallel
// fused head's rank fixture (test/fixtures/parallel/vocab-head-rank.ts) over `size` processes, and its
// results against the single-process fused head and the unfused linear + crossEntropy.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect } from 'vitest';
import { runRanks } from '../distributed/spawn-ranks.js';

/** Runs the fixture over `size` ranks of `backend` (with `env` added) and checks every rank's results. */
export async function expectVocabHeadRanks(size: number, backend: string, env: Record<string, string> = {}): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'nt-vocab-head-'));
  try {
    const res = await runRanks('../parallel/vocab-head-rank.ts', size, [backend, dir], { NODETRON_WARN_LEAKS: '0', ...env }, 150_000);
    for (const r of res) {
      expect(r.code, r.stderr.slice(-3000)).toBe(0);
      expect(r.result.size).toBe(size);
      expect(r.result.cases).toHaveLength(4);
      for (const c of r.result.cases) {
        expect(Math.abs(c.loss - c.lossSingle), c.name).toBeLessThan(1e-5 * Math.max(1, Math.abs(c.lossSingle)));
        expect(Math.abs(c.loss - c.lossUnfused), c.name).toBeLessThan(1e-5 * Math.max(1, Math.abs(c.lossUnfused)));
        expect(c.dxDiff, `${c.name}: dx`).toBeLessThan(1e-5);
        expect(c.dwDiff, `${c.name}: dw`).toBeLessThan(1e-5);
        expect(c.dwVsUnfused, `${c.name}: dw vs unfused`).toBeLessThan(1e-5);
        expect(c.singleVsUnfused, `${c.name}: single-process fused vs unfused dx`).toBeLessThan(1e-5);
      }
      expect(r.result.errors).toEqual(['ArgumentError', 'ShapeError', 'ShapeError']);
      // bf16 autocast: the single process's bf16 head within bf16 rounding, f32 loss and gradients,
      // and visibly not the f32 computation.
      const a = r.result.autocast;
      expect(a.lossDtype).toBe('f32');
      expect(a.gradDtypes).toEqual(['f32', 'f32']);
      expect(Math.abs(a.loss - a.lossSingle)).toBeLessThan(2e-3 * Math.max(1, Math.abs(a.lossSingle)));
      expect(a.dxDiff).toBeLessThan(2e-2);
      expect(a.dwDiff).toBeLessThan(2e-2);
      expect(a.dxVsF32).toBeGreaterThan(1e-4);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
