// The world of a launched rank whose every group communicates through NCCL only — NcclBackend over
// the file-based fake NCCL (file-nccl.ts), with no Gloo communicator — filed under cpu, so the
// CPU-only test machine runs a layout the way `init({ backend: 'nccl' })` runs it on GPUs: one
// communicator per group, made from a unique id rank 0 shares through the launcher's store.
// NODETRON_TEST_NCCL_ONLY=<directory> turns it on in the equivalence fixtures (ncclOnlyOptions).
import { connectLaunchStore, NonMemberGroup, ProcessGroup, readLaunchEnv, type CollectiveGroup, type WorldGroup } from '../../lib/distributed/index.js';
import { createNcclBackend } from '../../lib/internal.js';
import { FileNccl } from './file-nccl.js';

const TIMEOUT_MS = 120_000;

/** What this process opened for its NCCL-only world (closed by closeNcclOnlyWorld). */
let opened: { store: { close(): Promise<void> }; groups: ProcessGroup[] } | null = null;

/** The NCCL-only world of this process (null when there is none): runRank's error path meets the other ranks over it. */
export function ncclOnlyWorldGroup(): ProcessGroup | null { return opened?.groups[0] ?? null; }

/** Joins the launched job with NCCL-only groups meeting in `dir`; every rank calls newGroup in the same order. */
export async function ncclOnlyWorld(dir: string): Promise<WorldGroup & { readonly devices: string[] }> {
  const env = readLaunchEnv();
  const store = await connectLaunchStore(env, { timeoutMs: TIMEOUT_MS });
  const addon = new FileNccl(dir, TIMEOUT_MS);
  let made = 0;
  const groups: ProcessGroup[] = [];
  opened = { store, groups };
  const build = async (name: string, ranks: readonly number[]): Promise<ProcessGroup> => {
    const rank = ranks.indexOf(env.rank);
    const comm = await createNcclBackend({ store, prefix: `fake-nccl/${name}`, group: name, rank, size: ranks.length, device: 0, timeoutMs: TIMEOUT_MS, addon });
    const group = new ProcessGroup(name, rank, ranks, new Map([['cpu', comm]]), TIMEOUT_MS, { store, check: false, makeGroup: build });
    groups.push(group);
    return group;
  };
  const world = await build('world', Array.from({ length: env.worldSize }, (_, i) => i));
  const newGroup = async (ranks: readonly number[]): Promise<CollectiveGroup> => {
    const name = `group${made++}`;
    return ranks.includes(env.rank) ? build(name, ranks) : new NonMemberGroup(name) as unknown as CollectiveGroup;
  };
  return Object.assign(world, { newGroup });
}

/**
 * initParallelTraining's options for an equivalence fixture: under NODETRON_TEST_NCCL_ONLY=<dir>,
 * the NCCL-only world (one process alone needs none); otherwise none (the job's own init, Gloo).
 */
export async function ncclOnlyOptions(): Promise<{ world?: WorldGroup }> {
  const dir = process.env.NODETRON_TEST_NCCL_ONLY;
  if (!dir || readLaunchEnv().worldSize === 1) return {};
  return { world: await ncclOnlyWorld(dir) };
}

/** Destroys the NCCL-only world's groups and closes its store connection (nothing when there is none), so the rank can exit. */
export async function closeNcclOnlyWorld(): Promise<void> {
  if (!opened) return;
  const { store, groups } = opened;
  opened = null;
  for (const g of groups.reverse()) await g.destroy();
  await store.close();
}
