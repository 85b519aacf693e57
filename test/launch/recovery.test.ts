// Tests of the launcher's in-job recovery mode (`nodetron launch --spares N`, lib/launch/recovery.ts)
// with a fixture worker that uses none of nodetron's training code (test/fixtures/launch/recovery-worker.ts):
// a killed rank replaced by a hot spare (and a new spare started) or by a new process (NODETRON_JOIN=1),
// a stopped rank killed after --stop-timeout-ms and replaced, a rank that never turned recovery on taking
// the restart path, the holder reachable from the workers, every process gone at the end; and the options.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { parseLaunchArgs } from '../../lib/launch/cli.js';
import { freePort } from '../helpers/net.js';
import { isAlive as alive } from '../helpers/jobs.js';
import { nodeArgs } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');
const worker = join(fixtures, 'recovery-worker.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-recovery-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Event {
  t: number;
  src: 'agent' | 'rank';
  event: string;
  rank?: number;
  pid?: number;
  generation?: number;
  [k: string]: unknown;
}

interface Launch {
  events: () => Event[];
  /** Resolves with the first event that `pred` accepts (polling the events file). */
  waitFor: (what: string, pred: (e: Event) => boolean, timeoutMs?: number) => Promise<Event>;
  done: Promise<{ code: number | null; stdout: string; stderr: string }>;
}

let runs = 0;
/** Starts a launcher (2 ranks unless `args` say otherwise) of the fixture; `file` is the events file (shared by the nodes of one job). */
function launch(args: string[], env: NodeJS.ProcessEnv = {}, file = join(work, `events-${runs++}.jsonl`)): Launch & { kill: (s: NodeJS.Signals) => void } {
  const child = spawn(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), '--nproc-per-node', '2', '--monitor-interval-ms', '100', ...args, worker], {
    cwd: root,
    env: { ...process.env, NODETRON_RECOVERY_EVENTS: file, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c) => (stdout += c));
  child.stderr.on('data', (c) => (stderr += c));
  const done = new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
  let exited = false;
  void done.then(() => (exited = true));
  const events = (): Event[] => {
    if (!existsSync(file)) return [];
    return readFileSync(file, 'utf8').split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l) as Event);
  };
  const waitFor = async (what: string, pred: (e: Event) => boolean, timeoutMs = 30_000): Promise<Event> => {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const hit = events().find(pred);
      if (hit) return hit;
      if (exited || Date.now() > deadline) {
        child.kill('SIGKILL');
        const r = await done;
        throw new Error(`no ${what} event ${exited ? 'before the launcher exited' : `within ${timeoutMs} ms`}:\n${JSON.stringify(events(), null, 1)}\n${r.stderr}`);
      }
      await new Promise((r) => setTimeout(r, 25));
    }
  };
  return { events, waitFor, done, kill: (sig) => child.kill(sig) };
}


/** Both first ranks have set recover/ready; returns their pids. */
async function readyRanks(l: Launch): Promise<number[]> {
  const pids: number[] = [];
  for (const rank of [0, 1]) pids.push((await l.waitFor(`rank ${rank} ready`, (e) => e.src === 'rank' && e.event === 'ready' && e.rank === rank && e.generation === 0)).pid!);
  return pids;
}

/** Every process the agent started (ranks, spares, replacements) has exited, and the recovery directories are gone. */
function expectAllGone(events: Event[]): void {
  const started = events.filter((e) => e.src === 'agent' && e.event === 'worker-started').map((e) => e.pid!);
  expect(started.length).toBeGreaterThan(0);
  expect(started.filter(alive)).toEqual([]);
  for (const e of events.filter((x) => x.event === 'started')) expect(existsSync(String(e.dir))).toBe(false);
}

