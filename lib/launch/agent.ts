// The launcher's per-node agent, torchrun's elastic agent as a small state machine:
// rendezvous (nodes meet in the store) → start (spawn local ranks) → monitor (exits, the job's
// failure key, heartbeats) → restart (new attempt, new store namespace) or stop (report, exit code).
// With `spares` set (--spares N) it runs in-job recovery mode (lib/launch/recovery.ts): lost ranks are
// replaced inside the attempt, and only what cannot be recovered there takes the restart path.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { CommError, TimeoutError } from '../errors.js';
import { PrefixStore, type Store } from '../distributed/store.js';
import { isLoopbackHost } from '../distributed/store-api.js';
import { analyzeFlight, readFlightDumps } from './flight-analysis.js';
import { processState, RecoverySession, type RecoveryFallback } from './recovery.js';
import { scriptCommand, WorkerGroup, type WorkerExit, type WorkerSpec } from './workers.js';

export interface AgentConfig {
  script: string;
  scriptArgs: string[];
  nprocPerNode: number;
  nnodes: number;
  nodeRank: number;
  masterAddr: string;
  masterPort: number;
  maxRestarts: number;
  monitorIntervalMs: number;
  /** How long nodes wait for each other at the start of an attempt. */
  joinTimeoutMs: number;
  /** A node whose heartbeat has not changed for this long is reported and the job stopped. */
  heartbeatTimeoutMs: number;
  /** SIGTERM → SIGKILL grace period when stopping workers. */
  stopGraceMs: number;
  /** Stop the job when no local rank has completed a collective for this long (flight recorder progress files); 0 or absent: off. */
  hangTimeoutMs?: number;
  /** Namespace of this job in the store (matters when a Redis store is shared). */
  runId: string;
  /** redis://host:port when rendezvous goes through Redis. */
  rdzvUrl?: string;
  /** The job token the workers' store clients present (NODETRON_STORE_TOKEN in their environment). */
  storeToken?: string;
  /** In-job recovery mode with this many hot spares per node (--spares N); undefined: off. */
  spares?: number;
  /** Recovery mode: how long a rank may sit stopped (SIGSTOP) before it is killed and replaced (default 1000). */
  stopTimeoutMs?: number;
  /** Recovery mode: generations before a loss takes the restart path instead (default 100). */
  maxRecoveries?: number;
  /** Recovery mode: a loss with no hot spare free shrinks data parallelism and grows back (--shrink). */
  shrink?: boolean;
}

/** The first failure of an attempt, as published in the store for every node to report. */
export interface FailureRecord {
  node: number;
  rank?: number;
  localRank?: number;
  pid?: number;
  exitCode?: number | null;
  signal?: string | null;
  reason: string;
  stderrTail: string[];
}

/** What one node announces when it joins an attempt. */
interface NodeInfo {
  localWorldSize: number;
  host: string;
  pid: number;
  /** Recovery mode: where this node's image holder listens (host:port). */
  holder?: string;
}

type Outcome = { ok: true } | { ok: false; failure: FailureRecord; fatal?: boolean };

type State = 'rendezvous' | 'running' | 'stopping' | 'restarting' | 'succeeded' | 'failed';

const encodeJson = (v: unknown) => JSON.stringify(v);

/** Characters of one stderr line kept in a failure record (20 lines stay far below the store's value limit). */
const MAX_TAIL_LINE_CHARS = 2000;

export class LaunchAgent {
  state: State = 'rendezvous';
  private readonly log: (line: string) => void;
  private interrupted: NodeJS.Signals | undefined;
  private wakeMonitor: (() => void) | undefined;

  constructor(
    private readonly config: AgentConfig,
    private readonly store: Store,
    log?: (line: string) => void,
  ) {
    this.log = log ?? ((line) => process.stderr.write(`[nodetron launch node ${config.nodeRank}] ${line}\n`));
  }

  /** Asks the agent to stop its workers and end (SIGINT/SIGTERM to the launcher). */
  interrupt(signal: NodeJS.Signals): void {
    this.interrupted = signal;
    this.wakeMonitor?.();
  }

