// Initialization of the distributed runtime: reads the launcher's environment, connects the store,
// builds the world group and later subgroups (newGroup), and tears everything down (destroy).
import { hostname } from 'node:os';
import { setCudaDevice } from '../device.js';
import { ArgumentError, CommError, StateError } from '../errors.js';
import { cpu, cuda } from '../native.js';
import { type CommBackend, createGlooBackend } from './backend.js';
import { HostStagedBackend } from './host-staging.js';
import { createNcclBackend, loadNcclAddon, ncclUsableDevices, nvidiaDeviceNodePresent } from './nccl-backend.js';
import { installFlightSignal } from './flight.js';
import { alignTraceClock, traceEnabled } from '../observe/trace.js';
import { selfCheckFromEnv } from './self-check.js';
import { checkLayout } from './cluster-env.js';
import { connectLaunchStore, readLaunchEnv, type LaunchEnv } from './env.js';
import { type Group, NonMemberGroup, ProcessGroup } from './group.js';
import { PendingBackend } from './pending.js';
import { type Store, StoreServer } from './store.js';
import { storeSecurity } from './store-security.js';
import { awaitSpareAssignment, recoveryEnv } from './recovery-env.js';
import { abortAllCommunicators, abortWhileConnecting, readAbortFile, watchAbortFile } from './abort.js';
import { join } from 'node:path';

/** Which communicators a group gets: Gloo for cpu tensors, NCCL for cuda tensors, or both. */
export type BackendChoice = 'auto' | 'gloo' | 'nccl';

/** Options of {@link init}. */
export interface InitOptions {
  /**
   * 'auto' (the default): Gloo for cpu tensors, plus NCCL for cuda tensors when NCCL can give every
   * local rank its own GPU (LOCAL_WORLD_SIZE <= GPUs), as PyTorch's "cpu:gloo,cuda:nccl".
   * Without NCCL, cuda tensors go through Gloo in host memory (two copies per op).
   * 'gloo': Gloo only (cuda tensors through host memory). 'nccl': cuda tensors only, BackendUnavailableError when NCCL cannot run.
   * With NCCL, rank r's GPU is cuda:LOCAL_RANK, which also becomes the default 'cuda' device.
   */
  backend?: BackendChoice;
  /** Default timeout of every collective and of the rendezvous; default 300 000 ms. */
  timeoutMs?: number;
  /** Check mode: all ranks verify they run the same collective before each one (also NODETRON_COMM_CHECK=1). */
  check?: boolean;
  /**
   * Before each collective, ranks agree on op, dtype and sizes with one tiny allreduce and all throw
   * CommError naming the smallest and largest size when they differ (Gloo would abort the process).
   * Default true; false (or NODETRON_COMM_VERIFY_SIZES=0) saves that round trip per collective.
   */
  verifySizes?: boolean;
  /**
   * When every rank of a group runs on this host, Gloo groups move allreduce bytes (and the size
   * agreement) through a shared-memory segment under /dev/shm instead of loopback TCP. Default true;
   * false (or NODETRON_COMM_SHM=0) keeps TCP. Ranks that disagree all fall back to TCP.
   */
  sharedMemory?: boolean;
  /** The launch environment; default: read from process.env. */
  env?: LaunchEnv;
}

/** Default timeout of collectives and of the rendezvous: 300 000 ms (5 minutes). */
export const DEFAULT_COMM_TIMEOUT_MS = 300_000;

interface Runtime {
  env: LaunchEnv;
  store: Store;
  ownServer: StoreServer | undefined;
  world: ProcessGroup;
  groups: ProcessGroup[];
  groupCount: number;
  timeoutMs: number;
  check: boolean;
  verifySizes: boolean;
  sharedMemory: boolean;
  backends: Backends;
  /** In-job recovery: the generation whose communicators the groups use (0 at the start; NODETRON_GENERATION). */
  generation: number;
  /** A replacement that has not met the running ranks yet: groups are built unconnected (PendingBackend). */
  joining: boolean;
  /** Whether each group was asked for shared memory (its members are its ranks), for regroup(). */
  sharedMemoryOf: Map<ProcessGroup, boolean>;
  /** The node's recovery directory (its abort file), when the launcher recovers lost ranks. */
  recoveryDir: string | undefined;
}

