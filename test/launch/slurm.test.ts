// Tests of cluster environments: Slurm hostlist expansion, readLaunchEnv under srun and mpirun
// variables (explicit variables win; contradictions are typed errors), the launcher's Slurm defaults,
// and jobs started through a simulated Slurm environment on loopback: 4 srun-style tasks over 2
// "nodes" (rank 0's init() serves the store), and 2 `nodetron launch` tasks, one per "node".
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { ArgumentError, distributed } from '../../lib/index.js';
import { expandHostlist, expandTasksPerNode, readClusterEnv } from '../../lib/distributed/cluster-env.js';
import { launchStoreSecurity, parseLaunchArgs } from '../../lib/launch/cli.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const TOKEN = 'slurm-test-token-0123456789';

/** Slurm's variables for task `rank` of `tasks` over `nodes` nodes (block placement), as srun sets them. */
function slurmTask(rank: number, tasks: number, nodes: number, nodelist: string, jobId: number): NodeJS.ProcessEnv {
  const perNode = tasks / nodes;
  return {
    SLURM_PROCID: String(rank), SLURM_NTASKS: String(tasks), SLURM_LOCALID: String(rank % perNode), SLURM_NODEID: String(Math.floor(rank / perNode)),
    SLURM_NNODES: String(nodes), SLURM_NODELIST: nodelist, SLURM_JOB_NODELIST: nodelist, SLURM_TASKS_PER_NODE: `${perNode}(x${nodes})`,
    SLURM_JOB_ID: String(jobId),
  };
}

describe('Slurm hostlists', () => {
  it('expands ranges, lists, zero padding and several bracket groups, in order', () => {
    expect(expandHostlist('gpu[01-03,07],other')).toEqual(['gpu01', 'gpu02', 'gpu03', 'gpu07', 'other']);
    expect(expandHostlist('node7')).toEqual(['node7']);
    expect(expandHostlist('a[8-11]')).toEqual(['a8', 'a9', 'a10', 'a11']);
    expect(expandHostlist('rack[1-2]-n[1-2]')).toEqual(['rack1-n1', 'rack1-n2', 'rack2-n1', 'rack2-n2']);
    expect(expandHostlist('127.0.0.[1-2]')).toEqual(['127.0.0.1', '127.0.0.2']);
    expect(expandHostlist('x[009-011],y[1]')).toEqual(['x009', 'x010', 'x011', 'y1']);
    expect(expandHostlist('')).toEqual([]);
    expect(expandHostlist('gpu[001-512]')).toHaveLength(512);
  });

  it('malformed lists are ArgumentErrors naming the variable', () => {
    for (const bad of ['gpu[1-', 'gpu1]', 'gpu[3-1]', 'a,,b', 'gpu[x]', 'gpu[1-2', 'n[1-100000000]', 'a[1-4096][1-4096]']) {
      expect(() => expandHostlist(bad, 'environment variable SLURM_NODELIST'), bad).toThrow(ArgumentError);
      expect(() => expandHostlist(bad, 'environment variable SLURM_NODELIST'), bad).toThrow(/SLURM_NODELIST/);
    }
  });

  it('expands tasks per node', () => {
    expect(expandTasksPerNode('8(x2),4')).toEqual([8, 8, 4]);
    expect(expandTasksPerNode('2')).toEqual([2]);
    expect(() => expandTasksPerNode('8(2)')).toThrow(/SLURM_TASKS_PER_NODE/);
  });
});

