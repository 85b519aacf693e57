// What a cluster's own launcher tells each process: Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_NODELIST, ...) and Open MPI's mpirun (OMPI_COMM_WORLD_*), read into ranks, nodes and the
// master's address, so `srun`/`mpirun` start a job with no wrapper. Slurm's hostlist syntax
// (`gpu[01-03,07],other`) is expanded here. lib/distributed/env.ts merges this under the explicit
// variables (RANK, WORLD_SIZE, MASTER_ADDR, ...), which always win.
import { ArgumentError } from '../errors.js';

/** A job's layout as a cluster launcher (srun, mpirun) describes it to one process. */
export interface ClusterEnv {
  /** Which launcher: 'slurm' (srun) or 'mpi' (Open MPI's mpirun). */
  kind: 'slurm' | 'mpi';
  /** Global rank of this process (SLURM_PROCID, OMPI_COMM_WORLD_RANK). */
  rank: number;
  /** Processes in the job (SLURM_NTASKS, OMPI_COMM_WORLD_SIZE). */
  worldSize: number;
  /** Rank on this node (SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK). */
  localRank: number;
  /** Processes on this node (from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE, OMPI_COMM_WORLD_LOCAL_SIZE). */
  localWorldSize: number;
  /** This node's index (SLURM_NODEID; under MPI rank / local size, which assumes ranks placed by node). */
  nodeRank: number;
  /** Nodes in the job (SLURM_NNODES; under MPI world size / local size). */
  nnodes: number;
  /** Host of rank 0's store: the first host of the node list under Slurm (127.0.0.1 on one node); undefined under MPI across nodes. */
  masterAddr: string | undefined;
  /** Port of rank 0's store: under Slurm 15000 + SLURM_JOB_ID mod 15000, so every job on a node gets its own; undefined under MPI. */
  masterPort: number | undefined;
  /** The scheduler's job id (SLURM_JOB_ID, or Open MPI's OMPI_MCA_orte_ess_jobid / PMIX_NAMESPACE when given). */
  jobId: string | undefined;
  /** The job's hosts, expanded from the node list (Slurm only). */
  hosts: string[];
}

/** Most hosts one hostlist may expand to: a typo such as `n[1-100000000]` must not exhaust memory. */
const MAX_HOSTS = 1 << 20;

/** Splits `text` at commas that are not inside brackets. */
function splitTopLevel(text: string, what: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '[') depth++;
    else if (c === ']') {
      depth--;
      if (depth < 0) throw new ArgumentError(`${what}: unbalanced ']' at character ${i} of ${JSON.stringify(text)}`);
    } else if (c === ',' && depth === 0) {
      parts.push(text.slice(start, i));
      start = i + 1;
    }
  }
  if (depth !== 0) throw new ArgumentError(`${what}: unbalanced '[' in ${JSON.stringify(text)}`);
  parts.push(text.slice(start));
  return parts;
}

/** Expands one bracket's ranges (`01-03,07`) into the strings they stand for, zero padding kept. */
function expandRanges(ranges: string, what: string, whole: string): string[] {
  const out: string[] = [];
  for (const r of ranges.split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(r.trim());
    if (!m) throw new ArgumentError(`${what}: ${JSON.stringify(r)} in ${JSON.stringify(whole)} is not a number or a range a-b`);
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo) throw new ArgumentError(`${what}: the range ${r} in ${JSON.stringify(whole)} runs backwards`);
    if (hi - lo + out.length >= MAX_HOSTS) throw new ArgumentError(`${what}: ${JSON.stringify(whole)} expands to more than ${MAX_HOSTS} hosts`);
    const width = m[1]!.length;
    for (let v = lo; v <= hi; v++) out.push(String(v).padStart(width, '0'));
  }
  return out;
}

/**
 * Expands a Slurm hostlist (`gpu[01-03,07],login,rack[1-2]-n[1-2]`) into host names, in order:
 * comma-separated items, each with any number of bracketed ranges (zero padding kept; `[a-b]` and
 * `[a,b]` forms). Throws ArgumentError naming the variable for malformed text.
 */
