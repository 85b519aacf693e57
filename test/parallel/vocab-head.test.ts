// The vocabulary-parallel fused head over 2 and 3 processes equals the single-process fused head and
// the unfused linear + crossEntropy: loss, x's gradient (summed over the slices, or reduce-scattered
// to the sequence chunks) and each rank's rows of the weight's gradient (test/helpers/vocab-head.ts).
import { describe, it } from 'vitest';
import { expectVocabHeadRanks } from '../helpers/vocab-head.js';

describe('vocabParallelLinearCrossEntropy (multi-process)', () => {
  for (const [size, backend] of [[2, 'gloo'], [3, 'gloo'], [2, 'file']] as const) {
    it(`over ${size} ranks (${backend}): the single-process fused and unfused heads' loss and gradients`, async () => {
      await expectVocabHeadRanks(size, backend);
    }, 180_000);
  }
});
