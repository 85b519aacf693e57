// The cross-entropies share one set of argument checks (lib/ops/loss.ts): crossEntropy, the fused
// head linearCrossEntropy and both vocabulary-parallel forms refuse the same bad input with the same
// typed error and message, each naming itself and its own input.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';

const ids = (...v: number[]) => nt.tensor(Int32Array.from(v), [v.length]);

describe('cross-entropy argument checks', () => {
  it('one message per mistake, whichever cross-entropy gets it', async () => {
    const logits = nt.zeros([3, 8]), x = nt.zeros([3, 4]), w = nt.zeros([8, 4]);
    const good = ids(0, 1, 2);
    const expectError = (f: () => unknown, type: typeof nt.ArgumentError | typeof nt.ShapeError, message: RegExp) => {
      expect(f, String(message)).toThrow(type);
      expect(f, String(message)).toThrow(message);
    };
    // A scalar has no last dimension to score over.
    expectError(() => nt.crossEntropy(nt.zeros([]), nt.zeros([], { dtype: 'i32' })), nt.ShapeError, /^crossEntropy: logits must be \[\.\.\., V\], got a scalar$/);
    expectError(() => nt.linearCrossEntropy(nt.zeros([]), w, nt.zeros([], { dtype: 'i32' })), nt.ShapeError, /^linearCrossEntropy: x must be \[\.\.\., C\], got a scalar$/);
    // Targets of another shape than the rows.
    expectError(() => nt.crossEntropy(logits, ids(0, 1)), nt.ShapeError, /^crossEntropy: targets \[2\] must match logits \[3, 8\] without its last dimension$/);
    expectError(() => nt.linearCrossEntropy(x, w, ids(0, 1)), nt.ShapeError, /^linearCrossEntropy: targets \[2\] must match x \[3, 4\] without its last dimension$/);
    // Options.
    for (const [name, f] of [
      ['crossEntropy', (o: object) => nt.crossEntropy(logits, good, o)],
      ['linearCrossEntropy', (o: object) => nt.linearCrossEntropy(x, w, good, o)],
    ] as const) {
      expectError(() => f({ ignoreIndex: 0.5 }), nt.ArgumentError, new RegExp(`^${name}: ignoreIndex must be an integer, got 0.5$`));
      expectError(() => f({ reduction: 'avg' }), nt.ArgumentError, new RegExp(`^${name}: reduction must be 'mean' or 'sum', got avg$`));
    }
    // A target outside the vocabulary (the fused head checks it here; crossEntropy's kernel does).
    expectError(() => nt.crossEntropy(logits, ids(0, 8, 1)), nt.ArgumentError, /target 8 at row 1 is outside the vocabulary \[0, 8\)/);
    expectError(() => nt.linearCrossEntropy(x, w, ids(0, 8, 1)), nt.ArgumentError,
      /^linearCrossEntropy: target 8 at row 1 is outside the vocabulary \[0, 8\) \(and is not ignoreIndex -100\)$/);

    // The vocabulary-parallel forms, over two in-process ranks (4 of the 8 columns each): the same
    // checks, before any communication (a LocalGroup cannot finish a collective synchronously).
    await runLocalRanks(2, async (g) => {
      const local = nt.zeros([3, 4]), wLocal = nt.zeros([4, 4]);
      expectError(() => nt.parallel.tp.vocabParallelCrossEntropy(nt.zeros([]), nt.zeros([], { dtype: 'i32' }), g), nt.ShapeError,
        /^vocabParallelCrossEntropy: localLogits must be \[\.\.\., V\/tp\], got a scalar$/);
      expectError(() => nt.parallel.tp.vocabParallelCrossEntropy(local, ids(0, 1), g), nt.ShapeError,
        /^vocabParallelCrossEntropy: targets \[2\] must match localLogits \[3, 4\] without its last dimension$/);
      expectError(() => nt.parallel.tp.vocabParallelLinearCrossEntropy(x, wLocal, ids(0, 1), g), nt.ShapeError,
        /^vocabParallelLinearCrossEntropy: targets \[2\] must match x \[3, 4\] without its last dimension$/);
      expectError(() => nt.parallel.tp.vocabParallelCrossEntropy(local, good, g, { ignoreIndex: 0.5 }), nt.ArgumentError,
        /^vocabParallelCrossEntropy: ignoreIndex must be an integer, got 0.5$/);
      expectError(() => nt.parallel.tp.vocabParallelLinearCrossEntropy(x, wLocal, good, g, { ignoreIndex: 0.5 }), nt.ArgumentError,
        /^vocabParallelLinearCrossEntropy: ignoreIndex must be an integer, got 0.5$/);
      expectError(() => nt.parallel.tp.vocabParallelLinearCrossEntropy(x, wLocal, good, g, { reduction: 'avg' as never }), nt.ArgumentError,
        /^vocabParallelLinearCrossEntropy: reduction must be 'mean' or 'sum', got avg$/);
      for (const [name, f] of [
        ['vocabParallelCrossEntropy', () => nt.parallel.tp.vocabParallelCrossEntropy(local, ids(0, 8, 1), g)],
        ['vocabParallelLinearCrossEntropy', () => nt.parallel.tp.vocabParallelLinearCrossEntropy(x, wLocal, ids(0, 8, 1), g)],
      ] as const) {
        expectError(f, nt.ArgumentError, new RegExp(`^${name}: target 8 at row 1 is outside the vocabulary \\[0, 8\\) \\(and is not ignoreIndex -100\\)$`));
      }
      local.dispose(); wLocal.dispose();
    });
    // ignoreIndex rows are not targets, whatever their value: the other rows' mean of log 8 (zero logits).
    expect(nt.linearCrossEntropy(x, w, ids(0, 99, 1), { ignoreIndex: 99 }).item()).toBeCloseTo(Math.log(8), 5);
    for (const t of [logits, x, w, good]) t.dispose();
  });
});
