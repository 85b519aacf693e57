// `nodetron bench chaos`: in-job recovery under faults (issue #37). Runs a training script under
// `nodetron launch --spares S ... --recover memory`, kills a random live rank every --kill-every seconds
// (SIGKILL, SIGSTOP left stopped for the launcher to find, or a whole simulated node's agent and workers),
// and from the recovery events (NODETRON_RECOVERY_EVENTS, docs: the in-job recovery contract) times each
// fault → detection → full strength, with steps lost and disk fallbacks; beside it the same run without
// faults (losses compared bit for bit, the failure-free step time) and the same kills under today's path
// (--max-restarts, checkpoints, --resume auto). The launcher command is injectable (`launcher`), which is
// how test/bench/chaos.test.ts runs it against a fake launcher.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, createWriteStream, existsSync, fstatSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { constants } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { ArgumentError } from '../errors.js';
import { lossThreshold, netnsExec, NetnsTopology, type NetnsPlan } from './netns.js';
import { info } from '../info.js';
import { median } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';
import {
  analyzeBaseline, analyzeFaults, compareLosses, goodput, GOODPUT_DEFINITION, isNodeFault, lossesOf, stepSeconds, trainingGoodput,
  type BaselineFaultRow, type ChaosEvent, type ChaosFaultRow, type FaultKind, type Injected, type LossComparison, type StepLine,
} from './chaos-analysis.js';
export {
  analyzeBaseline, analyzeFaults, compareLosses, goodput, GOODPUT_DEFINITION, isNodeFault, lossesOf, stepSeconds, trainingGoodput,
  type BaselineFaultRow, type ChaosEvent, type ChaosFaultRow, type FaultKind, type Injected, type LossComparison, type StepLine,
};

const FAULT_KINDS: readonly FaultKind[] = ['kill', 'stop', 'node', 'link'];

export interface ChaosOptions {
  /** Ranks per node (launch --nproc-per-node). */
  nproc: number;
  /** Simulated nodes: one launcher process per node on this machine (1: no node faults). */
  nodes: number;
  spares: number;
  /** launch --shrink: a loss with no spare free shrinks data parallelism, then grows back. */
  shrink?: boolean;
  killEverySec: number;
  kills: number;
  faults: FaultKind[];
  seed: number;
  steps?: number;
  /** Layout flags for the script (default --dp 2 --tp 2 --zero 3). */
  layout: string[];
  script: string;
  scriptArgs: string[];
  baseline: 'restart' | 'none';
  reference: boolean;
  /** Where runs write (DIR/reference, DIR/chaos, DIR/baseline, their events and logs). */
  out: string;
  /** The command that starts a launcher, before its flags (default: node bin/nodetron.js launch). */
  launcher?: string[];
  /** Steps between checkpoints (--save-every) in every run: the baseline resumes from them, in-job recovery falls back to them. */
  saveEvery: number;
  /** The baseline's --hang-timeout-ms: how today's launcher finds a stopped rank. */
  baselineHangMs: number;
  /** A run still going after this long is killed (its process groups) and reported as timed out. */
  timeoutSec: number;
  /** Each simulated node in a network namespace of its own (lib/bench/netns.ts): Linux, root, `ip`. */
  netns?: boolean;
  /** --netns: the percentage of packets dropped on entering each node's namespace, all run long (nftables). */
  netLoss?: number;
  /** --netns: the ms every connection between nodes is held each way (a relay: lib/bench/delay-relay.ts), in every run. */
  netDelayMs?: number;
  /** --netns: how long a node cut off by a link fault gets to end on its own once the others have exited, before the bench kills it. */
  linkGraceSec?: number;
  /** The launchers' --heartbeat-timeout-ms (every run; default: the launcher's). */
  heartbeatTimeoutMs?: number;
  /** Write the runs' output through to this process's (else only to DIR/<run>.log). */
  verbose?: boolean;
  log?: (line: string) => void;
}

export interface RunResult {
  name: string; commands: string[][]; wallMs: number; exitCodes: (number | null)[]; timedOut: boolean;
  injected: Injected[]; skipped: Array<{ i: number; how: FaultKind; reason: string }>;
  steps: StepLine[]; restarts: number[]; resumes: Array<{ t: number; step: number }>; events: ChaosEvent[]; losses: Map<number, number> | null;
  /** Epoch ms at which each launcher exited (null: not seen). */
  exitAt?: (number | null)[];
}

/** A small seeded generator (mulberry32): the same --seed draws the same faults and victims. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The fault plan: per kill, its kind and a draw in [0, 1) that picks the victim among what is live then. */
export function faultPlan(o: Pick<ChaosOptions, 'kills' | 'faults' | 'seed'>): Array<{ how: FaultKind; u: number }> {
  const r = seeded(o.seed);
  return Array.from({ length: o.kills }, () => ({ how: o.faults[Math.floor(r() * o.faults.length)]!, u: r() }));
}

/** Parses event lines (a torn or foreign line is skipped). */
export function parseEvents(text: string): ChaosEvent[] {
  const out: ChaosEvent[] = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      const e = JSON.parse(line) as ChaosEvent;
      if (e && typeof e.t === 'number' && typeof e.event === 'string') out.push(e);
    } catch { /* a partial line */ }
  }
  return out.sort((a, b) => a.t - b.t);
}