describe('readLaunchEnv under srun and mpirun', () => {
  it('reads a 2 nodes x 8 GPUs srun task: ranks, node, first host as master, a port from the job id', () => {
    const env = distributed.readLaunchEnv(slurmTask(9, 16, 2, 'gpu[01-02]', 123_456));
    expect(env).toEqual({
      rank: 9, localRank: 1, worldSize: 16, localWorldSize: 8, groupRank: 1, masterAddr: 'gpu01', masterPort: 15000 + (123_456 % 15000),
      restartCount: 0, storePrefix: 'attempt0', cluster: 'slurm',
    });
    // SLURM_STEP_* describe the step and win over the allocation's values.
    const step = distributed.readLaunchEnv({ ...slurmTask(0, 16, 2, 'gpu[01-04]', 5), SLURM_STEP_NODELIST: 'gpu[03-04]', SLURM_NNODES: '4', SLURM_STEP_NUM_NODES: '2' });
    expect(step.masterAddr).toBe('gpu03');
    // One node: loopback, whatever the node's name.
    expect(distributed.readLaunchEnv(slurmTask(3, 8, 1, 'gpu05', 7)).masterAddr).toBe('127.0.0.1');
  });

  it('explicit variables win over Slurm and MPI ones', () => {
    const slurm = slurmTask(9, 16, 2, 'gpu[01-02]', 1);
    expect(distributed.readLaunchEnv({ ...slurm, MASTER_ADDR: '10.0.0.5', MASTER_PORT: '29400' })).toMatchObject({ rank: 9, masterAddr: '10.0.0.5', masterPort: 29400 });
    // A launcher's rank (RANK and WORLD_SIZE) replaces the srun task's layout entirely.
    const launched = distributed.readLaunchEnv({ ...slurm, RANK: '3', WORLD_SIZE: '4', LOCAL_WORLD_SIZE: '2' });
    expect(launched).toMatchObject({ rank: 3, worldSize: 4, localRank: 1, groupRank: 1 });
    expect(launched.cluster).toBeUndefined();
    // mpirun inside a Slurm allocation: Open MPI's variables describe the process, the batch step's SLURM_PROCID is stale.
    const mpi = distributed.readLaunchEnv({
      ...slurmTask(0, 1, 1, 'gpu01', 1), OMPI_COMM_WORLD_RANK: '5', OMPI_COMM_WORLD_SIZE: '8', OMPI_COMM_WORLD_LOCAL_RANK: '1', OMPI_COMM_WORLD_LOCAL_SIZE: '4',
      MASTER_ADDR: 'gpu01',
    });
    expect(mpi).toMatchObject({ rank: 5, worldSize: 8, localRank: 1, localWorldSize: 4, groupRank: 1, masterAddr: 'gpu01', masterPort: 29500, cluster: 'mpi' });
    const oneNode = distributed.readLaunchEnv({ OMPI_COMM_WORLD_RANK: '2', OMPI_COMM_WORLD_SIZE: '4', OMPI_COMM_WORLD_LOCAL_RANK: '2', OMPI_COMM_WORLD_LOCAL_SIZE: '4' });
    expect(oneNode).toMatchObject({ rank: 2, masterAddr: '127.0.0.1', groupRank: 0 });
    expect(distributed.readLaunchEnv({ ...slurm, NODETRON_STORE_TOKEN: TOKEN }).storeToken).toBe(TOKEN);
  });

  it('malformed and contradictory variables are ArgumentErrors naming them', () => {
    const base = slurmTask(1, 4, 2, 'n[1-2]', 1);
    const bad: [NodeJS.ProcessEnv, RegExp][] = [
      [{ ...base, SLURM_PROCID: '4' }, /SLURM_PROCID=4 must be < SLURM_NTASKS=4/],
      [{ ...base, SLURM_PROCID: 'x' }, /SLURM_PROCID="x"/],
      [{ ...base, SLURM_NTASKS: undefined }, /SLURM_NTASKS is not set/],
      [{ ...base, SLURM_NODEID: '2' }, /SLURM_NODEID=2 must be < SLURM_NNODES=2/],
      [{ ...base, SLURM_NODELIST: 'n1', SLURM_JOB_NODELIST: 'n1' }, /names 1 host\(s\), but SLURM_NNODES=2/],
      [{ ...base, SLURM_NODELIST: 'n[1-', SLURM_JOB_NODELIST: 'n[1-' }, /SLURM_JOB_NODELIST/],
      [{ ...base, SLURM_TASKS_PER_NODE: '3,2' }, /adds up to 5 tasks, but SLURM_NTASKS=4/],
      [{ ...base, SLURM_TASKS_PER_NODE: '4' }, /lists 1 node\(s\), but SLURM_NNODES=2/],
      [{ ...base, SLURM_LOCALID: '2' }, /SLURM_LOCALID=2 must be < the 2 task\(s\)/],
      [{ ...base, SLURM_NNODES: '8' }, /more nodes than tasks/],
      [{ ...base, SLURM_JOB_ID: 'abc' }, /SLURM_JOB_ID="abc"/],
      [{ ...base, NODETRON_STORE_TOKEN: 'short' }, /NODETRON_STORE_TOKEN/],
      [{ OMPI_COMM_WORLD_RANK: '1', OMPI_COMM_WORLD_SIZE: '4', OMPI_COMM_WORLD_LOCAL_RANK: '1', OMPI_COMM_WORLD_LOCAL_SIZE: '2' }, /set MASTER_ADDR/],
      [{ OMPI_COMM_WORLD_RANK: '4', OMPI_COMM_WORLD_SIZE: '4', OMPI_COMM_WORLD_LOCAL_RANK: '0', OMPI_COMM_WORLD_LOCAL_SIZE: '4' }, /OMPI_COMM_WORLD_RANK=4 must be < OMPI_COMM_WORLD_SIZE=4/],
      [{ OMPI_COMM_WORLD_RANK: '1', OMPI_COMM_WORLD_SIZE: '4' }, /OMPI_COMM_WORLD_LOCAL_RANK is not set/],
      [{ OMPI_COMM_WORLD_RANK: '1', OMPI_COMM_WORLD_SIZE: '5', OMPI_COMM_WORLD_LOCAL_RANK: '1', OMPI_COMM_WORLD_LOCAL_SIZE: '2', MASTER_ADDR: 'a' }, /same number of processes on every node/],
      [{ OMPI_COMM_WORLD_RANK: '2', OMPI_COMM_WORLD_SIZE: '4', OMPI_COMM_WORLD_LOCAL_RANK: '1', OMPI_COMM_WORLD_LOCAL_SIZE: '2', MASTER_ADDR: 'a' }, /not placed node by node/],
    ];
    for (const [env, message] of bad) {
      expect(() => distributed.readLaunchEnv(env), String(message)).toThrow(ArgumentError);
      expect(() => distributed.readLaunchEnv(env), String(message)).toThrow(message);
    }
    expect(readClusterEnv({})).toBeUndefined();
  });

  it('init() on rank 0 of a multi-node srun job refuses to serve the store without a token; a busy port is one line', async () => {
    const env = distributed.readLaunchEnv(slurmTask(0, 16, 2, 'gpu[01-02]', 42));
    await expect(distributed.init({ env, backend: 'gloo' })).rejects.toThrow(/export NODETRON_STORE_TOKEN=\$\(openssl rand -hex 32\)/);
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', () => r()));
    const port = (taken.address() as { port: number }).port;
    const oneNode = distributed.readLaunchEnv({ ...slurmTask(0, 2, 1, 'gpu01', 42), MASTER_PORT: String(port), NODETRON_STORE_TOKEN: TOKEN });
    const err = await distributed.init({ env: oneNode, backend: 'gloo' }).catch((e) => e);
    expect(err).toBeInstanceOf(distributed.AddressInUseError);
    expect(err.message).toContain(`127.0.0.1:${port}`);
    expect(err.message).not.toContain('\n');
    expect(distributed.isInitialized()).toBe(false);
    await new Promise<void>((r) => taken.close(() => r()));
  });
});

