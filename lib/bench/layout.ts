// `nodetron bench train --layout dp=N[,zero=A..B]`: launches N ranks that each train a GPT a few
// steps per ZeRO stage and report the bytes of parameters, gradients and optimizer state they hold
// beside zeroMemoryFormula, and the step time with gradient communication overlapped with backward
// (the grad-ready hooks of GradBuffer at stage 0 and of ZeroOptimizer at stages 1 and 2) and not
// (all buckets after backward), in the same run.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { tensor } from '../creation.js';
import * as dist from '../distributed/init.js';
import { ArgumentError, UsageError } from '../errors.js';
import { memoryStats, scope } from '../memory.js';
import { cpu } from '../native.js';
import { GPT } from '../nn/gpt.js';
import { AdamW, type AdamWOptions } from '../optim/adamw.js';
import type { Optimizer } from '../optim/optimizer.js';
import { DEFAULT_BUCKET_BYTES } from '../parallel/buckets.js';
import { GradBuffer } from '../parallel/data-parallel/buffer.js';
import type { CollectiveGroup } from '../distributed/group.js';
import { ZeroOptimizer, zeroMemoryFormula, type ZeroMemoryBytes, type ZeroStage } from '../parallel/zero/optimizer.js';
import type { Tensor } from '../tensor.js';
import { gptConfigOf, selectConfigs, type TrainBenchConfig } from './configs.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { parseOptions, type Options } from '../cmdline/args.js';

/** The parallel layout a bench run asks for. */
export interface BenchLayout { dp: number; tp: number; pp: number; zeroStages: number[] }

/** Measured / formula may differ by this fraction (the issue's acceptance bound). */
export const FORMULA_TOLERANCE = 0.1;

/** Reads `dp=2,zero=0..2,tp=1,pp=1` (zero: one stage or an inclusive range). */
export function parseLayout(text: string): BenchLayout {
  const layout: BenchLayout = { dp: 1, tp: 1, pp: 1, zeroStages: [0, 1, 2, 3] };
  for (const part of text.split(',').map((s) => s.trim()).filter(Boolean)) {
    const m = /^(dp|tp|pp|zero)=(\d+)(?:\.\.(\d+))?$/.exec(part);
    if (!m) throw new ArgumentError(`--layout: cannot read ${JSON.stringify(part)} (expected dp=N, tp=N, pp=N, zero=S or zero=A..B)`);
    const [, key, a, b] = m as unknown as [string, 'dp' | 'tp' | 'pp' | 'zero', string, string | undefined];
    if (key === 'zero') {
      const lo = Number(a), hi = b === undefined ? lo : Number(b);
      if (hi > 3 || lo > hi) throw new ArgumentError(`--layout: zero=${a}${b ? `..${b}` : ''} is not a stage or range within 0..3`);
      layout.zeroStages = Array.from({ length: hi - lo + 1 }, (_, i) => lo + i);
    } else {
      if (b !== undefined || Number(a) < 1) throw new ArgumentError(`--layout: ${key} must be one integer >= 1, got ${part.slice(key.length + 1)}`);
      layout[key] = Number(a);
    }
  }
  if (layout.tp > 1 || layout.pp > 1) {
    throw new ArgumentError(`--layout tp=${layout.tp},pp=${layout.pp}: this bench measures data-parallel layouts (tp = pp = 1); tensor- and pipeline-parallel GPT training is not wired into it yet`);
  }
  if (layout.dp < 2) throw new ArgumentError('--layout: dp must be >= 2 (one rank has nothing to communicate)');
  return layout;
}

type Bytes = Pick<ZeroMemoryBytes, 'params' | 'grads' | 'optimizerState' | 'total'>;

