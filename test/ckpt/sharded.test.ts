// Checkpoints across processes, through the real launcher and Gloo: exact resume on the same layout
// (DP2 ZeRO-2, TP2×DP2 without ZeRO, TP2×PP2: stopped at step 3 of 6 and resumed = uninterrupted, bit for bit), resharding
// (saved under TP2×PP2×DP2 ZeRO-1, loaded in one process, under DP3 ZeRO-3, TP3 and DP3 without ZeRO: the state
// re-saved there equals the source exactly, and the next step agrees across layouts), and a rank
// killed under `launch --max-restarts 1` finishing where an uninterrupted run does.
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { checkpointRuns, expectSameCheckpointState as expectSameState } from '../helpers/ckpt-runs.js';
import { QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const { launch, at, ckpt, pool } = checkpointRuns('nt-ckpt-mp-', { limitMs: 240_000 });

const resumeLayouts: Record<string, [number, string[]]> = {
  'DP2 ZeRO-2': [2, ['--zero', '2']],
  'TP2×DP2 (no ZeRO: each replica writes half of its slices)': [4, ['--tp', '2']],
  'TP2×PP2': [4, ['--tp', '2', '--pp', '2']],
};
const resumeRuns = Object.fromEntries(Object.entries(resumeLayouts).map(([name, [n, flags]], i) => {
  const straight = launch(`straight${i}`, n, [...flags, '--steps', '6', '--save', ckpt(`straight${i}`)]);
  const resumed = launch(`stop${i}`, n, [...flags, '--steps', '3', '--save', ckpt(`stop${i}`)])
    .then((first) => (first.code !== 0 ? first : launch(`resume${i}`, n, [...flags, '--steps', '6', '--resume', ckpt(`stop${i}`), '--save', ckpt(`resume${i}`)])));
  return [name, { i, straight, resumed }];
}));

const source = launch('source', 8, ['--tp', '2', '--pp', '2', '--zero', '1', '--dropout', '0', '--steps', '3', '--save', ckpt('source')]);
const targets: Record<string, [number, string[]]> = {
  'one process': [1, []],
  'DP3 ZeRO-3': [3, ['--zero', '3']],
  'TP3': [3, ['--tp', '3']],
  // Plain data parallelism: each of 3 replicas writes a third of every tensor (uneven at the edges).
  'DP3 (no ZeRO)': [3, []],
};
const targetRuns = Object.fromEntries(Object.entries(targets).map(([name, [n, flags]], i) => [name, source.then((s) => (s.code !== 0 ? s
  : launch(`target${i}`, n, [...flags, '--dropout', '0', '--steps', '4', '--resume', ckpt('source'), '--save-loaded', '--save', ckpt(`target${i}`)])))]));

// Interleaved 1F1B (issue #27): rank r holds chunks r and r + 2 of 4 layers, so its checkpoint parts
// are non-adjacent layers; saved so, it loads in one process, under PP2 1F1B and PP4, and a state
// re-saved by PP2 1F1B loads back interleaved.
const DEEP = ['--layers', '4', '--dropout', '0'];
const INTERLEAVED = ['--pp', '2', '--virtual-stages', '2', '--micro-batches', '2'];
const interleavedSource = launch('isource', 2, [...DEEP, ...INTERLEAVED, '--steps', '3', '--save', ckpt('isource')]);
const interleavedTargets: Record<string, [number, string[]]> = {
  'one process': [1, []],
  'PP2 1F1B': [2, ['--pp', '2', '--micro-batches', '2']],
  'PP4 GPipe': [4, ['--pp', '4', '--micro-batches', '2', '--schedule', 'gpipe']],
};
const interleavedRuns = Object.fromEntries(Object.entries(interleavedTargets).map(([name, [n, flags]], i) => [name, interleavedSource.then((s) => (s.code !== 0 ? s
  : launch(`itarget${i}`, n, [...DEEP, ...flags, '--steps', '4', '--resume', ckpt('isource'), '--save-loaded', '--save', ckpt(`itarget${i}`)])))]));
// Back: the PP2 1F1B run's step-4 state, loaded interleaved.
const interleavedBack = interleavedRuns['PP2 1F1B']!.then((t) => (t.code !== 0 ? [t, t]
  : Promise.all([launch('iback', 2, [...DEEP, ...INTERLEAVED, '--steps', '5', '--resume', ckpt('itarget1'), '--save-loaded', '--save', ckpt('iback')]),
    launch('iback-single', 1, [...DEEP, '--steps', '5', '--resume', ckpt('itarget1')])])));
// ZB-V (2 chunks per rank in a V: rank 0 holds layers 0 and 3 and both ends of the model, rank 1 layers 1
// and 2): saved so, it loads in one process, and that process's re-saved state loads back under ZB-V.
const ZBV = ['--pp', '2', '--schedule', 'zb-v', '--micro-batches', '2'];
const zbvSource = launch('vsource', 2, [...DEEP, ...ZBV, '--steps', '3', '--save', ckpt('vsource')]);
const zbvSingle = zbvSource.then((s) => (s.code !== 0 ? s : launch('vtarget', 1, [...DEEP, '--steps', '4', '--resume', ckpt('vsource'), '--save-loaded', '--save', ckpt('vtarget')])));
const zbvBack = zbvSingle.then((t) => (t.code !== 0 ? [t, t]
  : Promise.all([launch('vback', 2, [...DEEP, ...ZBV, '--steps', '5', '--resume', ckpt('vtarget'), '--save-loaded', '--save', ckpt('vback')]),
    launch('vback-single', 1, [...DEEP, '--steps', '5', '--resume', ckpt('vtarget')])])));
// A Llama (multi-query: its one key/value head replicated under TP) saved under TP2×PP2×DP2 ZeRO-1 and
// loaded in one process and under TP3; a GPT checkpoint loaded into a Llama is refused by name.
const llamaSource = launch('llama-source', 8, ['--model', 'llama', '--tp', '2', '--pp', '2', '--zero', '1', '--steps', '3', '--save', ckpt('llama-source')]);
const llamaTargets: Record<string, [number, string[]]> = { 'one process': [1, []], 'TP3': [3, ['--tp', '3']] };
const llamaTargetRuns = Object.fromEntries(Object.entries(llamaTargets).map(([name, [n, flags]], i) => [name, llamaSource.then((s) => (s.code !== 0 ? s
  : launch(`llama-target${i}`, n, [...flags, '--model', 'llama', '--steps', '4', '--resume', ckpt('llama-source'), '--save-loaded', '--save', ckpt(`llama-target${i}`)])))]));
const wrongFamily = source.then((s) => (s.code !== 0 ? s : launch('wrong-family', 1, ['--model', 'llama', '--steps', '4', '--resume', ckpt('source')])));

const killed = launch('killed', 2, ['--zero', '1', '--steps', '6', '--save', ckpt('killed'), '--save-every', '2', '--sync', '--resume', ckpt('killed'), '--kill-at', '4', '--kill-rank', '1'], ['--max-restarts', '1']);
const unkilled = launch('unkilled', 2, ['--zero', '1', '--steps', '6', '--save', ckpt('unkilled')]);

/**
 * A pipeline run that loaded `source`'s step-4 state and re-saved it as `saved`, beside one process that
 * loaded the same: both ran, the re-saved state equals the source, and the step after the load agrees
 * with the single process's from the same checkpoint.
 */
function expectLoadedBack([b, single]: Awaited<typeof zbvBack>, saved: string, source: string): void {
  expect(b.code, b.output).toBe(0);
  expect(single.code, single.output).toBe(0);
  expect(b.start).toBe(4);
  expectSameState(at(saved, 4), at(source, 4));
  expect(Math.abs(b.losses[4]! - single.losses[4]!)).toBeLessThan(1e-5 * Math.abs(single.losses[4]!));
}

describe('sharded checkpoints (launcher + Gloo)', () => {
  it.each(Object.keys(resumeLayouts))('%s: stopped at step 3 and resumed is bit-identical to an uninterrupted run', async (name) => {
    const { i, straight, resumed } = resumeRuns[name]!;
    const [a, b] = await Promise.all([straight, resumed]);
    expect(a.code, a.output).toBe(0);
    expect(b.code, b.output).toBe(0);
    expect(b.start).toBe(3);
    expect([3, 4, 5].map((s) => b.losses[s])).toEqual([3, 4, 5].map((s) => a.losses[s]));
    expectSameState(at(`resume${i}`, 6), at(`straight${i}`, 6));
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(targets))('TP2×PP2×DP2 ZeRO-1 → %s: the loaded state equals the saved one, and training goes on', async (name) => {
    const i = Object.keys(targets).indexOf(name);
    const s = await source;
    expect(s.code, s.output).toBe(0);
    const t = await targetRuns[name]!;
    expect(t.code, t.output).toBe(0);
    expect(t.start).toBe(3);
    expectSameState(at(`target${i}`, 3), at('source', 3));
    // The step after the load agrees with the single process's to f32 tolerance.
    const single = await targetRuns['one process']!;
    expect(Math.abs(t.losses[3]! - single.losses[3]!)).toBeLessThan(1e-5 * Math.abs(single.losses[3]!));
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(interleavedTargets))('PP2 interleaved (2 virtual stages) → %s: the loaded state equals the saved one, and the next step agrees', async (name) => {
    const i = Object.keys(interleavedTargets).indexOf(name);
    const s = await interleavedSource;
    expect(s.code, s.output).toBe(0);
    const t = await interleavedRuns[name]!;
    expect(t.code, t.output).toBe(0);
    expect(t.start).toBe(3);
    expectSameState(at(`itarget${i}`, 3), at('isource', 3));
    const single = await interleavedRuns['one process']!;
    expect(Math.abs(t.losses[3]! - single.losses[3]!)).toBeLessThan(1e-5 * Math.abs(single.losses[3]!));
  }, QUEUED_TEST_TIMEOUT_MS);

  it('PP2 1F1B → PP2 interleaved: a state saved without virtual stages loads back into them', async () => {
    expectLoadedBack(await interleavedBack, 'iback', 'itarget1');
  }, QUEUED_TEST_TIMEOUT_MS);

  it('PP2 ZB-V → one process → PP2 ZB-V: the V\'s checkpoint loads under another layout and back', async () => {
    const s = await zbvSource;
    expect(s.code, s.output).toBe(0);
    const t = await zbvSingle;
    expect(t.code, t.output).toBe(0);
    expect(t.start).toBe(3);
    expectSameState(at('vtarget', 3), at('vsource', 3));
    expectLoadedBack(await zbvBack, 'vback', 'vtarget');
  }, QUEUED_TEST_TIMEOUT_MS);

  it.each(Object.keys(llamaTargets))('Llama TP2×PP2×DP2 ZeRO-1 → %s: the loaded state equals the saved one, and training goes on', async (name) => {
    const i = Object.keys(llamaTargets).indexOf(name);
    const s = await llamaSource;
    expect(s.code, s.output).toBe(0);
    const t = await llamaTargetRuns[name]!;
    expect(t.code, t.output).toBe(0);
    expect(t.start).toBe(3);
    expectSameState(at(`llama-target${i}`, 3), at('llama-source', 3));
    const single = await llamaTargetRuns['one process']!;
    expect(Math.abs(t.losses[3]! - single.losses[3]!)).toBeLessThan(1e-5 * Math.abs(single.losses[3]!));
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a GPT checkpoint loaded into a Llama is refused, naming both families', async () => {
    const r = await wrongFamily;
    expect(r.code, r.output).not.toBe(0);
    expect(r.output).toMatch(/it holds a GPT model, and the model loading it is a Llama/);
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a rank killed mid-run under --max-restarts 1 resumes from the last checkpoint and ends where an uninterrupted run does', async () => {
    const [k, u] = await Promise.all([killed, unkilled]);
    expect(u.code, u.output).toBe(0);
    expect(k.code, k.output).toBe(0);
    expect(k.output).toMatch(/was killed by SIGKILL/);
    expect(k.output).toMatch(/restarting the group/);
    expect([2, 4]).toContain(k.start);
    expectSameState(at('killed', 6), at('unkilled', 6));
  }, QUEUED_TEST_TIMEOUT_MS);

  it('loadLatest right after background saves: every rank loads the same, newest step', async () => {
    const fixture = join(root, 'test', 'fixtures', 'ckpt', 'save-then-load.ts');
    const r = await pool.run(() => runProcess(process.execPath, [...nodeArgs(launcher), '--nproc-per-node', '2', scriptPath(fixture), '--root', ckpt('save-then-load')],
      { cwd: root, limitMs: 240_000 }));
    expect(r.code, r.output).toBe(0);
    const loaded = [...r.output.matchAll(/LOADED rank=(\d) step=(\S+)/g)].map((m) => `${m[1]}:${m[2]}`).sort();
    expect(loaded, r.output).toEqual(['0:2', '1:2']);
  }, QUEUED_TEST_TIMEOUT_MS);
});