  /** Runs attempts until one succeeds or the restarts are used up; returns the launcher's exit code. */
  async run(): Promise<number> {
    for (let attempt = 0; ; attempt++) {
      const attemptStore = new PrefixStore(this.store, `${this.config.runId}/attempt${attempt}`);
      const agentStore = new PrefixStore(attemptStore, 'agent');
      let outcome: Outcome;
      let group: WorkerGroup | undefined;
      let recovery: RecoverySession | undefined;
      const flight = this.flightDir(attempt);
      try {
        this.state = 'rendezvous';
        if (this.config.spares !== undefined) recovery = await this.openRecovery();
        const nodes = await this.rendezvous(agentStore, recovery?.holderAddress);
        this.state = 'running';
        const firstFailure: { value?: FailureRecord } = {};
        const onExit = (exit: WorkerExit, tail: string[]) => {
          if (firstFailure.value || exit.stopped || (exit.exitCode === 0 && !exit.signal)) return;
          firstFailure.value = this.failureOf(exit, tail);
          this.wakeMonitor?.();
        };
        group = recovery
          ? this.startRecovery(recovery, attemptStore, attempt, nodes, flight?.dir, firstFailure)
          : this.start(attempt, nodes, flight?.dir, onExit);
        outcome = await this.monitor(agentStore, group, firstFailure, flight?.dir, recovery);
      } catch (e) {
        // The store failed or a node never joined: there is nothing to coordinate a restart with.
        if (!(e instanceof CommError || e instanceof TimeoutError)) {
          await group?.stop(this.config.stopGraceMs);
          await recovery?.close();
          throw e;
        }
        outcome = { ok: false, fatal: true, failure: { node: this.config.nodeRank, reason: e.message, stderrTail: [] } };
      }
      if (outcome.ok) {
        this.state = 'succeeded';
        await group?.stop(this.config.stopGraceMs);  // nothing runs by now (a spare started at the last moment)
        await recovery?.close();
        if (flight?.temporary) rmSync(flight.dir, { recursive: true, force: true });
        return 0;
      }
      this.state = 'stopping';
      const stopped = group && flight && !this.interrupted ? await this.requestDumps(group, flight.dir) : undefined;
      await group?.stop(this.config.stopGraceMs);
      await recovery?.close();
      this.report(attempt, outcome.failure);
      if (group && flight && stopped) this.reportFlight(group, flight.dir, stopped);
      // Nothing was recorded (the workers do not use nt.distributed): leave no empty temp dir behind.
      if (flight?.temporary && readdirSync(flight.dir).length === 0) rmSync(flight.dir, { recursive: true, force: true });
      if (this.interrupted) return 128 + (this.interrupted === 'SIGINT' ? 2 : 15);
      if (outcome.fatal || attempt >= this.config.maxRestarts) {
        this.state = 'failed';
        return 1;
      }
      this.state = 'restarting';
      this.log(`restarting the group (restart ${attempt + 1} of ${this.config.maxRestarts})`);
    }
  }

  // ---- rendezvous: every node announces itself and waits for the others ------------------------
  private async rendezvous(agentStore: Store, holder?: string): Promise<NodeInfo[]> {
    const { nnodes, nodeRank, nprocPerNode, joinTimeoutMs } = this.config;
    const me: NodeInfo = { localWorldSize: nprocPerNode, host: hostname(), pid: process.pid, ...(holder !== undefined ? { holder } : {}) };
    await agentStore.set(`node/${nodeRank}`, encodeJson(me));
    const keys = Array.from({ length: nnodes }, (_, r) => `node/${r}`);
    try {
      await agentStore.wait(keys, { timeoutMs: joinTimeoutMs });
    } catch (e) {
      if (!(e instanceof TimeoutError)) throw e;
      const missing: number[] = [];
      for (let r = 0; r < nnodes; r++) if (!(await agentStore.check([`node/${r}`]))) missing.push(r);
      throw new TimeoutError(`rendezvous: node(s) ${missing.join(', ')} of ${nnodes} did not join within ${joinTimeoutMs} ms`, 'launch');
    }
    return Promise.all(keys.map(async (k) => JSON.parse(await agentStore.getString(k)) as NodeInfo));
  }