export function expandHostlist(list: string, what = 'hostlist'): string[] {
  const text = list.trim();
  if (text === '') return [];
  const hosts: string[] = [];
  for (const item of splitTopLevel(text, what)) {
    const name = item.trim();
    if (name === '') throw new ArgumentError(`${what}: empty host name in ${JSON.stringify(list)}`);
    // Cartesian product of the item's literal pieces and bracket groups, left to right.
    let partial = [''];
    for (const piece of name.split(/(\[[^\]]*\])/)) {
      if (piece === '') continue;
      if (piece.startsWith('[')) {
        const values = expandRanges(piece.slice(1, -1), what, list);
        if (partial.length * values.length + hosts.length > MAX_HOSTS) {
          throw new ArgumentError(`${what}: ${JSON.stringify(list)} expands to more than ${MAX_HOSTS} hosts`);
        }
        partial = partial.flatMap((p) => values.map((v) => p + v));
      } else {
        if (/[[\]\s]/.test(piece)) throw new ArgumentError(`${what}: ${JSON.stringify(piece)} in ${JSON.stringify(list)} is not a host name`);
        partial = partial.map((p) => p + piece);
      }
    }
    hosts.push(...partial);
  }
  return hosts;
}

/**
 * Expands Slurm's tasks-per-node text (`8(x2),4` = 8, 8, 4) into one count per node. Throws
 * ArgumentError naming the variable for malformed text.
 */
export function expandTasksPerNode(text: string, what = 'SLURM_TASKS_PER_NODE'): number[] {
  const counts: number[] = [];
  for (const item of text.split(',')) {
    const m = /^\s*(\d+)(?:\(x(\d+)\))?\s*$/.exec(item);
    if (!m) throw new ArgumentError(`environment variable ${what}=${JSON.stringify(text)}: ${JSON.stringify(item)} is not N or N(xK)`);
    const repeat = m[2] === undefined ? 1 : Number(m[2]);
    if (counts.length + repeat > MAX_HOSTS) throw new ArgumentError(`environment variable ${what}=${JSON.stringify(text)} lists more than ${MAX_HOSTS} nodes`);
    for (let i = 0; i < repeat; i++) counts.push(Number(m[1]));
  }
  return counts;
}

/**
 * An integer environment variable in [min, max], or undefined when it is unset or empty; an
 * ArgumentError naming the variable and its text when it is anything else. Every launch variable
 * (torchrun's, Slurm's, Open MPI's) is read through it.
 */
export function intOf(env: NodeJS.ProcessEnv, name: string, min: number, max = Number.MAX_SAFE_INTEGER): number | undefined {
  const text = env[name]?.trim();
  if (text === undefined || text === '') return undefined;
  if (!/^\d+$/.test(text) || !Number.isSafeInteger(Number(text)) || Number(text) < min || Number(text) > max) {
    const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `in [${min}, ${max}]`;
    throw new ArgumentError(`environment variable ${name}=${/^\d+$/.test(text) ? text : JSON.stringify(env[name])} must be an integer ${range}`);
  }
  return Number(text);
}

/** The numbers of a launch layout whose relations {@link checkLayout} checks. */
export interface Layout {
  /** Global rank. */
  rank: number;
  /** Ranks in the job. */
  worldSize: number;
  /** Rank on this node. */
  localRank: number;
  /** Ranks on this node. */
  localWorldSize: number;
}

/**
 * Checks the relations of a layout, for readLaunchEnv (from variables) and init() (a LaunchEnv given
 * to it): rank below worldSize, localWorldSize at most worldSize, localRank below localWorldSize.
 * `label` names a value as its source does (`RANK=4`, `env.rank 4`), `prefix` starts the message.
 */
export function checkLayout(l: Layout, label: (k: keyof Layout) => string, prefix: string): void {
  const check = (ok: boolean, a: keyof Layout, relation: string, b: keyof Layout) => {
    if (!ok) throw new ArgumentError(`${prefix}${label(a)} must be ${relation} ${label(b)}`);
  };
  check(l.rank < l.worldSize, 'rank', 'below', 'worldSize');
  check(l.localWorldSize <= l.worldSize, 'localWorldSize', 'at most', 'worldSize');
  check(l.localRank < l.localWorldSize, 'localRank', 'below', 'localWorldSize');
}

