// In-job recovery's side of a worker's environment (nodetron launch --spares N): whether recovery is on,
// the generation this process starts in, whether it joins a running job (a replacement), and a hot
// spare's wait for the lost rank whose place it takes. docs/recovery.md has the whole protocol.
import { ArgumentError, TimeoutError } from '../errors.js';
import { connectLaunchStore, readLaunchEnv } from './env.js';

/** What the launcher's recovery mode says about this process. */
export interface RecoveryEnv {
  /** The launcher recovers lost ranks in the job (NODETRON_RECOVERY=1). */
  enabled: boolean;
  /** The generation whose communicators this process starts with (NODETRON_GENERATION, 0 for the first ranks). */
  generation: number;
  /** A replacement taking a lost rank's place (NODETRON_JOIN=1, or an assigned spare). */
  joining: boolean;
  /** The node's recovery directory (its abort file), when recovery is on. */
  dir: string | undefined;
  /** The holder of this rank's in-memory copies (NODETRON_HOLDER, host:port). */
  holder: string | undefined;
}

/** Reads the recovery variables; ArgumentError naming a malformed one. */
export function recoveryEnv(env: NodeJS.ProcessEnv = process.env): RecoveryEnv {
  const raw = env.NODETRON_GENERATION?.trim();
  const generation = raw === undefined || raw === '' ? 0 : Number(raw);
  if (!Number.isSafeInteger(generation) || generation < 0) throw new ArgumentError(`environment variable NODETRON_GENERATION=${JSON.stringify(raw)} must be an integer >= 0`);
  const enabled = env.NODETRON_RECOVERY === '1';
  return {
    enabled,
    generation,
    joining: env.NODETRON_JOIN === '1',
    dir: enabled ? env.NODETRON_RECOVERY_DIR?.trim() || undefined : undefined,
    holder: enabled ? env.NODETRON_HOLDER?.trim() || undefined : undefined,
  };
}

/** A spare's assignment, as the launcher writes it at `recover/spare/<node>/<id>`. */
interface Assignment { rank: number; localRank: number; generation: number; holder?: string }

/**
 * A hot spare (NODETRON_SPARE set, no RANK) waits until the launcher assigns it a lost rank, then
 * takes that rank's environment (RANK, LOCAL_RANK, NODETRON_GENERATION, NODETRON_JOIN=1) and goes on as
 * a replacement. Returns at once for any other process. The spare has already loaded Node.js, the
 * script's modules and the addon, which is the time a hot spare saves.
 */
export async function awaitSpareAssignment(env: NodeJS.ProcessEnv = process.env): Promise<void> {
  const id = env.NODETRON_SPARE?.trim();
  if (!id || env.RANK !== undefined) return;
  const provisional = readLaunchEnv({ ...env, RANK: '0', LOCAL_RANK: '0' });
  const store = await connectLaunchStore(provisional);
  const key = `recover/spare/${provisional.groupRank}/${id}`;
  let value: string | undefined;
  try {
    for (;;) {
      try {
        value = await store.getString(key, { timeoutMs: 60_000 });
        break;
      } catch (e) {
        if (!(e instanceof TimeoutError)) throw e;
      }
    }
  } finally {
    await store.close();
  }
  const a = JSON.parse(value) as Assignment;
  if (!Number.isInteger(a.rank) || a.rank < 0 || a.rank >= provisional.worldSize || !Number.isInteger(a.localRank) || !Number.isInteger(a.generation) || a.generation < 1) {
    throw new ArgumentError(`spare ${id}: malformed assignment ${value} at ${key}`);
  }
  env.RANK = String(a.rank);
  env.LOCAL_RANK = String(a.localRank);
  env.NODETRON_GENERATION = String(a.generation);
  env.NODETRON_JOIN = '1';
  // A rank of a lost node restores from that rank's own holder, and may sit above this node's local ranks.
  if (typeof a.holder === 'string' && a.holder !== '') env.NODETRON_HOLDER = a.holder;
  if (Number(env.LOCAL_WORLD_SIZE ?? 0) < a.localRank + 1) env.LOCAL_WORLD_SIZE = String(a.localRank + 1);
  delete env.NODETRON_SPARE;
}
