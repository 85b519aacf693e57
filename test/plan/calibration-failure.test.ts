// `nodetron plan --calibrate` with bad input or a failing rank: a layout the calibration model cannot
// train is an ArgumentError before any process starts, and a rank that throws mid-calibration makes
// the whole job fail with that rank's error, within a time limit, instead of hanging.
import { afterEach, describe, expect, it, vi } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { main } from '../../lib/cli.js';

/** Rejects with a clear message when `p` has not settled within `ms` (a hang, not a slow run). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const limit = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`${what} did not end within ${ms} ms`)), ms); });
  return Promise.race([p, limit]).finally(() => clearTimeout(timer));
}

describe('calibration layouts are checked before anything is launched', () => {
  afterEach(() => { vi.restoreAllMocks(); });

  it('pp2,mb3: 1·3 micro-batches do not divide the batch of 8 (ArgumentError naming the layout)', () => {
    expect(() => plan.checkCalibrationLayout('pp2,mb3')).toThrow(nt.ArgumentError);
    expect(() => plan.checkCalibrationLayout('pp2,mb3')).toThrow(/layout "pp2,mb3" cannot train the calibration model .*batch 8.*: dp·micro-batches = 1·3 does not divide the global batch of 8 sequences/);
  });

  it('every problem is named: heads by tp, stages by layers, ZeRO without dp, offload', () => {
    expect(() => plan.checkCalibrationLayout('tp3')).toThrow(/--tp 3: /);
    expect(() => plan.checkCalibrationLayout('pp5')).toThrow(/--pp 5 is more pipeline stages than the model's 4 layers/);
    expect(() => plan.checkCalibrationLayout('dp1,zero2')).toThrow(/--zero 2 shards over the data-parallel ranks, but dp = 1/);
    expect(() => plan.checkCalibrationLayout('dp2,zero1,offload')).toThrow(/offload is not calibrated/);
    expect(plan.checkCalibrationLayout('pp3,mb4,gpipe')).toMatchObject({ pp: 3, microBatches: 4, schedule: 'gpipe' });
  });

  it('calibrateLayout and `nodetron plan --calibrate` reject it without starting a rank (exit code 2)', async () => {
    await expect(plan.calibrateLayout('pp2,mb3')).rejects.toThrow(/layout "pp2,mb3".*1·3 does not divide/);
    const err: string[] = [];
    vi.spyOn(console, 'error').mockImplementation((...a: unknown[]) => { err.push(a.map(String).join(' ')); });
    vi.spyOn(console, 'log').mockImplementation(() => undefined);
    const launcherLines: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = ((s: string | Uint8Array) => { launcherLines.push(String(s)); return true; }) as typeof process.stderr.write;
    let code: number;
    // dp2 comes first: it must not run, every layout is checked before the first is launched.
    try { code = await within(main(['plan', '--calibrate', '--layouts', 'dp2;pp2,mb3']), 30_000, 'nodetron plan --calibrate'); } finally { process.stderr.write = write; }
    expect(code).toBe(2);
    expect(err.join('\n')).toMatch(/nodetron plan: .*layout "pp2,mb3" cannot train the calibration model.*1·3 does not divide the global batch of 8/);
    expect(launcherLines.join('')).not.toMatch(/attempt 0|\[rank /);
  });
});

describe('a rank that fails mid-calibration fails the job with its error', () => {
  // The other ranks are then inside the step, waiting on the failed one (pipeline recv, gradient
  // allreduce): the launcher must stop them. 90 s is far beyond a 3-step run here (about 5-15 s).
  for (const [spec, rank, step] of [['pp2,mb2', 1, 1], ['dp2', 0, 2]] as const) {
    it(`${spec}: rank ${rank} throws at step ${step}; calibrateLayout rejects with its StateError`, async () => {
      const t0 = performance.now();
      const run = plan.calibrateLayout(spec, plan.CALIBRATION_SHAPE, { failAt: { rank, step } });
      const e = await within(run.then(() => null, (x: unknown) => x), 90_000, `calibrateLayout(${spec}) with a failing rank`);
      expect(e).toBeInstanceOf(nt.StateError);
      expect((e as Error).message).toMatch(new RegExp(`layout ${spec} failed on rank ${rank}: StateError: calibrate-rank: injected failure of rank ${rank} at step ${step}`));
      expect(performance.now() - t0).toBeLessThan(90_000);
    }, 120_000);
  }

  it('failAt is checked', async () => {
    await expect(plan.calibrateLayout('dp2', plan.CALIBRATION_SHAPE, { failAt: { rank: -1, step: 0 } })).rejects.toThrow(/failAt needs integer rank and step >= 0/);
  });
});
