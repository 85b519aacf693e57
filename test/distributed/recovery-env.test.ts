// recoveryEnv (lib/distributed/recovery-env.ts): the in-job recovery variables of a worker's environment,
// the generation wait (NODETRON_RECOVERY_GENERATION_WAIT_MS) among them, and generationWaitMs, the
// launcher's rule for that wait: always longer than the launcher's own time to detect a loss; and
// lostRanks, the ranks the launcher's generation records say were lost.
import { describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { DEFAULT_GENERATION_WAIT_MS, generationWaitMs, lostRanks, recoveryEnv } from '../../lib/distributed/recovery-env.js';

describe('recoveryEnv', () => {
  it('reads recovery, generation, joining, directory, holder and the generation wait', () => {
    expect(recoveryEnv({})).toEqual({ enabled: false, generation: 0, joining: false, dir: undefined, holder: undefined, generationWaitMs: DEFAULT_GENERATION_WAIT_MS });
    expect(recoveryEnv({
      NODETRON_RECOVERY: '1', NODETRON_GENERATION: '3', NODETRON_JOIN: '1', NODETRON_RECOVERY_DIR: ' /tmp/r ', NODETRON_HOLDER: '127.0.0.1:5000',
      NODETRON_RECOVERY_GENERATION_WAIT_MS: '72000',
    })).toEqual({ enabled: true, generation: 3, joining: true, dir: '/tmp/r', holder: '127.0.0.1:5000', generationWaitMs: 72_000 });
    expect(recoveryEnv({ NODETRON_RECOVERY_GENERATION_WAIT_MS: '' }).generationWaitMs).toBe(DEFAULT_GENERATION_WAIT_MS);
  });

  it('names a malformed variable', () => {
    for (const v of ['0', '-5', '1.5', 'soon', '1e400']) {
      expect(() => recoveryEnv({ NODETRON_RECOVERY_GENERATION_WAIT_MS: v })).toThrow(ArgumentError);
      expect(() => recoveryEnv({ NODETRON_RECOVERY_GENERATION_WAIT_MS: v })).toThrow(/NODETRON_RECOVERY_GENERATION_WAIT_MS/);
    }
    expect(() => recoveryEnv({ NODETRON_GENERATION: '-1' })).toThrow(/NODETRON_GENERATION/);
  });
});

describe('generationWaitMs (the launcher sets NODETRON_RECOVERY_GENERATION_WAIT_MS with it)', () => {
  it('outwaits the launcher\'s longest detection time, twice over plus 10 s, and never goes below the default', () => {
    // nodetron launch's defaults: --stop-timeout-ms 1000, --heartbeat-timeout-ms 30000, a 200 ms monitor.
    expect(generationWaitMs({ stopTimeoutMs: 1000, heartbeatTimeoutMs: 30_000, monitorIntervalMs: 200 })).toBe(2 * 30_200 + 10_000);
    expect(generationWaitMs({ stopTimeoutMs: 1000, heartbeatTimeoutMs: 5000, monitorIntervalMs: 200 })).toBe(DEFAULT_GENERATION_WAIT_MS);
    expect(generationWaitMs({ stopTimeoutMs: 120_000, heartbeatTimeoutMs: 30_000 })).toBe(250_000);
    for (const stop of [0, 1000, 50_000, 400_000]) {
      for (const hb of [1000, 30_000, 90_000, 600_000]) {
        const wait = generationWaitMs({ stopTimeoutMs: stop, heartbeatTimeoutMs: hb, monitorIntervalMs: 200 });
        expect(wait).toBeGreaterThan(Math.max(stop, hb + 200));
        // What the launcher puts in the environment reads back as the same wait.
        expect(recoveryEnv({ NODETRON_RECOVERY_GENERATION_WAIT_MS: String(wait) }).generationWaitMs).toBe(wait);
      }
    }
    expect(() => generationWaitMs({ stopTimeoutMs: -1, heartbeatTimeoutMs: 1 })).toThrow(ArgumentError);
    expect(() => generationWaitMs({ stopTimeoutMs: 1, heartbeatTimeoutMs: Number.NaN })).toThrow(/heartbeatTimeoutMs/);
  });
});

describe('lostRanks', () => {
  it("collects the lost ranks of the launcher's generation records from..to, each once, ascending", async () => {
    const records = new Map<string, string>([
      ['recover/gen/1', JSON.stringify({ generation: 1, lost: [3], reason: 'x' })],
      ['recover/gen/2', JSON.stringify({ generation: 2, lost: [5, 1, 3], reason: 'y' })],
      ['recover/gen/4', JSON.stringify({ generation: 4, lost: [7], reason: 'z' })],
    ]);
    const store = { tryGet: async (k: string) => (records.has(k) ? new TextEncoder().encode(records.get(k)!) : undefined) };
    expect(await lostRanks(store, 1, 1)).toEqual([3]);
    expect(await lostRanks(store, 1, 2)).toEqual([1, 3, 5]);
    expect(await lostRanks(store, 2, 4)).toEqual([1, 3, 5, 7]);
    expect(await lostRanks(store, 3, 3)).toEqual([]);
    expect(await lostRanks(store, 5, 4)).toEqual([]);
    await expect(lostRanks(store, 0, 2)).rejects.toThrow(ArgumentError);
  });
});
