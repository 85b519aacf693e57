// `nodetron bench trace`: what tracing costs. Launches the same data-parallel GPT job (the small
// configuration of lib/bench/configs.ts under DP2 by default) alternately without and with
// NODETRON_TRACE (which also records the per-step metrics), several runs each; each rank times its
// steps after warm-up. Prints per run the median step time (the slowest rank's) and the main thread's
// CPU time per step (the work tracing adds, less blurred by a loaded machine), and the overheads: the
// median over "with" runs against the median over "without" runs; and, measured in a traced child
// process, the instrumentation's cost per span and per backward node, times the events of a step: a
// bound on what tracing adds that a loaded machine cannot hide. Writes JSON with --json.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { tensor } from '../creation.js';
import { destroy } from '../distributed/init.js';
import { cpuNowMs } from '../observe/metrics.js';
import { ArgumentError } from '../errors.js';
import { cpu } from '../native.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import { AdamW } from '../optim/adamw.js';
import { batchSlice } from '../parallel/index.js';
import { initParallelTraining } from '../parallel/layout.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import { slice } from '../ops/index.js';
import { gptConfigOf, selectConfigs, type TrainBenchConfig } from './configs.js';
import { median } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { parseOptions } from '../cmdline/args.js';

/** One launch: each rank's step times and its main thread's CPU time per step (ms, after warm-up). */
interface RunResult { traced: boolean; stepMs: number[][]; cpuMs: number[][]; traceBytes?: number; traceEvents?: number }

const usage = `usage: nodetron bench trace [--config tiny|small (small)] [--dp N (2)] [--steps N (6)] [--warmup N (2)] [--runs R (3)] [--json F]
  launches the GPT job R times without and R times with NODETRON_TRACE, alternating; per run, the median over the
  timed steps of the slowest rank's step time; the overhead is median(with) / median(without) - 1`;


/** One rank's part (run under the launcher): `steps` timed steps after `warmup`, written to <out>/rank-R.json. */
async function rankMain(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { config: 'string', dp: 'number', steps: 'number', warmup: 'number', out: 'string' });
  const c: TrainBenchConfig = selectConfigs(o.config as string)[0]!;
  const dp = o.dp as number, steps = o.steps as number, warmup = o.warmup as number;
  const config: GPTConfig = gptConfigOf(c);
  // The configuration's batch per replica; the global batch is dp times that.
  const globalBatch = c.batch * dp;
  const { rank, mesh } = await initParallelTraining({ dp }, config, globalBatch);
  cpu().setBlasThreads(Math.max(1, Math.floor(cpus().length / Number(process.env.LOCAL_WORLD_SIZE ?? dp))));
  const stage = new GPTStage(new GPT(config, { seed: 0 }), 0, 1);
  const trainer = await ParallelTrainer.create(stage, [{ params: stage.parameters() }], {
    mesh, createOptimizer: (groups) => new AdamW(groups, { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 }),
  });
  let x = 12345;
  const ids = () => Int32Array.from({ length: globalBatch * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; });
  using inputs = tensor(ids(), [globalBatch, c.ctx], { dtype: 'i32' });
  using targets = tensor(ids(), [globalBatch, c.ctx], { dtype: 'i32' });
  const { start, count } = batchSlice(globalBatch, mesh?.dpRank ?? 0, dp);
  using xs = slice(inputs, 0, start, start + count);
  using ys = slice(targets, 0, start, start + count);
  const times: number[] = [], cpuTimes: number[] = [];
  for (let i = 0; i < warmup + steps; i++) {
    const t0 = performance.now(), c0 = cpuNowMs();
    await trainer.step(xs, ys);
    if (i >= warmup) { times.push(performance.now() - t0); cpuTimes.push(cpuNowMs() - c0); }
  }
  trainer.dispose();
  stage.dispose();
  writeFileSync(join(o.out as string, `rank-${rank}.json`), JSON.stringify({ times, cpuTimes }));
  await destroy();
  return 0;
}

/**
 * The instrumentation's own cost, measured in a process with tracing on (run as `--micro`): ns per
 * traceSpan, per traceLayer and per backward node (BackwardRegions.at), the rest of the work nil.
 * Load inflates these too, but they bound what tracing can add to a step: events × cost.
 */
