// `nodetron bench start`: a job's start time, from launch to the end of its first training step, for
// 2, 4 and 8 ranks with the launcher's TCP store and with Redis (--rdzv). Each run starts a real
// `nodetron launch` in a fresh process; the ranks record when they started, when init() returned and
// when their first step ended. Prints a table (medians over --repeat runs) and writes JSON.
//
// First step, precisely: a data-parallel step of a 64x64 Linear on a batch of 8 (forward, loss,
// backward, the gradients all-reduced with op 'avg', SGD update), ending when the updated weights
// are read back. The job's start time is `launch → first step`: from the moment the launcher process
// is spawned to the moment the LAST rank has finished that step (a job is started when all ranks are).
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ArgumentError } from '../errors.js';
import { scriptCommand } from '../launch/workers.js';
import { median } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { parseOptions } from '../cmdline/args.js';

/** What one rank records, as epoch milliseconds. */
interface RankTimes {
  rank: number;
  /** The process started (performance.timeOrigin). */
  processStart: number;
  /** nodetron was imported (module evaluation done). */
  imported: number;
  /** init() returned (store connected, world group built). */
  initDone: number;
  /** The first training step ended on this rank. */
  stepDone: number;
}

/** One launch, reduced to the job's view: the latest rank at each phase, relative to the launch. */
export interface StartRun {
  /** 'tcp' (the launcher's store) or 'redis' (--rdzv). */
  store: 'tcp' | 'redis';
  /** Ranks in the job. */
  ranks: number;
  /** ms from spawning the launcher until the last rank's process started. */
  processesMs: number;
  /** ms until the last rank had imported nodetron. */
  importedMs: number;
  /** ms until the last rank's init() returned. */
  initMs: number;
  /** ms until the last rank finished its first step: the job's start time. */
  firstStepMs: number;
  /** ms until the launcher exited (the job's whole life, including its shutdown). */
  exitMs: number;
}

const usage = `usage: nodetron bench start [--ranks 2,4,8] [--stores tcp,redis] [--repeat 3] [--redis-server PATH] [--json FILE]

Measures a job's start time: from spawning \`nodetron launch --nproc-per-node N\` to the end of the
first data-parallel training step on the last rank, with the launcher's TCP store and with Redis
(--rdzv; a redis-server is started on a free loopback port). Prints medians over --repeat runs.`;

const here = fileURLToPath(import.meta.url);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The rank side: one first step, its times written to $NODETRON_BENCH_START_DIR/rank-R.json. */
async function rankMain(): Promise<number> {
  const nt = await import('../index.js');
  const imported = performance.timeOrigin + performance.now();
  const { world, rank } = await nt.distributed.init({ backend: 'gloo', timeoutMs: 120_000 });
  const initDone = performance.timeOrigin + performance.now();
  nt.manualSeed(1234 + rank);
  const model = new nt.nn.Linear(64, 64);
  const opt = new nt.optim.SGD(model.parameters(), { lr: 0.01 });
  const y = model.forward(nt.randn([8, 64]));
  nt.mean(nt.mul(y, y)).backward();
  for (const p of model.parameters()) await world.allReduce(p.grad!, { op: 'avg' });
  opt.step();
  model.weight.toArraySync();
  const stepDone = performance.timeOrigin + performance.now();
  await nt.distributed.destroy();
  const times: RankTimes = { rank, processStart: performance.timeOrigin, imported, initDone, stepDone };
  writeFileSync(join(process.env.NODETRON_BENCH_START_DIR!, `rank-${rank}.json`), JSON.stringify(times));
  return 0;
}

/** Runs the launcher's CLI in this process (the bench spawns itself with --launcher to time a real launch). */
async function launcherMain(argv: string[]): Promise<number> {
  const { main } = await import('../launch/cli.js');
  return main(argv);
}

function waitExit(child: ChildProcess): Promise<number | null> {
  return new Promise((resolve) => child.on('close', (code) => resolve(code)));
}