describe('nodetron launch under srun', () => {
  it('takes --nnodes, --node-rank, --master-addr and --master-port from Slurm; flags and MASTER_* win', () => {
    const env = slurmTask(1, 2, 2, 'gpu[07-08]', 1000);
    expect(parseLaunchArgs(['s.js'], env)).toMatchObject({ nnodes: 2, nodeRank: 1, masterAddr: 'gpu07', masterPort: 15000 + 1000 });
    expect(parseLaunchArgs(['--master-port', '2000', '--master-addr', 'h', 's.js'], env)).toMatchObject({ masterAddr: 'h', masterPort: 2000 });
    expect(parseLaunchArgs(['s.js'], { ...env, MASTER_ADDR: 'ib-gpu07', MASTER_PORT: '3000' })).toMatchObject({ masterAddr: 'ib-gpu07', masterPort: 3000 });
    // MASTER_PORT is read as init() reads it (one reader of launch variables), naming the variable.
    expect(() => parseLaunchArgs(['s.js'], { ...env, MASTER_PORT: '70000' })).toThrow(/^environment variable MASTER_PORT=70000 must be an integer in \[1, 65535\]$/);
    expect(() => distributed.readLaunchEnv({ MASTER_PORT: '70000' })).toThrow(/^environment variable MASTER_PORT=70000 must be an integer in \[1, 65535\]$/);
    expect(parseLaunchArgs(['--nnodes', '1', 's.js'], env)).toMatchObject({ nnodes: 1, nodeRank: 0 });
    // One node: the store listens on loopback, so its ranks must dial loopback, whatever MASTER_ADDR a batch file exported.
    const oneNode = parseLaunchArgs(['s.js'], { ...slurmTask(0, 1, 1, 'gpu01', 1000), MASTER_ADDR: 'gpu01' });
    expect(oneNode).toMatchObject({ nnodes: 1, masterAddr: '127.0.0.1' });
    expect(launchStoreSecurity(oneNode, {}).listenHost).toBe(oneNode.masterAddr);
    // srun started one task per GPU: the launcher is the wrong tool there.
    expect(() => parseLaunchArgs(['s.js'], slurmTask(1, 16, 2, 'gpu[07-08]', 1000))).toThrow(/one task per node/);
    expect(parseLaunchArgs(['s.js'], {})).toMatchObject({ nnodes: 1, nodeRank: 0, masterAddr: '127.0.0.1', masterPort: undefined });
  });
});

