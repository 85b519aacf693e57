// `nodetron bench comm`: collective bandwidth the way nccl-tests reports it (size, count, type,
// redop, root, time, algbw, busbw, #wrong; out-of-place and in-place), run under the launcher (or
// launching itself), with an optional side-by-side run of torch.distributed's Gloo allreduce.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { full, tensor, zeros } from '../creation.js';
import { DTYPES, dtypeCode, dtypeSize, type DType } from '../dtype.js';
import { ArgumentError, UsageError } from '../errors.js';
import * as dist from '../distributed/index.js';
import type { ReduceOp } from '../distributed/index.js';
import type { Tensor } from '../tensor.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseBytes, parseOptions } from '../cmdline/args.js';

const OPS = ['all_reduce', 'all_gather', 'reduce_scatter', 'broadcast', 'all_to_all', 'all_to_all_v', 'sendrecv'] as const;
type BenchOp = (typeof OPS)[number];

/** nccl-tests' bus-bandwidth factors: busbw = algbw * factor(n). */
export function busFactor(op: BenchOp, n: number): number {
  if (op === 'all_reduce') return (2 * (n - 1)) / n;
  if (op === 'all_gather' || op === 'reduce_scatter' || op === 'all_to_all' || op === 'all_to_all_v') return (n - 1) / n;
  return 1;
}

interface Measurement { timeUs: number; algbw: number; busbw: number; wrong: number }
export interface CommRow { bytes: number; count: number; dtype: DType; redop: string; root: number; outOfPlace: Measurement | null; inPlace: Measurement | null }

// Small integers: exact in every dtype, so #wrong counts real errors and not rounding.
const valueAt = (rank: number, i: number): number => ((i % 7) + rank) % 5;

function filled(count: number, dtype: DType, rank: number): Tensor {
  const a = new Float32Array(count);
  for (let i = 0; i < count; i++) a[i] = valueAt(rank, i);
  return dtype === 'f32' ? tensor(a, [count]) : tensor(a, [count], { dtype });
}

function reduceRef(op: ReduceOp, i: number, n: number, dtype: DType): number {
  let acc = op === 'prod' ? 1 : op === 'max' ? -Infinity : op === 'min' ? Infinity : 0;
  for (let r = 0; r < n; r++) {
    const v = valueAt(r, i);
    acc = op === 'prod' ? acc * v : op === 'max' ? Math.max(acc, v) : op === 'min' ? Math.min(acc, v) : acc + v;
  }
  if (op !== 'avg') return acc;
  return dtype === 'i32' || dtype === 'u8' ? Math.trunc(acc / n) : acc / n;
}

function countWrong(t: Tensor, expected: (i: number) => number, dtype: DType): number {
  const got = t.toArraySync();
  const tol = dtype === 'f16' || dtype === 'bf16' ? 1e-2 : dtype === 'f32' ? 1e-6 : 0;
  let wrong = 0;
  for (let i = 0; i < got.length; i++) {
    const e = expected(i);
    if (!(Math.abs(got[i]! - e) <= tol * Math.max(1, Math.abs(e)))) wrong++;
  }
  return wrong;
}

interface Plan {
  /** Runs the op once; `inPlace` picks the form. */
  run(inPlace: boolean): PromiseLike<unknown>;
  /** Mismatching elements after a fresh run of the form. */
  check(inPlace: boolean): Promise<number>;
  supports: { outOfPlace: boolean; inPlace: boolean };
  dispose(): void;
}

// Puts rank's initial values back into t (the in-place forms overwrite their input).
function refill(t: Tensor, rank: number): void {
  const fresh = filled(t.size, t.dtype, rank);
  t.backend.copy(t.storage, 0, fresh.storage, 0, t.nbytes);
  fresh.dispose();
}

