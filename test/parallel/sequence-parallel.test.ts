// Sequence parallelism: the three sequence mappings over 2 (Gloo) and 3 (file-backed) processes
// against float64 references, typed errors for sequence lengths the group does not divide, and the
// in-process pieces (layout checks, the GPT's sequence hook) that need no communication.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { sequenceParallelLayout } from '../../lib/internal.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { runRanks } from '../distributed/spawn-ranks.js';

describe('sequence-parallel mappings (multi-process)', () => {
  for (const [size, backend] of [[2, 'gloo'], [3, 'file']] as const) {
    it(`over ${size} ranks (${backend}): forward values and gradients against float64; bad T is a ShapeError and the group stays usable`, async () => {
      const dir = mkdtempSync(join(tmpdir(), 'nt-spmap-'));
      try {
        const res = await runRanks('../parallel/sp-mappings-rank.ts', size, [backend, dir], { NODETRON_WARN_LEAKS: '0' }, 120_000);
        for (const r of res) {
          expect(r.code, r.stderr.slice(-3000)).toBe(0);
          const diffs = r.result.diffs as Record<string, number>;
          // 3 shapes × 3 mappings × (shape, forward, grad), and the gathered linear's output and 3 gradients.
          expect(Object.keys(diffs)).toHaveLength(31);
          for (const [name, d] of Object.entries(diffs)) {
            // Copies are exact; sums of f32 values in [-1, 1) over ≤ 3 ranks are within a few ulps of float64.
            expect(d, `${name} on rank ${r.rank}`).toBeLessThan(/reduceScatter .* forward|gather .* grad|gathered linear/.test(name) ? 1e-6 : 1e-7);
          }
          const errors = r.result.errors as Record<string, string>;
          expect(Object.keys(errors)).toHaveLength(5);
          for (const name of ['scatter T', 'reduceScatter T']) {
            expect(errors[name]).toMatch(new RegExp(`^ShapeError: \\w+SequenceRegion: sequence length \\(dimension 1\\) ${size + 1} of .* is not divisible by the group size ${size}`));
          }
          for (const name of ['scatter 1-D', 'gather 1-D', 'reduceScatter 1-D']) expect(errors[name]).toMatch(/^ShapeError: .*at least 2 dimension/);
          expect(r.result.healthy).toBe(true);
        }
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    }, 150_000);
  }
});

describe('sequence parallelism (in process)', () => {
  const shape = { nLayer: 2, nHead: 2, nEmbd: 32, vocabSize: 64, blockSize: 16 };
  it('the layout accepts --sp with tp > 1 and rejects it with tp = 1 or a sequence length tp does not divide', () => {
    const l = nt.parallel.resolveTrainingLayout({ tp: 2, sequenceParallel: true }, shape, 4, 4);
    expect(l.sequenceParallel).toBe(true);
    expect(nt.parallel.describeLayout(l)).toBe('tp=2 sp pp=1 dp=2 zero=0 micro-batches=1');
    expect(nt.parallel.resolveTrainingLayout({ tp: 2 }, shape, 2, 4).sequenceParallel).toBe(false);
    for (const [flags, model, message] of [
      [{ sequenceParallel: true }, shape, /--sp splits the sequence over the tensor-parallel ranks, but tp = 1/],
      [{ tp: 2, sequenceParallel: true }, { ...shape, blockSize: 15 }, /--sp: the sequence length 15 is not a multiple of --tp 2/],
      [{ tp: 2, sequenceParallel: true }, { nLayer: 2, nHead: 2, nEmbd: 32, vocabSize: 64 }, /--sp needs the sequence length/],
    ] as const) {
      expect(() => nt.parallel.resolveTrainingLayout(flags, model, 2, 4)).toThrow(nt.ArgumentError);
      expect(() => nt.parallel.resolveTrainingLayout(flags, model, 2, 4)).toThrow(message);
    }
  });

  it('sequenceParallelLayout chunks positions by rank and rejects lengths it does not divide', async () => {
    await runLocalRanks(3, async (g) => {
      const seq = sequenceParallelLayout(g);
      expect(seq.parts).toBe(3);
      expect(seq.chunk(12)).toEqual({ start: 4 * g.rank, count: 4 });
      expect(() => seq.chunk(10)).toThrow(nt.ShapeError);
      expect(() => seq.chunk(10)).toThrow(/sequence length 10 is not a multiple of the tensor-parallel size 3/);
      expect(nt.nn.wholeSequence.chunk(10)).toEqual({ start: 0, count: 10 });
    });
  });

  // A LocalGroup cannot finish a collective synchronously, so any communication would be a
  // StateError: a ShapeError proves the sequence check comes before the embedding's reduce-scatter.
  it('a GPT under sequence parallelism rejects a sequence length tp does not divide before communicating, and stays usable', async () => {
    const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 8, nLayer: 1, nHead: 2, nEmbd: 8, dropout: 0, bias: true };
    await runLocalRanks(2, async (g) => {
      const model = nt.parallel.tp.tensorParallelGPT(config, { seed: 1, group: g, sequenceParallel: true });
      expect(model.sequenceLayout.parts).toBe(2);
      const idx = nt.tensor(Int32Array.from([1, 2, 3, 4, 5, 6]), [2, 3]);
      expect(() => model.forward(idx)).toThrow(nt.ShapeError);
      expect(() => model.forward(idx)).toThrow(/sequence length 3 is not a multiple of the tensor-parallel size 2/);
      expect(() => model.generate(nt.tensor(Int32Array.from([1]), [1, 1]), 1)).toThrow(nt.StateError);
      expect(nt.ones([2]).add(1).toArraySync()).toEqual(new Float32Array([2, 2]));
    });
  });

  it('a sequence layout paired with a vocabulary layout that gives the whole sequence is a StateError', () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-sp1-'));
    try {
      const halves: nt.nn.SequenceLayout = { parts: 2, chunk: (t) => ({ start: 0, count: t / 2 }), replicated: (p) => p };
      const model = new nt.nn.GPT({ vocabSize: 16, blockSize: 8, nLayer: 1, nHead: 2, nEmbd: 8, dropout: 0, bias: true }, { sequenceLayout: halves });
      expect(() => model.forward(nt.tensor(Int32Array.from([1, 2, 3, 4]), [1, 4]))).toThrow(nt.StateError);
      expect(() => model.forward(nt.tensor(Int32Array.from([1, 2, 3, 4]), [1, 4]))).toThrow(/pair the vocabulary and sequence layouts/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
