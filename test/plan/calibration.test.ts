// Predicted f32 peak memory per rank against the allocator's measured peak, through the launcher.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';

describe('calibration on this machine', () => {
  for (const spec of ['dp2,zero1', 'tp2,sp', 'pp2,mb4,1f1b']) {
    it(`${spec}: every rank within 10%`, async () => {
      const row = await nt.plan.calibrateLayout(spec);
      for (const r of row.ranks) expect(Math.abs(r.error), `rank ${r.rank}: predicted ${r.predicted}, measured ${r.peak}`).toBeLessThan(0.1);
    }, 180_000);
  }
});
