// The launcher's in-job recovery mode (`nodetron launch --spares N`, issue #37; docs/recovery.md and
// the in-job recovery contract): per node and attempt, an image holder (lib/distributed/holder.ts) for
// the ranks of the previous node, a recovery directory with the abort file, N hot spares, detection
// (a rank's process exits unsuccessfully, sits stopped longer than --stop-timeout-ms, or its node stops
// heartbeating), generations announced in the store (`recover/gen/<g>`, compareSet, then the abort
// files), the lost ranks' replacements (a spare, else a new process with NODETRON_JOIN=1) and the
// events file. A loss the job cannot recover in process (a rank never set `recover/ready/<rank>`, a
// rank already finished, more than --max-recoveries generations) takes the old path: the agent stops
// the attempt and restarts it (lib/launch/agent.ts).
import { appendFileSync, mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { ImageHolder, imageEpoch } from '../distributed/holder.js';
import { generationWaitMs } from '../distributed/recovery-env.js';

/** The token each holder of this process wants (random on a job without one). */
const holderTokens = new WeakMap<ImageHolder, string | undefined>();
import type { Store } from '../distributed/store.js';
import { WorkerGroup, type WorkerExit, type WorkerSpec } from './workers.js';

/** The launcher's recovery knobs (--spares, --stop-timeout-ms, --max-recoveries). */
export interface RecoveryOptions {
  spares: number;
  stopTimeoutMs: number;
  maxRecoveries: number;
  /** A loss with no hot spare free shrinks data parallelism while the lost replica starts anew, then grows back (--shrink). */
  shrink?: boolean;
  /** The agents' heartbeat timeout and monitor interval: how long the ranks wait for a generation follows from them. */
  heartbeatTimeoutMs?: number;
  monitorIntervalMs?: number;
}

/** What the agent tells a recovery session about its attempt (after the rendezvous). */
export interface RecoveryAttempt {
  nnodes: number;
  /** Ranks per node (LOCAL_WORLD_SIZE of each), from the rendezvous. */
  localWorldSizes: number[];
  /** Each node's holder address (host:port), from the rendezvous. */
  holders: string[];
  /** The attempt's job-prefix store (the workers' keys: recover/...). */
  jobStore: Store;
  /** The attempt's agent store (the agents' own keys). */
  agentStore: Store;
  command: string[];
  /** A worker's environment on this node without RANK/LOCAL_RANK (the agent's contract). */
  baseEnv: NodeJS.ProcessEnv;
  stopGraceMs: number;
  /** Takes the old path: the agent publishes this failure, stops the attempt and restarts it. */
  fallback: (failure: RecoveryFallback) => void;
  /** Wakes the agent's monitor (this node was declared lost, or its ranks are done). */
  wake: () => void;
}

/** Why a loss is not recovered in process: the lost worker's exit and stderr tail, or a lost node. */
export interface RecoveryFallback {
  reason: string;
  exit?: WorkerExit;
  stderrTail?: string[];
  node?: number;
}

/** `recover/gen/<g>`: the contract's fields, plus where the lost ranks ran (`node`), how, and which node replaces them (`by`). */
interface GenerationRecord {
  generation: number;
  lost: number[];
  reason: string;
  at: number;
  node: number;
  by: number;
  how: How | 'grow';
  /** --shrink, no spare free: the survivors may go on with fewer data-parallel replicas (their plan at recover/gen/<g>/plan). */
  shrink?: boolean;
  /** The grow back: the shrunk world whose images every rank restores from (its reshape generation and size). */
  from?: { epoch: number; worldSize: number };
  /** A lost node: every job rank's holder from now on (a survivor whose holder was on that node moves its copies to the next live one). */
  holders?: string[];
}

type How = 'exit' | 'stopped' | 'node';

/** A shrunk job, on every node: the ranks in it and the ranks out of it (restarted for the grow back). */
interface Shrunk {
  generation: number;
  /** Job ranks of the shrunk world, by its ranks. */
  members: number[];
  /** Job ranks outside it: each runs anew, waiting for the grow back. */
  out: number[];
}

/** How long the launcher waits for the survivors' shrink plan. */
const PLAN_WAIT_MS = 120_000;

interface Lost {
  rank: number;
  how: How;
  reason: string;
  exit?: WorkerExit;
  stderrTail?: string[];
}

/** How long the first loss waits for others of the same moment (two ranks killed together make one generation). */
const LOSS_BATCH_MS = 50;
/** How often the abort generation and the workers' /proc state are polled. */
const POLL_MS = 50;

const decode = (v: Uint8Array) => new TextDecoder().decode(v);
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** A process's state letter from /proc (R, S, T = stopped, Z, ...), or undefined off Linux or once it is gone. */
export function processState(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2).charAt(0);
  } catch {
    return undefined;
  }
}