/** What one rank measured for one ZeRO stage. */
export interface StageResult {
  stage: number;
  /** Set when the stage could not run (e.g. not implemented); nothing else is then filled in. */
  skipped?: string;
  numParams?: number;
  /** Bytes held after the optimizer step of the last step, before gradients are cleared. */
  measured?: Bytes;
  formula?: Bytes;
  /** measured / formula per kind. */
  ratio?: Bytes;
  /** memoryStats().allocated at the same moment, above what the rank held before building the model. */
  allocatedBytes?: number;
  /** Median ms per timed step; at stages 0-2 with and without overlap, interleaved step by step. */
  msPerStep?: { overlap?: number; noOverlap?: number };
  /** Every timed step's ms (the spread behind the means). */
  stepMs?: { overlap?: number[]; noOverlap?: number[] };
  /** Median ms per timed step spent waiting for gradient communication after backward. */
  syncWaitMs?: { overlap?: number; noOverlap?: number };
  /** With overlap: the buckets, and how many of them started before backward returned (last timed step). */
  buckets?: { count: number; launchedDuringBackward: number };
  /** Stages 1 and 2 with overlap: the most bytes of full gradients held at a gradient hook (ZeroOptimizer.reduceStats). */
  peakFullGradBytes?: number;
}

export interface RankResult { rank: number; config: string; blasThreads: number; stages: StageResult[] }

const sumBytes = (ts: Iterable<Tensor | null | undefined>) => { let s = 0; for (const t of ts) if (t && !t.disposed) s += t.nbytes; return s; };

function stateBytes(opt: Optimizer<{ lr: number }>): number {
  let s = 0;
  for (const st of opt.state.values()) s += sumBytes(Object.values(st.tensors));
  return s;
}

