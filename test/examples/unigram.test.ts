// The demo's yardsticks (examples/gpt/data.ts): the unigram level (entropy of the training split's token
// frequencies, and the validation cross-entropy under them with the best additive smoothing) against
// float64 sums written out token by token here, and the share of a sample's words found in a text.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { knownWordShare, unigramLevel, wordsOf } from '../../examples/gpt/data.js';

const GRID = [1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1];

/** Validation cross-entropy token by token, straight from the definition. */
function crossEntropy(train: number[], val: number[], vocab: number, alpha: number): number {
  let nll = 0;
  for (const t of val) nll -= Math.log((train.filter((x) => x === t).length + alpha) / (train.length + alpha * vocab));
  return nll / val.length;
}

describe('unigramLevel', () => {
  it('equals the definitions on a small case (an unseen validation token included)', () => {
    const train = [0, 0, 1, 2], val = [0, 1, 3], vocab = 4;
    const u = unigramLevel(train, val, vocab);
    // p = (1/2, 1/4, 1/4, 0)
    expect(u.trainEntropy).toBeCloseTo(-(0.5 * Math.log(0.5) + 2 * 0.25 * Math.log(0.25)), 12);
    const each = GRID.map((a) => crossEntropy(train, val, vocab, a));
    const best = Math.min(...each);
    expect(u.valCrossEntropy).toBeCloseTo(best, 12);
    expect(u.alpha).toBe(GRID[each.indexOf(best)]);
    // The unseen token makes the smoothing matter: not the smallest pseudo-count.
    expect(u.alpha).toBeGreaterThan(GRID[0]!);
  });

  it('reaches ln k for k equally likely tokens, on train and on fresh validation draws', () => {
    let s = 7;
    const draw = (n: number, k: number) => Array.from({ length: n }, () => { s = (Math.imul(s, 1103515245) + 12345) >>> 0; return (s >>> 8) % k; });
    const u = unigramLevel(draw(200_000, 16), draw(20_000, 16), 50257);
    expect(u.trainEntropy).toBeCloseTo(Math.log(16), 3);
    expect(Math.abs(u.valCrossEntropy - Math.log(16))).toBeLessThan(0.01);
    // A skewed distribution is below ln k: frequencies are what a context-free model learns.
    const skew = draw(100_000, 64).map((t) => (t < 48 ? 0 : t));
    expect(unigramLevel(skew, skew.slice(0, 10_000), 64).trainEntropy).toBeLessThan(Math.log(64) - 1);
  });

  it('rejects tokens outside the vocabulary and empty splits with ArgumentError', () => {
    expect(() => unigramLevel([0, 5], [0], 4)).toThrow(nt.ArgumentError);
    expect(() => unigramLevel([0, 1], [9], 4)).toThrow(/val token 9 at 0 is outside the vocabulary \[0, 4\)/);
    expect(() => unigramLevel([], [0], 4)).toThrow(/both have tokens/);
    expect(() => unigramLevel([0], [0], 0)).toThrow(/vocabSize/);
  });
});

describe('knownWordShare', () => {
  it('counts the lower-cased words found in the vocabulary', () => {
    expect(wordsOf("Call me Ishmael. It's the whale-ship's 2nd day")).toEqual(['call', 'me', 'ishmael', "it's", 'the', "whale-ship's", 'nd', 'day']);
    const vocab = new Set(wordsOf('The whale swam; the sea was calm.'));
    const r = knownWordShare('the WHALE flew over the calm sea, zorbly', vocab);
    expect(r.words).toBe(8);
    expect(r.unknown).toEqual(['flew', 'over', 'zorbly']);
    expect(r.share).toBeCloseTo(5 / 8, 12);
    expect(knownWordShare('... !!', vocab)).toEqual({ share: 0, words: 0, unknown: [] });
  });
});