interface Backends { gloo: boolean; nccl: boolean }

/**
 * The communicators init(backend) gives each group on this machine. `usableGpus` reports how many
 * GPUs NCCL can use (0 when it cannot run); every rank of a node computes the same answer, so the
 * ranks agree on the set. Throws BackendUnavailableError for 'nccl' when NCCL cannot run here.
 */
export function selectBackends(backend: unknown, env: LaunchEnv, usableGpus: () => number = ncclUsableDevices): Backends {
  if (backend === undefined || backend === 'auto') return { gloo: true, nccl: usableGpus() >= env.localWorldSize };
  if (backend === 'gloo') return { gloo: true, nccl: false };
  if (backend === 'nccl') {
    loadNcclAddon(env.localRank);
    return { gloo: false, nccl: true };
  }
  throw new ArgumentError(`init: backend must be 'auto', 'gloo' or 'nccl', got ${String(backend)}`);
}

let runtime: Runtime | undefined;

function current(call: string): Runtime {
  if (!runtime) throw new StateError(`${call}: call await nt.distributed.init() first`);
  return runtime;
}

const LOOPBACK = new Set(['127.0.0.1', 'localhost', '::1']);

// Where this rank's Gloo device listens: GLOO_SOCKET_IFNAME / NODETRON_GLOO_HOST when set (as
// torch), loopback for a single-node job on loopback, else this host's name.
function deviceAddress(env: LaunchEnv): { deviceHost: string; deviceIface: string } {
  const iface = process.env.GLOO_SOCKET_IFNAME?.split(',')[0]?.trim() ?? '';
  const host = process.env.NODETRON_GLOO_HOST?.trim() || (LOOPBACK.has(env.masterAddr) ? '127.0.0.1' : hostname());
  return { deviceHost: host, deviceIface: iface };
}

/** GPUs whose tensors a Gloo-only group moves through host memory (0 without a driver: no cuda addon load). */
function stagedCudaDevices(): number {
  if (!nvidiaDeviceNodePresent()) return 0;
  try {
    return cuda().deviceCount() as number;
  } catch {
    return 0;
  }
}

// The communicators of one group: connected (the group's members meet through the store under a
// prefix of this generation), or, for a joining process, stand-ins that know only their devices.
async function groupComms(rt: Runtime, name: string, globalRanks: readonly number[], sharedMemory: boolean, store: Store = rt.store): Promise<Map<string, CommBackend>> {
  const rank = globalRanks.indexOf(rt.env.rank);
  const comms = new Map<string, CommBackend>();
  const size = globalRanks.length;
  if (rt.joining) {
    if (rt.backends.gloo) comms.set('cpu', new PendingBackend(rank, size));
    if (rt.backends.gloo && !rt.backends.nccl) for (let d = 0; d < stagedCudaDevices(); d++) comms.set(`cuda:${d}`, new PendingBackend(rank, size));
    if (rt.backends.nccl) comms.set(`cuda:${rt.env.localRank}`, new PendingBackend(rank, size, false));
    return comms;
  }
  // Each generation's communicators meet under their own prefix, so a rank of an older generation never matches them.
  const gen = rt.generation > 0 ? `gen${rt.generation}/` : '';
  try {
    if (rt.backends.gloo) {
      // Gloo meets through the job's store connection (its calls forwarded from the communicator's
      // thread) when that is Redis (--rdzv) or a TCP store that wants the job token, which Gloo's
      // native client does not present; else natively through the TCP store node 0's launcher serves.
      const viaJobStore = rt.env.rdzvUrl !== undefined || rt.env.storeToken !== undefined;
      comms.set('cpu', await createGlooBackend({
        storeHost: rt.env.masterAddr,
        storePort: rt.env.masterPort,
        ...(viaJobStore ? { store } : {}),
        prefix: viaJobStore ? `gloo/${gen}${name}` : `${rt.env.storePrefix}/gloo/${gen}${name}`,
        rank,
        size,
        timeoutMs: rt.timeoutMs,
        ...deviceAddress(rt.env),
        verifySizes: rt.verifySizes,
        sharedMemory,
      }));
    }
    const gloo = comms.get('cpu');
    if (gloo && process.env.NODETRON_TEST_HOST_STAGING === '1') {
      // Test hook: cpu tensors take the host-staged path (cpu storages as the "device"), so the
      // staging is exercised by every collective test on a machine without a GPU.
      comms.set('cpu', new HostStagedBackend(gloo, cpu(), true));
    }
    if (gloo && !rt.backends.nccl) {
      // Without NCCL, cuda tensors go through Gloo in host memory (ranks sharing a GPU, or backend 'gloo').
      const gpus = stagedCudaDevices();
      for (let d = 0; d < gpus; d++) comms.set(`cuda:${d}`, new HostStagedBackend(gloo, cuda()));
    }
    if (rt.backends.nccl) {
      comms.set(`cuda:${rt.env.localRank}`, await createNcclBackend({
        store, prefix: `nccl/${gen}${name}`, group: name, rank, size, device: rt.env.localRank, timeoutMs: rt.timeoutMs,
      }));
    }
  } catch (e) {
    for (const c of comms.values()) await c.destroy().catch(() => {});
    throw e;
  }
  return comms;
}

