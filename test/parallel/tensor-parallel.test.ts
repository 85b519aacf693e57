// Tensor-parallel layers in 2 and 4 processes over a file-backed group: outputs, input gradients
// and each rank's weight gradients equal the single-process block's; mapping failures are typed.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { copyToRegion, reduceFromRegion } from '../../lib/parallel/tensor-parallel/mappings.js';
import { ColumnParallelLinear } from '../../lib/parallel/tensor-parallel/layers.js';
import { runRanks } from '../distributed/spawn-ranks.js';

async function tpRun(size: number, scenario: string) {
  const dir = mkdtempSync(join(tmpdir(), 'nt-tp-'));
  try {
    return await runRanks('../parallel/tp-rank.ts', size, [dir, scenario]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('tensor-parallel layers (multi-process)', () => {
  for (const [size, scenario] of [[2, 'mlp'], [4, 'mlp'], [2, 'gather'], [2, 'qkv']] as const) {
    it(`${scenario} over ${size} ranks matches the single-process block`, async () => {
      const res = await tpRun(size, scenario);
      for (const r of res) {
        expect(r.code, r.stderr).toBe(0);
        if (r.result.loss !== null) expect(Math.abs(r.result.loss - r.result.lossRef)).toBeLessThan(1e-5);
        expect(Object.keys(r.result.maxDiff).length).toBeGreaterThanOrEqual(5);
        for (const [k, v] of Object.entries(r.result.maxDiff as Record<string, number>)) expect(v, `${k} on rank ${r.rank}`).toBeLessThan(1e-5);
      }
    });
  }
});

describe('mappings', () => {
  it('a group without synchronous completion is refused with a StateError; the process stays usable', async () => {
    await runLocalRanks(2, async (g) => {
      const x = nt.ones([2, 4]); x.requiresGrad = true;
      expect(() => reduceFromRegion(x, g)).toThrow(nt.StateError);
      const y = copyToRegion(x, g);
      expect(() => nt.sum(y).backward()).toThrow(/waitSync/);
      expect(nt.ones([2]).toArraySync()).toEqual(new Float32Array([1, 1]));
    });
  });

  it('layers reject sizes the group does not divide', async () => {
    await runLocalRanks(3, async (g) => {
      expect(() => new ColumnParallelLinear(4, 8, { group: g })).toThrow(nt.ArgumentError);
      expect(() => new ColumnParallelLinear(4, 8, { group: g })).toThrow(/multiple of the tensor-parallel size 3/);
    });
  });
});