  // ---- start: one process per local rank, with the environment contract -----------------------
  private start(attempt: number, nodes: NodeInfo[], flightDir: string | undefined, onExit: (exit: WorkerExit, tail: string[]) => void): WorkerGroup {
    const { script, scriptArgs } = this.config;
    const { env, rankOffset, localWorldSize } = this.nodeEnv(attempt, nodes, flightDir);
    const specs: WorkerSpec[] = Array.from({ length: localWorldSize }, (_, localRank) => ({
      rank: rankOffset + localRank,
      localRank,
      env: { ...env, RANK: String(rankOffset + localRank), LOCAL_RANK: String(localRank) },
    }));
    return new WorkerGroup(scriptCommand(script, scriptArgs), specs, onExit);
  }

  /** The environment every worker of this node shares (all of the contract but RANK and LOCAL_RANK). */
  private nodeEnv(attempt: number, nodes: NodeInfo[], flightDir: string | undefined): { env: NodeJS.ProcessEnv; rankOffset: number; localWorldSize: number } {
    const { nodeRank, masterAddr, masterPort, runId, rdzvUrl } = this.config;
    const worldSize = nodes.reduce((n, node) => n + node.localWorldSize, 0);
    const rankOffset = nodes.slice(0, nodeRank).reduce((n, node) => n + node.localWorldSize, 0);
    const localWorldSize = nodes[nodeRank]!.localWorldSize;
    const env: NodeJS.ProcessEnv = {
      ...process.env,
      WORLD_SIZE: String(worldSize),
      LOCAL_WORLD_SIZE: String(localWorldSize),
      GROUP_RANK: String(nodeRank),
      MASTER_ADDR: masterAddr,
      MASTER_PORT: String(masterPort),
      NODETRON_RESTART_COUNT: String(attempt),
      // A worker's parent: its kernel ends it with this process (lib/native.ts dieWithLauncher).
      NODETRON_LAUNCHER_PID: String(process.pid),
      NODETRON_STORE_PREFIX: `${runId}/attempt${attempt}/job`,
      ...(rdzvUrl ? { NODETRON_RDZV: rdzvUrl } : {}),
      ...(this.config.storeToken !== undefined ? { NODETRON_STORE_TOKEN: this.config.storeToken } : {}),
      ...(flightDir ? { NODETRON_FLIGHT_DIR: flightDir } : {}),
      // Progress files only for the hang check that reads them (one write a second per rank otherwise for nothing).
      NODETRON_FLIGHT_PROGRESS: flightDir && (this.config.hangTimeoutMs ?? 0) > 0 ? '1' : '0',
    };
    if (nodeRank === 0 || attempt > 0) {
      this.log(`attempt ${attempt}: world size ${worldSize} over ${nodes.length} node(s); this node runs ranks ${rankOffset}..${rankOffset + localWorldSize - 1}`);
    }
    return { env, rankOffset, localWorldSize };
  }

  // ---- in-job recovery mode (--spares): the holder, the ranks, spares and replacements ------------
  private openRecovery(): Promise<RecoverySession> {
    const { nodeRank, masterAddr, storeToken, spares } = this.config;
    const options = { spares: spares ?? 0, stopTimeoutMs: this.config.stopTimeoutMs ?? 1000, maxRecoveries: this.config.maxRecoveries ?? 100, shrink: this.config.shrink ?? false,
      heartbeatTimeoutMs: this.config.heartbeatTimeoutMs, monitorIntervalMs: this.config.monitorIntervalMs };
    return RecoverySession.open(nodeRank, options, { loopback: isLoopbackHost(masterAddr), single: this.config.nnodes === 1, ...(storeToken !== undefined ? { token: storeToken } : {}) }, this.log);
  }