function required(env: NodeJS.ProcessEnv, name: string, min: number, because: string): number {
  const v = intOf(env, name, min);
  if (v === undefined) throw new ArgumentError(`environment variable ${name} is not set, but ${because}`);
  return v;
}

const firstOf = (env: NodeJS.ProcessEnv, names: string[]): string | undefined => {
  for (const n of names) if (env[n]?.trim()) return n;
  return undefined;
};

/**
 * Slurm's description of this task, or undefined outside an srun step (no SLURM_PROCID). Throws
 * ArgumentError for malformed or contradictory variables (SLURM_PROCID >= SLURM_NTASKS, a node list
 * shorter than SLURM_NNODES, ...).
 */
export function readSlurmEnv(env: NodeJS.ProcessEnv = process.env): ClusterEnv | undefined {
  if (!env.SLURM_PROCID?.trim()) return undefined;
  const because = 'SLURM_PROCID is set (an srun task); run the script through srun, or set RANK/WORLD_SIZE yourself';
  const rank = required(env, 'SLURM_PROCID', 0, because);
  const tasksVar = firstOf(env, ['SLURM_STEP_NUM_TASKS', 'SLURM_NTASKS', 'SLURM_NPROCS']) ?? 'SLURM_NTASKS';
  const worldSize = required(env, tasksVar, 1, because);
  const nodesVar = firstOf(env, ['SLURM_STEP_NUM_NODES', 'SLURM_NNODES', 'SLURM_JOB_NUM_NODES']) ?? 'SLURM_NNODES';
  const nnodes = intOf(env, nodesVar, 1) ?? 1;
  const nodeRank = intOf(env, 'SLURM_NODEID', 0) ?? 0;
  if (rank >= worldSize) throw new ArgumentError(`environment variable SLURM_PROCID=${rank} must be < ${tasksVar}=${worldSize}`);
  if (nodeRank >= nnodes) throw new ArgumentError(`environment variable SLURM_NODEID=${nodeRank} must be < ${nodesVar}=${nnodes}`);
  if (nnodes > worldSize) throw new ArgumentError(`environment variables ${nodesVar}=${nnodes} and ${tasksVar}=${worldSize}: more nodes than tasks`);

  let localWorldSize: number;
  const perNodeVar = firstOf(env, ['SLURM_STEP_TASKS_PER_NODE', 'SLURM_TASKS_PER_NODE']);
  if (perNodeVar) {
    const counts = expandTasksPerNode(env[perNodeVar]!, perNodeVar);
    if (counts.length !== nnodes) {
      throw new ArgumentError(`environment variable ${perNodeVar}=${JSON.stringify(env[perNodeVar])} lists ${counts.length} node(s), but ${nodesVar}=${nnodes}`);
    }
    const sum = counts.reduce((a, b) => a + b, 0);
    if (sum !== worldSize) {
      throw new ArgumentError(`environment variable ${perNodeVar}=${JSON.stringify(env[perNodeVar])} adds up to ${sum} tasks, but ${tasksVar}=${worldSize}`);
    }
    localWorldSize = counts[nodeRank]!;
  } else {
    const perNode = intOf(env, 'SLURM_NTASKS_PER_NODE', 1);
    if (perNode !== undefined) localWorldSize = perNode;
    else if (worldSize % nnodes === 0) localWorldSize = worldSize / nnodes;
    else {
      throw new ArgumentError(
        `cannot tell how many of the ${worldSize} Slurm tasks run on this node (${nodesVar}=${nnodes}, no SLURM_TASKS_PER_NODE); set LOCAL_WORLD_SIZE`,
      );
    }
  }
  const localRank = intOf(env, 'SLURM_LOCALID', 0) ?? rank % localWorldSize;
  if (localRank >= localWorldSize) {
    throw new ArgumentError(`environment variable SLURM_LOCALID=${localRank} must be < the ${localWorldSize} task(s) Slurm runs on this node`);
  }

  const listVar = firstOf(env, ['SLURM_STEP_NODELIST', 'SLURM_JOB_NODELIST', 'SLURM_NODELIST']);
  const hosts = listVar ? expandHostlist(env[listVar]!, `environment variable ${listVar}`) : [];
  if (nnodes > 1 && hosts.length < nnodes) {
    throw new ArgumentError(
      listVar
        ? `environment variable ${listVar}=${JSON.stringify(env[listVar])} names ${hosts.length} host(s), but ${nodesVar}=${nnodes}`
        : `${nodesVar}=${nnodes} but no SLURM_NODELIST (or SLURM_JOB_NODELIST) says where node 0 is; set MASTER_ADDR`,
    );
  }
  const jobId = env.SLURM_JOB_ID?.trim() || env.SLURM_JOBID?.trim() || undefined;
  let masterPort: number | undefined;
  if (jobId !== undefined) {
    if (!/^\d+$/.test(jobId)) throw new ArgumentError(`environment variable SLURM_JOB_ID=${JSON.stringify(jobId)} is not a number`);
    masterPort = 15000 + (Number(BigInt(jobId) % 15000n));
  }
  // One node: every task reaches the store over loopback, whatever the node is called.
  const masterAddr = nnodes === 1 ? '127.0.0.1' : hosts[0];
  return { kind: 'slurm', rank, worldSize, localRank, localWorldSize, nodeRank, nnodes, masterAddr, masterPort, jobId, hosts };
}