async function microMain(): Promise<number> {
  const { traceSpan, traceLayer, BackwardRegions, traceEnabled } = await import('../observe/trace.js');
  if (!traceEnabled) throw new ArgumentError('bench trace --micro: run with NODETRON_TRACE set');
  const per = (n: number, fn: () => void) => { fn(); const t = performance.now(); for (let i = 0; i < n; i++) fn(); return ((performance.now() - t) / n) * 1e6; };
  const n = 20_000;
  const span = per(n, () => traceSpan('span', () => 0));
  const layer = per(n, () => traceLayer('block', 1, () => 0));
  const regions = new BackwardRegions();
  let k = 0;
  // One region change every 20 nodes, as in a block's backward.
  const node = per(n * 10, () => regions.at((k++ % 20) === 0 ? `block ${k}` : `block ${k - (k % 20)}`));
  regions.end();
  console.log(JSON.stringify({ spanNs: span, layerNs: layer, backwardNodeNs: node }));
  process.exit(0);
}

/** This process's module-loader options (`--import tsx` when run from the sources), without -e/-p and their code. */
function loaderArgs(): string[] {
  const out: string[] = [], a = process.execArgv;
  for (let i = 0; i < a.length; i++) {
    if (['--import', '--loader', '--experimental-loader', '--require', '-r'].includes(a[i]!) && a[i + 1] !== undefined) out.push(a[i]!, a[++i]!);
    else if (/^--(import|loader|experimental-loader|require)=/.test(a[i]!)) out.push(a[i]!);
  }
  return out;
}

