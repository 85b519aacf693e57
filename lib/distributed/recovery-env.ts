// In-job recovery's side of a worker's environment (nodetron launch --spares N): whether recovery is on,
// the generation this process starts in, whether it joins a running job (a replacement), how long a
// rank whose collective failed waits for the launcher's next generation (and the launcher's rule for
// it), and a hot spare's wait for the lost rank whose place it takes. docs/recovery.md has the whole protocol.
import { ArgumentError, TimeoutError } from '../errors.js';
import { connectLaunchStore, readLaunchEnv } from './env.js';
import type { Store } from './store.js';

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
  /**
   * How long a rank whose collective failed waits for the launcher to announce the next generation
   * before it takes the failure for its own (NODETRON_RECOVERY_GENERATION_WAIT_MS, which the launcher
   * sets from its detection times: generationWaitMs; DEFAULT_GENERATION_WAIT_MS when unset).
   */
  generationWaitMs: number;
}

/** The generation wait of a worker started without NODETRON_RECOVERY_GENERATION_WAIT_MS (ms). */
export const DEFAULT_GENERATION_WAIT_MS = 60_000;

/**
 * The launcher's rule for NODETRON_RECOVERY_GENERATION_WAIT_MS: twice its longest time to detect a loss
 * (a stopped rank: --stop-timeout-ms; a silent node: --heartbeat-timeout-ms plus one monitor interval)
 * plus 10 s for announcing the generation, and never below DEFAULT_GENERATION_WAIT_MS, so a survivor
 * whose collective failed always outwaits the launcher's detection of the loss that failed it.
 */
export function generationWaitMs(launcher: { stopTimeoutMs: number; heartbeatTimeoutMs: number; monitorIntervalMs?: number }): number {
  const { stopTimeoutMs, heartbeatTimeoutMs, monitorIntervalMs = 1000 } = launcher;
  for (const [k, v] of Object.entries({ stopTimeoutMs, heartbeatTimeoutMs, monitorIntervalMs })) {
    if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new ArgumentError(`generationWaitMs: ${k} must be a finite number >= 0, got ${String(v)}`);
  }
  const detection = Math.max(stopTimeoutMs, heartbeatTimeoutMs + monitorIntervalMs);
  return Math.max(DEFAULT_GENERATION_WAIT_MS, Math.ceil(2 * detection + 10_000));
}

/** Reads the recovery variables; ArgumentError naming a malformed one. */
export function recoveryEnv(env: NodeJS.ProcessEnv = process.env): RecoveryEnv {
  const raw = env.NODETRON_GENERATION?.trim();
  const generation = raw === undefined || raw === '' ? 0 : Number(raw);
  if (!Number.isSafeInteger(generation) || generation < 0) throw new ArgumentError(`environment variable NODETRON_GENERATION=${JSON.stringify(raw)} must be an integer >= 0`);
  const enabled = env.NODETRON_RECOVERY === '1';
  const rawWait = env.NODETRON_RECOVERY_GENERATION_WAIT_MS?.trim();
  const generationWait = rawWait === undefined || rawWait === '' ? DEFAULT_GENERATION_WAIT_MS : Number(rawWait);
  if (!Number.isSafeInteger(generationWait) || generationWait < 1) {
    throw new ArgumentError(`environment variable NODETRON_RECOVERY_GENERATION_WAIT_MS=${JSON.stringify(rawWait)} must be an integer >= 1 (milliseconds)`);
  }
  return {
    enabled,
    generation,
    joining: env.NODETRON_JOIN === '1',
    dir: enabled ? env.NODETRON_RECOVERY_DIR?.trim() || undefined : undefined,
    holder: enabled ? env.NODETRON_HOLDER?.trim() || undefined : undefined,
    generationWaitMs: generationWait,
  };
}

/**
 * The ranks the launcher declared lost in generations `from` to `to` (its records `recover/gen/<g>`,
 * field `lost`), ascending, each once; a generation without a record (not announced) adds none. What
 * a recovery that went from generation from - 1 to `to` replaced: their processes are gone, so
 * whatever they had in flight (a checkpoint's part) will never be written.
 */
export async function lostRanks(store: Pick<Store, 'tryGet'>, from: number, to: number): Promise<number[]> {
  if (!Number.isSafeInteger(from) || !Number.isSafeInteger(to) || from < 1) throw new ArgumentError(`lostRanks: generations must be integers, from >= 1, got ${from} to ${to}`);
  const lost = new Set<number>();
  for (let g = from; g <= to; g++) {
    const raw = await store.tryGet(`recover/gen/${g}`);
    if (!raw) continue;
    const rec = JSON.parse(new TextDecoder().decode(raw)) as { lost?: unknown };
    if (Array.isArray(rec.lost)) for (const r of rec.lost) if (Number.isSafeInteger(r) && (r as number) >= 0) lost.add(r as number);
  }
  return [...lost].sort((a, b) => a - b);
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
