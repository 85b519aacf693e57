// Tests of `nodetron launch` (run from source through test/fixtures/launch/launcher.ts): the
// environment contract, rank prefixes, fail-fast with the stderr tail, signals, restarts, two nodes
// on loopback forming one job, heartbeats, argument errors, a .ts script without tsx (an optional peer),
// and readLaunchEnv.
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { networkInterfaces, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it, vi } from 'vitest';
import { ArgumentError, distributed, UsageError } from '../../lib/index.js';
import { parseLaunchArgs } from '../../lib/launch/cli.js';
import { cpu } from '../../lib/native.js';
import { resolveTsx, scriptCommand, tsxSearchPath } from '../../lib/launch/workers.js';
import { freePort } from '../helpers/net.js';
import { nodeArgs } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixtures = join(root, 'test', 'fixtures', 'launch');

interface Run {
  code: number | null;
  stdout: string;
  stderr: string;
  ms: number;
}

interface Launch {
  pid: number;
  done: Promise<Run>;
  signal(s: NodeJS.Signals): void;
  /** Resolves once stdout holds `count` matches of `pattern` (start-up takes longer on a loaded machine). */
  stdoutMatches(pattern: RegExp, count: number, timeoutMs?: number): Promise<void>;
}

/** Starts a launcher from a directory other than the package root (the .ts loader must resolve from anywhere). */
function launch(args: string[], env: NodeJS.ProcessEnv = {}): Launch {
  const t0 = Date.now();
  const child = spawn(process.execPath, [...nodeArgs(join(fixtures, 'launcher.ts')), ...args], {
    cwd: root,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c) => (stdout += c));
  child.stderr.on('data', (c) => (stderr += c));
  const done = new Promise<Run>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr, ms: Date.now() - t0 })));
  const stdoutMatches = async (pattern: RegExp, count: number, timeoutMs = 30_000) => {
    const global = new RegExp(pattern.source, 'g');
    const deadline = Date.now() + timeoutMs;
    while ((stdout.match(global)?.length ?? 0) < count) {
      if (Date.now() > deadline) throw new Error(`stdout did not show ${count} x ${pattern} within ${timeoutMs} ms:\n${stdout}\n${stderr}`);
      await new Promise((r) => setTimeout(r, 50));
    }
  };
  return { pid: child.pid!, done, signal: (s) => child.kill(s), stdoutMatches };
}

const run = (args: string[], env?: NodeJS.ProcessEnv) => launch(args, env).done;

/** An IPv4 address of this host beyond loopback, if it has one. */
const hostAddress = Object.values(networkInterfaces()).flat().find((a) => a && !a.internal && a.family === 'IPv4')?.address;