function describeExit(exit: WorkerExit, nodeRank: number): string {
  const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.exitCode}`;
  return `rank ${exit.rank} (node ${nodeRank}, local rank ${exit.localRank}, pid ${exit.pid}) ${how}`;
}

/**
 * One node's recovery mode for one attempt. `open` starts the holder and makes the recovery directory
 * (before the rendezvous, which publishes the holder's address); `start` spawns the ranks and spares
 * and polls; `close` stops polling, closes the holder and removes the directory.
 */
export class RecoverySession {
  /** Nodes declared lost (their heartbeat stopped and a generation replaced their ranks). */
  readonly dead = new Set<number>();
  /** Set when another node declared this one lost: the agent stops its workers and fails. */
  evicted: string | undefined;
  private generation = 0;
  private attempt!: RecoveryAttempt;
  private group!: WorkerGroup;
  private ownerOf: number[] = [];
  private localRankOf: number[] = [];
  private holderNodeOf: number[] = [];
  /** The pid of each rank's current process (only ranks this node runs). */
  private readonly current = new Map<number, number | undefined>();
  private readonly finished = new Set<number>();
  private readonly stoppedSince = new Map<number, number>();
  private readonly killedStopped = new Set<number>();
  private readonly nodesHandled = new Set<number>();
  private pending: Lost[] = [];
  private batchTimer: NodeJS.Timeout | undefined;
  private queue: Promise<void> = Promise.resolve();
  private spareSeq = 0;
  private spareFailures = 0;
  private keepSpares = true;
  private closed = false;
  private poller: Promise<void> | undefined;
  private doneFlag = false;
  private finishing = false;
  private readonly events: string | undefined;
  /** Set while the job is shrunk (--shrink), until the grow back. */
  private shrunk: Shrunk | null = null;
  /** A shrink generation whose plan is not read yet. */
  private reshaping = false;
  /** The reshape generation that made the ranks' current world (their images' keys: lib/train/shrink.ts's imageKey). */
  private epoch = 0;

  private constructor(
    private readonly nodeRank: number,
    private readonly options: RecoveryOptions,
    private readonly holder: ImageHolder,
    /** host:port the workers dial (the holder listens on all interfaces beyond one node). */
    readonly holderAddress: string,
    /** NODETRON_RECOVERY_DIR of this node's workers. */
    readonly dir: string,
    private readonly log: (line: string) => void,
  ) {
    this.events = process.env.NODETRON_RECOVERY_EVENTS?.trim() || undefined;
  }

  /**
   * Starts this node's holder (on loopback when the job's store is, else on every interface, advertised
   * as NODETRON_GLOO_HOST or this host's name, as Gloo's devices are) and the recovery directory.
   */
  static async open(nodeRank: number, options: RecoveryOptions, where: { loopback: boolean; token?: string; single?: boolean }, log: (line: string) => void): Promise<RecoverySession> {
    const host = where.loopback ? '127.0.0.1' : '0.0.0.0';
    // A one-node job without a token (on loopback) still keeps its copies to itself: the holder wants a
    // random token that only this node's workers are given (NODETRON_HOLDER_TOKEN). (Several nodes
    // share the job token; on loopback without one, a simulation, the holders want none.)
    const token = where.token ?? (where.loopback && where.single ? randomBytes(16).toString('hex') : undefined);
    const holder = await ImageHolder.start({ host, ...(token !== undefined ? { token } : {}), log: (l) => log(`holder: ${l}`) });
    holderTokens.set(holder, token);
    const advertised = where.loopback ? '127.0.0.1' : process.env.NODETRON_GLOO_HOST?.trim() || hostname();
    const address = `${advertised.includes(':') ? `[${advertised}]` : advertised}:${holder.port}`;
    const dir = mkdtempSync(join(tmpdir(), `nodetron-recovery-${nodeRank}-`));
    return new RecoverySession(nodeRank, options, holder, address, dir, log);
  }

  /** Spawns this node's ranks (generation 0) and its spares, and starts polling; returns the group. */
  start(attempt: RecoveryAttempt): WorkerGroup {
    this.attempt = attempt;
    const { localWorldSizes, nnodes } = attempt;
    for (let node = 0; node < nnodes; node++) {
      for (let l = 0; l < localWorldSizes[node]!; l++) {
        this.ownerOf.push(node);
        this.localRankOf.push(l);
        this.holderNodeOf.push((node + 1) % nnodes);
      }
    }
    const specs: WorkerSpec[] = [];
    for (let r = 0; r < this.ownerOf.length; r++) {
      if (this.ownerOf[r] === this.nodeRank) specs.push({ rank: r, localRank: this.localRankOf[r]!, env: this.rankEnv(r, 0, false) });
    }
    this.group = new WorkerGroup(attempt.command, [], (exit, tail) => this.onExit(exit, tail));
    for (const spec of specs) {
      const pid = this.group.add(spec);
      this.current.set(spec.rank, pid);
      this.event('worker-started', { rank: spec.rank, pid, generation: 0 });
    }
    for (let i = 0; i < this.options.spares; i++) this.startSpare();
    this.poller = this.poll();
    return this.group;
  }

  /** Whether every rank this node runs has finished successfully (its spares are then stopped). */
  get done(): boolean {
    return this.doneFlag;
  }

  /** Stops polling, closes the holder and removes the recovery directory (the agent stops the workers). */
  async close(): Promise<void> {
    this.closed = true;
    this.keepSpares = false;
    clearTimeout(this.batchTimer);
    await this.poller;
    await this.queue;
    await this.holder.close();
    rmSync(this.dir, { recursive: true, force: true });
  }

  /**
   * The agent's monitor saw node `node`'s heartbeat stop: the lowest-numbered surviving node replaces
   * its ranks (the others wait for that generation). Called on every check; acts once per node.
   */
  nodeSilent(node: number, reason: string): void {
    if (this.dead.has(node) || this.nodesHandled.has(node)) return;
    let lowest = -1;
    for (let n = 0; n < this.attempt.nnodes; n++) if (n !== node && !this.dead.has(n)) { lowest = n; break; }
    if (lowest !== this.nodeRank) return;
    this.nodesHandled.add(node);
    const ranks = this.ownerOf.flatMap((owner, r) => (owner === node ? [r] : []));
    this.enqueue(() => this.recover(ranks.map((rank) => ({ rank, how: 'node' as const, reason })), node));
  }

  // ---- exits ------------------------------------------------------------------------------------
  private onExit(exit: WorkerExit, stderrTail: string[]): void {
    if (exit.stopped || this.closed) return;
    if (exit.rank < 0) return this.spareExited(exit, stderrTail);
    if (this.current.get(exit.rank) !== exit.pid) return;  // a replaced rank's old process
    if (exit.exitCode === 0 && !exit.signal) {
      this.finished.add(exit.rank);
      this.attempt.agentStore.add('finished', 1).catch(() => undefined);
      this.checkDone();
      return;
    }
    const how: How = exit.pid !== undefined && this.killedStopped.has(exit.pid) ? 'stopped' : 'exit';
    const reason = how === 'stopped' ? `${describeExit(exit, this.nodeRank)} after being stopped for more than ${this.options.stopTimeoutMs} ms` : describeExit(exit, this.nodeRank);
    this.pending.push({ rank: exit.rank, how, reason, exit, stderrTail });
    // Ranks lost at the same moment (a signal to several, a shared cause) become one generation.
    this.batchTimer ??= setTimeout(() => {
      this.batchTimer = undefined;
      const lost = this.pending;
      this.pending = [];
      this.enqueue(() => this.recover(lost));
    }, LOSS_BATCH_MS);
  }

  private checkDone(): void {
    if (this.finishing || this.pending.length > 0) return;
    for (let r = 0; r < this.ownerOf.length; r++) if (this.ownerOf[r] === this.nodeRank && !this.finished.has(r)) return;
    this.finishing = true;
    this.keepSpares = false;
    void this.group.stopSpares(this.attempt.stopGraceMs).then(() => {
      this.doneFlag = true;
      this.attempt.wake();
    });
  }

  private spareExited(exit: WorkerExit, stderrTail: string[]): void {
    if (!this.keepSpares) return;
    const how = exit.signal ? `was killed by ${exit.signal}` : `exited with code ${exit.exitCode}`;
    this.log(`spare ${exit.spare} (pid ${exit.pid}) ${how} before it was needed${stderrTail.length ? `; its last stderr line: ${stderrTail[stderrTail.length - 1]}` : ''}`);
    // A script that cannot start at all must not be restarted for ever.
    if (++this.spareFailures > 2 * this.options.spares + 2) {
      this.log(`not starting more spares after ${this.spareFailures} failed ones; lost ranks will be replaced by new processes`);
      this.keepSpares = false;
      return;
    }
    this.startSpare();
  }

  // ---- polling: the next generation (abort file) and stopped processes ---------------------------
  private async poll(): Promise<void> {
    while (!this.closed) {
      try {
        this.killStopped();
        await this.readGenerations();
        await this.checkShrunkDone();
      } catch {
        // The store is gone: the agent's monitor sees it and ends the attempt.
      }
      await sleep(POLL_MS);
    }
  }

  /** SIGKILLs every worker (rank or spare) that has been in state T longer than --stop-timeout-ms; its exit is then a loss. */
  private killStopped(): void {
    const now = Date.now();
    for (const w of [...this.group.running(), ...this.group.spares()]) {
      if (w.pid === undefined || this.killedStopped.has(w.pid)) continue;
      if (processState(w.pid) !== 'T') {
        this.stoppedSince.delete(w.pid);
        continue;
      }
      const since = this.stoppedSince.get(w.pid) ?? now;
      this.stoppedSince.set(w.pid, since);
      if (now - since > this.options.stopTimeoutMs) {
        this.killedStopped.add(w.pid);
        this.log(`pid ${w.pid} (${'rank' in w ? `rank ${w.rank}` : 'a spare'}) has been stopped for ${now - since} ms (--stop-timeout-ms ${this.options.stopTimeoutMs}): killing it`);
        try { process.kill(w.pid, 'SIGKILL'); } catch { /* already gone */ }
      }
    }
  }

  /** Applies every generation announced after the current one, in order (each writes the abort file). */
  private async readGenerations(): Promise<void> {
    for (;;) {
      const next = this.generation + 1;
      const value = await this.attempt.jobStore.tryGet(`recover/gen/${next}`);
      if (!value || this.generation + 1 !== next) return;
      const record = JSON.parse(decode(value)) as GenerationRecord;
      this.generation = next;
      if (record.how === 'node') {
        this.dead.add(record.node);
        for (const r of record.lost) this.ownerOf[r] = record.by;
        if (record.node === this.nodeRank) {
          this.evicted = `the other nodes declared this node lost (generation ${next}: ${record.reason})`;
          this.attempt.wake();
        }
      }
      if (record.how === 'grow') {
        // The shrunk world grew back at a step boundary of its own (no abort: its ranks are between steps).
        this.shrunk = null;
        this.reshaping = false;
        this.event('grow', { generation: next, from: record.from });
        this.log(`generation ${next}: the job grows back (${record.reason})`);
        this.dropImagesBefore(record.from?.epoch ?? 0);
        this.epoch = next;
        continue;
      }
      this.writeAbort(next);
      if (record.shrink) {
        // Until the plan is read (and, with a plan, until the grow back), another loss restarts the job.
        this.reshaping = true;
        this.enqueue(() => this.afterShrink(record));
      }
    }
  }

  private writeAbort(generation: number): void {
    const file = join(this.dir, 'abort');
    const tmp = `${file}.${process.pid}.tmp`;
    try {
      writeFileSync(tmp, `${generation}\n`);
      renameSync(tmp, file);
    } catch (e) {
      if (!this.closed) this.log(`could not write the abort file ${file}: ${(e as Error).message}`);
    }
  }

  // ---- recovery: a generation for the lost ranks, then their replacements -------------------------
  private enqueue(task: () => Promise<void>): void {
    this.queue = this.queue.then(task).catch((e: unknown) => {
      if (this.closed) return;
      this.fallback({ reason: `in-job recovery failed: ${(e as Error).message}` });
    });
  }

  private fallback(f: RecoveryFallback): void {
    this.event('fallback-restart', { reason: f.reason });
    this.keepSpares = false;
    this.attempt.fallback(f);
  }

  /** Why the job cannot recover in process now, or undefined. */
  private async unrecoverable(lost: readonly Lost[]): Promise<string | undefined> {
    // A rank that exited with an error code failed in its own code (an exception, a bad input), which a
    // replacement would meet again: only deaths by a signal (SIGKILL, the OOM killer, a crash), stopped
    // ranks and lost nodes are faults to recover from.
    const failed = lost.find((l) => l.exit && !l.exit.signal && l.how === 'exit');
    if (failed) return `it exited with code ${String(failed.exit!.exitCode)} (an error in the script, not a lost process), so the job takes the restart path (--max-restarts)`;
    const ready = this.ownerOf.map((_, r) => `recover/ready/${r}`);
    if (!(await this.attempt.jobStore.check(ready))) return 'not every rank has turned in-job recovery on (no recover/ready key), so the job restarts';
    if ((await this.attempt.agentStore.add('finished', 0)) > 0) return 'a rank has already finished, so the lost one cannot rejoin its peers; the job restarts';
    return undefined;
  }

  private async recover(lost: Lost[], lostNode?: number): Promise<void> {
    if (this.closed || this.evicted || lost.length === 0) return;
    const first = lost[0]!;
    const why = this.shrunk || this.reshaping ? 'a rank was lost while the job was shrinking or shrunk (--shrink recovers one loss at a time), so the job restarts' : await this.unrecoverable(lost);
    if (why) return this.fallback({ reason: `${first.reason}; ${why}`, ...(first.exit ? { exit: first.exit, stderrTail: first.stderrTail ?? [] } : {}), ...(lostNode !== undefined ? { node: lostNode } : {}) });
    await this.readGenerations();
    const record: GenerationRecord = {
      generation: 0,
      lost: lost.map((l) => l.rank),
      reason: lost.map((l) => l.reason).join('; '),
      at: Date.now(),
      node: lostNode ?? this.nodeRank,
      by: this.nodeRank,
      how: first.how,
      // --shrink: with no hot spare free, the survivors decide whether fewer replicas can go on.
      // (Not for a lost node: its holder kept the survivors' copies, which a reshape restores from.)
      ...(this.options.shrink && this.group.spares().length === 0 && first.how !== 'node' ? { shrink: true } : {}),
      // The survivors whose copies went to the lost node's holder send them to the next live node's.
      ...(lostNode !== undefined ? { holders: this.holderNodeOf.map((_, r) => this.holderFor(r, lostNode)) } : {}),
    };
    // Another agent may have announced generation g for another fault: ours is then the next one.
    for (let g = this.generation + 1; ; g++) {
      if (g > this.options.maxRecoveries) {
        return this.fallback({ reason: `${first.reason}; more than --max-recoveries ${this.options.maxRecoveries} generations, so the job restarts`, ...(first.exit ? { exit: first.exit, stderrTail: first.stderrTail ?? [] } : {}) });
      }
      record.generation = g;
      const json = JSON.stringify(record);
      if (decode(await this.attempt.jobStore.compareSet(`recover/gen/${g}`, '', json)) === json) break;
    }
    const g = record.generation;
    await this.readGenerations();  // up to ours: the abort file says g
    this.event('fault', { generation: g, lost: record.lost, reason: record.reason, how: record.how, ...(lostNode !== undefined ? { lostNode } : {}), ...(record.shrink ? { shrink: true } : {}) });
    // (A shrink's replacements wait for the survivors' plan: afterShrink, queued by readGenerations.)
    if (!record.shrink) for (const l of lost) await this.replace(l, g);
  }

  /**
   * A --shrink generation, on every node: waits for the survivors' plan. Refused (the layout cannot
   * shrink): the node that handled the loss replaces the lost ranks as usual. Else every rank outside
   * the shrunk world that this node runs (the lost ones, and the survivors of their replicas, which
   * are stopped) starts anew as a grow joiner (NODETRON_GROW), and the job is shrunk until the grow back.
   */
  private async afterShrink(record: GenerationRecord): Promise<void> {
    const g = record.generation;
    const deadline = Date.now() + PLAN_WAIT_MS;
    let plan: { members?: number[]; refused?: string } | undefined;
    while (!plan) {
      const v = await this.attempt.jobStore.tryGet(`recover/gen/${g}/plan`);
      if (v) plan = JSON.parse(decode(v)) as typeof plan;
      else if (this.closed || this.generation > g) return;
      else if (Date.now() > deadline) return this.fallback({ reason: `generation ${g}: the survivors gave no shrink plan within ${PLAN_WAIT_MS} ms, so the job restarts` });
      else await sleep(POLL_MS);
    }
    this.reshaping = false;
    if (plan.refused !== undefined || !plan.members) {
      this.log(`generation ${g}: no shrink (${plan.refused ?? 'no plan'}); the lost ranks are replaced`);
      if (record.by === this.nodeRank) for (const rank of record.lost) await this.replace({ rank, how: record.how as How, reason: record.reason }, g);
      return;
    }
    const members = plan.members;
    const out = this.ownerOf.map((_, r) => r).filter((r) => !members.includes(r));
    this.shrunk = { generation: g, members, out };
    // The shrunk world restores from the current world's images: older worlds' are not needed again.
    this.dropImagesBefore(this.epoch);
    this.epoch = g;
    this.event('shrink', { generation: g, members, out });
    this.log(`generation ${g}: no spare free; the job goes on as ${members.length} rank(s) (job ranks ${members.join(',')}) while ranks ${out.join(',')} start anew`);
    for (const r of out) {
      if (this.ownerOf[r] !== this.nodeRank) continue;
      const old = this.current.get(r);
      this.current.set(r, undefined);
      this.finished.delete(r);
      if (old !== undefined && !record.lost.includes(r)) { try { process.kill(old, 'SIGKILL'); } catch { /* gone */ } }
      const pid = this.group.add({ rank: r, localRank: this.localRankOf[r]!, env: { ...this.rankEnv(r, g, true), NODETRON_GROW: String(g) } });
      this.current.set(r, pid);
      this.event('worker-started', { rank: r, pid, generation: g, grow: true });
    }
  }

  /** Drops this node's holder's images of the worlds before `epoch` (a reshape restores only from the world just before it). */
  private dropImagesBefore(epoch: number): void {
    for (const key of this.holder.heldKeys()) if (imageEpoch(key) < epoch) this.holder.drop(key);
  }

  /**
   * While shrunk: when the shrunk world finishes training (its ranks grow the job back themselves, at a
   * step boundary, once the ranks outside are ready), the waiting ranks are stopped as done.
   */
  private async checkShrunkDone(): Promise<void> {
    const s = this.shrunk;
    if (!s || this.closed) return;
    if ((await this.attempt.agentStore.add('finished', 0)) < s.members.length) return;
    for (const r of s.out) {
      if (this.ownerOf[r] !== this.nodeRank) continue;
      const pid = this.current.get(r);
      this.current.set(r, undefined);
      if (pid !== undefined) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
      this.finished.add(r);
    }
    this.shrunk = null;
    this.checkDone();
  }

  private async replace(l: Lost, g: number): Promise<void> {
    const localRank = this.localRankOf[l.rank]!;
    this.finished.delete(l.rank);
    const spare = this.group.spares()[0];
    if (spare && this.group.assign(spare.id, l.rank, localRank)) {
      this.current.set(l.rank, spare.pid);
      const assignment = { rank: l.rank, localRank, generation: g, holder: this.holderFor(l.rank) };
      await this.attempt.jobStore.set(`recover/spare/${this.nodeRank}/${spare.id}`, JSON.stringify(assignment));
      this.event('spare-assigned', { generation: g, rank: l.rank, spare: spare.id, pid: spare.pid });
      this.log(`generation ${g}: rank ${l.rank} lost (${l.how}); replaced by spare ${spare.id}`);
      if (this.keepSpares) this.startSpare();
      return;
    }
    const pid = this.group.add({ rank: l.rank, localRank, env: this.rankEnv(l.rank, g, true) });
    this.current.set(l.rank, pid);
    this.event('replacement-started', { generation: g, rank: l.rank, pid });
    this.event('worker-started', { rank: l.rank, pid, generation: g });
    this.log(`generation ${g}: rank ${l.rank} lost (${l.how}); replaced by a new process${pid === undefined ? ' (which could not start)' : ''}`);
  }

  // ---- processes -------------------------------------------------------------------------------
  /** The holder that keeps rank r's copies (the node after its first node), or the next live one (`lost`: a node also taken as dead). */
  private holderFor(rank: number, lost?: number): string {
    const { holders, nnodes } = this.attempt;
    let n = this.holderNodeOf[rank]!;
    for (let i = 0; i < nnodes && (this.dead.has(n) || n === lost); i++) n = (n + 1) % nnodes;
    return holders[n]!;
  }

  private recoveryEnv(): NodeJS.ProcessEnv {
    const token = holderTokens.get(this.holder);
    const env: NodeJS.ProcessEnv = { ...this.attempt.baseEnv, NODETRON_RECOVERY: '1', NODETRON_RECOVERY_DIR: this.dir, ...(token !== undefined ? { NODETRON_HOLDER_TOKEN: token } : {}) };
    // A rank whose collective failed waits this long for the next generation: longer than this launcher's worst detection.
    env.NODETRON_RECOVERY_GENERATION_WAIT_MS = String(generationWaitMs({ stopTimeoutMs: this.options.stopTimeoutMs, heartbeatTimeoutMs: this.options.heartbeatTimeoutMs ?? 30_000, monitorIntervalMs: this.options.monitorIntervalMs ?? 200 }));
    for (const k of ['RANK', 'LOCAL_RANK', 'NODETRON_SPARE', 'NODETRON_JOIN', 'NODETRON_GENERATION']) delete env[k];
    return env;
  }

  private rankEnv(rank: number, generation: number, join: boolean): NodeJS.ProcessEnv {
    const localRank = this.localRankOf[rank]!;
    const localWorldSize = Math.max(Number(this.attempt.baseEnv.LOCAL_WORLD_SIZE), localRank + 1);
    return {
      ...this.recoveryEnv(),
      RANK: String(rank),
      LOCAL_RANK: String(localRank),
      // A lost node's rank run here keeps its local rank, which may exceed this node's count.
      LOCAL_WORLD_SIZE: String(localWorldSize),
      NODETRON_GENERATION: String(generation),
      NODETRON_HOLDER: this.holderFor(rank),
      ...(join ? { NODETRON_JOIN: '1' } : {}),
    };
  }

  private startSpare(): void {
    const id = `s${this.spareSeq++}`;
    const holder = this.attempt.holders[(this.nodeRank + 1) % this.attempt.nnodes]!;
    const pid = this.group.add({ rank: -1, localRank: -1, spare: id, env: { ...this.recoveryEnv(), NODETRON_SPARE: id, NODETRON_HOLDER: holder } });
    if (pid === undefined) return;
    this.event('spare-started', { spare: id, pid });
    this.event('worker-started', { rank: -1, pid, spare: id, generation: this.generation });
  }

  private event(event: string, fields: Record<string, unknown>): void {
    if (!this.events) return;
    const line = JSON.stringify({ t: Date.now(), src: 'agent', node: this.nodeRank, event, ...fields });
    try {
      appendFileSync(this.events, `${line}\n`);
    } catch {
      /* the record is best effort */
    }
  }
}