// sendrecv has no in-place form: a buffer cannot be sent while it is being received into.
function plan(op: BenchOp, g: dist.ProcessGroup, count: number, dtype: DType, redop: ReduceOp): Plan {
  const n = g.size, rank = g.rank, esize = dtypeSize(dtype);
  const owned: Tensor[] = [];
  const keep = <T extends Tensor>(t: T): T => { owned.push(t); return t; };
  const dispose = (): void => { for (const t of owned) t.dispose(); };
  // A plan with both forms whose check puts the inputs back (`reset`), runs the form and counts the
  // elements of result(inPlace) that differ from expected(inPlace, i).
  const bothForms = (run: (inPlace: boolean) => PromiseLike<unknown>, reset: (inPlace: boolean) => void,
    result: (inPlace: boolean) => Tensor, expected: (inPlace: boolean, i: number) => number): Plan => ({
    run, dispose, supports: { outOfPlace: true, inPlace: true },
    async check(ip) {
      reset(ip);
      await run(ip);
      return countWrong(result(ip), (i) => expected(ip, i), dtype);
    },
  });
  switch (op) {
    case 'all_reduce': {
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([count], { dtype }));
      const run = (ip: boolean) => (ip ? g.allReduce(x, { op: redop }) : g.allReduce(x, { op: redop, out }));
      return bothForms(run, () => refill(x, rank), (ip) => (ip ? x : out), (_ip, i) => reduceRef(redop, i, n, dtype));
    }
    case 'broadcast': {
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([count], { dtype }));
      const run = (ip: boolean) => (ip ? g.broadcast(x, { root: 0 }) : g.broadcast(x, { root: 0, out }));
      return bothForms(run, () => refill(x, rank), (ip) => (ip ? x : out), (_ip, i) => valueAt(0, i));
    }
    case 'all_gather': {
      // In place (nccl-tests): this rank's block of out is the input.
      const per = count / n;
      const x = keep(filled(per, dtype, rank)), out = keep(zeros([count], { dtype }));
      const run = (ip: boolean) => (ip ? g.allGather(out, out) : g.allGather(out, x));
      const reset = (ip: boolean) => {
        out.backend.fill(out.storage, dtypeCode(dtype), count, 0);
        if (ip) out.backend.copy(out.storage, rank * per * esize, x.storage, 0, x.nbytes);
      };
      return bothForms(run, reset, () => out, (_ip, i) => valueAt(Math.floor(i / per), i % per));
    }
    case 'reduce_scatter': {
      // In place (nccl-tests): the output is this rank's block of the input.
      const per = count / n;
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([per], { dtype }));
      const run = (ip: boolean) => (ip ? g.reduceScatter(x, x, { op: redop }) : g.reduceScatter(out, x, { op: redop }));
      return bothForms(run, () => refill(x, rank), (ip) => (ip ? x : out), (ip, i) => {
        const offset = ip ? rank * per : 0;
        return ip && (i < offset || i >= offset + per) ? valueAt(rank, i) : reduceRef(redop, rank * per + i - offset, n, dtype);
      });
    }
    case 'all_to_all': {
      const per = count / n;
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([count], { dtype }));
      const run = (ip: boolean) => (ip ? g.allToAll(x, x) : g.allToAll(out, x));
      // Block j of the output is block `rank` of rank j's input.
      return bothForms(run, () => refill(x, rank), (ip) => (ip ? x : out), (_ip, i) => valueAt(Math.floor(i / per), rank * per + (i % per)));
    }
    case 'all_to_all_v': {
      // Uneven blocks, as expert parallelism sends them: rank r sends rank j a share (r + j) % n + 1 of
      // n(n+1)/2 of its count (each rank sends and receives every share once; the last block takes the
      // remainder). Counts are exchanged first by an equal all-to-all of one integer per rank, inside the timed op.
      const shares = n * (n + 1) / 2;
      const blocks = (r: number): number[] => {
        const b = Array.from({ length: n }, (_, j) => Math.floor((count * ((r + j) % n + 1)) / shares));
        b[n - 1]! += count - b.reduce((a, v) => a + v, 0);
        return b;
      };
      const send = blocks(rank);
      const recvCounts = Array.from({ length: n }, (_, j) => blocks(j)[rank]!);
      const total = recvCounts.reduce((a, v) => a + v, 0);
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([total], { dtype }));
      const mine = keep(tensor(Int32Array.from(send), [n], { dtype: 'i32' })), theirs = keep(zeros([n], { dtype: 'i32' }));
      const run = async () => {
        await g.allToAll(theirs, mine);
        const got = Array.from(theirs.toArraySync());
        return g.allToAll(out, x, { sendCounts: send, recvCounts: got });
      };
      // Block j of the output is the part of rank j's input it sent to this rank.
      const starts = Array.from({ length: n }, (_, j) => blocks(j).slice(0, rank).reduce((a, v) => a + v, 0));
      const expected = (i: number) => {
        let j = 0, at = i;
        while (at >= recvCounts[j]!) { at -= recvCounts[j]!; j++; }
        return valueAt(j, starts[j]! + at);
      };
      return {
        run, dispose, supports: { outOfPlace: true, inPlace: false },
        async check() { await run(); return countWrong(out, expected, dtype); },
      };
    }
    case 'sendrecv': {
      const x = keep(filled(count, dtype, rank)), out = keep(zeros([count], { dtype }));
      const right = (rank + 1) % n, left = (rank + n - 1) % n;
      // One batch, so that NCCL posts both sides of the ring together.
      const run = () => Promise.all(g.batch(() => [g.send(x, right), g.recv(out, left)]));
      return {
        run, dispose, supports: { outOfPlace: true, inPlace: false },
        async check() { await run(); return countWrong(out, (i) => valueAt(left, i), dtype); },
      };
    }
  }
}

