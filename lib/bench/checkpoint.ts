// `nodetron bench checkpoint`: the cost of sharded checkpoints on a GPT under data parallelism
// (DP2, every rank a replica: each writes half the state) and ZeRO-3 (each rank writes its shard).
// Per layout: the training stall per save (waiting for the previous save + copying to host memory),
// what it costs at one save per 20 steps, save bandwidth (bytes / time to the committed manifest),
// load bandwidth; beside `dd` writing the same bytes to the same disk (fsynced, round by round) and, with
// --compare-torch, torch.distributed.checkpoint saving the same bytes per rank (scripts/bench/torch_dcp.py).
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import * as dist from '../distributed/init.js';
import { ArgumentError } from '../errors.js';
import { tensor } from '../creation.js';
import { cpu } from '../native.js';
import { GPT } from '../nn/gpt.js';
import { AdamW, type AdamWOptions } from '../optim/adamw.js';
import { initializeParallel } from '../parallel/mesh.js';
import { ParallelTrainer } from '../parallel/trainer.js';
import { GPTStage } from '../parallel/pipeline/gpt-stage.js';
import { Checkpointer } from '../ckpt/checkpoint.js';
import { readManifest, stepDirName } from '../ckpt/format.js';
import { gptConfigOf, selectConfigs } from './configs.js';
import { median } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';

/** The layouts measured: ranks (processes) and ZeRO stage. `one`: a single process writes everything. */
const LAYOUTS: Record<string, { ranks: number; zero: 0 | 3 }> = { one: { ranks: 1, zero: 0 }, dp2: { ranks: 2, zero: 0 }, zero3: { ranks: 2, zero: 3 } };
const SAVE_INTERVAL = 20;
/** Timed synchronous save rounds (each with a dd beside it; --rounds), after WARMUP_ROUNDS untimed ones. */
const SYNC_ROUNDS = 7;
const WARMUP_ROUNDS = 2;

interface RankRecord {
  layout: string;
  stepMs: number;
  /** Background saves, a training step after each: the stall, and save() → committed. */
  saves: Array<{ waitMs: number; copyMs: number; totalMs: number }>;
  /** Synchronous saves (nothing else running): save() → committed, what the bandwidth is computed from. */
  syncMs: number[];
  /** dd writing the checkpoint's bytes to the same directory, fsynced, beside each synchronous save (rank 0 only; empty on the others). */
  ddMs: number[];
  bytes: number;
  loadMs: number;
}

/** One rank (under the launcher): warm up, time steps, save N times with a step after each, load the last. */
async function rankMain(argv: string[]): Promise<number> {
  const o = parseOptions(argv, { layout: 'string', config: 'string', saves: 'number', rounds: 'number', dir: 'string', out: 'string' });
  const rounds = (o.rounds as number | undefined) ?? SYNC_ROUNDS;
  const name = o.layout as string;
  const [c] = selectConfigs((o.config as string | undefined) ?? 'small');
  const { world, rank } = await dist.init({ timeoutMs: 600_000 });
  cpu().setBlasThreads(Math.max(1, Math.floor(cpus().length / world.size)));
  const mesh = await initializeParallel({ tp: 1, pp: 1, dp: world.size });
  const stage = new GPTStage(new GPT(gptConfigOf(c!), { seed: 1 }), 0, 1);
  const trainer = await ParallelTrainer.create<AdamWOptions>(stage, [{ params: stage.parameters() }], {
    mesh, zero: LAYOUTS[name]!.zero, createOptimizer: (g) => new AdamW(g, { lr: 1e-4 }),
  });
  const rows = c!.batch / world.size;
  const ids = new Int32Array(rows * c!.ctx).map((_, i) => (i * 7919 + rank) % c!.vocab);
  const step = async () => {
    using x = tensor(ids, [rows, c!.ctx]);
    using y = tensor(ids, [rows, c!.ctx]);
    await trainer.step(x, y);
  };
  await step();
  const t0 = performance.now();
  for (let i = 0; i < 3; i++) await step();
  const stepMs = (performance.now() - t0) / 3;
  const root = join(o.dir as string, name);
  const ckpt = new Checkpointer(root);
  const saves: RankRecord['saves'] = [];
  let lastDir = '';
  for (let i = 0; i < ((o.saves as number | undefined) ?? 3); i++) {
    await world.barrier();
    const s0 = performance.now();
    const r = await ckpt.save(i + 1, { model: trainer });
    await step(); // training goes on while stage 2 writes
    await r.done;
    await world.barrier(); // the checkpoint is complete once rank 0 has committed
    saves.push({ waitMs: r.waitMs, copyMs: r.copyMs, totalMs: performance.now() - s0 });
    lastDir = r.dir;
  }
  await ckpt.close();
  await world.barrier();
  const bytes = readManifest(lastDir).files.reduce((s, f) => s + f.size, 0);
  // Synchronous saves, each beside a dd of the same bytes into the same directory (the disk's speed
  // drifts from second to second: rounds side by side compare the two under the same conditions; which
  // of the two goes first alternates). The first WARMUP_ROUNDS rounds are not timed (the new
  // checkpointer's staging buffer is faulted in, the disk settles). Each round starts from an empty
  // directory (the last round's checkpoint deleted untimed, as dd's file is), so neither overlaps the
  // other's deletion.
  const syncRoot = join(o.dir as string, `${name}-sync`);
  const sync = new Checkpointer(syncRoot, { async: false });
  const syncMs: number[] = [], ddMs: number[] = [];
  for (let i = 0; i < WARMUP_ROUNDS + rounds; i++) {
    let dd: number | null = null, save = 0;
    const timeSave = async () => {
      await world.barrier();
      const s0 = performance.now();
      await sync.save(i + 1, { model: trainer });
      await world.barrier();
      save = performance.now() - s0;
      if (rank === 0) rmSync(join(syncRoot, stepDirName(i + 1)), { recursive: true, force: true });
    };
    const timeDd = async () => {
      await world.barrier();
      if (rank === 0) { mkdirSync(syncRoot, { recursive: true }); dd = ddSeconds(syncRoot, bytes); }
      await world.barrier();
    };
    if (i % 2 === 0) { await timeDd(); await timeSave(); } else { await timeSave(); await timeDd(); }
    if (i < WARMUP_ROUNDS) continue;
    syncMs.push(save);
    if (dd !== null) ddMs.push(dd * 1000);
  }
  await sync.close();
  await world.barrier();
  const l0 = performance.now();
  await ckpt.load(lastDir, { model: trainer });
  await world.barrier();
  const loadMs = performance.now() - l0;
  writeFileSync(join(o.out as string, `rank-${rank}.json`), JSON.stringify({ layout: name, stepMs, saves, syncMs, ddMs, bytes, loadMs } satisfies RankRecord));
  trainer.dispose();
  stage.dispose();
  await dist.destroy();
  return 0;
}

