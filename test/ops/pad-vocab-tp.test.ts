// The vocabulary-parallel fused head with a padded vocabulary (NODETRON_PAD_VOCAB=64 in every rank,
// so each rank's slice of 21 or 14 columns runs its GEMMs on 64): the group's loss and gradients equal
// the single-process head's and the unfused linear + crossEntropy's (which never pads) within the
// tolerances of test/parallel/vocab-head.test.ts, whose rank fixture this runs.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { runRanks } from '../distributed/spawn-ranks.js';

describe('vocabParallelLinearCrossEntropy with NODETRON_PAD_VOCAB=64 (multi-process)', () => {
  it('over 2 ranks (gloo): the unpadded, unfused loss and gradients', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-pad-vocab-tp-'));
    try {
      const res = await runRanks('../parallel/vocab-head-rank.ts', 2, ['gloo', dir], { NODETRON_WARN_LEAKS: '0', NODETRON_PAD_VOCAB: '64' }, 150_000);
      for (const r of res) {
        expect(r.code, r.stderr.slice(-3000)).toBe(0);
        expect(r.result.cases).toHaveLength(4);
        for (const c of r.result.cases) {
          expect(Math.abs(c.loss - c.lossUnfused), c.name).toBeLessThan(1e-5 * Math.max(1, Math.abs(c.lossUnfused)));
          expect(Math.abs(c.loss - c.lossSingle), c.name).toBeLessThan(1e-5 * Math.max(1, Math.abs(c.lossSingle)));
          expect(c.dxDiff, `${c.name}: dx`).toBeLessThan(1e-5);
          expect(c.dwVsUnfused, `${c.name}: dw vs unfused`).toBeLessThan(1e-5);
          expect(c.singleVsUnfused, `${c.name}: single-process padded vs unfused dx`).toBeLessThan(1e-5);
        }
        expect(r.result.errors).toEqual(['ArgumentError', 'ShapeError', 'ShapeError']);
        const a = r.result.autocast;
        expect(a.lossDtype).toBe('f32');
        expect(Math.abs(a.loss - a.lossSingle)).toBeLessThan(2e-3 * Math.max(1, Math.abs(a.lossSingle)));
        expect(a.dxDiff).toBeLessThan(2e-2);
        expect(a.dwDiff).toBeLessThan(2e-2);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