/** Runs the alternating launches, prints the table, writes the JSON. Returns the exit code. */
export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { config: 'string', dp: 'number', steps: 'number', warmup: 'number', runs: 'number', json: 'string', help: 'boolean' });
  if (o.help) { console.log(usage); return 0; }
  const configName = (o.config as string | undefined) ?? 'small';
  const c = selectConfigs(configName)[0]!;
  if (configName === 'all') throw new ArgumentError('bench trace: one --config at a time (tiny or small)');
  const dp = (o.dp as number | undefined) ?? 2, steps = (o.steps as number | undefined) ?? 6, warmup = (o.warmup as number | undefined) ?? 2, runs = (o.runs as number | undefined) ?? 3;
  for (const [k, v, min] of [['dp', dp, 1], ['steps', steps, 1], ['warmup', warmup, 1], ['runs', runs, 1]] as const) {
    if (!Number.isInteger(v) || v < min) throw new ArgumentError(`bench trace: --${k} must be an integer >= ${min}, got ${v}`);
  }
  const { main: launch } = await import('../launch/cli.js');
  const results: RunResult[] = [];
  // The per-call costs, in a traced child process (this one's tracing was decided at import).
  const microDir = mkdtempSync(join(tmpdir(), 'nt-bench-trace-micro-'));
  const child = spawnSync(process.execPath, [...loaderArgs(), fileURLToPath(import.meta.url), '--micro'], { encoding: 'utf8', env: { ...process.env, NODETRON_TRACE: microDir } });
  rmSync(microDir, { recursive: true, force: true });
  if (child.status !== 0) throw new Error(`bench trace: the cost measurement failed: ${child.stderr}`);
  const micro = JSON.parse(child.stdout.trim().split('\n').at(-1)!) as { spanNs: number; layerNs: number; backwardNodeNs: number };
  const loadAtStart = loadavg();
  const work = mkdtempSync(join(tmpdir(), 'nt-bench-trace-'));
  try {
    for (let run = 0; run < runs; run++) {
      for (const traced of [false, true]) {
        const out = mkdtempSync(join(work, 'run-'));
        const traceDir = join(out, 'trace');
        const saved = process.env.NODETRON_TRACE;
        if (traced) process.env.NODETRON_TRACE = traceDir; else delete process.env.NODETRON_TRACE;
        let code: number;
        try {
          code = await launch(['--nproc-per-node', String(dp), fileURLToPath(import.meta.url), '--config', c.name, '--dp', String(dp), '--steps', String(steps), '--warmup', String(warmup), '--out', out]);
        } finally {
          if (saved === undefined) delete process.env.NODETRON_TRACE; else process.env.NODETRON_TRACE = saved;
        }
        if (code !== 0) return code;
        const ranks = Array.from({ length: dp }, (_, r) => JSON.parse(readFileSync(join(out, `rank-${r}.json`), 'utf8')) as { times: number[]; cpuTimes: number[] });
        const result: RunResult = { traced, stepMs: ranks.map((x) => x.times), cpuMs: ranks.map((x) => x.cpuTimes) };
        if (traced) {
          const files = readdirSync(traceDir).filter((f) => f.endsWith('.trace.json'));
          result.traceBytes = files.reduce((s, f) => s + statSync(join(traceDir, f)).size, 0);
          result.traceEvents = files.reduce((s, f) => s + (JSON.parse(readFileSync(join(traceDir, f), 'utf8')) as { traceEvents: unknown[] }).traceEvents.length, 0);
        }
        results.push(result);
      }
    }
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  // Per run: each timed step's slowest rank, then the median over steps.
  const runMedian = (r: RunResult) => median(r.stepMs[0]!.map((_, i) => Math.max(...r.stepMs.map((ranks) => ranks[i]!))));
  // CPU time of the main thread per step, mean over ranks: what tracing adds to the work, less blurred by the machine's load.
  const runCpu = (r: RunResult) => median(r.cpuMs[0]!.map((_, i) => r.cpuMs.reduce((s, ranks) => s + ranks[i]!, 0) / r.cpuMs.length));
  const off = results.filter((r) => !r.traced).map(runMedian), on = results.filter((r) => r.traced).map(runMedian);
  const offMs = median(off), onMs = median(on), overhead = onMs / offMs - 1;
  const offCpu = median(results.filter((r) => !r.traced).map(runCpu)), onCpu = median(results.filter((r) => r.traced).map(runCpu)), cpuOverhead = onCpu / offCpu - 1;
  console.log(`\n# nodetron bench trace: GPT ${c.name} (${c.layers} layers, width ${c.width}, ctx ${c.ctx}, batch ${c.batch} per replica) under DP${dp} on cpu;`);
  console.log(`# ${runs} run(s) each without and with NODETRON_TRACE, alternating; ${warmup} warm-up + ${steps} timed steps per run\n`);
  printTable(['run', 'tracing', 'median step ms (slowest rank)', 'main-thread CPU ms/step', 'trace events', 'trace MiB'], results.map((r, i) => [
    Math.floor(i / 2) + 1, r.traced ? 'on' : 'off', runMedian(r).toFixed(1), runCpu(r).toFixed(1), r.traceEvents ?? '-', r.traceBytes === undefined ? '-' : (r.traceBytes / 2 ** 20).toFixed(2),
  ]));
  const load = (l: number[]) => l.map((v) => v.toFixed(1)).join(' ');
  console.log(`\n# median step: ${offMs.toFixed(1)} ms without, ${onMs.toFixed(1)} ms with tracing: overhead ${(overhead * 100).toFixed(2)}% (target <= 2%)`);
  console.log(`# main-thread CPU per step: ${offCpu.toFixed(1)} ms without, ${onCpu.toFixed(1)} ms with tracing: ${(cpuOverhead * 100).toFixed(2)}%`);
  const eventsPerStep = results.filter((r) => r.traced).reduce((s, r) => s + r.traceEvents!, 0) / (runs * dp * (warmup + steps));
  // Backward nodes per step: a few tens per block (the ops of attention, MLP, norms, residuals) plus the head; 60 per layer bounds it.
  const boundMs = (eventsPerStep * Math.max(micro.spanNs, micro.layerNs) + 60 * c.layers * micro.backwardNodeNs) / 1e6;
  console.log(`# trace events per rank and step: ${eventsPerStep.toFixed(1)}; in-process cost: ${micro.spanNs.toFixed(0)} ns per span, ${micro.layerNs.toFixed(0)} ns per layer span, ` +
    `${micro.backwardNodeNs.toFixed(0)} ns per backward node; bound per step: ${boundMs.toFixed(3)} ms = ${((boundMs / offMs) * 100).toFixed(4)}% of the step`);
  console.log(`# load average (1, 5, 15 min) at start: ${load(loadAtStart)}; at end: ${load(loadavg())} on ${cpus().length} cores (a loaded machine makes this indicative only)`);
  writeJson(o.json as string | undefined, {
    bench: 'trace', machine: machineRecord(), config: c, dp, steps, warmup, runs,
    medianStepMs: { off: offMs, on: onMs }, overhead, perCallNs: micro, eventsPerRankStep: eventsPerStep, instrumentationBoundMs: boundMs, medianCpuMs: { off: offCpu, on: onCpu }, cpuOverhead, runMedians: { off, on }, results, loadAverage: { atStart: loadAtStart, atEnd: loadavg() },
  });
  return 0;
}

// Launched as a rank script by main (through the launcher).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  (process.argv[2] === '--micro' ? microMain() : rankMain(process.argv.slice(2))).then((code) => process.exit(code), (e: unknown) => { console.error(e); process.exit(1); });
}
