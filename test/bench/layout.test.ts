// `bench train --layout` argument reading: stages and ranges, and clear errors for what it cannot run.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { parseLayout } from '../../lib/bench/layout.js';

describe('bench train --layout', () => {
  it('reads dp, a ZeRO stage or range, and defaults to every stage', () => {
    expect(parseLayout('dp=2')).toEqual({ dp: 2, tp: 1, pp: 1, zeroStages: [0, 1, 2, 3] });
    expect(parseLayout('dp=4,zero=1..2')).toEqual({ dp: 4, tp: 1, pp: 1, zeroStages: [1, 2] });
    expect(parseLayout(' dp=3 , zero=2, tp=1,pp=1')).toEqual({ dp: 3, tp: 1, pp: 1, zeroStages: [2] });
  });

  it('rejects what it cannot read or run with ArgumentError', () => {
    for (const bad of ['dp=2,zero=4', 'dp=2,zero=2..1', 'dp=two', 'dp=2,ep=2', 'dp=1', 'dp=2,tp=2', 'dp=2,pp=2', 'dp=0', 'dp=2..3']) {
      expect(() => parseLayout(bad), bad).toThrow(nt.ArgumentError);
    }
    expect(parseLayout('dp=2,zero=0').zeroStages).toEqual([0]);
  });
});
