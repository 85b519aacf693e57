// The vocabulary-parallel fused head over 2 and 3 processes equals the single-process fused head and
// the unfused linear + crossEntropy: loss, x's gradient (summed over the slices, or reduce-scattered
// to the sequence chunks) and each rank's rows of the weight's gradient.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runRanks } from '../distributed/spawn-ranks.js';

describe('vocabParallelLinearCrossEntropy (multi-process)', () => {
  for (const [size, backend] of [[2, 'gloo'], [3, 'gloo'], [2, 'file']] as const) {
    it(`over ${size} ranks (${backend}): the single-process fused and unfused heads' loss and gradients`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'nt-vocab-head-'));
      try {
        const res = await runRanks('../parallel/vocab-head-rank.ts', size, [backend, dir], { NODETRON_WARN_LEAKS: '0' }, 150_000);
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
    }, 180_000);
  }
});
