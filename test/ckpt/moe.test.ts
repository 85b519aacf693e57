// Checkpoints of expert-parallel runs, through the real launcher and Gloo: a tiny MoE GPT (4 experts,
// top-2) saved under EP2×DP2 with ZeRO 1 (experts sharded over their expert-data-parallel pair), loaded
// in one process, under EP4 without ZeRO (each rank one expert) and, from the state EP4 re-saved, back
// under EP2×DP2 with ZeRO 3 and under EP2 with ZeRO 2 (no expert copies): each state re-saved right
// after its load equals the source bit for bit (every expert whole under its global name, the
// optimizer's moments and step counts), and the step after the load agrees with one process.
import { cpSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { type CheckpointRun as Result, checkpointRuns, expectSameCheckpointState as expectSameState } from '../helpers/ckpt-runs.js';
import { QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';

// 4 experts, a global batch of 4 (dp 4 takes a sequence each), no dropout (layouts draw it differently).
const MOE = ['--moe-experts', '4', '--batch', '4', '--dropout', '0'];

const { launch, at, ckpt } = checkpointRuns('nt-ckpt-moe-', { common: MOE, limitMs: 300_000 });

const source = launch('source', 4, ['--ep', '2', '--dp', '4', '--zero', '1', '--steps', '3', '--save', ckpt('source')]);
const resave = (name: string, nproc: number, flags: string[], from: string) => (s: Result) => (s.code !== 0 ? s
  : launch(name, nproc, [...flags, '--steps', '4', '--resume', ckpt(from), '--save-loaded', '--save', ckpt(name)]));
const single = source.then(resave('single', 1, [], 'source'));
const ep4 = source.then(resave('ep4', 4, ['--ep', '4', '--dp', '4'], 'source'));
// Back from the EP4 run's re-saved state (its step 3, copied alone so it is the newest): EP2×DP2 with ZeRO 3, EP2 with ZeRO 2.
const ep4At3 = ep4.then((t) => {
  if (t.code === 0) cpSync(at('ep4', 3), at('ep4-step3', 3), { recursive: true });
  return t;
});
const back: Record<string, Promise<Result>> = {
  'EP2×DP2 ZeRO 3': ep4At3.then(resave('back-zero3', 4, ['--ep', '2', '--dp', '4', '--zero', '3'], 'ep4-step3')),
  'EP2 ZeRO 2 (one copy of each expert)': ep4At3.then(resave('back-ep2', 2, ['--ep', '2', '--dp', '2', '--zero', '2'], 'ep4-step3')),
};
const backNames: Record<string, string> = { 'EP2×DP2 ZeRO 3': 'back-zero3', 'EP2 ZeRO 2 (one copy of each expert)': 'back-ep2' };

async function expectLoaded(run: Promise<Result>, name: string): Promise<Result> {
  const t = await run;
  expect(t.code, t.output).toBe(0);
  expect(t.start).toBe(3);
  expectSameState(at(name, 3), at('source', 3));
  return t;
}

describe('checkpoints of expert-parallel runs (launcher + Gloo)', () => {
  it('the EP2×DP2 ZeRO-1 source holds every expert of every layer whole, with its optimizer state', async () => {
    const s = await source;
    expect(s.code, s.output).toBe(0);
    const m = nt.ckpt.readManifest(at('source', 3));
    for (const layer of [0, 1]) {
      for (let e = 0; e < 4; e++) {
        for (const w of ['gate', 'up', 'down']) {
          const key = `h.${layer}.mlp.experts.${e}.${w}`;
          expect(m.tensors[`model/${key}`]?.shape, key).toEqual(w === 'down' ? [48, 32] : [32, 48]);
          expect(m.tensors[`optim/expAvg/${key}`], `optim/expAvg/${key}`).toBeDefined();
          expect(m.optimizer.steps[key]).toBe(3);
        }
      }
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it('loads in one process: the state re-saved equals the source bit for bit', async () => {
    await expectLoaded(single, 'single');
  }, QUEUED_TEST_TIMEOUT_MS);

  it('loads under EP4 without ZeRO (one expert per rank): equal to the source, and the next step agrees with one process', async () => {
    const t = await expectLoaded(ep4, 'ep4');
    const one = await single;
    expect(Math.abs(t.losses[3]! - one.losses[3]!)).toBeLessThan(1e-5 * Math.abs(one.losses[3]!));
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(back))('EP4\'s state loads back under %s: equal to the source, and the next step agrees', async (name) => {
    const t = await back[name]!;
    expect(t.code, t.output).toBe(0);
    expect(t.start).toBe(3);
    expectSameState(at(backNames[name]!, 3), at('source', 3));
    const one = await single;
    expect(Math.abs(t.losses[3]! - one.losses[3]!)).toBeLessThan(1e-5 * Math.abs(one.losses[3]!));
  }, QUEUED_TEST_TIMEOUT_MS);
});
