// `nodetron bench chaos`: the fault plan, event parsing and per-fault timing on hand-made events with
// known answers, the loss comparison and goodput arithmetic, the launcher command lines, and whole runs
// against a fake launcher (test/fixtures/bench/chaos-train.mjs: real rank processes killed and stopped by
// the benchmark, the contract's events, losses.json) — the real launcher's --spares and the trainer's
// --recover memory are not used here.
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import {
  analyzeBaseline, analyzeFaults, chaosOptions, compareLosses, faultPlan, goodput, GOODPUT_DEFINITION, launchCommands, lossesOf, main, parseEvents, pickVictim,
  printReport, procState, rankPids, runChaos, runPhase, stepSeconds, type ChaosEvent, type ChaosOptions, type Injected,
} from '../../lib/bench/chaos.js';

const work = mkdtempSync(join(tmpdir(), 'nt-bench-chaos-test-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const fake = fileURLToPath(new URL('../fixtures/bench/chaos-train.mjs', import.meta.url));

const ev = (t: number, src: 'agent' | 'rank', event: string, fields: Record<string, unknown> = {}): ChaosEvent => ({ t, src, event, node: 0, ...fields });
const inj = (i: number, at: number, rank: number, how: Injected['how'] = 'kill'): Injected => ({ i, at, how, rank, node: 0, pid: 1000 + i, ranks: [rank] });

describe('bench chaos: the arithmetic', () => {
  it('draws the same faults and victims from the same seed, and picks only among live ranks', () => {
    const o = { kills: 20, faults: ['kill', 'stop'] as ChaosOptions['faults'], seed: 7 };
    const a = faultPlan(o), b = faultPlan(o), c = faultPlan({ ...o, seed: 8 });
    expect(a).toEqual(b);
    expect(a).not.toEqual(c);
    expect(new Set(a.map((f) => f.how))).toEqual(new Set(['kill', 'stop']));
    for (const f of a) expect(f.u >= 0 && f.u < 1).toBe(true);
    expect(pickVictim([], 0.5)).toBeNull();
    expect(pickVictim([3, 0, 2], 0)).toBe(0);
    expect(pickVictim([3, 0, 2], 0.5)).toBe(2);
    expect(pickVictim([3, 0, 2], 0.999)).toBe(3);
  });

  it('reads events (torn lines skipped, sorted by time) and follows each rank to its current process', () => {
    const text = [
      JSON.stringify(ev(5, 'agent', 'worker-started', { rank: 1, pid: 11, generation: 0 })),
      JSON.stringify(ev(1, 'agent', 'worker-started', { rank: 0, pid: 10, generation: 0 })),
      JSON.stringify(ev(2, 'agent', 'worker-started', { rank: -1, spare: 's0', pid: 20, generation: 0 })),
      '{"t": 3, "src": "agent", "event": "worker-st', // torn
      JSON.stringify(ev(9, 'agent', 'spare-assigned', { rank: 0, spare: 's0', generation: 1 })),
      JSON.stringify(ev(12, 'agent', 'replacement-started', { rank: 1, pid: 31, generation: 2 })),
      JSON.stringify({ ...ev(13, 'agent', 'worker-started', { rank: 2, pid: 40 }), node: 1 }),
    ].join('\n');
    const events = parseEvents(text);
    expect(events.map((e) => e.t)).toEqual([1, 2, 5, 9, 12, 13]);
    const pids = rankPids(events);
    expect(pids.get(0)).toEqual({ pid: 20, node: 0 }); // the spare took rank 0
    expect(pids.get(1)).toEqual({ pid: 31, node: 0 });
    expect(pids.get(2)).toEqual({ pid: 40, node: 1 });
    expect(pids.has(-1)).toBe(false); // never a spare
  });

  it('times fault → detection → full strength, steps lost and fallbacks from the events', () => {
    const events = parseEvents([
      ev(1000, 'agent', 'fault', { generation: 1, lost: [1], how: 'exit' }),
      ev(1400, 'rank', 'recovered', { rank: 0, generation: 1, step: 9, stepsLost: 1 }),
      ev(1450, 'rank', 'recovered', { rank: 1, generation: 1, step: 9, stepsLost: 1 }),
      ev(1500, 'rank', 'first-step', { rank: 0, generation: 1, step: 10 }),
      ev(1530, 'rank', 'first-step', { rank: 1, generation: 1, step: 10 }),
      ev(1600, 'rank', 'first-step', { rank: 0, generation: 1, step: 11 }), // not a first of its rank
      // Fault 2 (a stop, found after 1.2 s): a third fault strikes in its recovery; both come to full strength in generation 3.
      ev(6200, 'agent', 'fault', { generation: 2, lost: [0], how: 'stopped' }),
      ev(6500, 'rank', 'recovered', { rank: 1, generation: 2, step: 20, stepsLost: 2 }),
      ev(6600, 'rank', 'fallback-disk', { rank: 0, generation: 2, dir: '/ckpt' }),
      ev(6700, 'rank', 'first-step', { rank: 1, generation: 2, step: 21 }),
      ev(6800, 'agent', 'fault', { generation: 3, lost: [1], how: 'exit' }),
      ev(7300, 'rank', 'first-step', { rank: 1, generation: 3, step: 21 }),
      ev(7350, 'rank', 'first-step', { rank: 0, generation: 3, step: 21 }),
    ].map((e) => JSON.stringify(e)).join('\n'));
    const rows = analyzeFaults([inj(0, 900, 1), inj(1, 5000, 0, 'stop'), inj(2, 6790, 1), inj(3, 9000, 0)], events, 2);
    expect(rows[0]).toMatchObject({ generation: 1, detectMs: 100, fullStrengthMs: 630, stepsLost: 1, recoveredToStep: 9, diskFallback: false, status: 'recovered' });
    expect(rows[1]).toMatchObject({ generation: 2, detectMs: 1200, fullStrengthMs: 2350, stepsLost: 2, diskFallback: true, status: 'recovered' });
    expect(rows[2]).toMatchObject({ generation: 3, detectMs: 10, fullStrengthMs: 560, stepsLost: null, status: 'recovered' });
    expect(rows[3]).toMatchObject({ generation: null, detectMs: null, status: 'undetected' });
    // A generation whose ranks never all complete a step: incomplete; a fallback restart says so.
    const partial = parseEvents([ev(100, 'agent', 'fault', { generation: 1, lost: [0] }), ev(200, 'rank', 'first-step', { rank: 0, generation: 1 })].map((e) => JSON.stringify(e)).join('\n'));
    expect(analyzeFaults([inj(0, 50, 0)], partial, 2)[0]!.status).toBe('incomplete');
    const restarted = parseEvents(JSON.stringify(ev(100, 'agent', 'fallback-restart', { reason: 'not every rank ready' })));
    expect(analyzeFaults([inj(0, 50, 0)], restarted, 2)[0]).toMatchObject({ status: 'fallback-restart', fallbackRestart: true });
  });

  it('a shrink (--shrink): training again with the shrunk world, full strength at the grow back, the steps both roll back', () => {
    const events = parseEvents([
      ev(1000, 'agent', 'fault', { generation: 1, lost: [3], shrink: true }),
      ev(1100, 'agent', 'shrink', { generation: 1, members: [0, 1], out: [2, 3] }),
      ev(1400, 'rank', 'recovered', { rank: 0, generation: 1, step: 5, stepsLost: 1 }),
      ev(1420, 'rank', 'recovered', { rank: 1, generation: 1, step: 5, stepsLost: 1 }),
      ev(1700, 'rank', 'first-step', { rank: 1, generation: 1 }), ev(1690, 'rank', 'first-step', { rank: 0, generation: 1 }),
      ev(3000, 'agent', 'grow', { generation: 2, from: { epoch: 1, worldSize: 2 } }),
      ...[0, 1].map((rank) => ev(3300, 'rank', 'recovered', { rank, generation: 2, step: 9, stepsLost: 1 })),
      ...[2, 3].map((rank) => ev(3350, 'rank', 'recovered', { rank, generation: 2, step: 9, stepsLost: 0, joined: true })),
      ...[0, 1, 2, 3].map((rank) => ev(3500 + rank, 'rank', 'first-step', { rank, generation: 2 })),
    ].map((e) => JSON.stringify(e)).join('\n'));
    const [row] = analyzeFaults([inj(0, 900, 3)], events, 4);
    expect(row).toMatchObject({ generation: 1, detectMs: 100, shrunk: true, trainingAgainMs: 790, fullStrengthMs: 2603, stepsLost: 2, recoveredToStep: 5, status: 'recovered' });
  });

  it('times the baseline: fault → the first step after the restart, and the steps redone since the checkpoint', () => {
    const steps = [1, 2, 3, 4, 5, 6, 7].map((s) => ({ t: s * 100, step: s })).concat([{ t: 2000, step: 6 }, { t: 2100, step: 7 }, { t: 3000, step: 1 }]);
    // Fault 2 strikes during the restart after fault 1 (that attempt completed no step): it loses nothing more.
    const rows = analyzeBaseline([inj(0, 750, 1), inj(1, 2150, 0), inj(2, 2600, 1), inj(4, 4000, 0)], {
      steps, restarts: [1200, 2500, 2700], resumes: [{ t: 1900, step: 5 }], skipped: [{ i: 3, how: 'node', reason: 'x' }],
    });
    expect(rows[0]).toMatchObject({ nextStepMs: 1250, lastStepBefore: 7, resumedAt: 5, stepsLost: 2, status: 'recovered' });
    expect(rows[1]).toMatchObject({ nextStepMs: 850, lastStepBefore: 7, resumedAt: 0, stepsLost: 7, status: 'recovered' }); // no checkpoint: from scratch
    expect(rows[2]).toMatchObject({ nextStepMs: 400, lastStepBefore: 0, resumedAt: 0, stepsLost: 0, status: 'recovered' });
    expect(rows[3]).toMatchObject({ i: 3, status: 'skipped' });
    expect(rows[4]).toMatchObject({ i: 4, nextStepMs: null, stepsLost: null, status: 'not-recovered' });
  });

  it('compares losses bit for bit and computes step time and goodput', () => {
    const a = lossesOf({ train: [[1, 5], [2, 4], [3, 3]] });
    expect(lossesOf({ train: [[1, 5], [2, 9], [2, 4], [3, 3]] })).toEqual(a); // a step done twice keeps its last loss
    expect(compareLosses(a, a)).toEqual({ equal: true, valuesEqual: true, stepsCompared: 3, firstDifferingStep: null, maxAbsDiff: 0, missing: [] });
    const b = lossesOf({ train: [[1, 5], [2, 4 + 2 ** -50], [3, 3.5]] });
    const d = compareLosses(a, b);
    expect(d).toMatchObject({ equal: false, valuesEqual: false, firstDifferingStep: 2, maxAbsDiff: 0.5 });
    expect(compareLosses(a, lossesOf({ train: [[1, 5], [2, 4]] }))).toMatchObject({ equal: false, valuesEqual: true, firstDifferingStep: null, missing: [3] });
    expect(() => lossesOf({})).toThrow(ArgumentError);
    // 0.1 s, 0.1 s, then 0.6 s over 2 steps (0.3 per step), 0.1: median of [0.1, 0.1, 0.3, 0.1] = 0.1.
    expect(stepSeconds([{ t: 0, step: 1 }, { t: 100, step: 2 }, { t: 200, step: 3 }, { t: 800, step: 5 }, { t: 900, step: 6 }])).toBeCloseTo(0.1, 12);
    expect(stepSeconds([{ t: 0, step: 1 }])).toBeNull();
    expect(goodput(100, 0.5, 100_000)).toBeCloseTo(0.5, 12);
  });

  it('builds the launcher command lines of each run; refuses node faults on one node', async () => {
    const o = chaosOptions({ nproc: 2, spares: 1, steps: 30, script: 's.ts', 'script-args': '--progress-every 1 --lr 1e-3', out: work });
    expect(o).toMatchObject({ nodes: 1, kills: 10, killEverySec: 30, faults: ['kill', 'stop'], layout: ['--dp', '2', '--tp', '2', '--zero', '3'], baseline: 'restart', reference: true });
    const [chaos] = launchCommands({ ...o, launcher: ['L'] }, 'chaos', '/d', null);
    expect(chaos).toEqual(['L', '--nproc-per-node', '2', '--spares', '1', 's.ts', '--dp', '2', '--tp', '2', '--zero', '3', '--steps', '30', '--progress-every', '1', '--lr', '1e-3', '--recover', 'memory', '--save', '/d/ckpt', '--save-every', '5', '--out', '/d']);
    const [base] = launchCommands({ ...o, launcher: ['L'] }, 'baseline', '/b', null);
    expect(base!.join(' ')).toBe('L --nproc-per-node 2 --max-restarts 11 --hang-timeout-ms 10000 s.ts --dp 2 --tp 2 --zero 3 --steps 30 --progress-every 1 --lr 1e-3 --save /b/ckpt --save-every 5 --resume auto --out /b');
    const two = launchCommands({ ...o, nodes: 2, launcher: ['L'] }, 'chaos', '/d', 4321);
    expect(two.map((c) => c.slice(3, 11).join(' '))).toEqual(['--nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 4321', '--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 4321']);
    expect(() => chaosOptions({ faults: 'kill,fire' })).toThrow(/unknown fault 'fire'/);
    await expect(runChaos({ ...o, faults: ['kill', 'node'] })).rejects.toThrow(/this run has one node/);
    await expect(main(['--faults', 'node', '--out', work])).rejects.toThrow(ArgumentError);
  });
});

describe('bench chaos: runs against a fake launcher', () => {
  const base = (out: string, over: Partial<ChaosOptions> = {}): ChaosOptions => ({
    ...chaosOptions({ nproc: 2, spares: 1, steps: 40, kills: 3, 'kill-every': 0.5, faults: 'kill,stop', seed: 3, script: 'fake-train', 'script-args': '', out }),
    launcher: [process.execPath, fake], layout: [], timeoutSec: 120, ...over,
  });

  it('kills and stops live ranks (never a spare), and reports recovery, losses and the restart baseline', async () => {
    const out = join(work, 'run');
    const r = await runChaos(base(out));
    expect(r.runs.reference!.exitCodes).toEqual([0]);
    expect(r.runs.chaos!.exitCodes).toEqual([0]);
    expect(r.runs.baseline!.exitCodes).toEqual([0]);
    expect(r.faults).toHaveLength(3);
    const events = parseEvents(readFileSync(join(out, 'chaos-events.jsonl'), 'utf8'));
    const sparePids = events.filter((e) => e.event === 'worker-started' && e.spare !== undefined).map((e) => e.pid);
    const plan = faultPlan({ kills: 3, faults: ['kill', 'stop'], seed: 3 });
    expect(r.faults.map((f) => f.how)).toEqual(plan.map((f) => f.how));
    expect(r.runs.chaos!.commands[0]).toContain('--spares');
    for (const f of r.faults) {
      expect(f.status).toBe('recovered');
      expect(f.detectMs).toBeGreaterThanOrEqual(0);
      expect(f.fullStrengthMs!).toBeGreaterThan(f.detectMs!);
      expect(f.stepsLost).toBe(1);
      if (f.how === 'stop') expect(f.detectMs).toBeGreaterThanOrEqual(300); // the fake's stop timeout
    }
    // Every victim was the process of a live rank at the time (each a different one), never a spare not yet assigned.
    expect(events.filter((e) => e.event === 'fault')).toHaveLength(3);
    expect(new Set(r.injected.chaos.map((f) => f.pid)).size).toBe(3);
    for (const f of r.injected.chaos) {
      expect(rankPids(events.filter((e) => e.t <= f.at)).get(f.rank!)?.pid).toBe(f.pid);
      expect(procState(f.pid)).toBeNull(); // gone: the benchmark leaves nothing stopped behind
    }
    expect(r.summary.lossesEqual).toBe(true);
    expect(r.losses).toMatchObject({ equal: true, stepsCompared: 40 });
    expect(r.runs.chaos!.lastStep).toBe(40);
    expect(r.runs.chaos!.goodput).toBeGreaterThan(0);
    expect(r.runs.chaos!.goodput).toBeLessThan(1);
    expect(r.runs.reference!.goodput).toBeGreaterThan(r.runs.chaos!.goodput!);
    expect(r.summary.medianFaultToFullStrengthMs).toBeGreaterThan(0);
    // The baseline: the same kinds of fault, each followed by a restart and a resume from a multiple of 5.
    expect(r.baselineFaults.map((f) => f.how)).toEqual(plan.map((f) => f.how));
    for (const f of r.baselineFaults) {
      expect(f.status).toBe('recovered');
      expect(f.resumedAt! % 5).toBe(0);
      expect(f.stepsLost).toBe(f.lastStepBefore! - f.resumedAt!);
      expect(f.nextStepMs).toBeGreaterThan(300); // the fake's restart pause
    }
    // Each fault strikes a training job: the one before has been followed by a completed step.
    const bi = r.injected.baseline;
    for (let k = 1; k < bi.length; k++) expect(bi[k - 1]!.at + r.baselineFaults[k - 1]!.nextStepMs!).toBeLessThanOrEqual(bi[k]!.at);
    // The restarted run's losses.json holds its last attempt's steps (from its resume on), each equal to the reference's.
    const lastResume = r.baselineFaults.at(-1)!.resumedAt!;
    expect(r.baselineLosses).toMatchObject({ valuesEqual: true, stepsCompared: 40 - lastResume, missing: Array.from({ length: lastResume }, (_, i) => i + 1) });
    expect(sparePids).toHaveLength(1);
    expect(r.injected.chaos.some((f) => f.pid === sparePids[0])).toBe(r.injected.chaos.some((f, i) => i > 0 && f.rank === r.injected.chaos[0]!.rank));
    // The report: a table of the runs and one of the faults, in-memory beside restart.
    const lines: string[] = [];
    printReport(r, (l) => lines.push(l));
    const text = lines.join('\n');
    expect(text).toContain(GOODPUT_DEFINITION);
    expect(text).toMatch(/→ full strength ms .* restart: victim +→ next step ms/);
    expect(lines.filter((l) => /^\d+ +(kill|stop) +rank \d.* recovered +rank \d.* recovered$/.test(l))).toHaveLength(3);
    expect(text).toContain('losses (chaos vs failure-free, 40 steps in both): bit-identical\n');
    expect(text).toMatch(/losses \(baseline vs failure-free, \d+ steps in both\): bit-identical; \d+ step\(s\) in only one run's losses.json \(first 1\), so not equal/);
    expect(JSON.parse(JSON.stringify(r))).toMatchObject({ bench: 'chaos', goodputDefinition: GOODPUT_DEFINITION, summary: { faults: 3, recovered: 3, lossesEqual: true } });
  }, 180_000);

  it('reports the first differing step and the largest difference when recovery changes the losses', async () => {
    const o = base(join(work, 'corrupt'), { kills: 1, faults: ['kill'] });
    const ref = await runPhase(o, 'reference', []);
    process.env.FAKE_CORRUPT = '1';
    let chaos;
    try { chaos = await runPhase(o, 'chaos', faultPlan(o)); } finally { delete process.env.FAKE_CORRUPT; }
    const events = chaos.events.filter((e) => e.event === 'first-step');
    const c = compareLosses(ref.losses!, chaos.losses!);
    expect(c.equal).toBe(false);
    expect(c.firstDifferingStep).toBe(events[0]!.step);
    expect(c.maxAbsDiff).toBeGreaterThan(0);
    expect(c.maxAbsDiff).toBeLessThan(1e-6);
  }, 120_000);

  it('kills a whole simulated node: its launcher and its ranks (never node 0)', async () => {
    const out = join(work, 'nodes');
    // An earlier run's events in the same place must not be read as this run's.
    mkdirSync(out, { recursive: true });
    writeFileSync(join(out, 'chaos-events.jsonl'), `${JSON.stringify(ev(1, 'rank', 'recovered', { rank: 0, generation: 1, step: 0, stepsLost: 99 }))}\n`);
    const r = await runChaos(base(out, { nodes: 2, nproc: 1, spares: 0, kills: 1, faults: ['node'], reference: false, baseline: 'none' }));
    expect(r.injected.chaos).toHaveLength(1);
    const f = r.injected.chaos[0]!;
    expect(f).toMatchObject({ how: 'node', node: 1, ranks: [1] });
    const events = parseEvents(readFileSync(join(out, 'chaos-events.jsonl'), 'utf8'));
    const rank1 = events.find((e) => e.event === 'worker-started' && e.rank === 1 && e.node === 1)!;
    expect(procState(rank1.pid as number)).toBeNull();
    expect(r.runs.chaos!.exitCodes).toEqual([0, 137]); // node 1's launcher died of SIGKILL; node 0 finished the job
    expect(r.faults[0]).toMatchObject({ how: 'node', generation: 1, status: 'recovered', stepsLost: 1 });
    expect(r.runs.chaos!.lastStep).toBe(40);
  }, 120_000);
});