// Seconds per op on this rank: iterations issued back to back after warm-up (each Gloo op runs
// to completion on the communicator thread before the next starts).
async function timeOp(g: dist.ProcessGroup, p: Plan, inPlace: boolean, iters: number, warmup: number): Promise<number> {
  for (let i = 0; i < warmup; i++) await p.run(inPlace);
  await g.barrier();
  const t0 = process.hrtime.bigint();
  const works: Promise<unknown>[] = [];
  for (let i = 0; i < iters; i++) works.push(Promise.resolve(p.run(inPlace)));
  await Promise.all(works);
  return Number(process.hrtime.bigint() - t0) / 1e9 / iters;
}

// The slowest rank's time, as every rank sees it.
async function maxOverRanks(g: dist.ProcessGroup, seconds: number): Promise<number> {
  const t = full([1], seconds);
  await g.allReduce(t, { op: 'max' });
  const v = t.item();
  t.dispose();
  return v;
}

export interface CommBenchOptions {
  op: BenchOp; minBytes: number; maxBytes: number; factor: number; iters: number; warmup: number; dtype: DType; redop: ReduceOp; check: boolean;
}

/** Runs the sweep on `g` (every member calls it); rows are identical on all ranks. */
export async function runCommBench(o: CommBenchOptions, g: dist.ProcessGroup = dist.world()): Promise<CommRow[]> {
  const n = g.size, esize = dtypeSize(o.dtype);
  const unit = o.op === 'all_reduce' || o.op === 'broadcast' || o.op === 'sendrecv' ? 1 : n;
  const rows: CommRow[] = [];
  for (let bytes = o.minBytes; bytes <= o.maxBytes; bytes = Math.max(bytes + 1, Math.round(bytes * o.factor))) {
    const count = Math.floor(bytes / esize / unit) * unit;
    if (count === 0) continue;
    const p = plan(o.op, g, count, o.dtype, o.redop);
    const measure = async (ip: boolean): Promise<Measurement | null> => {
      if (!(ip ? p.supports.inPlace : p.supports.outOfPlace)) return null;
      const sec = await maxOverRanks(g, await timeOp(g, p, ip, o.iters, o.warmup));
      const wrong = o.check ? await p.check(ip) : 0;
      const wrongAll = full([1], wrong);
      await g.allReduce(wrongAll);
      const algbw = (count * esize) / sec / 1e9;
      const m = { timeUs: sec * 1e6, algbw, busbw: algbw * busFactor(o.op, n), wrong: wrongAll.item() };
      wrongAll.dispose();
      return m;
    };
    const outOfPlace = await measure(false);
    const inPlace = await measure(true);
    p.dispose();
    const hasRedop = o.op === 'all_reduce' || o.op === 'reduce_scatter';
    rows.push({ bytes: count * esize, count, dtype: o.dtype, redop: hasRedop ? o.redop : 'none', root: o.op === 'broadcast' ? 0 : -1, outOfPlace, inPlace });
  }
  return rows;
}

const fmt = (m: Measurement | null): string[] => (m ? [m.timeUs.toFixed(1), m.algbw.toFixed(2), m.busbw.toFixed(2), String(m.wrong)] : ['-', '-', '-', '-']);

/** Average busbw over all measured cells (nccl-tests' footer). */
export function averageBusbw(rows: CommRow[]): number {
  const all = rows.flatMap((r) => [r.outOfPlace, r.inPlace]).filter((m): m is Measurement => m !== null);
  return all.reduce((a, m) => a + m.busbw, 0) / Math.max(all.length, 1);
}