describe('nodetron launch --spares (in-job recovery mode)', () => {
  it('replaces a SIGKILLed rank by a hot spare, starts a new spare, and the job succeeds', async () => {
    const l = launch(['--spares', '1']);
    const [, pid1] = await readyRanks(l);
    await l.waitFor('spare started', (e) => e.event === 'spare-started' && e.spare === 's0');
    const killedAt = Date.now();
    process.kill(pid1!, 'SIGKILL');
    // The spare that took rank 1 is lost in turn: generation 2, the new spare s1 takes it.
    const s0 = await l.waitFor('spare s0 ready as rank 1', (e) => e.src === 'rank' && e.event === 'ready' && e.rank === 1 && e.generation === 1);
    process.kill(s0.pid!, 'SIGKILL');
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    const faults = events.filter((e) => e.event === 'fault');
    expect(faults).toMatchObject([{ src: 'agent', node: 0, generation: 1, lost: [1], how: 'exit' }, { generation: 2, lost: [1], how: 'exit' }]);
    const fault = faults[0]!;
    const latency = fault.t - killedAt;
    console.log(`detection latency (SIGKILL → fault event): ${latency} ms`);
    expect(latency).toBeLessThan(5000);
    const assignments = events.filter((e) => e.event === 'spare-assigned');
    expect(assignments).toMatchObject([{ generation: 1, rank: 1, spare: 's0', pid: s0.pid }, { generation: 2, rank: 1, spare: 's1' }]);
    const assigned = assignments[1]!;
    // The spare read its assignment key and ran as rank 1 of generation 1, joining, and reached its holder.
    const joined = events.find((e) => e.src === 'rank' && e.event === 'started' && e.pid === assigned.pid)!;
    expect(joined).toMatchObject({ rank: 1, generation: 2, spare: 's1', joining: true, holderReachable: true, recovery: '1' });
    expect(events.some((e) => e.src === 'rank' && e.event === 'exit' && e.pid === assigned.pid)).toBe(true);
    // A new spare was started each time one was used (s2, stopped at the end: it never ran as a rank).
    const s2 = events.find((e) => e.event === 'spare-started' && e.spare === 's2')!;
    expect(s2.t).toBeGreaterThanOrEqual(assigned.t);
    expect(events.some((e) => e.src === 'rank' && e.pid === s2.pid)).toBe(false);
    // The survivor saw both generations in its abort file and finished in its own process.
    expect(events.filter((e) => e.src === 'rank' && e.rank === 0 && e.event === 'abort').map((e) => e.abortGeneration)).toEqual([1, 2]);
    expect(events.filter((e) => e.src === 'rank' && e.event === 'exit' && e.rank === 0)).toHaveLength(1);
    // Every first rank got the holder (one node: its own agent's), reachable.
    for (const e of events.filter((x) => x.event === 'started' && x.generation === 0)) expect(e).toMatchObject({ holderReachable: true, joining: false });
    expect(r.stderr).toContain('[nodetron launch node 0] generation 1: rank 1 lost (exit); replaced by spare s0');
    expect(r.stderr).toContain('[nodetron launch node 0] generation 2: rank 1 lost (exit); replaced by spare s1');
    expect(r.stderr).not.toContain('restarting');
    expectAllGone(events);
  }, 90_000);

  it('with --spares 0 starts a new process with NODETRON_JOIN=1 and the lost rank; a lost replacement is the next generation', async () => {
    const l = launch(['--spares', '0']);
    const [, pid1] = await readyRanks(l);
    const killedAt = Date.now();
    process.kill(pid1!, 'SIGKILL');
    const ready1 = await l.waitFor('replacement ready', (e) => e.src === 'rank' && e.event === 'ready' && e.rank === 1 && e.generation === 1);
    process.kill(ready1.pid!, 'SIGKILL');
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    const faults = events.filter((e) => e.event === 'fault');
    expect(faults).toMatchObject([{ generation: 1, lost: [1], how: 'exit' }, { generation: 2, lost: [1], how: 'exit' }]);
    console.log(`detection latency (SIGKILL → fault event, --spares 0): ${faults[0]!.t - killedAt} ms`);
    expect(events.some((e) => e.event === 'spare-started' || e.event === 'spare-assigned')).toBe(false);
    const started = events.filter((e) => e.event === 'replacement-started');
    expect(started).toMatchObject([{ rank: 1, generation: 1, pid: ready1.pid }, { rank: 1, generation: 2 }]);
    const joined = events.find((e) => e.src === 'rank' && e.event === 'started' && e.pid === started[1]!.pid)!;
    expect(joined).toMatchObject({ rank: 1, localRank: 1, generation: 2, joining: true, spare: null, holderReachable: true });
    expect(events.some((e) => e.src === 'rank' && e.rank === 0 && e.event === 'abort' && e.abortGeneration === 2)).toBe(true);
    expect(r.stderr).toContain('generation 1: rank 1 lost (exit); replaced by a new process');
    expect(r.stderr).toContain('generation 2: rank 1 lost (exit); replaced by a new process');
    expectAllGone(events);
  }, 90_000);

  it('kills a rank stopped (SIGSTOP) longer than --stop-timeout-ms and replaces it', async () => {
    const l = launch(['--spares', '1', '--stop-timeout-ms', '500']);
    const [, pid1] = await readyRanks(l);
    const stoppedAt = Date.now();
    process.kill(pid1!, 'SIGSTOP');
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    const fault = events.find((e) => e.event === 'fault')!;
    expect(fault).toMatchObject({ generation: 1, lost: [1], how: 'stopped' });
    const latency = fault.t - stoppedAt;
    console.log(`detection latency (SIGSTOP → fault event, --stop-timeout-ms 500): ${latency} ms`);
    expect(latency).toBeGreaterThanOrEqual(500);
    expect(latency).toBeLessThan(6000);
    expect(alive(pid1!)).toBe(false);
    expect(events.find((e) => e.event === 'spare-assigned')).toMatchObject({ rank: 1, generation: 1 });
    expect(r.stderr).toMatch(/rank 1\) has been stopped for \d+ ms \(--stop-timeout-ms 500\): killing it/);
    expect(r.stderr).toContain('generation 1: rank 1 lost (stopped); replaced by spare s0');
    expectAllGone(events);
  }, 90_000);

  it('takes the restart path when a rank never set recover/ready', async () => {
    const l = launch(['--spares', '1', '--max-restarts', '1'], { RECOVERY_FIXTURE_NOT_READY: '1' });
    await l.waitFor('rank 0 ready', (e) => e.event === 'ready' && e.rank === 0);
    const started1 = await l.waitFor('rank 1 started', (e) => e.event === 'started' && e.rank === 1 && e.attempt === 0);
    process.kill(started1.pid!, 'SIGKILL');
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    expect(events.some((e) => e.event === 'fault' || e.event === 'spare-assigned')).toBe(false);
    expect(String(events.find((e) => e.event === 'fallback-restart')?.reason)).toMatch(/not every rank has turned in-job recovery on/);
    expect(r.stderr).toContain('restarting the group (restart 1 of 1)');
    // The second attempt ran both ranks anew (and recovery mode again), every one finished.
    expect(events.filter((e) => e.event === 'started' && e.attempt === 1).map((e) => e.rank).sort()).toEqual([0, 1]);
    expectAllGone(events);
  }, 90_000);

  it('takes the restart path when a rank exits with an error code (the script failed; a replacement would fail again)', async () => {
    const l = launch(['--spares', '1', '--max-restarts', '1'], { RECOVERY_FIXTURE_FAIL: '1' });
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    expect(events.some((e) => e.event === 'fault' || e.event === 'spare-assigned')).toBe(false);
    expect(String(events.find((e) => e.event === 'fallback-restart')?.reason)).toMatch(/exited with code 1 \(an error in the script/);
    expect(r.stderr).toContain('restarting the group (restart 1 of 1)');
    expectAllGone(events);
  }, 90_000);

  it('takes the restart path after --max-recoveries generations', async () => {
    const l = launch(['--spares', '1', '--max-restarts', '1', '--max-recoveries', '0']);
    const [, pid1] = await readyRanks(l);
    process.kill(pid1!, 'SIGKILL');
    const r = await l.done;
    const events = l.events();
    expect(r.code, r.stderr).toBe(0);
    expect(events.some((e) => e.event === 'fault' || e.event === 'spare-assigned')).toBe(false);
    expect(String(events.find((e) => e.event === 'fallback-restart')?.reason)).toMatch(/more than --max-recoveries 0 generations/);
    expect(r.stderr).toContain('restarting the group (restart 1 of 1)');
    expectAllGone(events);
  }, 90_000);

  it('SIGTERM to the launcher stops its ranks and spares', async () => {
    const l = launch(['--spares', '2']);
    await readyRanks(l);
    await l.waitFor('second spare', (e) => e.event === 'spare-started' && e.spare === 's1');
    l.kill('SIGTERM');
    const r = await l.done;
    expect(r.code).toBe(143);
    const events = l.events();
    expect(events.filter((e) => e.event === 'worker-started')).toHaveLength(4);
    expectAllGone(events);
  }, 90_000);

  it('two nodes: the ranks copy to the other node\'s holder; a rank lost on node 1 is replaced there; a silent node\'s rank on the surviving node', async () => {
    const port = String(await freePort());
    const file = join(work, 'events-nodes.jsonl');
    const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '1', '--spares', '1', '--heartbeat-timeout-ms', '1500'];
    const env = { NODETRON_STORE_TOKEN: 'recovery-test-token-0123456789', RECOVERY_FIXTURE_SECONDS: '8' };
    const node0 = launch([...common, '--node-rank', '0'], env, file);
    const node1 = launch([...common, '--node-rank', '1'], env, file);
    const [, pid1] = await readyRanks(node0);
    const spare1 = await node0.waitFor('node 1 spare', (e) => e.event === 'spare-started' && e.node === 1);
    const started = node0.events().filter((e) => e.event === 'started' && e.generation === 0);
    const holderOf = (rank: number) => started.find((e) => e.rank === rank)!.holder;
    expect(holderOf(0)).not.toEqual(holderOf(1));
    for (const e of started) expect(e.holderReachable).toBe(true);
    // Rank 1 (node 1) is killed: node 1's spare takes it, node 0's agent writes generation 1 into its abort file.
    process.kill(pid1!, 'SIGKILL');
    const first = await node0.waitFor('node 1 spare as rank 1', (e) => e.src === 'rank' && e.event === 'ready' && e.rank === 1 && e.generation === 1);
    expect(first.pid).toBe(spare1.pid);
    await node0.waitFor('rank 0 abort 1', (e) => e.src === 'rank' && e.rank === 0 && e.event === 'abort' && e.abortGeneration === 1);
    const spare1b = await node0.waitFor('node 1 second spare', (e) => e.event === 'spare-started' && e.node === 1 && e.spare === 's1');
    // Node 1 dies whole: its agent (and with it its holder), its rank and its spare.
    const killedAt = Date.now();
    node1.kill('SIGKILL');
    process.kill(first.pid!, 'SIGKILL');
    process.kill(spare1b.pid!, 'SIGKILL');
    const [r0] = await Promise.all([node0.done, node1.done]);
    const events = node0.events();
    expect(r0.code, r0.stderr).toBe(0);
    const faults = events.filter((e) => e.event === 'fault');
    expect(faults).toMatchObject([{ node: 1, generation: 1, lost: [1], how: 'exit' }, { node: 0, generation: 2, lost: [1], how: 'node', lostNode: 1 }]);
    expect(events.find((e) => e.src === 'rank' && e.event === 'started' && e.pid === first.pid)).toMatchObject({ rank: 1, generation: 1, holder: holderOf(1) });
    const fault = faults[1]!;
    console.log(`detection latency (node killed → fault event, --heartbeat-timeout-ms 1500): ${fault.t - killedAt} ms`);
    const assigned = events.filter((e) => e.event === 'spare-assigned')[1]!;
    expect(assigned).toMatchObject({ node: 0, rank: 1, generation: 2, spare: 's0' });
    // The replacement restores from where rank 1's copies were (node 0's holder, the one after node 1).
    const joined = events.find((e) => e.src === 'rank' && e.event === 'started' && e.pid === assigned.pid)!;
    expect(joined).toMatchObject({ rank: 1, generation: 2, joining: true, holder: holderOf(1), holderReachable: true });
    expect(events.some((e) => e.src === 'rank' && e.rank === 0 && e.event === 'abort' && e.abortGeneration === 2)).toBe(true);
    expect(r0.stderr).toContain('[nodetron launch node 0] generation 2: rank 1 lost (node); replaced by spare s0');
    expect(events.filter((e) => e.event === 'worker-started').map((e) => e.pid!).filter(alive)).toEqual([]);
  }, 90_000);

  it('parses --spares, --stop-timeout-ms and --max-recoveries', () => {
    const o = parseLaunchArgs(['--spares', '2', '--stop-timeout-ms', '250', '--max-recoveries=3', 's.ts'], {});
    expect(o).toMatchObject({ spares: 2, stopTimeoutMs: 250, maxRecoveries: 3 });
    expect(parseLaunchArgs(['s.ts'], {})).toMatchObject({ stopTimeoutMs: 1000, maxRecoveries: 100 });
    expect((parseLaunchArgs(['s.ts'], {}) as { spares?: number }).spares).toBeUndefined();
    expect(() => parseLaunchArgs(['--spares', '-1', 's.ts'], {})).toThrow(ArgumentError);
    expect(() => parseLaunchArgs(['--stop-timeout-ms', '10', 's.ts'], {})).toThrow(/needs|give --spares/);
  });
});