/**
 * Open MPI's description of this process (mpirun), or undefined without OMPI_COMM_WORLD_RANK. The
 * node index is rank / local size, which holds for mpirun's default placement by slot (`--map-by
 * slot`/`ppr:N:node` with the same count on every node). Throws ArgumentError for malformed or
 * contradictory variables.
 */
export function readMpiEnv(env: NodeJS.ProcessEnv = process.env): ClusterEnv | undefined {
  if (!env.OMPI_COMM_WORLD_RANK?.trim()) return undefined;
  const because = 'OMPI_COMM_WORLD_RANK is set (an mpirun process)';
  const rank = required(env, 'OMPI_COMM_WORLD_RANK', 0, because);
  const worldSize = required(env, 'OMPI_COMM_WORLD_SIZE', 1, because);
  const localRank = required(env, 'OMPI_COMM_WORLD_LOCAL_RANK', 0, because);
  const localWorldSize = required(env, 'OMPI_COMM_WORLD_LOCAL_SIZE', 1, because);
  if (rank >= worldSize) throw new ArgumentError(`environment variable OMPI_COMM_WORLD_RANK=${rank} must be < OMPI_COMM_WORLD_SIZE=${worldSize}`);
  if (localRank >= localWorldSize) {
    throw new ArgumentError(`environment variable OMPI_COMM_WORLD_LOCAL_RANK=${localRank} must be < OMPI_COMM_WORLD_LOCAL_SIZE=${localWorldSize}`);
  }
  if (localWorldSize > worldSize || worldSize % localWorldSize !== 0) {
    throw new ArgumentError(
      `environment variables OMPI_COMM_WORLD_SIZE=${worldSize} and OMPI_COMM_WORLD_LOCAL_SIZE=${localWorldSize}: nodetron needs the same number of ` +
        'processes on every node (mpirun --map-by ppr:N:node)',
    );
  }
  const nnodes = worldSize / localWorldSize;
  const nodeRank = Math.floor(rank / localWorldSize);
  if (rank % localWorldSize !== localRank) {
    throw new ArgumentError(
      `OMPI_COMM_WORLD_RANK=${rank} with OMPI_COMM_WORLD_LOCAL_RANK=${localRank}: ranks are not placed node by node ` +
        '(use mpirun --map-by slot or ppr:N:node, or set GROUP_RANK yourself)',
    );
  }
  const jobId = env.OMPI_MCA_orte_ess_jobid?.trim() || env.PMIX_NAMESPACE?.trim() || undefined;
  return { kind: 'mpi', rank, worldSize, localRank, localWorldSize, nodeRank, nnodes, masterAddr: nnodes === 1 ? '127.0.0.1' : undefined, masterPort: undefined, jobId, hosts: [] };
}

/** The cluster launcher's description of this process: Open MPI's when present (mpirun inside a Slurm allocation), else Slurm's, else undefined. */
export function readClusterEnv(env: NodeJS.ProcessEnv = process.env): ClusterEnv | undefined {
  return readMpiEnv(env) ?? readSlurmEnv(env);
}