const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('nodetron launch', () => {
  it('gives every rank the environment contract and passes script arguments', async () => {
    const r = await run(['--nproc-per-node', '3', join(fixtures, 'env.mjs'), 'x', '--flag']);
    expect(r.code).toBe(0);
    const envs = [...r.stdout.matchAll(/^\[rank (\d)\] ENV (\{.*\}) ARGS (.*)$/gm)].map((m) => ({ prefix: Number(m[1]), env: JSON.parse(m[2]!), args: JSON.parse(m[3]!) }));
    expect(envs.map((e) => e.prefix).sort()).toEqual([0, 1, 2]);
    const port = envs[0]!.env.MASTER_PORT;
    expect(Number(port)).toBeGreaterThan(0);
    for (const { prefix, env, args } of envs) {
      expect(env).toEqual({
        RANK: String(prefix),
        LOCAL_RANK: String(prefix),
        WORLD_SIZE: '3',
        LOCAL_WORLD_SIZE: '3',
        GROUP_RANK: '0',
        MASTER_ADDR: '127.0.0.1',
        MASTER_PORT: port,
        NODETRON_RESTART_COUNT: '0',
        NODETRON_STORE_PREFIX: 'nodetron/attempt0/job',
      });
      expect(args).toEqual(['x', '--flag']);
    }
  });

  it('prefixes every output line with its rank, never splitting a line', async () => {
    const r = await run(['--nproc-per-node', '2', join(fixtures, 'lines.mjs')]);
    expect(r.code).toBe(0);
    const lines = r.stdout.split('\n').filter((l) => l.length);
    expect(lines.length).toBe(2 * 51);
    for (const line of lines) {
      const m = /^\[rank (\d)\] r(\d)(-line(\d+)-x*-end| no newline at exit)$/.exec(line);
      expect(m, line).not.toBeNull();
      expect(m![1]).toBe(m![2]);
      if (m![4] !== undefined) expect(line.length - line.indexOf('-line') - `-line${m![4]}-`.length - '-end'.length).toBe(Number(m![4]) * 7);
    }
    expect(r.stderr).toContain('[rank 0] r0 on stderr');
    expect(r.stderr).toContain('[rank 1] r1 on stderr');
  });

  it('a rank exiting 1 stops the others within seconds and the report holds its stderr tail', async () => {
    const r = await run(['--nproc-per-node', '3', '--stop-grace-ms', '2000', join(fixtures, 'fail.mjs')], { FAIL_RANK: '1' });
    expect(r.code).toBe(1);
    // The healthy ranks sleep for 60 s; the launcher must have stopped them.
    expect(r.ms).toBeLessThan(15_000);
    expect(r.stderr).toMatch(/attempt 0 failed: rank 1 \(node 0, local rank 1, pid \d+\) exited with code 1/);
    const report = r.stderr.slice(r.stderr.indexOf('attempt 0 failed'));
    expect(report).toContain("last 20 line(s) of rank 1's stderr");
    expect(report).toContain('| failing rank stderr line 29');
    expect(report).toContain('| failing rank stderr line 10');
    expect(report).not.toContain('| failing rank stderr line 9\n');
    // Only the first failure is reported, not the ranks the launcher stopped.
    expect(report).not.toMatch(/rank [02] .*(SIGTERM|exited)/);
  });

  it('reports a rank killed by a signal', async () => {
    const r = await run(['--nproc-per-node', '2', join(fixtures, 'killed.mjs')]);
    expect(r.code).toBe(1);
    expect(r.ms).toBeLessThan(15_000);
    expect(r.stderr).toMatch(/rank 1 \(node 0, local rank 1, pid \d+\) was killed by SIGKILL/);
    expect(r.stderr).toContain('| about to be killed');
  });

  it('--max-restarts restarts the whole group with a new attempt number and store namespace', async () => {
    const r = await run(['--nproc-per-node', '2', '--max-restarts', '2', join(fixtures, 'restart.mjs')]);
    expect(r.code).toBe(0);
    expect(r.stderr).toContain('exited with code 3');
    expect(r.stderr).toContain('restarting the group (restart 1 of 2)');
    expect(r.stdout).toContain('[rank 0] attempt 1 ok nodetron/attempt1/job');
    expect(r.stdout).toContain('[rank 1] attempt 1 ok nodetron/attempt1/job');
    const without = await run(['--nproc-per-node', '2', join(fixtures, 'restart.mjs')]);
    expect(without.code).toBe(1);
    expect(without.stdout).not.toContain('attempt 1 ok');
  });

  it('two launchers with --nnodes 2 on loopback form one job of 4 ranks that meet in the store', async () => {
    const port = String(await freePort());
    const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '2'];
    // Node 1 starts first: it must wait for node 0's store to come up.
    const node1 = launch([...common, '--node-rank', '1', join(fixtures, 'meet.ts')]);
    await new Promise((r) => setTimeout(r, 300));
    const node0 = launch([...common, '--node-rank', '0', join(fixtures, 'meet.ts')]);
    const [r0, r1] = await Promise.all([node0.done, node1.done]);
    expect(r0.code, r0.stderr).toBe(0);
    expect(r1.code, r1.stderr).toBe(0);
    const meets = [...(r0.stdout + r1.stdout).matchAll(/^\[rank (\d)\] MEET rank=(\d) world=(\d) seen=(\d) arrived>=\d nodes=(.*)$/gm)];
    expect(meets.map((m) => Number(m[1])).sort()).toEqual([0, 1, 2, 3]);
    for (const m of meets) {
      expect(m[1]).toBe(m[2]);
      expect(m[3]).toBe('4');
      expect(m[4]).toBe('4');
      expect(m[5]).toBe('0,1');
    }
    expect(r0.stdout).toMatch(/^\[rank 0\]/m);
    expect(r1.stdout).toMatch(/^\[rank 2\]/m);
  });

  it('a failure on node 1 stops node 0 too, and both report it', async () => {
    const port = String(await freePort());
    const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '2', '--stop-grace-ms', '2000'];
    const node0 = launch([...common, '--node-rank', '0', join(fixtures, 'fail.mjs')], { FAIL_RANK: '3' });
    const node1 = launch([...common, '--node-rank', '1', join(fixtures, 'fail.mjs')], { FAIL_RANK: '3' });
    const [r0, r1] = await Promise.all([node0.done, node1.done]);
    expect(r0.code).toBe(1);
    expect(r1.code).toBe(1);
    expect(Math.max(r0.ms, r1.ms)).toBeLessThan(20_000);
    for (const r of [r0, r1]) {
      expect(r.stderr).toMatch(/attempt 0 failed: rank 3 \(node 1, local rank 1, pid \d+\) exited with code 1/);
      expect(r.stderr).toContain('| failing rank stderr line 29');
    }
    expect(r0.stderr).toContain('the failure was on node 1');
  });

  it('a node that stops heartbeating is reported and the job stopped', async () => {
    const port = String(await freePort());
    const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '1', '--heartbeat-timeout-ms', '1500', '--monitor-interval-ms', '100'];
    const node0 = launch([...common, '--node-rank', '0', join(fixtures, 'fail.mjs')], { FAIL_RANK: '-1' });
    const node1 = launch([...common, '--node-rank', '1', join(fixtures, 'fail.mjs')], { FAIL_RANK: '-1' });
    // Wait until both ranks run, then freeze node 1's launcher (its rank keeps running).
    await Promise.all([node0.stdoutMatches(/sleeping pid/, 1), node1.stdoutMatches(/sleeping pid/, 1)]);
    node1.signal('SIGSTOP');
    const r0 = await node0.done;
    node1.signal('SIGCONT');
    const r1 = await node1.done;
    expect(r0.code).toBe(1);
    expect(r0.stderr).toMatch(/node 1 stopped heartbeating \(no heartbeat for \d+ ms, limit 1500 ms\)/);
    // Node 1, once thawed, either sees the failure key or finds the store gone; either way it stops.
    expect(r1.code).toBe(1);
    expect(r1.stderr).toMatch(/stopped heartbeating|lost the rendezvous store/);
  });

  it('node 1 with no reachable master fails with a CommError naming the address', async () => {
    const port = String(await freePort());
    const r = await run(['--nnodes', '2', '--node-rank', '1', '--master-port', port, '--join-timeout-ms', '500', join(fixtures, 'env.mjs')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`CommError: could not reach the rendezvous store at 127.0.0.1:${port} within 500 ms`);
  });

  it('a node that never joins is a rendezvous timeout naming it', async () => {
    const port = String(await freePort());
    const r = await run(['--nnodes', '2', '--node-rank', '0', '--master-port', port, '--join-timeout-ms', '400', join(fixtures, 'env.mjs')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain('node(s) 1 of 2 did not join within 400 ms');
  });

  it('nodes must share the job token: a node with another token is refused at once, naming the variable', async () => {
    const port = String(await freePort());
    const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '1', '--join-timeout-ms', '20000'];
    const node0 = launch([...common, '--node-rank', '0', join(fixtures, 'env.mjs')], { NODETRON_STORE_TOKEN: 'the-right-token-0123456789' });
    const r1 = await run([...common, '--node-rank', '1', join(fixtures, 'env.mjs')], { NODETRON_STORE_TOKEN: 'a-wrong-token-0123456789' });
    expect(r1.code).toBe(1);
    expect(r1.stderr).toContain(`StoreAuthError: the rendezvous store at 127.0.0.1:${port} refused this client (authentication failed: wrong job token)`);
    expect(r1.stderr).toContain('same NODETRON_STORE_TOKEN');
    expect(r1.ms).toBeLessThan(15_000);
    // Node 0 is still in rendezvous, waiting for node 1 (no ranks started): nothing is left behind.
    node0.signal('SIGKILL');
    await node0.done;
  });

  it('a busy master port is an AddressInUseError naming the address before anything starts', async () => {
    const { main } = await import('../../lib/launch/cli.js');
    const blocker = await distributed.StoreServer.start();
    try {
      const err = await main(['--master-port', String(blocker.port), '--nproc-per-node', '1', join(fixtures, 'env.mjs')]).catch((e) => e);
      expect(err).toBeInstanceOf(distributed.AddressInUseError);
      expect(err.message).toBe(
        `the rendezvous store cannot listen on 127.0.0.1:${blocker.port}: the port is already in use (another job or an earlier run holds it); ` +
          'choose another --master-port / MASTER_PORT, or stop the process that holds it',
      );
    } finally {
      await blocker.close();
    }
  });

  it('a .ts script without tsx installed is one usage error (exit 2) saying how to get it; tsx is found in the project too', async () => {
    const { main } = await import('../../lib/launch/cli.js');
    const dir = mkdtempSync(join(tmpdir(), 'nt-no-tsx-'));
    try {
      // A project without tsx: nothing to resolve it from.
      const empty = join(dir, 'empty');
      mkdirSync(empty);
      writeFileSync(join(empty, 'package.json'), '{"name":"empty","private":true}');
      const hint = '`train.ts` is TypeScript: `nodetron launch` runs .ts scripts with tsx, an optional peer dependency that is not installed here; ' +
        'install it in your project (`npm install --save-dev tsx`) or launch a compiled .js';
      expect(() => scriptCommand('train.ts', [], [join(empty, 'package.json')])).toThrow(UsageError);
      expect(() => scriptCommand('train.ts', [], [join(empty, 'package.json')])).toThrow(hint);
      for (const ext of ['.mts', '.cts']) expect(() => scriptCommand(`s${ext}`, [], [join(empty, 'package.json')])).toThrow(/is TypeScript/);
      // JavaScript needs nothing.
      expect(scriptCommand('s.mjs', ['a'], [join(empty, 'package.json')])).toEqual([process.execPath, 's.mjs', 'a']);

      const errors: string[] = [];
      const spy = vi.spyOn(console, 'error').mockImplementation((...a: unknown[]) => void errors.push(a.join(' ')));
      let code: number;
      try {
        code = await main(['--nproc-per-node', '2', '--spares', '1', 'train.ts', '--steps', '1'], { tsxFrom: [join(empty, 'package.json')] });
      } finally {
        spy.mockRestore();
      }
      expect(code).toBe(2);
      expect(errors).toEqual([`nodetron launch: ${hint}`]);

      // A project that has tsx (a link to this checkout's) is where it is found when nodetron's own place has none.
      const project = join(dir, 'project');
      mkdirSync(join(project, 'node_modules'), { recursive: true });
      writeFileSync(join(project, 'package.json'), '{"name":"project","private":true}');
      symlinkSync(join(root, 'node_modules', 'tsx'), join(project, 'node_modules', 'tsx'));
      const loader = resolveTsx([join(empty, 'package.json'), join(project, 'package.json')]);
      expect(loader).toBe(pathToFileURL(realpathSync(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs'))).href);
      expect(scriptCommand('s.ts', ['a'], [join(empty, 'package.json'), join(project, 'package.json')])).toEqual([process.execPath, '--import', loader, 's.ts', 'a']);
      expect(resolveTsx([join(empty, 'package.json')])).toBeUndefined();
      // By default nodetron's own place comes first, then the working directory's project.
      expect(tsxSearchPath(project)).toEqual([expect.stringMatching(/^file:.*\/launch\/workers\.(ts|js)$/), join(project, 'package.json')]);
      expect(resolveTsx()).toBe(pathToFileURL(realpathSync(join(root, 'node_modules', 'tsx', 'dist', 'loader.mjs'))).href);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  // A one-node launch told to serve on this host's address (--master-addr): its ranks dial that address,
  // so the store must listen there (with the token the launcher made), not on loopback only.
  it.skipIf(hostAddress === undefined)('one node with --master-addr set to this host: the ranks reach the store there', async () => {
    const r = await run(['--nproc-per-node', '2', '--master-addr', hostAddress!, join(fixtures, 'meet.ts')]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('[rank 0] MEET rank=0 world=2 seen=2');
    expect(r.stdout).toContain('[rank 1] MEET rank=1 world=2 seen=2');
  });

  it('the ranks get the job token and the store refuses clients without it', async () => {
    const r = await run(['--nproc-per-node', '1', join(fixtures, 'token.ts')]);
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^\[rank 0\] TOKEN length=64 refused=StoreAuthError$/m);
  });

  it('SIGTERM to the launcher stops its ranks', async () => {
    const l = launch(['--nproc-per-node', '2', join(fixtures, 'fail.mjs')], { FAIL_RANK: '-1' });
    await l.stdoutMatches(/sleeping pid/, 2);
    l.signal('SIGTERM');
    const r = await l.done;
    expect(r.code).toBe(143);
    expect(r.stderr).toContain('received SIGTERM');
    const pids = [...r.stdout.matchAll(/sleeping pid (\d+)/g)].map((m) => Number(m[1]));
    expect(pids.length).toBe(2);
    for (const pid of pids) expect(alive(pid)).toBe(false);
  });

  it.skipIf(process.platform !== 'linux')('a launcher killed with SIGKILL leaves no worker behind (the kernel ends them with it)', async () => {
    const l = launch(['--nproc-per-node', '2', join(fixtures, 'orphan.ts')]);
    await l.stdoutMatches(/WORKER \d+/, 2, 60_000);
    l.signal('SIGKILL');
    const r = await l.done;
    const pids = [...r.stdout.matchAll(/WORKER (\d+)/g)].map((m) => Number(m[1]));
    expect(pids.length).toBe(2);
    // (The workers sleep for a minute: without the parent-death signal they would outlive this wait.
    // A killed orphan may stay a zombie until whatever adopted it reaps it: that counts as ended.)
    const running = (pid: number) => {
      try { return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8')); } catch { return false; }
    };
    const deadline = Date.now() + 10_000;
    while (pids.some(running) && Date.now() < deadline) await new Promise((res) => setTimeout(res, 50));
    for (const pid of pids) expect(running(pid), `worker ${pid}`).toBe(false);
    // (Only bad arguments here: a good one would tie this test process to its parent.)
    for (const bad of [0, 65, 1.5, '9']) expect(() => cpu().setParentDeathSignal(bad as number)).toThrow(ArgumentError);
  });

  it('bad arguments are usage errors (exit 2) with the reason', async () => {
    const r = await run(['--nproc-per-node', 'zero', 'x.mjs']);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain('--nproc-per-node expects an integer');
    expect(() => parseLaunchArgs(['--nnodes', '2', 'x.mjs'])).toThrow(/--master-port is required/);
    expect(() => parseLaunchArgs(['--nnodes', '2', '--node-rank', '2', '--master-port', '1', 'x.mjs'])).toThrow(ArgumentError);
    expect(() => parseLaunchArgs(['--bogus', '1', 'x.mjs'])).toThrow(/unknown option --bogus/);
    expect(() => parseLaunchArgs(['--nproc-per-node', '2'])).toThrow(/no script/);
    expect(() => parseLaunchArgs(['--rdzv', 'tcp://a:1', 'x.mjs'])).toThrow(/redis:\/\//);
    const ok = parseLaunchArgs(['--nproc-per-node=auto', '--max-restarts', '3', 's.ts', '--nnodes', '7']);
    expect(ok).toMatchObject({ nprocPerNode: 'auto', maxRestarts: 3, script: 's.ts', scriptArgs: ['--nnodes', '7'], nnodes: 1 });
  });
});

const haveRedis = spawnSync('redis-server', ['--version']).status === 0;
if (!haveRedis) console.warn('launch --rdzv redis test skipped: redis-server is not installed (apt-get install -y redis-server)');

describe.skipIf(!haveRedis)('nodetron launch --rdzv redis://', () => {
  it('two launchers meet through Redis; ranks get NODETRON_RDZV and use the Redis store', async () => {
    const redisPort = await freePort();
    const redis = spawn('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
    try {
      const port = String(await freePort());
      const runId = `t${Date.now()}`;
      const common = ['--nnodes', '2', '--master-port', port, '--nproc-per-node', '1', '--rdzv', `redis://127.0.0.1:${redisPort}`, '--run-id', runId];
      const node0 = launch([...common, '--node-rank', '0', join(fixtures, 'meet.ts')]);
      const node1 = launch([...common, '--node-rank', '1', join(fixtures, 'meet.ts')]);
      const [r0, r1] = await Promise.all([node0.done, node1.done]);
      expect(r0.code, r0.stderr).toBe(0);
      expect(r1.code, r1.stderr).toBe(0);
      expect(r0.stdout).toContain('[rank 0] MEET rank=0 world=2 seen=2');
      expect(r1.stdout).toContain('[rank 1] MEET rank=1 world=2 seen=2');
      // The ranks' keys are in Redis under the run's namespace.
      const store = await distributed.RedisStore.connect({ port: redisPort, timeoutMs: 5000 });
      expect((await store.keys(`${runId}/attempt0/job/rank/`)).sort()).toEqual([`${runId}/attempt0/job/rank/0`, `${runId}/attempt0/job/rank/1`]);
      await store.close();
    } finally {
      redis.kill('SIGTERM');
    }
  });
});

describe('readLaunchEnv', () => {
  it('defaults to a single process', () => {
    expect(distributed.readLaunchEnv({})).toEqual({
      rank: 0, localRank: 0, worldSize: 1, localWorldSize: 1, groupRank: 0,
      masterAddr: '127.0.0.1', masterPort: 29500, restartCount: 0, storePrefix: 'attempt0',
    });
  });

  it('reads the launcher contract', () => {
    const env = distributed.readLaunchEnv({
      RANK: '5', LOCAL_RANK: '1', WORLD_SIZE: '8', LOCAL_WORLD_SIZE: '4', GROUP_RANK: '1', MASTER_ADDR: 'node0',
      MASTER_PORT: '1234', NODETRON_RESTART_COUNT: '2', NODETRON_STORE_PREFIX: 'job/attempt2/job', NODETRON_RDZV: 'redis://r:6379',
    });
    expect(env).toEqual({
      rank: 5, localRank: 1, worldSize: 8, localWorldSize: 4, groupRank: 1, masterAddr: 'node0', masterPort: 1234,
      restartCount: 2, storePrefix: 'job/attempt2/job', rdzvUrl: 'redis://r:6379',
    });
  });

  it('names the bad variable', () => {
    const bad: [NodeJS.ProcessEnv, RegExp][] = [
      [{ RANK: 'x' }, /RANK="x"/],
      [{ WORLD_SIZE: '0' }, /WORLD_SIZE=0/],
      [{ RANK: '4', WORLD_SIZE: '4' }, /environment variable RANK=4 must be below WORLD_SIZE=4/],
      [{ WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2', LOCAL_RANK: '2' }, /LOCAL_RANK=2/],
      [{ MASTER_PORT: '70000' }, /MASTER_PORT=70000/],
      [{ NODETRON_RESTART_COUNT: '-1' }, /NODETRON_RESTART_COUNT/],
      [{ NODETRON_RDZV: 'redis-host' }, /NODETRON_RDZV/],
    ];
    for (const [env, message] of bad) {
      expect(() => distributed.readLaunchEnv(env)).toThrow(ArgumentError);
      expect(() => distributed.readLaunchEnv(env)).toThrow(message);
    }
    expect(distributed.readLaunchEnv({ RANK: '3', WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2' })).toMatchObject({ localRank: 1, groupRank: 1 });
  });

  it('init() checks a LaunchEnv given to it by the same layout rules as the variables', async () => {
    const good = distributed.readLaunchEnv({});
    expect(() => distributed.readLaunchEnv({ WORLD_SIZE: '1', LOCAL_WORLD_SIZE: '2' })).toThrow(/environment variable LOCAL_WORLD_SIZE=2 must be at most WORLD_SIZE=1/);
    // More ranks on this node than in the job: refused before anything is served or connected.
    const err = await distributed.init({ env: { ...good, localWorldSize: 2 } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ArgumentError);
    expect((err as Error).message).toBe('init: env.localWorldSize 2 must be at most env.worldSize 1');
    expect(distributed.isInitialized()).toBe(false);
  });
});