/** Which process is each rank now, and on which node, from worker-started / spare-assigned / replacement-started events. */
export function rankPids(events: readonly ChaosEvent[]): Map<number, { pid: number; node: number }> {
  const spares = new Map<string, number>(), ranks = new Map<number, { pid: number; node: number }>();
  for (const e of events) {
    const node = e.node ?? 0, pid = e.pid as number | undefined;
    if (e.src !== 'agent') continue;
    if (e.event === 'worker-started' || e.event === 'spare-started' || e.event === 'replacement-started') {
      if (typeof pid !== 'number') continue;
      if (typeof e.spare === 'string' && (e.rank === undefined || e.rank < 0)) spares.set(`${node}/${e.spare}`, pid);
      else if (typeof e.rank === 'number' && e.rank >= 0) ranks.set(e.rank, { pid, node });
    } else if (e.event === 'spare-assigned' && typeof e.rank === 'number') {
      const p = spares.get(`${node}/${String(e.spare)}`);
      if (p !== undefined) ranks.set(e.rank, { pid: p, node });
    }
  }
  return ranks;
}

/** A process's state letter in /proc (R, S, D, T, Z...), or null when it is gone. */
export function procState(pid: number): string | null {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return s.slice(s.lastIndexOf(')') + 2, s.lastIndexOf(')') + 3);
  } catch { return null; }
}

/** The ranks' pids found in /proc: descendants of `roots` whose environment has RANK and no NODETRON_SPARE. */
export function procRankPids(roots: number[]): Map<number, { pid: number; node: number }> {
  const parent = new Map<number, number>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const s = readFileSync(`/proc/${d}/stat`, 'utf8');
      parent.set(Number(d), Number(s.slice(s.lastIndexOf(')') + 2).split(' ')[1]));
    } catch { /* gone */ }
  }
  const out = new Map<number, { pid: number; node: number }>();
  for (const pid of parent.keys()) {
    let p: number | undefined = pid, node = -1;
    for (let hops = 0; p && hops < 8 && node < 0; hops++) { p = parent.get(p); if (p !== undefined) node = roots.indexOf(p); }
    if (node < 0) continue;
    try {
      const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
      const rank = env.find((v) => v.startsWith('RANK='));
      if (rank && !env.some((v) => v.startsWith('NODETRON_SPARE='))) out.set(Number(rank.slice(5)), { pid, node });
    } catch { /* gone or not ours */ }
  }
  return out;
}

/** Picks the victim of draw `u` among the live ranks (ascending), or null when none is live. */
export function pickVictim(live: number[], u: number): number | null {
  if (live.length === 0) return null;
  const s = [...live].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(u * s.length))]!;
}

const STEP_LINE = /\bstep\s+(\d+)(?:\/\d+)?\s+loss\b/;
const RESUME_LINE = /resumed from .*\(step (\d+)/;
const RESTART_LINE = /restarting the group/;

/** A free TCP port on the loopback (the multi-node store's). */
async function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => { const p = (s.address() as { port: number }).port; s.close(() => res(p)); });
  });
}

/** The launcher command lines of one run: one per simulated node. */
export function launchCommands(o: ChaosOptions, mode: 'chaos' | 'reference' | 'baseline', dir: string, port: number | null, net?: NetnsPlan): string[][] {
  const launcher = o.launcher ?? [process.execPath, join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'bin', 'nodetron.js'), 'launch'];
  const script = [o.script, ...o.layout, ...(o.steps !== undefined ? ['--steps', String(o.steps)] : []), ...o.scriptArgs];
  const mine = mode === 'baseline'
    ? { launch: ['--max-restarts', String(o.kills + 1), '--hang-timeout-ms', String(o.baselineHangMs)],
      script: ['--save', join(dir, 'ckpt'), '--save-every', String(o.saveEvery), '--resume', 'auto', '--out', dir] }
    : { launch: ['--spares', String(o.spares), ...(o.shrink ? ['--shrink'] : [])], script: ['--recover', 'memory', '--save', join(dir, 'ckpt'), '--save-every', String(o.saveEvery), '--out', dir] };
  // --netns: each node's launcher in its namespace, node 0's address the master's.
  return Array.from({ length: o.nodes }, (_, i) => {
    const cmd = [...launcher, '--nproc-per-node', String(o.nproc),
      ...(o.nodes > 1 ? ['--nnodes', String(o.nodes), '--node-rank', String(i), '--master-addr', net ? net.addresses[0]! : '127.0.0.1', '--master-port', String(port)] : []),
      ...(o.heartbeatTimeoutMs !== undefined ? ['--heartbeat-timeout-ms', String(o.heartbeatTimeoutMs)] : []), ...mine.launch, ...script, ...mine.script];
    return net ? netnsExec(net, i, cmd) : cmd;
  });
}