async function buildGroup(rt: Runtime, name: string, globalRanks: readonly number[], sharedMemory = rt.sharedMemory): Promise<ProcessGroup> {
  const rank = globalRanks.indexOf(rt.env.rank);
  const comms = await groupComms(rt, name, globalRanks, sharedMemory);
  const group = new ProcessGroup(name, rank, globalRanks, comms, rt.timeoutMs, {
    store: rt.store,
    check: rt.check,
    generation: rt.generation,
    makeGroup: (n, ranks) => buildGroup(rt, n, ranks),
  });
  rt.groups.push(group);
  rt.sharedMemoryOf.set(group, sharedMemory);
  return group;
}

/**
 * The store server this process must run itself, if any: a world of one started without a launcher
 * serves a private one on loopback (with a random token); under srun or mpirun (no nodetron launcher)
 * rank 0 serves the job's on MASTER_PORT, where storeSecurity says (the launcher's policy): on loopback
 * when MASTER_ADDR is loopback (one node), else on every interface, which needs the job token
 * (NODETRON_STORE_TOKEN). Throws ArgumentError without one, AddressInUseError when the port is taken.
 */
async function serveStoreIfNeeded(env: LaunchEnv): Promise<{ server: StoreServer; env: Partial<LaunchEnv> } | undefined> {
  if (env.rdzvUrl !== undefined) return undefined;
  const alone = env.worldSize === 1 && process.env.MASTER_PORT === undefined;
  if (!alone && (env.cluster === undefined || env.rank !== 0)) return undefined;
  const masterAddr = alone ? '127.0.0.1' : env.masterAddr;
  const { token, listenHost, warning } = storeSecurity({
    masterAddr, masterPort: alone ? undefined : env.masterPort, token: env.storeToken, makeToken: alone, server: 'init: rank 0', startedBy: 'srun/mpirun',
  });
  if (warning) console.warn(`nodetron: ${warning}`);
  const server = await StoreServer.start({ host: listenHost, port: alone ? 0 : env.masterPort, ...(token !== undefined ? { token } : {}) });
  return { server, env: alone ? { masterAddr, masterPort: server.port, storeToken: token } : {} };
}