// A rank's batch: its own seeded token stream (data parallelism gives each rank different data).
function batch(c: TrainBenchConfig, rank: number, step: number): { inputs: Tensor; targets: Tensor } {
  let x = (rank + 1) * 1_000_003 + step * 7919;
  const ids = () => Int32Array.from({ length: c.batch * c.ctx }, () => { x = (Math.imul(x, 1103515245) + 12345) >>> 0; return x % c.vocab; });
  return { inputs: tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' }), targets: tensor(ids(), [c.batch, c.ctx], { dtype: 'i32' }) };
}

const adamw = (groups: { params: Iterable<Tensor> }[]) => new AdamW(groups, { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });

/** Trains one stage for warmup + steps steps on a fresh model and measures it. */
async function runStage(c: TrainBenchConfig, group: CollectiveGroup, stage: number, variants: boolean[], warmup: number, steps: number, bucketBytes: number): Promise<StageResult> {
  const baseline = memoryStats().allocated;
  const model = new GPT(gptConfigOf(c), { seed: 0 });
  const params = model.parameters();
  const numParams = params.reduce((s, p) => s + p.size, 0);
  let zero: ZeroOptimizer<AdamWOptions> | null = null;
  let plain: AdamW | null = null;
  try {
    if (stage === 0) plain = adamw([{ params }]);
    else {
      try {
        zero = new ZeroOptimizer<AdamWOptions>(params, adamw, { group, stage: stage as ZeroStage, bucketBytes, bucketOrder: params });
        // Stage 3 gathers each block's parameters around its forward and backward.
        if (zero.stage === 3) zero.attach(model);
      } catch (e) {
        if (e instanceof ArgumentError) return { stage, skipped: e.message };
        throw e;
      }
    }
    // Per variant (overlap on: true), each timed step's ms, and its ms waiting for gradient communication.
    const stepMs = new Map<boolean, number[]>(), waitMs = new Map<boolean, number[]>();
    const push = (map: Map<boolean, number[]>, v: boolean, ms: number) => map.set(v, [...(map.get(v) ?? []), ms]);
    let measured: Bytes | null = null, allocatedBytes = 0;
    let buckets: StageResult['buckets'];
    // One buffer per variant for the whole run: the overlapping one rebuilds its buckets in backward's
    // order after its first step. Its hooks would mark gradients in the other variant's steps too,
    // so those run inside its noSync().
    const buffers = new Map(plain ? variants.map((v) => [v, new GradBuffer(params, { group, overlap: v, bucketBytes })] as const) : []);
    const hooked = buffers.get(true);
    // ZeRO 1 and 2 without overlap: the backward runs inside noSync(), so every reduce-scatter happens in step().
    const hookedZero = zero && zero.stage !== 3 ? zero : null;
    const launchedSoFar = () => hookedZero?.reduceStats.duringBackward ?? hooked?.launched ?? 0;
    for (let i = 0; i < warmup + steps; i++) {
      const overlap = variants[i % variants.length]!;
      const buf = buffers.get(overlap) ?? null;
      const { inputs, targets } = batch(c, group.rank, i);
      const backward = () => scope(() => { model.forward(inputs, targets).loss!.backward(); });
      const launchedBefore = launchedSoFar();
      const t0 = performance.now();
      if (hooked && buf !== hooked) await hooked.noSync(backward);
      else if (hookedZero && !overlap) await hookedZero.noSync(backward);
      else backward();
      const t1 = performance.now();
      if (overlap && i >= warmup && (buf === hooked || hookedZero)) {
        const count = hookedZero ? hookedZero.reduceStats.buckets : buf!.buckets.length;
        buckets = { count, launchedDuringBackward: launchedSoFar() - launchedBefore };
      }
      if (buf) await buf.finishGradSync();
      else await zero!.step();
      const t2 = performance.now();
      if (plain) plain.step();
      const t3 = performance.now();
      if (i >= warmup) {
        push(stepMs, overlap, t3 - t0);
        if (buf) push(waitMs, overlap, t2 - t1);
      }
      if (i === warmup + steps - 1) {
        allocatedBytes = memoryStats().allocated - baseline - inputs.nbytes - targets.nbytes;
        if (zero) measured = zero.memoryBytes();
        else {
          const grads = sumBytes(params.map((p) => p.grad)) + sumBytes(buf!.buckets.map((b) => b.flat));
          const m = { params: sumBytes(params), grads, optimizerState: stateBytes(plain!) };
          measured = { ...m, total: m.params + m.grads + m.optimizerState };
        }
      }
      if (zero) zero.zeroGrad(); else plain!.zeroGrad();
      inputs.dispose(); targets.dispose();
    }
    for (const b of buffers.values()) b.dispose();
    const f = zeroMemoryFormula(numParams, group.size, stage as 0 | ZeroStage);
    const formula: Bytes = { params: f.params, grads: f.grads, optimizerState: f.optimizerState, total: f.total };
    const m = measured!;
    const ratio: Bytes = { params: m.params / formula.params, grads: m.grads / formula.grads, optimizerState: m.optimizerState / formula.optimizerState, total: m.total / formula.total };
    // Medians: other work on a shared machine makes single steps slow, and a mean would follow them.
    const median = (xs: number[] | undefined) => {
      if (!xs) return undefined;
      const s = [...xs].sort((a, b) => a - b), h = s.length >> 1;
      return s.length % 2 ? s[h]! : (s[h - 1]! + s[h]!) / 2;
    };
    const pick = <T>(map: Map<boolean, number[]>, f: (xs: number[] | undefined) => T) => ({ overlap: f(map.get(true)), noOverlap: f(map.get(false)) });
    return {
      stage, numParams, measured: m, formula, ratio, allocatedBytes, msPerStep: pick(stepMs, median), stepMs: pick(stepMs, (xs) => xs),
      ...(plain ? { syncWaitMs: pick(waitMs, median) } : {}), ...(buckets ? { buckets } : {}),
      ...(hookedZero ? { peakFullGradBytes: hookedZero.reduceStats.peakFullGradBytes } : {}),
    };
  } finally {
    zero?.dispose();
    plain?.dispose();
    model.dispose();
  }
}

/** One rank's part (run under the launcher): every configuration and stage, written to <out>/rank-<rank>.json. */
async function rankMain(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { layout: 'string', config: 'string', steps: 'number', warmup: 'number', overlap: 'string', 'bucket-mb': 'number', out: 'string' });
  const layout = parseLayout(o.layout as string);
  const configs = selectConfigs(o.config as string | undefined);
  const variants = overlapVariants(o.overlap as string | undefined);
  const { world, rank } = await dist.init({ timeoutMs: 600_000 });
  if (world.size !== layout.dp) throw new ArgumentError(`bench train --layout: dp=${layout.dp} but the job has ${world.size} ranks`);
  // The ranks share this machine's cores: each gets its share for BLAS (torchrun's OMP_NUM_THREADS habit).
  const localWorld = Number(process.env.LOCAL_WORLD_SIZE ?? world.size);
  const blasThreads = Math.max(1, Math.floor(cpus().length / localWorld));
  cpu().setBlasThreads(blasThreads);
  const results: RankResult[] = [];
  for (const c of configs) {
    const stages: StageResult[] = [];
    for (const s of layout.zeroStages) stages.push(await runStage(c, world, s, s === 3 ? [true] : variants, (o.warmup as number | undefined) ?? 1, (o.steps as number | undefined) ?? 4, bucketBytesOf(o)));
    results.push({ rank, config: c.name, blasThreads, stages });
  }
  writeFileSync(join(o.out as string, `rank-${rank}.json`), JSON.stringify(results));
  await dist.destroy();
  return 0;
}