  private startRecovery(recovery: RecoverySession, attemptStore: Store, attempt: number, nodes: NodeInfo[], flightDir: string | undefined, firstFailure: { value?: FailureRecord }): WorkerGroup {
    const missing = nodes.findIndex((n) => n.holder === undefined);
    if (missing >= 0) throw new CommError(`node ${missing} runs without --spares while this node runs in-job recovery mode: give --spares on every node`, 'launch');
    const { env } = this.nodeEnv(attempt, nodes, flightDir);
    return recovery.start({
      nnodes: nodes.length,
      localWorldSizes: nodes.map((n) => n.localWorldSize),
      holders: nodes.map((n) => n.holder!),
      jobStore: new PrefixStore(attemptStore, 'job'),
      agentStore: new PrefixStore(attemptStore, 'agent'),
      command: scriptCommand(this.config.script, this.config.scriptArgs),
      baseEnv: env,
      stopGraceMs: this.config.stopGraceMs,
      fallback: (f: RecoveryFallback) => {
        if (firstFailure.value) return;
        firstFailure.value = f.exit
          ? { ...this.failureOf(f.exit, f.stderrTail ?? []), reason: f.reason }
          : { node: f.node ?? this.config.nodeRank, reason: f.reason, stderrTail: [] };
        this.wakeMonitor?.();
      },
      wake: () => this.wakeMonitor?.(),
    });
  }

