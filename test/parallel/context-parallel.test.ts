// Context parallelism: ring attention and Ulysses over 2 and 3 real processes (Gloo) against the
// single-process attention and a float64 reference, forward and gradients; bad sequence lengths and
// head counts are typed errors on every rank, with the group still usable afterwards.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { ringChunks } from '../../lib/parallel/context-parallel/ring.js';
import { ulyssesChunk } from '../../lib/parallel/context-parallel/ulysses.js';
import { runRanks } from '../distributed/spawn-ranks.js';

describe('context-parallel attention (multi-process)', () => {
  // [cp, B, T, H, D]: T = 2·cp·c with chunks of 5 and 4 tokens (odd sizes, and chunks shorter than a kernel tile).
  for (const [cp, B, T, H, D] of [[2, 2, 20, 4, 8], [3, 1, 24, 3, 16]] as const) {
    it(`cp=${cp}: ring and Ulysses equal the single process to float32 rounding (forward and gradients); bad lengths and heads are ShapeErrors`, async () => {
      const res = await runRanks('../parallel/cp-attention-rank.ts', cp, [B, T, H, D].map(String), { NODETRON_WARN_LEAKS: '0' }, 150_000);
      for (const r of res) {
        expect(r.code, r.stderr.slice(-3000)).toBe(0);
        const diffs = r.result.diffs as Record<string, number>;
        expect(Object.keys(diffs)).toHaveLength(10);
        // The single process's own error against float64 sets the scale of float32 rounding here.
        const single = Math.max(diffs['single forward vs f64']!, diffs['single grad vs f64']!);
        expect(single).toBeLessThan(1e-5);
        for (const mode of ['ring', 'ulysses']) {
          for (const what of ['forward', 'grad']) {
            expect(diffs[`${mode} ${what} vs single`], `${mode} ${what} on rank ${r.rank}`).toBeLessThan(1e-6);
            expect(diffs[`${mode} ${what} vs f64`], `${mode} ${what} vs f64 on rank ${r.rank}`).toBeLessThan(1e-5);
          }
        }
        const errors = r.result.errors as Record<string, string>;
        expect(errors['ring odd']).toMatch(/^ShapeError: ringAttentionPacked: this rank's 3 tokens are not two equal chunks/);
        expect(errors['ring chunks']).toMatch(new RegExp(`^ShapeError: ring attention: the sequence length ${2 * cp + 1} is not a multiple of 2·cp = ${2 * cp}`));
        expect(errors['ulysses chunk']).toMatch(new RegExp(`^ShapeError: Ulysses attention: the sequence length ${cp + 1} is not a multiple of cp = ${cp}`));
        expect(errors['ulysses heads']).toMatch(new RegExp(`^ShapeError: ulyssesAttentionPacked: ${cp + 1} attention heads .* not divisible by cp = ${cp}`));
        expect(r.result.healthy).toBe(true);
      }
    }, 200_000);
  }
});

describe('context-parallel chunks (in process)', () => {
  it('ring chunks balance the causal work: rank i holds chunks i and 2·cp−1−i; Ulysses holds contiguous chunks', () => {
    expect(ringChunks(16, 2, 0)).toEqual([{ start: 0, count: 4 }, { start: 12, count: 4 }]);
    expect(ringChunks(16, 2, 1)).toEqual([{ start: 4, count: 4 }, { start: 8, count: 4 }]);
    // Every position exactly once over the ranks, and each rank's causal work (Σ visible keys) equal.
    for (const cp of [1, 2, 3, 4]) {
      const T = 8 * cp, seen = new Array<number>(T).fill(0), work: number[] = [];
      for (let r = 0; r < cp; r++) {
        let w = 0;
        for (const c of ringChunks(T, cp, r)) for (let t = c.start; t < c.start + c.count; t++) { seen[t]!++; w += t + 1; }
        work.push(w);
      }
      expect(seen.every((n) => n === 1)).toBe(true);
      expect(new Set(work).size).toBe(1);
    }
    expect(ulyssesChunk(12, 3, 2)).toEqual({ start: 8, count: 4 });
    expect(() => ringChunks(12, 4, 0)).toThrow(nt.ShapeError);
    expect(() => ulyssesChunk(10, 4, 0)).toThrow(nt.ShapeError);
  });
});