/** One launch of `ranks` ranks; resolves with the job's phases relative to the spawn. */
async function runOnce(store: 'tcp' | 'redis', ranks: number, redisUrl: string | undefined, runId: string): Promise<StartRun> {
  const dir = mkdtempSync(join(tmpdir(), 'nodetron-bench-start-'));
  try {
    const launchArgs = ['--nproc-per-node', String(ranks), ...(store === 'redis' ? ['--rdzv', redisUrl!, '--run-id', runId] : []), here, '--rank'];
    const cmd = scriptCommand(here, ['--launcher', ...launchArgs]);
    let output = '';
    const t0 = performance.timeOrigin + performance.now();
    const child = spawn(cmd[0]!, cmd.slice(1), {
      env: { ...process.env, NODETRON_BENCH_START_DIR: dir, NODETRON_WARN_LEAKS: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.on('data', (c) => (output += c));
    child.stderr!.on('data', (c) => (output += c));
    const code = await waitExit(child);
    const exitMs = performance.timeOrigin + performance.now() - t0;
    if (code !== 0) throw new Error(`the ${store} launch of ${ranks} ranks exited with ${code}:\n${output.slice(-3000)}`);
    const times = readdirSync(dir).filter((f) => f.startsWith('rank-')).map((f) => JSON.parse(readFileSync(join(dir, f), 'utf8')) as RankTimes);
    if (times.length !== ranks) throw new Error(`${times.length} of ${ranks} ranks reported their times:\n${output.slice(-3000)}`);
    const last = (k: keyof RankTimes) => Math.max(...times.map((t) => t[k])) - t0;
    return { store, ranks, processesMs: last('processStart'), importedMs: last('imported'), initMs: last('initDone'), firstStepMs: last('stepDone'), exitMs };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Starts redis-server on a free loopback port; resolves once it answers. */
async function startRedis(binary: string): Promise<{ url: string; stop(): void }> {
  const { createServer } = await import('node:net');
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', () => r()));
  const port = (srv.address() as { port: number }).port;
  await new Promise<void>((r) => srv.close(() => r()));
  const redis = spawn(binary, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const { RedisStore } = await import('../distributed/redis-store.js');
  const probe = await RedisStore.connect({ port, timeoutMs: 10_000 });
  await probe.close();
  return { url: `redis://127.0.0.1:${port}`, stop: () => redis.kill('SIGTERM') };
}


/** `nodetron bench start`. */
export async function main(argv: string[]): Promise<number> {
  if (argv[0] === '--rank') return rankMain();
  if (argv[0] === '--launcher') return launcherMain(argv.slice(1));
  const o = parseOptions(argv, { ranks: 'string', stores: 'string', repeat: 'number', 'redis-server': 'string', json: 'string', help: 'boolean' }, { h: 'help' });
  if (o.help) {
    console.log(usage);
    return 0;
  }
  const ranksList = String(o.ranks ?? '2,4,8').split(',').map((s) => Number(s.trim()));
  if (ranksList.some((n) => !Number.isInteger(n) || n < 1 || n > 256)) throw new ArgumentError(`--ranks expects integers in [1, 256], got ${JSON.stringify(o.ranks)}`);
  const stores = String(o.stores ?? 'tcp,redis').split(',').map((s) => s.trim());
  for (const s of stores) if (s !== 'tcp' && s !== 'redis') throw new ArgumentError(`--stores expects tcp and/or redis, got ${JSON.stringify(s)}`);
  const repeat = (o.repeat as number | undefined) ?? 3;
  if (!Number.isInteger(repeat) || repeat < 1) throw new ArgumentError(`--repeat expects an integer >= 1, got ${repeat}`);
  const redisBinary = (o['redis-server'] as string | undefined) ?? 'redis-server';
  let redis: { url: string; stop(): void } | undefined;
  if (stores.includes('redis')) {
    if (spawnSync(redisBinary, ['--version']).status !== 0) throw new ArgumentError(`--stores redis needs ${redisBinary} (install redis-server, or pass --redis-server PATH)`);
    redis = await startRedis(redisBinary);
  }
  const load = loadavg()[0]!;
  const runs: StartRun[] = [];
  try {
    for (const ranks of ranksList) {
      for (const store of stores as ('tcp' | 'redis')[]) {
        for (let i = 0; i < repeat; i++) {
          runs.push(await runOnce(store, ranks, redis?.url, `bench-start-${process.pid}-${ranks}-${i}`));
          await sleep(200);
        }
      }
    }
  } finally {
    redis?.stop();
  }
  const rows: StartRun[] = [];
  for (const ranks of ranksList) {
    for (const store of stores as ('tcp' | 'redis')[]) {
      const mine = runs.filter((r) => r.ranks === ranks && r.store === store);
      const med = (k: keyof StartRun) => median(mine.map((r) => r[k] as number));
      rows.push({ store, ranks, processesMs: med('processesMs'), importedMs: med('importedMs'), initMs: med('initMs'), firstStepMs: med('firstStepMs'), exitMs: med('exitMs') });
    }
  }
  const f = (ms: number) => ms.toFixed(0);
  console.log(`job start time, launch → first step (median of ${repeat} run(s); load average ${load.toFixed(1)} at start)`);
  printTable(['store', 'ranks', 'processes up ms', 'imported ms', 'init done ms', 'first step ms', 'launcher exit ms'],
    rows.map((r) => [r.store, r.ranks, f(r.processesMs), f(r.importedMs), f(r.initMs), f(r.firstStepMs), f(r.exitMs)]));
  writeJson(o.json as string | undefined, {
    bench: 'start', machine: machineRecord(), loadAverage1m: load, repeat,
    definition: 'ms from spawning `nodetron launch --nproc-per-node N` until the last rank ended its first data-parallel step (64x64 Linear, batch 8, gradients all-reduced, SGD update)',
    rows, runs,
  });
  return 0;
}

// Run as a script (the launcher's rank, or the self-spawned launcher): `node start.js --rank|--launcher ...`.
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1] && (process.argv[2] === '--rank' || process.argv[2] === '--launcher')) {
  process.exitCode = await main(process.argv.slice(2));
}