/** Runs one phase: its launcher(s), the kill loop (a plan, or none for the reference), the output watched. */
export async function runPhase(o: ChaosOptions, mode: 'chaos' | 'reference' | 'baseline', plan: Array<{ how: FaultKind; u: number }>, net?: NetnsTopology): Promise<RunResult> {
  const dir = resolve(o.out, mode);
  const eventsPath = resolve(o.out, `${mode}-events.jsonl`);
  // A fresh start: an earlier run's checkpoints (--resume auto) or events (appended to) must not leak into this one.
  for (const p of [dir, eventsPath]) rmSync(p, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const commands = launchCommands(o, mode, dir, o.nodes > 1 ? await freePort() : null, net?.plan);
  const env = { ...process.env, NODETRON_RECOVERY_EVENTS: eventsPath, ...(o.nodes > 1 && !process.env.NODETRON_STORE_TOKEN ? { NODETRON_STORE_TOKEN: randomBytes(16).toString('hex') } : {}) };
  // --netns: Gloo listens, and the node's holder is advertised, at the node's own address.
  const envOf = (node: number) => (net ? { ...env, NODETRON_GLOO_HOST: net.plan.addresses[node]! } : env);
  const logPath = resolve(o.out, `${mode}.log`);
  const logFile = createWriteStream(logPath);
  const res: RunResult = { name: mode, commands, wallMs: 0, exitCodes: [], timedOut: false, injected: [], skipped: [], steps: [], restarts: [], resumes: [], events: [], losses: null, exitAt: commands.map(() => null) };
  const t0 = Date.now();
  const children: ChildProcess[] = [];
  const exits = commands.map((cmd, node) => new Promise<number | null>((done) => {
    // Each launcher leads its own process group: a node fault (and the timeout) kills it with its workers.
    const c = spawn(cmd[0]!, cmd.slice(1), { env: envOf(node), detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(c);
    liveLaunchers.add(c);
    for (const [stream, sink] of [[c.stdout!, process.stdout], [c.stderr!, process.stderr]] as const) {
      let part = '';
      stream.on('data', (d: Buffer) => {
        const lines = (part + d.toString('utf8')).split('\n');
        part = lines.pop()!;
        for (const line of lines) {
          const t = Date.now();
          logFile.write(`${nodePrefix(o, node)}${line}\n`);
          if (o.verbose || /generation \d+:/.test(line)) sink.write(`${nodePrefix(o, node)}${line}\n`);
          const m = STEP_LINE.exec(line), r = RESUME_LINE.exec(line);
          if (m) res.steps.push({ t, step: Number(m[1]) });
          if (r) res.resumes.push({ t, step: Number(r[1]) });
          if (RESTART_LINE.test(line) && node === 0) res.restarts.push(t);
        }
      });
    }
    c.on('error', (e) => { logFile.write(`could not start ${cmd[0]}: ${e.message}\n`); done(127); });
    c.on('exit', (code, sig) => { res.exitAt![node] = Date.now(); liveLaunchers.delete(c); done(code ?? (sig ? 128 + (constants.signals[sig] ?? 0) : null)); });
  }));
  let running = true;
  const all = Promise.all(exits).then((codes) => { running = false; res.exitCodes = codes; });
  // Every launcher but the ones cut off by a link fault has exited (those get --link-grace to end on their own).
  const cutNodes = new Set<number>();
  const othersDone = (async () => {
    for (;;) {
      if (!running) return;
      if (children.length === commands.length && children.every((c, n) => cutNodes.has(n) || res.exitAt![n] !== null)) return;
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  const killGroup = (c: ChildProcess) => { try { if (c.pid) process.kill(-c.pid, 'SIGKILL'); } catch { /* gone */ } };
  const timer = setTimeout(() => { res.timedOut = true; for (const c of children) killGroup(c); }, o.timeoutSec * 1000);
  // Interrupted: the launchers lead their own process groups, so they go down with the benchmark.
  const onSignal = (sig: NodeJS.Signals) => { for (const c of children) killGroup(c); process.exit(128 + (constants.signals[sig] ?? 0)); };
  process.once('SIGINT', onSignal).once('SIGTERM', onSignal);
  // The kill loop.
  const events = new EventTail(eventsPath);
  const stopped = new Set<number>(), killed = new Set<number>(), deadNodes = new Set<number>();
  const worldSize = o.nproc * o.nodes;
  let armedAt: number | null = null, allUpAt: number | null = null, k = 0;
  while (running && k < plan.length) {
    await new Promise((r) => setTimeout(r, 50));
    if (!running) break;
    const ev = events.read();
    const pids = rankPids(ev);
    if (pids.size < worldSize) for (const [r, p] of procRankPids(children.map((c) => c.pid ?? -1))) if (!pids.has(r)) pids.set(r, p);
    // Armed at the first completed step; a script that prints no progress lines: once every rank has been up 3 intervals.
    if (pids.size >= worldSize) allUpAt ??= Date.now();
    armedAt ??= res.steps[0]?.t ?? (allUpAt !== null && Date.now() - allUpAt > 3 * o.killEverySec * 1000 ? Date.now() : null);
    // Each fault --kill-every seconds after the one before, once the job has found that one (its fault event, or the
    // baseline's restart) and completed a step since: a fault strikes a training job, not a recovery or a restart's
    // set-up (where today's launcher cannot tell a stopped rank from a slow one).
    const prev = res.injected.at(-1)?.at;
    if (armedAt === null || Date.now() < (prev ?? armedAt) + o.killEverySec * 1000) continue;
    // Training is over (the last step printed): what follows (the final validation, sampling, exit) is not
    // a training step, and in-job recovery protects only those, so no fault is aimed at it.
    if (o.steps !== undefined && (res.steps.at(-1)?.step ?? 0) >= o.steps) break;
    if (prev !== undefined) {
      const found = mode === 'baseline' ? res.restarts.find((t) => t > prev)
        : ev.find((e) => e.src === 'agent' && (e.event === 'fault' || e.event === 'fallback-restart') && e.t >= prev)?.t;
      if (found === undefined || (res.steps.length > 0 && res.steps.at(-1)!.t <= found)) continue;
    }
    const f = plan[k]!;
    const live = [...pids].filter(([, p]) => !killed.has(p.pid) && !stopped.has(p.pid) && !deadNodes.has(p.node) && isLive(p.pid));
    if (isNodeFault(f.how)) {
      if (mode === 'baseline') { res.skipped.push({ i: k, how: f.how, reason: "today's path cannot replace a node without a new launcher" }); k++; continue; }
      const nodes = [...new Set(live.map(([, p]) => p.node))].filter((n) => n > 0 && !deadNodes.has(n));
      const victim = pickVictim(nodes, f.u);
      if (victim === null) continue; // no node other than the master is whole: wait
      const c = children[victim]!;
      res.injected.push({ i: k, at: Date.now(), how: f.how, rank: null, node: victim, pid: c.pid ?? -1, ranks: live.filter(([, p]) => p.node === victim).map(([r]) => r) });
      if (f.how === 'link') {
        // Cut off, not killed: the node's processes must find out and end by themselves.
        if (!net) throw new ArgumentError("bench chaos: the 'link' fault needs --netns");
        net.linkDown(victim);
        cutNodes.add(victim);
      } else killGroup(c);
      deadNodes.add(victim);
    } else {
      const rank = pickVictim(live.map(([r]) => r), f.u);
      if (rank === null) continue; // nothing live right now (mid-recovery): try again shortly
      const p = pids.get(rank)!;
      res.injected.push({ i: k, at: Date.now(), how: f.how, rank, node: p.node, pid: p.pid, ranks: [rank] });
      try { process.kill(p.pid, f.how === 'stop' ? 'SIGSTOP' : 'SIGKILL'); } catch { res.injected.pop(); continue; }
      (f.how === 'stop' ? stopped : killed).add(p.pid);
    }
    o.log?.(`[bench chaos] ${mode}: fault ${k + 1}/${plan.length}: ${f.how} ${res.injected.at(-1)!.rank !== null ? `rank ${res.injected.at(-1)!.rank}` : `node ${res.injected.at(-1)!.node}`} at ${((Date.now() - t0) / 1000).toFixed(1)} s`);
    k++;
  }
  await othersDone;
  // A node cut off by a link fault: its launcher should see the store gone, stop its workers and exit; what
  // of it is still alive after the grace period is killed (and recorded as not having ended on its own).
  const benchKilled = new Set<number>();
  if (cutNodes.size > 0) {
    const graceEnd = Date.now() + (o.linkGraceSec ?? 30) * 1000;
    while (running && Date.now() < graceEnd && [...cutNodes].some((n) => res.exitAt![n] === null)) await new Promise((r) => setTimeout(r, 100));
    for (const n of cutNodes) if (res.exitAt![n] === null) { benchKilled.add(n); o.log?.(`[bench chaos] ${mode}: node ${n}'s launcher, cut off, had not exited ${o.linkGraceSec ?? 30} s after the others: killed`); killGroup(children[n]!); }
  }
  await all;
  for (const f of res.injected) if (f.how === 'link') f.cutLauncherExitMs = res.exitAt![f.node] !== null && !benchKilled.has(f.node) ? res.exitAt![f.node]! - f.at : null;
  clearTimeout(timer);
  process.off('SIGINT', onSignal).off('SIGTERM', onSignal);
  res.wallMs = Date.now() - t0;
  // A stopped process the launcher never reaped must not outlive the benchmark.
  for (const pid of stopped) if (procState(pid) !== null) try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
  for (const c of children) killGroup(c);
  await new Promise<void>((r) => logFile.end(r));
  res.events = events.read();
  const lossesPath = join(dir, 'losses.json');
  if (existsSync(lossesPath)) { try { res.losses = lossesOf(JSON.parse(readFileSync(lossesPath, 'utf8'))); } catch { res.losses = null; } }
  return res;
}

/** Every launcher of the phase running now (an interrupted --netns run kills them before it removes their namespaces). */
const liveLaunchers = new Set<ChildProcess>();

const nodePrefix = (o: ChaosOptions, node: number) => (o.nodes > 1 ? `[node ${node}] ` : '');
const isLive = (pid: number) => { const s = procState(pid); return s !== null && !'ZXTtx'.includes(s); };

/** Reads an append-only JSON-lines file as it grows (complete lines only). */
class EventTail {
  private offset = 0;
  private part = '';
  private readonly all: string[] = [];
  constructor(private readonly path: string) {}
  read(): ChaosEvent[] {
    if (existsSync(this.path)) {
      const fd = openSync(this.path, 'r');
      try {
        const size = fstatSync(fd).size;
        if (size > this.offset) {
          const buf = Buffer.alloc(size - this.offset);
          const n = readSync(fd, buf, 0, buf.length, this.offset);
          this.offset += n;
          const lines = (this.part + buf.subarray(0, n).toString('utf8')).split('\n');
          this.part = lines.pop()!;
          this.all.push(...lines);
        }
      } finally { closeSync(fd); }
    }
    return parseEvents(this.all.join('\n'));
  }
}

export interface ChaosRecord {
  bench: 'chaos'; machine: Record<string, unknown>; cuda: unknown; options: Omit<ChaosOptions, 'log'>; goodputDefinition: string;
  runs: Record<string, { commands: string[][]; wallS: number; exitCodes: (number | null)[]; timedOut: boolean; stepSeconds: number | null; lastStep: number | null; goodput: number | null; trainingGoodput: number | null }>;
  /** The faults caused (epoch ms, victim, pid): the chaos run's and the baseline's. */
  injected: { chaos: Injected[]; baseline: Injected[] };
  faults: ChaosFaultRow[]; baselineFaults: BaselineFaultRow[]; skipped: RunResult['skipped'];
  losses: LossComparison | null; baselineLosses: LossComparison | null;
  summary: Record<string, unknown>;
  /** --netns: the namespaces, bridge, subnet and addresses the runs used, and the packet loss. */
  network?: { namespaces: string[]; bridge: string; hostVeths: string[]; subnet: string; addresses: string[]; lossPercent: number; lossRule: string | null; lossIn: string[];
    /** --net-delay: the relay's hold each way, the runs it was on in, and what it carried (connections, bytes both ways). */
    delay: { msEachWay: number; how: string; in: string[]; relayed: { connections: number; failed: number; bytes: number } | null } | null; left: string[] };
}

/** ArgumentError for network options that do not fit together (--netns, --net-loss, the link fault, --nodes). */
export function checkNetOptions(o: Pick<ChaosOptions, 'netns' | 'netLoss' | 'netDelayMs' | 'faults' | 'nodes'>): void {
  if (o.netns && o.nodes < 2) throw new ArgumentError('bench chaos: --netns puts each simulated node in a network namespace of its own: give --nodes 2 or more');
  if (o.faults.includes('link') && !o.netns) throw new ArgumentError("bench chaos: the 'link' fault sets a node's network link down, and needs --netns (each node in a network namespace)");
  if (o.netLoss !== undefined && o.netLoss > 0 && !o.netns) throw new ArgumentError('bench chaos: --net-loss drops packets between network namespaces, and needs --netns');
  if (o.netLoss !== undefined && !(o.netLoss >= 0 && o.netLoss <= 100)) throw new ArgumentError(`bench chaos: --net-loss is a percentage from 0 to 100, got ${o.netLoss}`);
  if (o.netDelayMs !== undefined && o.netDelayMs > 0 && !o.netns) throw new ArgumentError('bench chaos: --net-delay delays the connections between network namespaces, and needs --netns');
  if (o.netDelayMs !== undefined && !(o.netDelayMs >= 0 && o.netDelayMs <= 10_000)) throw new ArgumentError(`bench chaos: --net-delay is a number of ms from 0 to 10000, got ${o.netDelayMs}`);
}

/** Runs the reference, chaos and baseline runs and puts the record together. */
export async function runChaos(o: ChaosOptions): Promise<ChaosRecord> {
  if (o.faults.includes('node') && o.nodes < 2) {
    throw new ArgumentError("bench chaos: the 'node' fault kills a whole node, and this run has one node (the master, whose loss ends the job): give --nodes 2 or more, or leave 'node' out of --faults");
  }
  checkNetOptions(o);
  mkdirSync(o.out, { recursive: true });
  const plan = faultPlan(o);
  // --netns: the namespaces live for the whole benchmark and are removed however it ends (an error, SIGINT or
  // SIGTERM: the launchers are killed first, then the topology's exit hook removes it).
  const net = o.netns ? NetnsTopology.create(o.nodes, { lossPercent: o.netLoss ?? 0, delayMs: o.netDelayMs ?? 0, ...(o.log ? { log: o.log } : {}) }) : undefined;
  const onSignal = (sig: NodeJS.Signals) => {
    for (const c of liveLaunchers) try { if (c.pid) process.kill(-c.pid, 'SIGKILL'); } catch { /* gone */ }
    process.exit(128 + (constants.signals[sig] ?? 0));
  };
  if (net) process.once('SIGINT', onSignal).once('SIGTERM', onSignal);
  let ref: RunResult | null, chaos: RunResult, base: RunResult | null, netLeft: string[] = [], relayed: ReturnType<NetnsTopology['delayStats']> = null;
  try {
    // --net-delay is the network's, not a fault: every run has it (the failure-free step time, which goodput is measured against, included).
    if (net && (o.netDelayMs ?? 0) > 0) { await net.setDelay(true); o.log?.(`[bench chaos] --net-delay: every connection between nodes held ${o.netDelayMs} ms each way by a relay on ${net.plan.relayAddress} (${net.delayActive(0) ? 'rule in place' : 'RULE NOT FOUND'})`); }
    ref = o.reference ? await runPhase(o, 'reference', [], net) : null;
    // --net-loss strikes the runs with faults; the reference stays failure-free (and loss-free).
    if (net && (o.netLoss ?? 0) > 0) { net.setLoss(true); o.log?.(`[bench chaos] --net-loss: ${o.netLoss}% of the packets entering each namespace dropped (${net.lossActive(0) ? 'rule in place' : 'RULE NOT FOUND'})`); }
    chaos = await runPhase(o, 'chaos', plan, net);
    base = o.baseline === 'restart' ? await runPhase(o, 'baseline', plan, net) : null;
  } finally {
    if (net) {
      relayed = net.delayStats();
      await net.setDelay(false).catch(() => undefined);
      process.off('SIGINT', onSignal).off('SIGTERM', onSignal);
      netLeft = net.teardown();
      if (netLeft.length) o.log?.(`[bench chaos] --netns: could not remove ${netLeft.join(', ')}`);
    }
  }
  const stepS = (ref && stepSeconds(ref.steps)) ?? stepSeconds(chaos.steps);
  const lastStep = (r: RunResult) => (r.losses && r.losses.size ? Math.max(...r.losses.keys()) : null);
  const runs: ChaosRecord['runs'] = {};
  for (const r of [ref, chaos, base]) {
    if (!r) continue;
    const last = lastStep(r);
    runs[r.name] = { commands: r.commands, wallS: r.wallMs / 1000, exitCodes: r.exitCodes, timedOut: r.timedOut, stepSeconds: stepSeconds(r.steps), lastStep: last,
      goodput: last !== null && stepS !== null ? goodput(last, stepS, r.wallMs) : null, trainingGoodput: stepS !== null ? trainingGoodput(r.steps, stepS) : null };
  }
  const faults = analyzeFaults(chaos.injected, chaos.events, o.nproc * o.nodes);
  const baselineFaults = base ? analyzeBaseline(base.injected, base) : [];
  const losses = ref?.losses && chaos.losses ? compareLosses(ref.losses, chaos.losses) : null;
  const baselineLosses = ref?.losses && base?.losses ? compareLosses(ref.losses, base.losses) : null;
  const num = (xs: (number | null)[]) => xs.filter((x): x is number => x !== null);
  const full = num(faults.map((f) => f.fullStrengthMs)), det = num(faults.map((f) => f.detectMs)), nxt = num(baselineFaults.map((f) => f.nextStepMs));
  const summary = {
    faults: faults.length, recovered: faults.filter((f) => f.status === 'recovered').length, diskFallbacks: faults.filter((f) => f.diskFallback).length,
    fallbackRestarts: faults.filter((f) => f.fallbackRestart).length,
    medianDetectMs: det.length ? median(det) : null, medianFaultToFullStrengthMs: full.length ? median(full) : null, maxFaultToFullStrengthMs: full.length ? Math.max(...full) : null,
    stepsLostPerFault: faults.map((f) => f.stepsLost), stepTimeSource: ref && stepSeconds(ref.steps) !== null ? 'reference (failure-free) run' : 'chaos run (no reference)',
    failureFreeStepSeconds: stepS, goodput: runs.chaos?.goodput ?? null, referenceGoodput: runs.reference?.goodput ?? null,
    trainingGoodput: runs.chaos?.trainingGoodput ?? null,
    lossesEqual: losses?.equal ?? null,
    ...(chaos.injected.some((f) => f.how === 'link') ? { cutNodes: chaos.injected.filter((f) => f.how === 'link').map((f) => ({ node: f.node, launcherExitedAfterMs: f.cutLauncherExitMs ?? null, endedOnItsOwn: f.cutLauncherExitMs != null })) } : {}),
    baseline: base ? { medianFaultToNextStepMs: nxt.length ? median(nxt) : null, maxFaultToNextStepMs: nxt.length ? Math.max(...nxt) : null,
      stepsLostPerFault: baselineFaults.map((f) => f.stepsLost), goodput: runs.baseline?.goodput ?? null, lossesEqual: baselineLosses?.equal ?? null } : null,
  };
  const { log: _log, ...options } = o;
  let cuda: unknown = null;
  try { cuda = info().backends.cuda; } catch { /* the cpu addon is not built: the record goes without */ }
  const network = net ? { namespaces: net.plan.namespaces, bridge: net.plan.bridge, hostVeths: net.plan.hostVeths, subnet: `${net.plan.subnet}.0/24`, addresses: net.plan.addresses,
    lossPercent: net.plan.lossPercent, lossRule: net.plan.lossPercent > 0 ? `inet nodetron input: iifname != "lo" numgen random mod 10000 < ${lossThreshold(net.plan.lossPercent)} drop` : null,
    lossIn: net.plan.lossPercent > 0 ? ['chaos', ...(base ? ['baseline'] : [])] : [],
    delay: net.plan.delayMs > 0 ? { msEachWay: net.plan.delayMs, how: `a relay in the root namespace on ${net.plan.relayAddress} (nftables dnat in each namespace; the original destination from its conntrack table) holds each chunk`, in: [...(ref ? ['reference'] : []), 'chaos', ...(base ? ['baseline'] : [])], relayed } : null,
    left: netLeft } : undefined;
  return { bench: 'chaos', machine: machineRecordSafe(), cuda, options, goodputDefinition: GOODPUT_DEFINITION, runs, injected: { chaos: chaos.injected, baseline: base?.injected ?? [] }, faults, baselineFaults, skipped: [...chaos.skipped, ...(base?.skipped ?? [])], losses, baselineLosses, summary, ...(network ? { network } : {}) };
}

function machineRecordSafe(): Record<string, unknown> {
  try { return machineRecord(); } catch (e) { return { date: new Date().toISOString(), node: process.version, error: (e as Error).message }; }
}

const ms = (x: number | null) => (x === null ? '-' : x.toFixed(0));

/** The tables: the runs, each fault (in-memory beside restart-from-checkpoint), the loss comparison. */
export function printReport(r: ChaosRecord, out: (s: string) => void = console.log): void {
  out(`\n# nodetron bench chaos: ${r.options.kills} faults (${r.options.faults.join(',')}) every ${r.options.killEverySec} s, ${r.options.nodes} node(s) × ${r.options.nproc} ranks, ${r.options.spares} spare(s)${r.options.shrink ? ', --shrink' : ''}, seed ${r.options.seed}`);
  printTable(['run', 'wall s', 'exit', 'step s (median)', 'last step', 'goodput', 'training goodput'], Object.entries(r.runs).map(([name, x]) => [
    name, x.wallS.toFixed(1), x.timedOut ? 'timed out' : x.exitCodes.join(','), x.stepSeconds === null ? '-' : x.stepSeconds.toFixed(3), x.lastStep ?? '-',
    x.goodput === null ? '-' : `${(100 * x.goodput).toFixed(1)}%`, x.trainingGoodput === null ? '-' : `${(100 * x.trainingGoodput).toFixed(1)}%`]), out);
  out(r.goodputDefinition);
  out('');
  // One row per planned fault either run caused (a run that ended or hung early caused fewer).
  const base = new Map(r.baselineFaults.map((b) => [b.i, b])), mem = new Map(r.faults.map((f) => [f.i, f]));
  const victim = (x: { rank: number | null; node: number }) => (x.rank !== null ? `rank ${x.rank}` : `node ${x.node}`);
  printTable(['fault', 'kind', 'in-memory: victim', 'gen', 'detect ms', '→ full strength ms', 'steps lost', 'disk fallback', 'status', 'restart: victim', '→ next step ms', 'steps lost', 'status'],
    [...new Set([...mem.keys(), ...base.keys()])].sort((a, b) => a - b).map((i) => {
      const f = mem.get(i), b = base.get(i), inj = r.injected.baseline.find((x) => x.i === i);
      return [i + 1, (f ?? b)!.how, f ? victim(f) : '-', f?.generation ?? '-', ms(f?.detectMs ?? null), ms(f?.fullStrengthMs ?? null), f?.stepsLost ?? '-',
        f ? (f.diskFallback ? 'yes' : 'no') : '-', f ? (f.shrunk ? `${f.status} (shrunk: training again at ${ms(f.trainingAgainMs ?? null)} ms)` : f.status) : 'not caused', inj ? victim(inj) : '-', ms(b?.nextStepMs ?? null), b?.stepsLost ?? '-', b?.status ?? (r.options.baseline === 'none' ? '-' : 'not caused')];
    }), out);
  const s = r.summary;
  out(`full strength after a fault: median ${ms(s.medianFaultToFullStrengthMs as number | null)} ms, max ${ms(s.maxFaultToFullStrengthMs as number | null)} ms (fault → the last rank's first completed step of the new generation)`);
  for (const [name, c] of [['chaos', r.losses], ['baseline', r.baselineLosses]] as const) {
    if (!c) continue;
    const values = c.valuesEqual ? 'bit-identical' : c.firstDifferingStep !== null ? `differ: first at step ${c.firstDifferingStep}, max |diff| ${c.maxAbsDiff.toExponential(3)}` : 'none to compare';
    out(`losses (${name} vs failure-free, ${c.stepsCompared} steps in both): ${values}${c.missing.length ? `; ${c.missing.length} step(s) in only one run's losses.json (first ${c.missing[0]}), so not equal` : ''}`);
  }
  for (const k of r.skipped) out(`skipped fault ${k.i + 1} (${k.how}): ${k.reason}`);
  out(`each run's output and events: ${join(r.options.out, '<run>.log')}, ${join(r.options.out, '<run>-events.jsonl')} (run: ${Object.keys(r.runs).join(', ')})`);
}

const usage = `usage: nodetron bench chaos [--nproc N (4)] [--nodes M (1)] [--spares S (1)] [--kill-every SEC (30)] [--kills N (10)]
    [--faults kill,stop[,node][,link]] [--seed X (1)] [--steps K] [--layout '<flags>' ('--dp 2 --tp 2 --zero 3')] [--script F (examples/gpt/train.ts)]
    [--script-args '...' ('--progress-every 1')] [--baseline restart|none] [--reference=true|false] [--save-every E (5)] [--baseline-hang-ms MS (10000)]
    [--timeout SEC (3600)] [--out DIR] [--verbose] [--json F] [--shrink] [--heartbeat-timeout-ms MS]
    [--netns [--net-loss PCT (0)] [--net-delay MS (0)] [--link-grace SEC (30)]]
  Trains under \`nodetron launch --spares S\` (with --shrink: \`--shrink\` too) with \`--recover memory\` and kills a random live rank (never a spare): the first
  fault --kill-every seconds after the first completed step, each next one --kill-every seconds after the one before once the
  job has found that one and completed a step. kill = SIGKILL; stop = SIGSTOP (left stopped: the launcher must find it);
  node = the agent of a simulated node (--nodes M: M launchers on this machine; never node 0) with its workers.
  Reports per fault: fault → detection (the agent's fault event) → full strength (every rank's first step of the new
  generation), steps lost, disk fallback; the losses against the same run without faults (bit for bit) and goodput; and,
  with --baseline restart, the same faults under today's path (--max-restarts, --resume auto; node faults skipped there).
  Every run saves a checkpoint every --save-every steps (the baseline resumes from them, in-job recovery falls back to them).
  --netns (Linux, root, \`ip\`; --nodes 2 or more): each node in a network namespace of its own (a bridge, a veth per
  node, addresses 10.x.y.(node+1)/24 on a subnet no route uses; the launcher under \`ip netns exec\`, NODETRON_GLOO_HOST
  its address), all removed at the end; then shared memory is never used between nodes. link = set a random node's
  link down (never node 0) and leave it down: the job replaces its ranks as for a node fault; its launcher should
  end by itself (the bench records when; after --link-grace s past the others' exit it kills what is left).
  --net-loss PCT drops PCT% of the packets entering each namespace from its link during the runs with faults (the
  reference stays loss-free; nftables, numgen random). --net-delay MS holds every TCP connection between two nodes MS ms
  each way in every run, the reference's included (this kernel has no sch_netem: each namespace's nat rule sends the connection to a relay
  in the bench's process, which finds its destination in the namespace's conntrack table). --heartbeat-timeout-ms goes to every launcher (a cut node is found by its silence).
  --nproc is per node. The script must print progress lines (nt.train's 'step N loss ...': --progress-every 1, which
  --script-args replaces) and write DIR/losses.json ({train: [[step, loss], ...]}).`;

export async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    nproc: { kind: 'positive', max: 1024 }, nodes: { kind: 'positive', max: 64 }, spares: { kind: 'count', max: 64 }, 'kill-every': { kind: 'number', min: 0.1 },
    kills: { kind: 'count', max: 10_000 }, faults: 'string', seed: 'count', steps: 'positive', layout: 'string', script: 'string', 'script-args': 'string',
    baseline: { kind: 'string', choices: ['restart', 'none'] }, reference: 'boolean', 'save-every': 'positive', 'baseline-hang-ms': 'positive',
    timeout: { kind: 'number', min: 1 }, out: 'string', verbose: 'boolean', json: 'outfile', help: 'boolean', shrink: 'boolean',
    netns: 'boolean', 'net-loss': { kind: 'number', min: 0 }, 'net-delay': { kind: 'number', min: 0, max: 10_000 }, 'link-grace': { kind: 'number', min: 0 }, 'heartbeat-timeout-ms': 'positive',
  }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  expectPositionals(o, 'nothing', 0);
  const opts = chaosOptions(o as Record<string, unknown>);
  const record = await runChaos({ ...opts, log: (l) => console.error(l) });
  printReport(record);
  writeJson(o.json as string | undefined, record);
  // The chaos run failed when it timed out or a launcher it did not kill (as a node fault) failed.
  const c = record.runs.chaos!, killed = new Set(record.injected.chaos.filter((f) => isNodeFault(f.how)).map((f) => f.node));
  return c.timedOut || c.exitCodes.some((x, node) => x !== 0 && !killed.has(node)) ? 1 : 0;
}

/** The options of the command line (parsed) with their defaults; ArgumentError for a bad --faults. */
export function chaosOptions(o: Record<string, unknown>): ChaosOptions {
  const words = (s: string) => s.split(/\s+/).filter(Boolean);
  const faults = String(o.faults ?? 'kill,stop').split(',').map((s) => s.trim()).filter(Boolean);
  for (const f of faults) if (!(FAULT_KINDS as readonly string[]).includes(f)) throw new ArgumentError(`bench chaos: unknown fault '${f}' in --faults (kill, stop, node, link)`);
  if (faults.length === 0) throw new ArgumentError('bench chaos: --faults lists nothing');
  const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
  const opts: ChaosOptions = {
    nproc: (o.nproc as number | undefined) ?? 4, nodes: (o.nodes as number | undefined) ?? 1, spares: (o.spares as number | undefined) ?? 1,
    ...(o.shrink ? { shrink: true } : {}),
    killEverySec: (o['kill-every'] as number | undefined) ?? 30, kills: (o.kills as number | undefined) ?? 10, faults: faults as FaultKind[],
    seed: (o.seed as number | undefined) ?? 1, ...(o.steps !== undefined ? { steps: o.steps as number } : {}),
    layout: words((o.layout as string | undefined) ?? '--dp 2 --tp 2 --zero 3'),
    script: (o.script as string | undefined) ?? join(root, 'examples', 'gpt', 'train.ts'),
    scriptArgs: words((o['script-args'] as string | undefined) ?? '--progress-every 1'),
    baseline: (o.baseline as 'restart' | 'none' | undefined) ?? 'restart', reference: (o.reference as boolean | undefined) ?? true,
    out: resolve((o.out as string | undefined) ?? join(process.cwd(), `nt-bench-chaos-${Date.now()}`)),
    saveEvery: (o['save-every'] as number | undefined) ?? 5, baselineHangMs: (o['baseline-hang-ms'] as number | undefined) ?? 10_000,
    timeoutSec: (o.timeout as number | undefined) ?? 3600, verbose: Boolean(o.verbose),
    ...(o.netns ? { netns: true } : {}), ...(o['net-loss'] !== undefined ? { netLoss: o['net-loss'] as number } : {}),
    ...(o['net-delay'] !== undefined ? { netDelayMs: o['net-delay'] as number } : {}),
    ...(o['link-grace'] !== undefined ? { linkGraceSec: o['link-grace'] as number } : {}),
    ...(o['heartbeat-timeout-ms'] !== undefined ? { heartbeatTimeoutMs: o['heartbeat-timeout-ms'] as number } : {}),
  };
  checkNetOptions(opts);
  return opts;
}