/** busbw vs message size as a self-contained SVG (log2 x axis). */
export function plotSvg(title: string, series: { name: string; points: [number, number][] }[]): string {
  const W = 720, H = 420, L = 70, R = 20, T = 40, B = 60;
  const pts = series.flatMap((s) => s.points);
  const xs = pts.map(([b]) => Math.log2(b)), ys = pts.map(([, v]) => v);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1), y1 = Math.max(...ys, 1e-9) * 1.1;
  const px = (b: number): number => L + ((Math.log2(b) - x0) / (x1 - x0)) * (W - L - R);
  const py = (v: number): number => H - B - (v / y1) * (H - T - B);
  const colors = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e'];
  const label = (b: number): string => (b >= 2 ** 30 ? `${b / 2 ** 30}G` : b >= 2 ** 20 ? `${b / 2 ** 20}M` : b >= 1024 ? `${b / 1024}K` : `${b}`);
  const parts = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="white"/>`, `<text x="${W / 2}" y="22" text-anchor="middle" font-size="15">${title}</text>`,
    `<line x1="${L}" y1="${H - B}" x2="${W - R}" y2="${H - B}" stroke="black"/>`, `<line x1="${L}" y1="${T}" x2="${L}" y2="${H - B}" stroke="black"/>`,
    `<text x="${W / 2}" y="${H - 15}" text-anchor="middle">message size (bytes)</text>`,
    `<text x="18" y="${H / 2}" text-anchor="middle" transform="rotate(-90 18 ${H / 2})">busbw (GB/s)</text>`];
  for (let e = Math.ceil(x0); e <= x1; e += Math.max(1, Math.round((x1 - x0) / 10))) {
    parts.push(`<text x="${px(2 ** e)}" y="${H - B + 16}" text-anchor="middle">${label(2 ** e)}</text>`);
  }
  for (let k = 0; k <= 5; k++) {
    const v = (y1 / 5) * k;
    parts.push(`<text x="${L - 6}" y="${py(v) + 4}" text-anchor="end">${v.toFixed(2)}</text>`,
      `<line x1="${L}" y1="${py(v)}" x2="${W - R}" y2="${py(v)}" stroke="#ddd"/>`);
  }
  series.forEach((s, i) => {
    const c = colors[i % colors.length];
    parts.push(`<polyline fill="none" stroke="${c}" stroke-width="2" points="${s.points.map(([b, v]) => `${px(b).toFixed(1)},${py(v).toFixed(1)}`).join(' ')}"/>`,
      `<text x="${L + 10}" y="${T + 16 * (i + 1)}" fill="${c}">${s.name}</text>`);
  });
  parts.push('</svg>');
  return parts.join('\n');
}

interface TorchRow { bytes: number; timeUs: number; algbw: number; busbw: number }

// torch.distributed's Gloo allreduce over the same sizes in a separate set of processes.
function runTorch(np: number, o: CommBenchOptions): TorchRow[] | string {
  const script = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'scripts', 'bench', 'torch_gloo.py');
  if (!existsSync(script)) return `missing ${script}`;
  const r = spawnSync('python3', [script, '--np', String(np), '-b', String(o.minBytes), '-e', String(o.maxBytes), '-f', String(o.factor),
    '-n', String(o.iters), '-w', String(o.warmup)], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 });
  if (r.status !== 0) return `torch run failed: ${(r.stderr || r.error?.message || '').slice(-500)}`;
  return JSON.parse(r.stdout.trim().split('\n').pop()!) as TorchRow[];
}

const usage = `usage: nodetron bench comm [--op ${OPS.join('|')}] [-b 8] [-e 128M] [-f 2] [-n 20] [-w 5] [-d f32] [-o sum]
                          [--check 0|1] [--transport shm|tcp|both] [--json F] [--plot F.svg]
                          [--np 2] [--repeat R] [--compare-torch]
Run under \`nodetron launch --nproc-per-node N\`; without WORLD_SIZE it launches itself with --np ranks,
--repeat times, interleaved with torch.distributed's Gloo allreduce when --compare-torch is given,
and reports medians with the load average of each run.
--transport: shm (default: shared memory when all ranks share a host), tcp (Gloo's sockets only), both.`;

