// Reads the environment `nodetron launch` gives each rank (torchrun's contract, see lib/launch/cli.ts),
// or that Slurm's srun / Open MPI's mpirun give (lib/distributed/cluster-env.ts), validating every
// variable; explicit variables win over the cluster's. With none set, the process is a world of one.
import { ArgumentError } from '../errors.js';
import { checkLayout, intOf, readClusterEnv } from './cluster-env.js';
import { createStore, PrefixStore, tokenFromEnv, type Store } from './store.js';

/** The launch environment of this rank (torchrun's variables), as readLaunchEnv() reads it. */
export interface LaunchEnv {
  /** Global rank (RANK; 0 when unset). */
  rank: number;
  /** Rank on this node (LOCAL_RANK; default rank % localWorldSize); selects the cuda device. */
  localRank: number;
  /** Number of ranks in the job (WORLD_SIZE; 1 when unset). */
  worldSize: number;
  /** Number of ranks on this node (LOCAL_WORLD_SIZE; default worldSize). */
  localWorldSize: number;
  /** The node's index among the job's nodes (GROUP_RANK). */
  groupRank: number;
  /** Host of rank 0's rendezvous store (MASTER_ADDR; default 127.0.0.1). */
  masterAddr: string;
  /** Port of rank 0's rendezvous store (MASTER_PORT; default 29500). */
  masterPort: number;
  /** How many times the launcher has restarted the group (0 on the first attempt). */
  restartCount: number;
  /** A redis://host:port store URL when the launcher was given --rdzv, else undefined (the TCP store on MASTER_ADDR:MASTER_PORT). */
  rdzvUrl?: string;
  /**
   * The key prefix this attempt's ranks share in the store (NODETRON_STORE_PREFIX): a new one per
   * restart, so a restarted group never reads its predecessor's keys.
   */
  storePrefix: string;
  /**
   * Set when the layout came (at least in part) from a cluster launcher rather than from RANK and
   * WORLD_SIZE: 'slurm' (srun) or 'mpi' (mpirun). Then no nodetron launcher serves the store, and
   * rank 0's init() serves it on MASTER_ADDR:MASTER_PORT.
   */
  cluster?: 'slurm' | 'mpi';
  /** The job token store clients present (NODETRON_STORE_TOKEN); undefined when none was given. */
  storeToken?: string;
}

const DEFAULT_MASTER_ADDR = '127.0.0.1';
const DEFAULT_MASTER_PORT = 29500;

const VARIABLES = { rank: 'RANK', worldSize: 'WORLD_SIZE', localRank: 'LOCAL_RANK', localWorldSize: 'LOCAL_WORLD_SIZE' } as const;

/**
 * The launch environment of this process (or of `env`). Each value comes from the explicit variable
 * (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) when set,
 * else from Open MPI's or Slurm's variables (readClusterEnv), else the default. Throws ArgumentError
 * naming the variable when one is malformed or the set is inconsistent (RANK >= WORLD_SIZE, ...).
 */
export function readLaunchEnv(env: NodeJS.ProcessEnv = process.env): LaunchEnv {
  const has = (name: string) => env[name] !== undefined && env[name] !== '';
  const explicit = has('RANK') && has('WORLD_SIZE');
  const c = explicit ? undefined : readClusterEnv(env);
  const worldSize = intOf(env, 'WORLD_SIZE', 1) ?? c?.worldSize ?? 1;
  const rank = intOf(env, 'RANK', 0) ?? c?.rank ?? 0;
  const localWorldSize = intOf(env, 'LOCAL_WORLD_SIZE', 1) ?? c?.localWorldSize ?? worldSize;
  const localRank = intOf(env, 'LOCAL_RANK', 0) ?? c?.localRank ?? rank % localWorldSize;
  const groupRank = intOf(env, 'GROUP_RANK', 0) ?? c?.nodeRank ?? Math.floor(rank / localWorldSize);
  const masterPort = intOf(env, 'MASTER_PORT', 1, 65535) ?? c?.masterPort ?? DEFAULT_MASTER_PORT;
  const restartCount = intOf(env, 'NODETRON_RESTART_COUNT', 0) ?? 0;
  const layout = { rank, worldSize, localRank, localWorldSize };
  checkLayout(layout, (k) => `${VARIABLES[k]}=${layout[k]}`, 'environment variable ');
  const masterAddr = env.MASTER_ADDR?.trim() || c?.masterAddr || DEFAULT_MASTER_ADDR;
  if (c && !env.MASTER_ADDR?.trim() && c.masterAddr === undefined) {
    throw new ArgumentError(
      `${c.kind === 'mpi' ? 'mpirun' : 'srun'} started ${c.worldSize} processes over ${c.nnodes} nodes but nothing says where rank 0 serves the store: ` +
        'set MASTER_ADDR to the first node (e.g. mpirun -x MASTER_ADDR=$(hostname) -x MASTER_PORT=29500 ...)',
    );
  }
  const rdzvUrl = env.NODETRON_RDZV?.trim() || undefined;
  if (rdzvUrl !== undefined && !/^(tcp|redis):\/\/.+:\d+\/?$/.test(rdzvUrl)) {
    throw new ArgumentError(`environment variable NODETRON_RDZV=${JSON.stringify(rdzvUrl)} must look like redis://host:port or tcp://host:port`);
  }
  const storePrefix = env.NODETRON_STORE_PREFIX?.trim() || `attempt${restartCount}`;
  const storeToken = tokenFromEnv(env);
  return {
    rank, localRank, worldSize, localWorldSize, groupRank, masterAddr, masterPort, restartCount, storePrefix,
    ...(rdzvUrl ? { rdzvUrl } : {}), ...(c ? { cluster: c.kind } : {}), ...(storeToken !== undefined ? { storeToken } : {}),
  };
}

/**
 * Connects to the job's store (the launcher's TCP store on MASTER_ADDR:MASTER_PORT, or NODETRON_RDZV)
 * and returns the view under this attempt's prefix, where the ranks of one attempt meet.
 */
export async function connectLaunchStore(env: LaunchEnv = readLaunchEnv(), options: { timeoutMs?: number } = {}): Promise<Store> {
  const url = env.rdzvUrl ?? `tcp://${env.masterAddr.includes(':') ? `[${env.masterAddr}]` : env.masterAddr}:${env.masterPort}`;
  const token = env.rdzvUrl === undefined || env.rdzvUrl.startsWith('tcp:') ? env.storeToken : undefined;
  return new PrefixStore(await createStore(url, { ...options, ...(token !== undefined ? { token } : {}) }), env.storePrefix, true);
}