function bucketBytesOf(o: Options): number {
  const mb = (o['bucket-mb'] as number | undefined) ?? DEFAULT_BUCKET_BYTES / 2 ** 20;
  if (!(mb > 0)) throw new ArgumentError(`bench train: --bucket-mb must be > 0, got ${mb}`);
  return Math.round(mb * 2 ** 20);
}

function overlapVariants(mode = 'both'): boolean[] {
  if (mode === 'both') return [true, false];
  if (mode === 'on' || mode === 'off') return [mode === 'on'];
  throw new ArgumentError(`bench train: --overlap must be on, off or both, got ${JSON.stringify(mode)}`);
}

const mib = (b: number) => (b / 2 ** 20).toFixed(1);
const fmtMs = (v: number | undefined) => (v === undefined ? '-' : v.toFixed(0));

/** Launches the ranks, collects their results, prints the table and writes the JSON. Returns the exit code. */
export async function layoutMain(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    layout: 'string', config: { kind: 'string', choices: ['tiny', 'small', 'all'] }, steps: { kind: 'positive', max: 1e6 }, warmup: { kind: 'positive', max: 1e6 },
    overlap: { kind: 'string', choices: ['on', 'off', 'both'] }, 'bucket-mb': { kind: 'number', min: 1 / 1024, max: 1 << 16 }, json: 'outfile', help: 'boolean',
  });
  if (o._.length > 0) throw new UsageError(`unexpected argument ${JSON.stringify(o._[0])}`);
  const layout = parseLayout(o.layout as string);
  const bucketBytes = bucketBytesOf(o);
  selectConfigs(o.config as string | undefined);
  overlapVariants(o.overlap as string | undefined);
  const steps = (o.steps as number | undefined) ?? 4, warmup = (o.warmup as number | undefined) ?? 1;
  if (!(steps >= 1 && warmup >= 1)) throw new ArgumentError('bench train --layout: --steps and --warmup must be >= 1 (the first step creates the optimizer state)');
  const out = mkdtempSync(join(tmpdir(), 'nt-bench-layout-'));
  try {
    const rankArgs = argv.filter((a, i) => a !== '--json' && argv[i - 1] !== '--json' && !a.startsWith('--json='));
    const { main: launch } = await import('../launch/cli.js');
    const loadAtStart = loadavg();
    const code = await launch(['--nproc-per-node', String(layout.dp), fileURLToPath(import.meta.url), ...rankArgs, '--out', out]);
    if (code !== 0) return code;
    const ranks = Array.from({ length: layout.dp }, (_, r) => JSON.parse(readFileSync(join(out, `rank-${r}.json`), 'utf8')) as RankResult[]);
    const loadAverage = { atStart: loadAtStart, atEnd: loadavg() };
    return report(layout, ranks, { steps, warmup, overlap: (o.overlap as string | undefined) ?? 'both', bucketBytes, loadAverage }, o.json as string | undefined);
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
}

interface RunRecord { steps: number; warmup: number; overlap: string; bucketBytes: number; loadAverage: { atStart: number[]; atEnd: number[] } }