type Transport = 'shm' | 'tcp';
/** What the ranks of one launch report (rank 0 writes it with --json). */
interface RankRecord { worldSize: number; sweeps: { transport: Transport; sharedMemory: boolean; rows: CommRow[] }[] }

function printSweep(o: CommBenchOptions, worldSize: number, transport: string, rows: CommRow[]): number {
  console.log(`# nodetron bench comm: ${o.op}, ${worldSize} ranks, gloo (cpu, ${transport}), ${o.iters} iters, ${o.warmup} warm-up, ` +
    `size agreement ${process.env.NODETRON_COMM_VERIFY_SIZES === '0' ? 'off (NODETRON_COMM_VERIFY_SIZES=0)' : 'on'}`);
  printTable(['size', 'count', 'type', 'redop', 'root', 'oop time(us)', 'algbw', 'busbw', '#wrong', 'ip time(us)', 'algbw', 'busbw', '#wrong'],
    rows.map((r) => [r.bytes, r.count, r.dtype, r.redop, r.root, ...fmt(r.outOfPlace), ...fmt(r.inPlace)]));
  const wrongTotal = rows.reduce((acc, r) => acc + (r.outOfPlace?.wrong ?? 0) + (r.inPlace?.wrong ?? 0), 0);
  console.log(`# Out of bounds values : ${wrongTotal} ${wrongTotal ? 'FAILED' : 'OK'}`);
  console.log(`# Avg bus bandwidth    : ${averageBusbw(rows).toFixed(3)} GB/s`);
  return wrongTotal;
}

// One launch's work on each rank: the sweep on the world group (and on a TCP-only group for 'both').
async function rankMain(o: CommBenchOptions, transport: Transport | 'both', jsonPath: string | undefined, plotPath: string | undefined): Promise<number> {
  const { rank, worldSize } = await dist.init({ timeoutMs: 120_000, sharedMemory: transport !== 'tcp' });
  const sweeps: RankRecord['sweeps'] = [];
  const world = dist.world();
  sweeps.push({ transport: transport === 'tcp' ? 'tcp' : 'shm', sharedMemory: world.sharedMemory, rows: await runCommBench(o, world) });
  if (transport === 'both') {
    const tcp = await dist.newGroup(world.ranks, { sharedMemory: false }) as dist.ProcessGroup;
    sweeps.push({ transport: 'tcp', sharedMemory: tcp.sharedMemory, rows: await runCommBench(o, tcp) });
  }
  await dist.destroy();
  if (rank !== 0) return 0;
  let wrong = 0;
  for (const sw of sweeps) wrong += printSweep(o, worldSize, sw.sharedMemory ? 'shared memory' : 'tcp', sw.rows);
  if (plotPath) {
    writeFileSync(plotPath, plotSvg(`${o.op} busbw, ${worldSize} ranks (gloo, ${o.dtype})`, sweeps.flatMap((sw) => [
      { name: `nodetron ${sw.transport} out-of-place`, points: sw.rows.filter((r) => r.outOfPlace).map((r): [number, number] => [r.bytes, r.outOfPlace!.busbw]) },
      { name: `nodetron ${sw.transport} in-place`, points: sw.rows.filter((r) => r.inPlace).map((r): [number, number] => [r.bytes, r.inPlace!.busbw]) },
    ]).filter((x) => x.points.length > 0)));
    console.log(`wrote ${plotPath}`);
  }
  const record: RankRecord = { worldSize, sweeps };
  writeJson(jsonPath, { bench: 'comm', machine: machineRecord(), options: o, ...record, avgBusbw: averageBusbw(sweeps[0]!.rows) });
  return wrong ? 1 : 0;
}

const median = (xs: number[]): number => {
  const v = xs.filter((x) => Number.isFinite(x)).sort((p, q) => p - q);
  if (v.length === 0) return NaN;
  return v.length % 2 ? v[(v.length - 1) / 2]! : (v[v.length / 2 - 1]! + v[v.length / 2]!) / 2;
};

interface Repetition { index: number; loadavg: { nodetron: number[]; torch?: number[] }; nodetron: RankRecord['sweeps']; torch?: TorchRow[] | string }

