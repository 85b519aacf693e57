// `nodetron bench pipeline`: the measured bubble read from per-rank traces (a hand-made timeline with
// a known answer), bad input as typed errors, and one small real run through the launcher whose
// JSON holds every schedule's measured bubble, formula, planner prediction, step time and memory.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { formulaBubble } from '../../lib/internal.js';
import { main, measureBubbles, measureCosts, measureCpuCosts, replayCpuBubbles, type BenchTraceEvent, type PipelineBenchRow } from '../../lib/bench/pipeline.js';

const work = mkdtempSync(join(tmpdir(), 'nt-bench-pipeline-test-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const span = (name: string, ts: number, dur: number, cpuUs?: number): BenchTraceEvent => ({ name, ph: 'X', ts, dur, ...(cpuUs === undefined ? {} : { args: { cpuUs } }) });

describe('bench pipeline', () => {
  it('measures the ranks\' idle share of each step\'s pipeline phase from their traces', () => {
    // Two ranks, two steps. Step 0 spans [0, 100) over both ranks: rank 0 computes 30 + 20 µs, rank 1
    // 60 µs (a layer's nested span and a collective do not count): 1 − 110 / 200.
    const rank0 = [
      span('forward+backward', 0, 90), span('forward', 0, 30), span('forward block 0', 5, 10), span('backward', 60, 20), span('allReduce', 85, 5),
      span('forward+backward', 200, 50), span('forward', 200, 50),
    ];
    const rank1 = [
      span('forward+backward', 10, 90), span('forward', 30, 30), span('weight grad', 70, 30),
      span('forward+backward', 200, 50), span('backward', 210, 25),
    ];
    const steps = measureBubbles([rank0, rank1]);
    expect(steps).toHaveLength(2);
    expect(steps[0]!.spanUs).toBe(100);
    expect(steps[0]!.busyUs).toEqual([50, 60]);
    expect(steps[0]!.bubble).toBeCloseTo(1 - 110 / 200, 12);
    expect(steps[1]!.bubble).toBeCloseTo(1 - 75 / 100, 12);
    expect(() => measureBubbles([])).toThrow(nt.ArgumentError);
    // The mean F, B and W over both ranks' steps (from step 1: the second step only).
    const all = measureCosts([rank0, rank1]);
    expect(all.F).toBeCloseTo((30 + 50 + 30) / 3, 12);
    expect(all.B).toBeCloseTo((20 + 25) / 2, 12);
    expect(all.W).toBe(30);
    expect(measureCosts([rank0, rank1], 1)).toEqual({ F: 50, B: 25, W: 0 });
  });

  it('replays each step\'s table with its actions\' CPU times: a bubble that waiting for a core does not inflate', () => {
    // 1F1B on 2 ranks, 2 micro-batches: rank 0 F0 F1 B0 B1, rank 1 F0 B0 F1 B1. The wall clock is
    // stretched (rank 1 lost its core for 500 µs inside B0) but the CPU times are F = 10, B = 20.
    const tables = nt.parallel.pp.scheduleTables('1f1b', { stages: 2, microBatches: 2 });
    const rank0 = [span('forward+backward', 0, 2000), span('forward', 0, 10, 10), span('forward', 10, 10, 10), span('backward', 600, 20, 20), span('backward', 1200, 20, 20)];
    const rank1 = [span('forward+backward', 0, 2000), span('forward', 10, 10, 10), span('backward', 20, 520, 20), span('forward', 540, 10, 10), span('backward', 550, 20, 20)];
    const [step] = replayCpuBubbles([rank0, rank1], tables, 1);
    // The replay: rank 0 F0 [0,10) F1 [10,20); rank 1 F0 [10,20) B0 [20,40) F1 [40,50) B1 [50,70); rank 0
    // B0 [40,60) B1 [70,90). Makespan 90, each rank busy 60.
    expect(step!.makespanUs).toBe(90);
    expect(step!.cpuUs).toEqual([60, 60]);
    expect(step!.bubble).toBeCloseTo(1 - 120 / 180, 12);
    // The wall-clock bubble of the same trace is far larger.
    expect(measureBubbles([rank0, rank1])[0]!.bubble).toBeCloseTo(1 - 620 / 4000, 12);
    expect(measureCpuCosts([rank0, rank1])).toEqual({ F: 10, B: 20, W: 0 });
    // Spans that are not the table's, or carry no CPU time, are typed errors.
    expect(() => replayCpuBubbles([rank1, rank0], tables, 1)).toThrow(nt.StateError);
    expect(() => replayCpuBubbles([rank0.map((e) => ({ ...e, args: {} })), rank1], tables, 1)).toThrow(/no args.cpuUs/);
    expect(() => replayCpuBubbles([rank0], tables, 1)).toThrow(nt.ArgumentError);
  });

  it('rejects bad input with typed errors before launching anything', async () => {
    await expect(main(['--stages', '1'])).rejects.toThrow(/--stages takes integers >= 2/);
    await expect(main(['--schedules', 'zigzag'])).rejects.toThrow(/unknown schedule 'zigzag'/);
    await expect(main(['--stages', '4', '--layers', '6'])).rejects.toThrow(/4 stages × 2 virtual stages need at least 8 layers/);
    await expect(main(['--stages', '2', '--micro-batches', '3'])).rejects.toThrow(/multiple of the stages: 3 over 2/);
    await expect(main(['--virtual-stages', '1'])).rejects.toThrow(nt.ArgumentError);
    await expect(main(['--stages', '4', '--layers', '7', '--schedules', 'zb-v'])).rejects.toThrow(/zb-v on 4 stages needs at least 8 layers/);
  });

  it('runs every schedule on 2 stages through the launcher and writes the comparison', async () => {
    const json = join(work, 'pipeline.json');
    const code = await main(['--stages', '2', '--layers', '4', '--width', '32', '--heads', '2', '--ctx', '16', '--rows', '1', '--vocab', '64', '--steps', '1', '--warmup', '1', '--json', json]);
    expect(code).toBe(0);
    const record = JSON.parse(readFileSync(json, 'utf8')) as { bench: string; rows: PipelineBenchRow[] };
    expect(record.bench).toBe('pipeline');
    expect(record.rows.map((r) => r.schedule)).toEqual(['gpipe', '1f1b', 'interleaved', 'zb-h1', 'zb-v']);
    for (const r of record.rows) {
      expect(r.stages).toBe(2);
      expect(r.microBatches).toBe(4);
      expect(r.virtualStages).toBe(r.schedule === 'interleaved' || r.schedule === 'zb-v' ? 2 : 1);
      expect(r.steps).toHaveLength(1);
      expect(r.measuredBubble).toBeGreaterThan(0);
      expect(r.measuredBubble).toBeLessThan(1);
      expect(r.formulaBubble).toBeCloseTo(formulaBubble(r.schedule, 2, 4, r.virtualStages), 12);
      expect(r.stepMs).toBeGreaterThan(0);
      expect(r.memory.map((x) => x.stage)).toEqual([0, 1]);
      for (const x of r.memory) { expect(x.peak).toBeGreaterThan(0); expect(x.predicted).toBeGreaterThan(0); }
    }
    // The planner simulates the tables: with m = 2p these reach the formulas.
    for (const r of record.rows) expect(r.plannerBubble).toBeCloseTo(r.formulaBubble, 12);
    // The run's own F, B, W: a W only under ZB-H1; the tables simulated with them give a bubble.
    for (const r of record.rows) {
      expect(r.costsUs.F).toBeGreaterThan(0);
      expect(r.costsUs.B).toBeGreaterThan(0);
      expect(r.costsUs.W > 0).toBe(r.schedule.startsWith('zb'));
      expect(r.simulatedBubble).toBeGreaterThan(0);
      expect(r.simulatedBubble).toBeLessThan(1);
      // The CPU replay: every timed step's table replayed with its own actions' CPU times.
      expect(r.replayed).toHaveLength(1);
      expect(r.cpuCostsUs.F).toBeGreaterThan(0);
      expect(r.cpuCostsUs.W > 0).toBe(r.schedule.startsWith('zb'));
      expect(r.cpuReplayedBubble).toBeGreaterThan(0);
      expect(r.cpuReplayedBubble).toBeLessThan(1);
      expect(r.replayed[0]!.cpuUs.every((c) => c > 0)).toBe(true);
    }
  }, 600_000);
});