  private failureOf(exit: WorkerExit, stderrTail: string[]): FailureRecord {
    const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.exitCode}`;
    return {
      node: this.config.nodeRank,
      rank: exit.rank,
      localRank: exit.localRank,
      pid: exit.pid,
      exitCode: exit.exitCode,
      signal: exit.signal,
      reason: `rank ${exit.rank} (node ${this.config.nodeRank}, local rank ${exit.localRank}, pid ${exit.pid}) ${how}`,
      // Published in the store for every node to report: long lines are cut to fit its value limit.
      stderrTail: stderrTail.map((l) => (l.length > MAX_TAIL_LINE_CHARS ? `${l.slice(0, MAX_TAIL_LINE_CHARS)}… (${l.length - MAX_TAIL_LINE_CHARS} more characters)` : l)),
    };
  }

  // ---- monitor: local exits, the job's failure key, heartbeats; until success or a failure -----
  private async monitor(agentStore: Store, group: WorkerGroup, localFailure: { value?: FailureRecord }, flightDir?: string, recovery?: RecoverySession): Promise<Outcome> {
    const { nnodes, nodeRank, monitorIntervalMs, heartbeatTimeoutMs } = this.config;
    const hangMs = this.config.hangTimeoutMs ?? 0;
    let groupDone = false;
    // In recovery mode the group grows (spares, replacements): the session says when this node's ranks are done.
    if (!recovery) {
      void group.wait().then(() => {
        groupDone = true;
        this.wakeMonitor?.();
      });
    }
    // Every store call of the pass must answer within twice the heartbeat timeout, at least 10 s (see
    // answered()), on the nodes that reach the store over the network (node 0 serves it: its calls cannot
    // be cut off from it). Generous: a loaded node 0 answers late, and the other nodes find a cut node by
    // its heartbeat anyway; this only lets the cut node itself end.
    const storeDeadlineMs = heartbeatTimeoutMs > 0 ? Math.max(2 * heartbeatTimeoutMs, 10_000) : 0;
    const ask = <T>(p: Promise<T>): Promise<T> => (nodeRank === 0 ? p : this.answered(p, storeDeadlineMs));
    const lastBeat = new Map<number, { value: string; changedAt: number }>();
    let beat = 0;
    let announcedDone = false;
    const dead = recovery?.dead ?? new Set<number>();
    try {
      for (;;) {
        const localDone = recovery ? recovery.done : groupDone;
        if (this.interrupted) {
          return { ok: false, failure: { node: nodeRank, reason: `the launcher received ${this.interrupted}`, stderrTail: [] } };
        }
        if (recovery?.evicted) return { ok: false, fatal: true, failure: { node: nodeRank, reason: recovery.evicted, stderrTail: [] } };
        // The first failure anywhere wins the failure key; every node then reports that one.
        if (localFailure.value) {
          const published = await ask(agentStore.compareSet('failed', '', encodeJson(localFailure.value)));
          return { ok: false, failure: JSON.parse(new TextDecoder().decode(published)) as FailureRecord };
        }
        const remote = await ask(agentStore.tryGet('failed'));
        if (remote) return { ok: false, failure: JSON.parse(new TextDecoder().decode(remote)) as FailureRecord };

        const hang = hangMs > 0 && flightDir ? stalled(group, flightDir, hangMs) : undefined;
        if (hang) {
          const failure: FailureRecord = { node: nodeRank, reason: hang, stderrTail: [] };
          const published = await ask(agentStore.compareSet('failed', '', encodeJson(failure)));
          return { ok: false, failure: JSON.parse(new TextDecoder().decode(published)) as FailureRecord };
        }
        await ask(agentStore.set(`heartbeat/${nodeRank}`, String(beat++)));
        const now = Date.now();
        for (let r = 0; r < nnodes; r++) {
          if (r === nodeRank || dead.has(r) || (await ask(agentStore.check([`done/${r}`])))) continue;
          const value = (await ask(agentStore.tryGet(`heartbeat/${r}`))) ?? new Uint8Array();
          const text = new TextDecoder().decode(value);
          const seen = lastBeat.get(r);
          if (!seen || seen.value !== text) lastBeat.set(r, { value: text, changedAt: now });
          else if (now - seen.changedAt > heartbeatTimeoutMs) {
            const silence = `node ${r} stopped heartbeating (no heartbeat for ${now - seen.changedAt} ms, limit ${heartbeatTimeoutMs} ms)`;
            // Recovery mode: the lowest surviving node replaces its ranks (or takes the restart path itself).
            if (recovery) {
              recovery.nodeSilent(r, silence);
              continue;
            }
            const failure: FailureRecord = {
              node: r,
              reason: silence,
              stderrTail: [],
            };
            await ask(agentStore.compareSet('failed', '', encodeJson(failure)));
            return { ok: false, failure };
          }
        }

        // Every worker's exit callback has run once localDone is set, but a failure may have arrived
        // while this pass awaited the store: go round again rather than announce a failed node done.
        if (localDone && localFailure.value) continue;
        if (localDone && !announcedDone) {
          await ask(agentStore.set(`done/${nodeRank}`, '1'));
          announcedDone = true;
        }
        const allDone = Array.from({ length: nnodes }, (_, r) => r).filter((r) => !dead.has(r)).map((r) => `done/${r}`);
        if (announcedDone && (await ask(agentStore.check(allDone)))) {
          await this.leave(agentStore, dead);
          return { ok: true };
        }
        await new Promise<void>((resolve) => {
          if (recovery?.done && !announcedDone) return resolve();
          const timer = setTimeout(resolve, monitorIntervalMs);
          this.wakeMonitor = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.wakeMonitor = undefined;
      }
    } catch (e) {
      if (!(e instanceof CommError)) throw e;
      return {
        ok: false,
        fatal: true,
        failure: { node: nodeRank, reason: `lost the rendezvous store (${e.message}); node 0 may have died`, stderrTail: [] },
      };
    }
  }

  /**
   * `p`, a store call, or CommError when it has not answered within `ms`: a store behind a cut link neither
   * answers nor fails (no reset comes back), and the monitor would wait on it for ever. The connection is then
   * closed, which fails every other call waiting on it (the recovery session's poll), so the attempt can end.
   */
  private answered<T>(p: Promise<T>, ms: number): Promise<T> {
    if (!(ms > 0)) return p;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        void this.store.close().catch(() => undefined);
        reject(new CommError(`the store did not answer within ${ms} ms (twice --heartbeat-timeout-ms, at least 10 s)`, 'launch'));
      }, ms);
    });
    return Promise.race([p, late]).finally(() => clearTimeout(timer));
  }

  /** After success: node 0 serves the store, so it waits (briefly) until every node has seen the result before closing it. */
  private async leave(agentStore: Store, dead: Set<number>): Promise<void> {
    const { nnodes, nodeRank, joinTimeoutMs } = this.config;
    await agentStore.set(`left/${nodeRank}`, '1');
    if (nodeRank !== 0) return;
    const keys = Array.from({ length: nnodes }, (_, r) => r).filter((r) => !dead.has(r)).map((r) => `left/${r}`);
    await agentStore.wait(keys, { timeoutMs: joinTimeoutMs }).catch(() => undefined);
  }

  // ---- flight recorder: where ranks dump, asking them to, and the analysis ----------------------
  /** This attempt's dump directory (under NODETRON_FLIGHT_DIR when set, else a new temp dir); undefined when the recorder is off. */
  private flightDir(attempt: number): { dir: string; temporary: boolean } | undefined {
    if (process.env.NODETRON_FLIGHT_RECORDER === '0') return undefined;
    const base = process.env.NODETRON_FLIGHT_DIR;
    try {
      if (base) {
        const dir = join(base, `node${this.config.nodeRank}-attempt${attempt}`);
        rmSync(dir, { recursive: true, force: true });
        mkdirSync(dir, { recursive: true });
        return { dir, temporary: false };
      }
      return { dir: mkdtempSync(join(tmpdir(), `nodetron-flight-${this.config.nodeRank}-${attempt}-`)), temporary: true };
    } catch (e) {
      this.log(`flight recorder off: cannot create its directory (${(e as Error).message})`);
      return undefined;
    }
  }

  /**
   * Sends SIGUSR2 to every running worker that registered the flight recorder's handler and waits
   * (briefly) for their dumps; returns the ranks whose process is stopped (SIGSTOP: they cannot dump).
   */
  private async requestDumps(group: WorkerGroup, dir: string): Promise<Set<number>> {
    const stopped = new Set<number>();
    const asked: { rank: number; path: string }[] = [];
    const t0 = Date.now();
    for (const w of group.running()) {
      if (w.pid === undefined || !existsSync(join(dir, `rank-${w.rank}.pid`))) continue;
      if (processState(w.pid) === 'T') { stopped.add(w.rank); continue; }
      try {
        process.kill(w.pid, 'SIGUSR2');
        asked.push({ rank: w.rank, path: join(dir, `rank-${w.rank}.json`) });
      } catch { /* it just exited */ }
    }
    const fresh = (p: string) => { try { return statSync(p).mtimeMs >= t0 - 5; } catch { return false; } };
    const deadline = t0 + Math.min(3000, Math.max(500, this.config.stopGraceMs));
    while (asked.some((a) => !fresh(a.path)) && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      // A rank blocked in a synchronous wait runs the handler late or never; one that exits meanwhile is done.
      for (let i = asked.length - 1; i >= 0; i--) if (!group.running().some((w) => w.rank === asked[i]!.rank)) asked.splice(i, 1);
    }
    return stopped;
  }

  private reportFlight(group: WorkerGroup, dir: string, stopped: Set<number>): void {
    const dumps = readFlightDumps(dir);
    const registered = readdirSync(dir).filter((f) => f.endsWith('.pid')).length;
    if (dumps.size === 0 && registered === 0) return;  // the workers do not use nt.distributed
    const worldSize = [...dumps.values()][0]?.worldSize ?? group.ranks.length;
    const lines = analyzeFlight(dumps, { worldSize, localRanks: group.ranks, stopped });
    this.log(`flight recorder (dumps in ${dir}):`);
    for (const l of lines) this.log(`  ${l}`);
  }

  private report(attempt: number, failure: FailureRecord): void {
    const lines = [`attempt ${attempt} failed: ${failure.reason}`];
    if (failure.node !== this.config.nodeRank && failure.rank !== undefined) lines.push(`(the failure was on node ${failure.node}; this node stopped its workers)`);
    if (failure.stderrTail.length) {
      lines.push(`last ${failure.stderrTail.length} line(s) of rank ${failure.rank}'s stderr:`);
      for (const l of failure.stderrTail) lines.push(`  | ${l}`);
    } else if (failure.rank !== undefined) {
      lines.push(`rank ${failure.rank} wrote nothing to stderr`);
    }
    for (const l of lines) this.log(l);
  }
}

/**
 * Whether this node's job stopped progressing: every running rank that has completed a collective
 * (its flight recorder touches `rank-R.progress` at most once a second) last did so more than
 * `limitMs` ago. Returns the reason, or undefined.
 */
function stalled(group: WorkerGroup, dir: string, limitMs: number): string | undefined {
  const running = group.running();
  if (running.length === 0) return undefined;
  const now = Date.now();
  let newest = 0;
  for (const w of running) {
    try {
      newest = Math.max(newest, statSync(join(dir, `rank-${w.rank}.progress`)).mtimeMs);
    } catch {
      return undefined;  // a rank that has not completed its first collective yet (start-up) is not judged
    }
  }
  const idle = now - newest;
  return idle > limitMs ? `the job stopped progressing: no rank of this node completed a collective for ${Math.round(idle)} ms (--hang-timeout-ms ${limitMs})` : undefined;
}