// Without a launcher: launches the ranks `repeat` times, each followed by the torch run when asked,
// so both see the same machine load; then reports medians per size.
async function orchestrate(o: CommBenchOptions, a: Record<string, unknown>, rankArgv: string[]): Promise<number> {
  const np = (a.np as number | undefined) ?? 2;
  const repeat = (a.repeat as number | undefined) ?? 1;
  if (!Number.isInteger(repeat) || repeat < 1) throw new ArgumentError('bench comm: --repeat must be a positive integer');
  let compareTorch = a['compare-torch'] === true;
  if (compareTorch && (o.op !== 'all_reduce' || o.dtype !== 'f32' || o.redop !== 'sum')) {
    console.log('# torch comparison skipped: it runs all_reduce f32 sum only');
    compareTorch = false;
  }
  const { main: launch } = await import('../launch/cli.js');
  const dir = mkdtempSync(join(tmpdir(), 'nodetron-bench-comm-'));
  const reps: Repetition[] = [];
  let failed = 0;
  try {
    for (let i = 0; i < repeat; i++) {
      const tmp = join(dir, `rep${i}.json`);
      const rep: Repetition = { index: i, loadavg: { nodetron: loadavg() }, nodetron: [] };
      const code = await launch(['--nproc-per-node', String(np), fileURLToPath(import.meta.url), ...rankArgv, '--json', tmp]);
      if (code !== 0) failed = code;
      if (existsSync(tmp)) rep.nodetron = (JSON.parse(readFileSync(tmp, 'utf8')) as RankRecord).sweeps;
      if (compareTorch) {
        rep.loadavg.torch = loadavg();
        rep.torch = runTorch(np, o);
        if (typeof rep.torch === 'string') console.log(`# torch run ${i}: ${rep.torch}`);
      }
      reps.push(rep);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  const transports = [...new Set(reps.flatMap((r) => r.nodetron.map((sw) => sw.transport)))];
  const sizes = [...new Set(reps.flatMap((r) => r.nodetron.flatMap((sw) => sw.rows.map((row) => row.bytes))))].sort((p, q) => p - q);
  // In-place busbw; out-of-place for the ops without an in-place form (sendrecv, all_to_all_v).
  const ipBusbw = (t: Transport, bytes: number): number[] => reps.map((r) => {
    const row = r.nodetron.find((sw) => sw.transport === t)?.rows.find((x) => x.bytes === bytes);
    return (row?.inPlace ?? row?.outOfPlace)?.busbw ?? NaN;
  });
  const torchBusbw = (bytes: number): number[] => reps.map((r) => (Array.isArray(r.torch) ? r.torch.find((x) => x.bytes === bytes)?.busbw ?? NaN : NaN));
  const summary = sizes.map((bytes) => {
    const row: Record<string, number> = { bytes };
    for (const t of transports) row[`${t}InPlaceBusbw`] = median(ipBusbw(t, bytes));
    if (compareTorch) {
      row.torchBusbw = median(torchBusbw(bytes));
      for (const t of transports) row[`${t}OverTorch`] = row[`${t}InPlaceBusbw`]! / row.torchBusbw;
    }
    return row;
  });
  console.log(`\n# ${o.op}, ${np} ranks: median ${o.op === 'sendrecv' || o.op === 'all_to_all_v' ? 'out-of-place' : 'in-place'} busbw (GB/s) over ${repeat} interleaved run(s)` +
    (compareTorch ? ', beside torch.distributed gloo allreduce (in place)' : ''));
  const cols = ['size', ...transports.map((t) => `nodetron ${t}`), ...(compareTorch ? ['torch gloo', ...transports.map((t) => `${t}/torch`)] : [])];
  printTable(cols, summary.map((row) => [row.bytes!, ...transports.map((t) => row[`${t}InPlaceBusbw`]!.toFixed(3)),
    ...(compareTorch ? [row.torchBusbw!.toFixed(3), ...transports.map((t) => row[`${t}OverTorch`]!.toFixed(3))] : [])]));
  console.log(`# load average (1 min) before each run: ${reps.map((r) => `nodetron ${r.loadavg.nodetron[0]!.toFixed(2)}` +
    (r.loadavg.torch ? ` / torch ${r.loadavg.torch[0]!.toFixed(2)}` : '')).join(', ')} (${cpus().length} cores)`);
  if (a.plot) {
    const series = [
      ...transports.map((t) => ({ name: `nodetron ${t} in-place (median)`, points: sizes.map((b): [number, number] => [b, median(ipBusbw(t, b))]) })),
      ...(compareTorch ? [{ name: 'torch gloo (median)', points: sizes.map((b): [number, number] => [b, median(torchBusbw(b))]) }] : []),
    ].map((x) => ({ ...x, points: x.points.filter(([, v]) => Number.isFinite(v)) })).filter((x) => x.points.length > 0);
    writeFileSync(String(a.plot), plotSvg(`${o.op} busbw, ${np} ranks, ${o.dtype} (median of ${repeat})`, series));
    console.log(`wrote ${a.plot}`);
  }
  writeJson(a.json as string | undefined, { bench: 'comm', machine: machineRecord(), options: o, np, repeat, summary, repetitions: reps });
  return failed;
}

export async function main(argv: string[]): Promise<number> {
  // Sizes are buffers every rank allocates (several of them): at most this machine's memory; counts are bounded too.
  const a = parseOptions(argv, {
    op: { kind: 'string', choices: OPS }, minbytes: 'bytes', maxbytes: 'bytes', stepfactor: { kind: 'number', min: 1.01, max: 1024 }, iters: { kind: 'positive', max: 1e6 },
    warmup_iters: { kind: 'count', max: 1e6 }, datatype: { kind: 'string', choices: DTYPES }, redop: { kind: 'string', choices: ['sum', 'avg', 'max', 'min', 'prod'] },
    check: { kind: 'string', choices: ['0', '1'] }, json: 'outfile', plot: 'outfile', np: { kind: 'positive', max: 256 }, 'compare-torch': 'boolean', repeat: { kind: 'positive', max: 1000 },
    transport: { kind: 'string', choices: ['shm', 'tcp', 'both'] }, help: 'boolean',
  }, { b: 'minbytes', e: 'maxbytes', f: 'stepfactor', n: 'iters', w: 'warmup_iters', d: 'datatype', o: 'redop', h: 'help' });
  if (a.help) { console.log(usage); return 0; }
  expectPositionals(a, 'nothing', 0);
  const op = (a.op as string | undefined) ?? 'all_reduce';
  if (!(OPS as readonly string[]).includes(op)) throw new ArgumentError(`bench comm: --op must be one of ${OPS.join(', ')}`);
  const dtype = (a.datatype as string | undefined) ?? 'f32';
  if (!(DTYPES as readonly string[]).includes(dtype)) throw new ArgumentError(`bench comm: -d must be one of ${DTYPES.join(', ')}`);
  const transport = (a.transport as string | undefined) ?? 'shm';
  if (!['shm', 'tcp', 'both'].includes(transport)) throw new ArgumentError('bench comm: --transport must be shm, tcp or both');
  const o: CommBenchOptions = {
    op: op as BenchOp, dtype: dtype as DType, redop: ((a.redop as string | undefined) ?? 'sum') as ReduceOp,
    minBytes: (a.minbytes as number | undefined) ?? 8, maxBytes: (a.maxbytes as number | undefined) ?? parseBytes('128M'),
    factor: (a.stepfactor as number | undefined) ?? 2, iters: (a.iters as number | undefined) ?? 20,
    warmup: (a.warmup_iters as number | undefined) ?? 5, check: ((a.check as string | undefined) ?? '1') !== '0',
  };
  if (!(o.factor > 1)) throw new ArgumentError('bench comm: -f must be > 1');
  if (o.minBytes > o.maxBytes) throw new UsageError(`-b (${o.minBytes} bytes) must not exceed -e (${o.maxBytes} bytes)`);
  if (process.env.WORLD_SIZE) return rankMain(o, transport as Transport | 'both', a.json as string | undefined, a.plot as string | undefined);
  // The ranks get the sweep's options; the orchestrator keeps --json, --plot, --np, --repeat, --compare-torch.
  const own = new Set(['--json', '--plot', '--np', '--repeat']);
  const rankArgv: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i]!.split('=', 1)[0]!;
    if (own.has(key)) { if (!argv[i]!.includes('=')) i++; continue; }
    if (key === '--compare-torch') continue;
    rankArgv.push(argv[i]!);
  }
  return orchestrate(o, a, rankArgv);
}

// Launched as a rank script by the launcher (see main's self-launch).
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main(process.argv.slice(2)).then((code) => process.exit(code), (e: unknown) => { console.error(e); process.exit(1); });
}