/** Checks a LaunchEnv given to init() (a typed error naming the bad field, not a TypeError later); its layout as readLaunchEnv checks one. */
function checkEnv(env: unknown): LaunchEnv {
  if (env === null || typeof env !== 'object' || Array.isArray(env)) throw new ArgumentError(`init: env must be a LaunchEnv object (rank, worldSize, localRank, localWorldSize, masterAddr, masterPort, ...), got ${env === null ? 'null' : Array.isArray(env) ? 'an array' : typeof env}`);
  const e = env as Record<string, unknown>;
  const int = (k: string, min: number, max = Number.MAX_SAFE_INTEGER) => {
    const v = e[k];
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min) throw new ArgumentError(`init: env.${k} must be an integer >= ${min}, got ${JSON.stringify(v) ?? String(v)}`);
    if (v > max) throw new ArgumentError(`init: env.${k} must be at most ${max}, got ${v}`);
  };
  int('worldSize', 1); int('rank', 0); int('localWorldSize', 1); int('localRank', 0); int('masterPort', 0, 65535);
  checkLayout(env as LaunchEnv, (k) => `env.${k} ${String(e[k])}`, 'init: ');
  if (typeof e.masterAddr !== 'string' || e.masterAddr === '') throw new ArgumentError(`init: env.masterAddr must be a host name or address, got ${JSON.stringify(e.masterAddr) ?? String(e.masterAddr)}`);
  if (typeof e.storePrefix !== 'string') throw new ArgumentError(`init: env.storePrefix must be a string, got ${typeof e.storePrefix}`);
  return env as LaunchEnv;
}

/**
 * Joins the job started by `nodetron launch`, by srun or mpirun (rank 0 then serves the store), or a
 * world of one without any, and builds the world group. Throws AddressInUseError when rank 0 must
 * serve the store and its port is taken.
 */
export async function init(options: InitOptions = {}): Promise<{
  /** The group of every rank. */
  world: ProcessGroup;
  /** This process's global rank. */
  rank: number;
  /** Number of ranks in the job. */
  worldSize: number;
}> {
  if (runtime) throw new StateError('init: the distributed runtime is already initialized (call destroy() first)');
  // A hot spare (nodetron launch --spares N) waits here until the launcher gives it a lost rank's place.
  await awaitSpareAssignment();
  const timeoutMs = options.timeoutMs ?? DEFAULT_COMM_TIMEOUT_MS;
  if (!Number.isFinite(timeoutMs) || timeoutMs < 1) throw new ArgumentError(`init: timeoutMs must be >= 1, got ${timeoutMs}`);
  let env = options.env === undefined ? readLaunchEnv() : checkEnv(options.env);
  // Before any connection, so an unusable backend leaves nothing behind.
  const backends = selectBackends(options.backend, env);
  if (backends.nccl) setCudaDevice(env.localRank);
  const check = options.check ?? process.env.NODETRON_COMM_CHECK === '1';
  const verifySizes = options.verifySizes ?? process.env.NODETRON_COMM_VERIFY_SIZES !== '0';
  const sharedMemory = options.sharedMemory ?? process.env.NODETRON_COMM_SHM !== '0';
  const ownServer = await serveStoreIfNeeded(env);
  if (ownServer) env = { ...env, ...ownServer.env };
  let store: Store;
  try {
    store = await connectLaunchStore(env, { timeoutMs });
  } catch (e) {
    await ownServer?.server.close();
    throw e;
  }
  const recovery = recoveryEnv();
  const rt: Runtime = {
    env, store, ownServer: ownServer?.server, world: undefined as unknown as ProcessGroup, groups: [], groupCount: 0, timeoutMs, check, verifySizes, sharedMemory, backends,
    generation: recovery.generation, joining: recovery.joining, sharedMemoryOf: new Map(), recoveryDir: recovery.dir,
  };
  try {
    rt.world = await buildGroup(rt, 'world', Array.from({ length: env.worldSize }, (_, i) => i));
  } catch (e) {
    await store.close();
    await ownServer?.server.close();
    throw e;
  }
  runtime = rt;
  installFlightSignal();
  // In-job recovery: the launcher's abort file makes every communicator fail at once when a rank is lost.
  if (rt.recoveryDir) watchAbortFile(join(rt.recoveryDir, 'abort'), rt.generation);
  // A joining process meets the running ranks later (regroup), not here.
  if (rt.joining) return { world: rt.world, rank: env.rank, worldSize: env.worldSize };
  // `nodetron launch --self-check`: every link timed before training; a failed one fails init on every rank.
  if (process.env.NODETRON_SELF_CHECK) await selfCheckFromEnv(rt.world, rt.store).catch(async (e: unknown) => { await destroy(); throw e; });
  // Tracing: measure this rank's clock offset to rank 0 so `nodetron trace merge` can align the ranks.
  if (traceEnabled) await alignTraceClock(rt.world);
  return { world: rt.world, rank: env.rank, worldSize: env.worldSize };
}

