// The vocabulary-parallel fused head with a padded vocabulary (NODETRON_PAD_VOCAB=64 in every rank,
// so each rank's slice of 21 or 14 columns runs its GEMMs on 64): the group's loss and gradients equal
// the single-process head's and the unfused linear + crossEntropy's (which never pads) within the
// tolerances of test/parallel/vocab-head.test.ts, with the same rank fixture and checks
// (test/helpers/vocab-head.ts).
import { describe, it } from 'vitest';
import { expectVocabHeadRanks } from '../helpers/vocab-head.js';

describe('vocabParallelLinearCrossEntropy with NODETRON_PAD_VOCAB=64 (multi-process)', () => {
  it('over 2 ranks (gloo): the unpadded, unfused loss and gradients', async () => {
    await expectVocabHeadRanks(2, 'gloo', { NODETRON_PAD_VOCAB: '64' });
  }, 180_000);
});