function report(layout: BenchLayout, ranks: RankResult[][], run: RunRecord, json: string | undefined): number {
  console.log(`\n# nodetron bench train --layout dp=${layout.dp}: ${run.warmup} warm-up + ${run.steps} timed steps per stage, f32 AdamW on cpu, ` +
    `${ranks[0]![0]!.blasThreads} BLAS thread(s) per rank; stages 0-2 alternate overlap on/off step by step, ${mib(run.bucketBytes)} MiB buckets`);
  console.log('# bytes held after the last optimizer step, before zeroGrad, summed over the tensors of each kind (meas) and as the allocator');
  console.log('# counts them (memoryStats().allocated above the rank\'s start); formula: zeroMemoryFormula (ZeRO paper 2Ψ+2Ψ+KΨ for f32)\n');
  const rows: (string | number)[][] = [];
  let worst = 0;
  const skipped: string[] = [];
  for (const [ci, first] of ranks[0]!.entries()) {
    for (const [si, st] of first.stages.entries()) {
      if (st.skipped) { skipped.push(`${first.config} zero=${st.stage}: ${st.skipped}`); continue; }
      for (const perRank of ranks) {
        const s = perRank[ci]!.stages[si]!;
        const m = s.measured!, f = s.formula!, r = s.ratio!;
        const allocRatio = s.allocatedBytes! / f.total;
        worst = Math.max(worst, ...Object.values(r).map((x) => Math.abs(x - 1)), Math.abs(allocRatio - 1));
        const cell = (k: keyof Bytes) => `${mib(m[k])} / ${mib(f[k])}`;
        rows.push([first.config, s.stage, perRank[ci]!.rank, (s.numParams! / 1e6).toFixed(2), cell('params'), cell('grads'), cell('optimizerState'), cell('total'),
          r.total.toFixed(3), `${mib(s.allocatedBytes!)} (${allocRatio.toFixed(3)})`, fmtMs(s.msPerStep!.overlap), fmtMs(s.msPerStep!.noOverlap),
          fmtMs(s.syncWaitMs?.overlap), fmtMs(s.syncWaitMs?.noOverlap), s.buckets ? `${s.buckets.launchedDuringBackward}/${s.buckets.count}` : '-',
          s.peakFullGradBytes === undefined ? '-' : mib(s.peakFullGradBytes)]);
      }
    }
  }
  printTable(['config', 'zero', 'rank', 'Ψ (M)', 'params MiB meas/formula', 'grads', 'optim state', 'total', 'total ratio', 'allocator MiB (/formula)',
    'ms/step', 'ms/step no-overlap', 'sync wait ms', 'sync wait no-overlap', 'buckets in backward', 'peak full grads MiB'], rows);
  console.log('\n# ms/step: medians over the timed steps, overlap on and off interleaved step by step (ZeRO 3: its own per-unit schedule, one variant);');
  console.log('# sync wait (stage 0): time in finishGradSync after backward; buckets in backward: buckets whose allReduce (stage 0) or reduce-scatter (stages 1, 2)');
  console.log('# started before backward returned / buckets (overlap on, last timed step); peak full grads: most bytes of full gradients held at a gradient hook');
  const load = (l: number[]) => l.map((x) => x.toFixed(1)).join(' ');
  console.log(`# load average (1, 5, 15 min) at start: ${load(run.loadAverage.atStart)}; at end: ${load(run.loadAverage.atEnd)} on ${cpus().length} cores`);
  for (const s of skipped) console.log(`# skipped ${s}`);
  const ok = worst <= FORMULA_TOLERANCE;
  console.log(`# worst |measured/formula - 1| over params, grads, optimizer state, total and allocator total: ${(worst * 100).toFixed(2)}% (${ok ? 'within' : 'OUTSIDE'} ${FORMULA_TOLERANCE * 100}%)`);
  writeJson(json, { bench: 'train-layout', machine: machineRecord(), layout, ...run, formulaTolerance: FORMULA_TOLERANCE, worstFormulaDeviation: worst, ranks: ranks.flat() });
  return ok ? 0 : 1;
}

// Launched as a rank script by layoutMain (through the launcher).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  rankMain(process.argv.slice(2)).then((code) => process.exit(code), (e: unknown) => { console.error(e); process.exit(1); });
}