/**
 * In-job recovery: gives every group of this process the communicators of `generation` (the same
 * members; built in the order the groups were created, which is the same on every rank, so the ranks
 * meet group by group), after aborting the old ones (their ops in flight fail). Survivors call it
 * after a lost rank's fault; a joining process calls it to meet the running ranks. Collective over
 * the whole job.
 */
export async function regroup(generation: number): Promise<void> {
  const rt = current('regroup');
  if (!Number.isSafeInteger(generation) || generation < 1 || (generation <= rt.generation && !rt.joining)) {
    throw new ArgumentError(`regroup: generation must be an integer above the current one (${rt.generation}), got ${generation}`);
  }
  const reason = `generation ${generation}: regrouping after a lost rank`;
  const live = rt.groups.filter((g) => !g.destroyed);
  // Every Gloo communicator of the process at once (side by side, ~20 ms), then each group's others (NCCL).
  if (rt.backends.gloo) abortAllCommunicators(reason);
  for (const g of live) g.abortCommunicators(reason);
  rt.generation = generation;
  rt.joining = false;
  if (!rt.recoveryDir) {
    for (const g of live) g.rebind(await groupComms(rt, g.name, g.ranks, rt.sharedMemoryOf.get(g)!), generation);
    return;
  }
  // The watcher moves to this generation before its communicators exist, so a file it has not read
  // yet (still saying g) never aborts them. A later generation (a peer of this one lost while it
  // started: it never comes) must end the wait for it at once, not at the collective timeout: the
  // file is read before each group connects, and polled while it does (abortWhileConnecting: the
  // watcher alone misses communicators made after it read the file).
  const file = join(rt.recoveryDir, 'abort');
  watchAbortFile(file, generation);
  const stop = abortWhileConnecting(file, generation);
  // The groups meet over a store connection of their own, closed afterwards: a rendezvous read that
  // waits for a peer that never comes (a replacement still starting when the next loss came) is given
  // up with it, instead of holding every later request on the job's connection (answered in order)
  // until its timeout.
  const meet = await connectLaunchStore(rt.env, { timeoutMs: rt.timeoutMs });
  try {
    for (const g of live) {
      const later = readAbortFile(file);
      if (later > generation) throw new CommError(`regroup: generation ${later} started before generation ${generation} connected (abort file ${file})`, 'regroup');
      g.rebind(await groupComms(rt, g.name, g.ranks, rt.sharedMemoryOf.get(g)!, meet), generation);
    }
  } finally {
    stop();
    await meet.close().catch(() => undefined);
  }
}

/** In-job recovery: the generation of this process's communicators (0 until the first regroup). */
export function generation(): number { return current('generation').generation; }

/** In-job recovery: the launcher's abort file for this process (undefined when the job runs without in-job recovery). */
export function abortFile(): string | undefined {
  const dir = current('abortFile').recoveryDir;
  return dir ? join(dir, 'abort') : undefined;
}

/** The job's store (the launcher's rendezvous store, under this attempt's prefix). */
export function jobStore(): Store { return current('jobStore').store; }

/** Whether init() has run (and destroy() has not). */
export function isInitialized(): boolean { return runtime !== undefined; }
/** The world group. */
export function world(): ProcessGroup { return current('world').world; }
/** This process's global rank. */
export function rank(): number { return current('rank').env.rank; }
/** Number of processes in the job. */
export function worldSize(): number { return current('worldSize').env.worldSize; }

