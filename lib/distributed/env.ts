// Reads the environment `nodetron launch` gives each rank (torchrun's contract, see lib/launch/cli.ts),
// validating every variable; with none set, the process is a single rank of a world of one.
import { ArgumentError } from '../errors.js';
import { createStore, PrefixStore, type Store } from './store.js';

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
}

const DEFAULT_MASTER_ADDR = '127.0.0.1';
const DEFAULT_MASTER_PORT = 29500;

function intVar(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number): number {
  const text = env[name];
  if (text === undefined || text === '') return fallback;
  if (!/^\d+$/.test(text.trim())) throw new ArgumentError(`environment variable ${name}=${JSON.stringify(text)} is not a non-negative integer`);
  const value = Number(text.trim());
  if (!Number.isSafeInteger(value) || value < min) throw new ArgumentError(`environment variable ${name}=${text} must be an integer >= ${min}`);
  return value;
}

/**
 * The launch environment of this process (or of `env`). Throws ArgumentError naming the variable when
 * one is malformed or the set is inconsistent (RANK >= WORLD_SIZE, ...).
 */
export function readLaunchEnv(env: NodeJS.ProcessEnv = process.env): LaunchEnv {
  const worldSize = intVar(env, 'WORLD_SIZE', 1, 1);
  const rank = intVar(env, 'RANK', 0, 0);
  const localWorldSize = intVar(env, 'LOCAL_WORLD_SIZE', worldSize, 1);
  const localRank = intVar(env, 'LOCAL_RANK', rank % localWorldSize, 0);
  const groupRank = intVar(env, 'GROUP_RANK', Math.floor(rank / localWorldSize), 0);
  const masterPort = intVar(env, 'MASTER_PORT', DEFAULT_MASTER_PORT, 1);
  const restartCount = intVar(env, 'NODETRON_RESTART_COUNT', 0, 0);
  if (rank >= worldSize) throw new ArgumentError(`environment variable RANK=${rank} must be < WORLD_SIZE=${worldSize}`);
  if (localWorldSize > worldSize) {
    throw new ArgumentError(`environment variable LOCAL_WORLD_SIZE=${localWorldSize} must be <= WORLD_SIZE=${worldSize}`);
  }
  if (localRank >= localWorldSize) {
    throw new ArgumentError(`environment variable LOCAL_RANK=${localRank} must be < LOCAL_WORLD_SIZE=${localWorldSize}`);
  }
  if (masterPort > 65535) throw new ArgumentError(`environment variable MASTER_PORT=${masterPort} must be <= 65535`);
  const masterAddr = env.MASTER_ADDR?.trim() || DEFAULT_MASTER_ADDR;
  const rdzvUrl = env.NODETRON_RDZV?.trim() || undefined;
  if (rdzvUrl !== undefined && !/^(tcp|redis):\/\/.+:\d+\/?$/.test(rdzvUrl)) {
    throw new ArgumentError(`environment variable NODETRON_RDZV=${JSON.stringify(rdzvUrl)} must look like redis://host:port or tcp://host:port`);
  }
  const storePrefix = env.NODETRON_STORE_PREFIX?.trim() || `attempt${restartCount}`;
  return { rank, localRank, worldSize, localWorldSize, groupRank, masterAddr, masterPort, restartCount, storePrefix, ...(rdzvUrl ? { rdzvUrl } : {}) };
}

/**
 * Connects to the job's store (the launcher's TCP store on MASTER_ADDR:MASTER_PORT, or NODETRON_RDZV)
 * and returns the view under this attempt's prefix, where the ranks of one attempt meet.
 */
export async function connectLaunchStore(env: LaunchEnv = readLaunchEnv(), options: { timeoutMs?: number } = {}): Promise<Store> {
  const url = env.rdzvUrl ?? `tcp://${env.masterAddr.includes(':') ? `[${env.masterAddr}]` : env.masterAddr}:${env.masterPort}`;
  return new PrefixStore(await createStore(url, options), env.storePrefix, true);
}