/** Seconds `dd` takes to write `bytes` (fsynced) into a new file in `dir` (null when dd fails). */
function ddSeconds(dir: string, bytes: number): number | null {
  const path = join(dir, 'dd.bin');
  const blocks = Math.max(1, Math.ceil(bytes / 2 ** 20));
  const t0 = performance.now();
  const r = spawnSync('dd', ['if=/dev/zero', `of=${path}`, 'bs=1M', `count=${blocks}`, 'conv=fsync'], { stdio: 'ignore' });
  const s = ((performance.now() - t0) / 1000) * (bytes / (blocks * 2 ** 20));
  rmSync(path, { force: true });
  return r.status === 0 ? s : null;
}

export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    layout: 'string', config: { kind: 'string', choices: ['small', 'tiny'] }, saves: { kind: 'positive', max: 1000 }, rounds: { kind: 'positive', max: 1000 }, dir: 'string', out: 'string', json: 'outfile', 'compare-torch': 'boolean', help: 'boolean',
  }, { h: 'help' });
  if (o.help) {
    console.log(`usage: nodetron bench checkpoint [--config small|tiny] [--layout one,dp2,zero3] [--saves 3] [--rounds ${SYNC_ROUNDS}] [--dir D] [--compare-torch] [--json F]
  Saves a GPT's training state (weights + AdamW state) under each layout (one: 1 process; dp2, zero3: 2 ranks), in the background
  while training goes on (--saves of them); reports the stall per save, save and load bandwidth, beside dd on the same disk
  (--rounds synchronous saves, each beside a dd, after ${WARMUP_ROUNDS} untimed ones).`);
    return 0;
  }
  const rounds = (o.rounds as number | undefined) ?? SYNC_ROUNDS;
  const layouts = ((o.layout as string | undefined) ?? 'one,dp2,zero3').split(',').map((s) => s.trim());
  expectPositionals(o, 'nothing', 0);
  for (const l of layouts) if (!Object.hasOwn(LAYOUTS, l)) throw new ArgumentError(`bench checkpoint: unknown --layout ${l} (${Object.keys(LAYOUTS).join(', ')})`);
  const config = (o.config as string | undefined) ?? 'small';
  selectConfigs(config);
  const base = (o.dir as string | undefined) ?? tmpdir();
  mkdirSync(base, { recursive: true });
  const dir = mkdtempSync(join(base, 'nt-bench-ckpt-'));
  const { main: launch } = await import('../launch/cli.js');
  const results: Array<RankRecord & { saveBytesPerS: number; ddBytesPerS: number | null; saveOverDd: number | null; saveOverDdBest: number | null; torch: unknown }> = [];
  try {
    for (const layout of layouts) {
      const out = join(dir, `out-${layout}`);
      mkdirSync(out);
      const code = await launch(['--nproc-per-node', String(LAYOUTS[layout]!.ranks), fileURLToPath(import.meta.url), '--layout', layout, '--config', config,
        '--saves', String((o.saves as number | undefined) ?? 3), '--rounds', String(rounds), '--dir', dir, '--out', out]);
      if (code !== 0) return code;
      const r0 = JSON.parse(readFileSync(join(out, 'rank-0.json'), 'utf8')) as RankRecord;
      for (const d of [layout, `${layout}-sync`]) rmSync(join(dir, d), { recursive: true, force: true });
      let torch: unknown = null;
      if (o['compare-torch']) torch = torchPeer(dir, r0.bytes, LAYOUTS[layout]!.ranks);
      const saveBytesPerS = r0.bytes / (median(r0.syncMs) / 1000);
      const ddBytesPerS = r0.ddMs.length ? r0.bytes / (median(r0.ddMs) / 1000) : null;
      results.push({ ...r0, saveBytesPerS, ddBytesPerS, saveOverDd: ddBytesPerS ? saveBytesPerS / ddBytesPerS : null,
        saveOverDdBest: r0.ddMs.length ? Math.min(...r0.ddMs) / Math.min(...r0.syncMs) : null, torch });
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const MB = 1e6;
  console.log(`\n# nodetron bench checkpoint --config ${config}: f32 AdamW; a save's stall = waiting for the previous save + copying to host memory`);
  printTable(['layout', 'checkpoint MB', 'step ms', 'stall ms (wait+copy)', 'stall @1/20 steps', 'save MB/s', 'dd MB/s', 'save/dd (median; best)', 'load MB/s', 'torch dcp save MB/s', 'torch async stall ms'],
    results.map((r) => {
      const stall = median(r.saves.map((s) => s.waitMs + s.copyMs));
      const t = r.torch as { saveS: number; asyncStallS: number } | null;
      return [r.layout, (r.bytes / MB).toFixed(1), r.stepMs.toFixed(0),
        `${stall.toFixed(1)} (${median(r.saves.map((s) => s.waitMs)).toFixed(1)}+${median(r.saves.map((s) => s.copyMs)).toFixed(1)})`,
        `${((100 * stall) / (SAVE_INTERVAL * r.stepMs)).toFixed(2)}%`, (r.saveBytesPerS / MB).toFixed(0),
        r.ddBytesPerS ? (r.ddBytesPerS / MB).toFixed(0) : '-', r.saveOverDd ? `${r.saveOverDd.toFixed(2)}; ${r.saveOverDdBest!.toFixed(2)}` : '-',
        (r.bytes / (r.loadMs / 1000) / MB).toFixed(0),
        t ? (r.bytes / t.saveS / MB).toFixed(0) : '-', t ? (t.asyncStallS * 1000).toFixed(1) : '-'];
    }));
  console.log(`stall: median of background saves (the first one allocates the staging buffer); save MB/s: checkpoint bytes / synchronous save() → manifest committed (median of ${rounds});
dd MB/s: dd writing the same bytes fsynced to the same directory beside each of those saves, before and after in turn (median of ${rounds}, after ${WARMUP_ROUNDS} untimed rounds);
save/dd: the ratio of the two medians; best: of the fastest of each;
one: one process writes the whole state; dp2: the two replicas write half the state each; zero3: each rank its shard. load: every rank loads its parts (replicas read the whole model), files verified by CRC-32`);
  writeJson(o.json as string | undefined, { bench: 'checkpoint', config, machine: machineRecord(), results });
  return 0;
}

/** torch.distributed.checkpoint on `ranks` Gloo ranks saving the same bytes (split as this layout splits them). */
function torchPeer(dir: string, bytes: number, ranks: number): unknown {
  const script = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'scripts', 'bench', 'torch_dcp.py');
  // Each rank writes an even share (dp2: each replica half, as torch's planner spreads replicated tensors over the ranks; zero3: its shard).
  const perRank = Array.from({ length: ranks }, () => bytes / ranks);
  try {
    const out = execFileSync('python3', [script, '--dir', join(dir, 'torch'), '--bytes', perRank.map((b) => String(Math.round(b))).join(',')], {
      encoding: 'utf8', env: { ...process.env, MALLOC_MMAP_MAX_: '0', MALLOC_TRIM_THRESHOLD_: '68719476736', MALLOC_TOP_PAD_: '1073741824' },
    });
    return JSON.parse(out.trim().split('\n').pop()!);
  } catch (e) {
    console.error(`bench checkpoint: the torch peer failed (${(e as Error).message.split('\n')[0]}); reporting without it`);
    return null;
  } finally {
    try { statSync(join(dir, 'torch')); rmSync(join(dir, 'torch'), { recursive: true, force: true }); } catch { /* none */ }
  }
}

// Launched as a rank script by main (through the launcher).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  rankMain(process.argv.slice(2)).then((code) => process.exit(code), (e: unknown) => { console.error(e); process.exit(1); });
}