/** A free loopback port in Slurm's derived range (15000..29999), so a job id can point at it. */
async function freeSlurmPort(): Promise<number> {
  for (;;) {
    const port = 15000 + Math.floor(Math.random() * 15000);
    const srv = createServer();
    const ok = await new Promise<boolean>((r) => {
      srv.once('error', () => r(false));
      srv.listen(port, '127.0.0.1', () => r(true));
    });
    if (ok) {
      await new Promise<void>((r) => srv.close(() => r()));
      return port;
    }
  }
}

interface Proc { code: number | null; stdout: string; stderr: string }

function runNode(args: string[], env: NodeJS.ProcessEnv, limitMs: number): Promise<Proc> {
  // The test's own launch variables must not leak into the simulated tasks.
  const clean = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|MASTER_ADDR|MASTER_PORT|SLURM_.*|OMPI_.*|NODETRON_STORE_TOKEN|NODETRON_STORE_PREFIX)$/.test(k)));
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [...nodeArgs(args[0]!), ...args.slice(1)], { cwd: root, env: { ...clean, NODETRON_WARN_LEAKS: '0', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c) => (stdout += c));
    child.stderr.on('data', (c) => (stderr += c));
    const timer = setTimeout(() => child.kill('SIGKILL'), limitMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

describe('jobs started through a simulated Slurm environment (2 "nodes" on loopback)', () => {
  const pool = new JobPool(1);

  it('srun one task per GPU: 4 tasks over 127.0.0.[1-2] join with no wrapper and all-reduce', async () => {
    await pool.run(async () => {
      const port = await freeSlurmPort();
      const jobId = 7 * 15000 + (port - 15000);
      const tasks = await Promise.all([0, 1, 2, 3].map((r) =>
        runNode([join(root, 'test', 'fixtures', 'launch', 'cluster-task.ts')], { ...slurmTask(r, 4, 2, '127.0.0.[1-2]', jobId), NODETRON_STORE_TOKEN: TOKEN }, 180_000)));
      for (const [r, t] of tasks.entries()) {
        expect(t.code, `task ${r}:\n${t.stdout}\n${t.stderr}`).toBe(0);
        const out = JSON.parse(t.stdout.trim().split('\n').pop()!);
        expect(out).toEqual({
          rank: r, worldSize: 4, localRank: r % 2, localWorldSize: 2, groupRank: Math.floor(r / 2), masterAddr: '127.0.0.1', masterPort: port,
          cluster: 'slurm', token: true, sum: 10,
        });
      }
    });
  }, QUEUED_TEST_TIMEOUT_MS);

  it('srun one task per node: two `nodetron launch` tasks form one job of 4 ranks', async () => {
    await pool.run(async () => {
      const port = await freeSlurmPort();
      const jobId = 3 * 15000 + (port - 15000);
      const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
      const script = join(root, 'test', 'fixtures', 'launch', 'cluster-task.ts');
      const nodes = await Promise.all([0, 1].map((n) =>
        runNode([launcher, '--nproc-per-node', '2', scriptPath(script)], { ...slurmTask(n, 2, 2, '127.0.0.[1-2]', jobId), NODETRON_STORE_TOKEN: TOKEN }, 180_000)));
      const results: { rank: number; sum: number; cluster: string | null; token: boolean; groupRank: number; masterPort: number }[] = [];
      for (const [n, node] of nodes.entries()) {
        expect(node.code, `node ${n}:\n${node.stdout}\n${node.stderr}`).toBe(0);
        for (const m of node.stdout.matchAll(/^\[rank \d\] (\{.*\})$/gm)) results.push(JSON.parse(m[1]!));
      }
      expect(results.map((r) => r.rank).sort()).toEqual([0, 1, 2, 3]);
      for (const r of results) {
        expect(r).toMatchObject({ sum: 10, cluster: null, token: true, groupRank: Math.floor(r.rank / 2), masterPort: port });
      }
    });
  }, QUEUED_TEST_TIMEOUT_MS);
});