/**
 * A group of the given global ranks. Collective: every process of the world calls it, in the same
 * order, with the same ranks; non-members get a handle whose ops throw StateError.
 */
export async function newGroup(ranks: readonly number[], options: { sharedMemory?: boolean } = {}): Promise<Group> {
  const rt = current('newGroup');
  if (!Array.isArray(ranks) || ranks.length === 0) throw new ArgumentError('newGroup: ranks must be a non-empty array');
  const seen = new Set<number>();
  for (const r of ranks) {
    if (!Number.isInteger(r) || r < 0 || r >= rt.env.worldSize) throw new ArgumentError(`newGroup: rank ${String(r)} is outside the world (0..${rt.env.worldSize - 1})`);
    if (seen.has(r)) throw new ArgumentError(`newGroup: rank ${r} is listed twice`);
    seen.add(r);
  }
  const name = `group${rt.groupCount++}`;
  if (!seen.has(rt.env.rank)) return new NonMemberGroup(name);
  return buildGroup(rt, name, ranks, options.sharedMemory ?? rt.sharedMemory);
}

/**
 * Destroys every group and closes the store connection. Under srun/mpirun, rank 0 (which serves the
 * store) first waits up to 30 s for every rank to reach destroy().
 */
export async function destroy(): Promise<void> {
  const rt = runtime;
  if (!rt) return;
  runtime = undefined;
  for (const g of rt.groups) await g.destroy();
  if (rt.env.cluster !== undefined && rt.env.rdzvUrl === undefined) {
    // Under srun/mpirun rank 0 serves the store: it waits (a while) for every rank to be done with it.
    await rt.store.set(`left/${rt.env.rank}`, '1').catch(() => undefined);
    if (rt.ownServer) {
      const keys = Array.from({ length: rt.env.worldSize }, (_, r) => `left/${r}`);
      await rt.store.wait(keys, { timeoutMs: Math.min(rt.timeoutMs, 30_000) }).catch(() => undefined);
    }
  }
  await rt.store.close();
  await rt.ownServer?.close();
}

/**
 * In-job recovery's reshape (a shrink to fewer data-parallel replicas, or the grow back): leaves this
 * process's world, its communicators aborted and released, and becomes rank `rank` of a world of
 * `worldSize` ranks in `generation`, as a joining process: the groups built from here on are
 * unconnected until regroup(generation) meets the new world's other ranks, group by group. The store
 * connection and the recovery directory stay. Not collective; every rank of the new world calls it
 * (and then builds the same groups in the same order, and regroups).
 */
export async function rejoinAs(generation: number, rank: number, worldSize: number): Promise<ProcessGroup> {
  const rt = current('rejoinAs');
  if (!Number.isSafeInteger(generation) || generation < rt.generation) throw new ArgumentError(`rejoinAs: generation must be an integer >= the current one (${rt.generation}), got ${generation}`);
  if (!Number.isInteger(worldSize) || worldSize < 1 || !Number.isInteger(rank) || rank < 0 || rank >= worldSize) throw new ArgumentError(`rejoinAs: rank ${rank} of a world of ${worldSize}`);
  const reason = `generation ${generation}: this process leaves its world for a reshaped one`;
  if (rt.backends.gloo) abortAllCommunicators(reason);
  for (const g of rt.groups) {
    g.abortCommunicators(reason);
    void g.destroy().catch(() => {});
  }
  rt.env = { ...rt.env, rank, worldSize };
  rt.groups = [];
  rt.groupCount = 0;
  rt.sharedMemoryOf = new Map();
  rt.generation = generation;
  rt.joining = true;
  if (rt.recoveryDir) watchAbortFile(join(rt.recoveryDir, 'abort'), generation);
  rt.world = await buildGroup(rt, 'world', Array.from({ length: worldSize }, (_, i) => i));
  return rt.world;
}
