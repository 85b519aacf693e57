// `nodetron launch`: starts one process per GPU (or N on CPU) on this node, torchrun-style, and
// forms one job with the launchers of the other nodes through the rendezvous store.
//
// Environment contract: every rank's process gets
//   RANK                    global rank, 0..WORLD_SIZE-1 (node-major: node r's ranks follow node r-1's)
//   LOCAL_RANK              rank on this node, 0..LOCAL_WORLD_SIZE-1 (the GPU to use)
//   WORLD_SIZE              ranks in the job (sum of every node's --nproc-per-node)
//   LOCAL_WORLD_SIZE        ranks on this node
//   GROUP_RANK              this node's index (--node-rank)
//   MASTER_ADDR, MASTER_PORT  the rendezvous StoreServer (served by node 0's launcher; protocol in docs/store-protocol.md)
//   NODETRON_RESTART_COUNT  0 on the first attempt, k on the k-th restart (--max-restarts)
//   NODETRON_STORE_PREFIX   key prefix of this attempt's ranks in the store (new per attempt)
//   NODETRON_RDZV           redis://host:port when the launchers meet through Redis (--rdzv)
//   NODETRON_STORE_TOKEN    the job token every store client presents (from the environment, or made
//                           here for a single-node job; docs/store-protocol.md)
//   NODETRON_FLIGHT_DIR     where the flight recorder dumps (lib/distributed/flight.ts), a directory per attempt
//   NODETRON_FLIGHT_PROGRESS  1 under --hang-timeout-ms (ranks then touch a progress file the hang check reads), else 0
// and the launcher's own environment otherwise. lib/distributed/env.ts reads it (readLaunchEnv).
// In in-job recovery mode (--spares N) every process also gets
//   NODETRON_RECOVERY=1, NODETRON_RECOVERY_DIR (this node's directory; its `abort` file holds the newest
//   generation), NODETRON_HOLDER (host:port of the image holder of node (n+1) mod nodes, which keeps this
//   rank's in-memory copies), NODETRON_GENERATION (0 for the first ranks); a replacement started anew
//   NODETRON_JOIN=1 and its generation; a hot spare NODETRON_SPARE=<id> and no RANK/LOCAL_RANK (it waits
//   for store key recover/spare/<node>/<id>); NODETRON_RECOVERY_EVENTS passes through when set.
//
// Behaviour: output lines are prefixed `[rank N]`; when a rank exits non-zero or is killed, every
// rank of every node is stopped (SIGTERM, then SIGKILL after --stop-grace-ms) and the first failure is
// reported with its stderr tail; with --max-restarts K the whole job restarts up to K times. With
// --spares N (lib/launch/recovery.ts, docs/recovery.md) a rank lost to an exit, a stop (SIGSTOP longer
// than --stop-timeout-ms) or its node's silence is replaced inside the job, when every rank has turned
// recovery on (store key recover/ready/<rank>): a new generation is announced in the store and in every
// node's abort file, and a hot spare (N are kept per node) or a new process takes the rank's place; the
// survivors stay in their processes. Anything else takes the restart path above.
import { ArgumentError, UsageError } from '../errors.js';
import { intOf, readSlurmEnv } from '../distributed/cluster-env.js';
import { createStore, StoreServer, TCPStore, tokenFromEnv, type Store } from '../distributed/store.js';
import { isLoopbackHost } from '../distributed/store-api.js';
import { storeSecurity, type StoreSecurity } from '../distributed/store-security.js';
import { LaunchAgent, type AgentConfig } from './agent.js';
import { isTypeScript, scriptCommand } from './workers.js';

const usage = `usage: nodetron launch [options] script.(ts|js|mjs) [script args]

options:
  --nproc-per-node N|auto    processes on this node (auto: number of GPUs, 1 without CUDA)  [auto]
  --nnodes N                 nodes in the job                                                [1]
  --node-rank R              this node's index, 0..N-1                                       [0]
  --master-addr A            address of node 0 (serves the rendezvous store)                 [127.0.0.1]
  --master-port P            port of the store; a free port is chosen when omitted (--nnodes 1 only)
  --max-restarts K           restart the whole job up to K times after a failure             [0]
  --rdzv redis://host:port   launchers meet through Redis instead of node 0's store
  --run-id ID                namespace of the job in the store (use a unique one with a shared Redis) [nodetron]
  --monitor-interval-ms MS   how often the launcher checks workers, the store and heartbeats [200]
  --join-timeout-ms MS       how long nodes wait for each other at rendezvous                [60000]
  --heartbeat-timeout-ms MS  a node silent this long is reported and the job stopped         [30000]
  --stop-grace-ms MS         SIGTERM → SIGKILL grace period when stopping ranks              [3000]
  --hang-timeout-ms MS       stop the job (with the flight recorder's analysis) when no local rank has
                             completed a collective for this long; 0: off (ranks' own timeouts only) [0]
  --spares N                 in-job recovery mode (docs/recovery.md): a lost rank is replaced in the running job
                             (survivors stay) by one of N hot spares kept per node, or a new process when none is left;
                             needs a script that turns recovery on (recover: 'memory'), else the restart path. Give it on every node
  --stop-timeout-ms MS       with --spares: a rank stopped (SIGSTOP) this long is killed and replaced        [1000]
  --max-recoveries K         with --spares: after K in-job recoveries a loss restarts the job instead        [100]
  --shrink                   with --spares: a loss with no hot spare free shrinks data parallelism instead of waiting:
                             the intact replicas go on (the same global batch, more micro-batches) while the lost
                             replica's processes start anew, and the job grows back once they are ready
  --self-check[=strict]      before training (inside distributed.init): an allreduce and an exchange between
                             every pair of ranks, timed; rank 0 prints a summary naming a failed or slow link,
                             rank or host; a failed link stops the job (strict: a slow one too). Give it on every node

Under srun (one task per node), --nnodes, --node-rank and --master-addr default to SLURM_NNODES,
SLURM_NODEID and the first host of SLURM_NODELIST, and --master-port to MASTER_PORT or one derived from
SLURM_JOB_ID. A job over several nodes needs NODETRON_STORE_TOKEN (the same secret on every node).

A .ts/.mts/.cts script runs through tsx, an optional peer dependency: npm install --save-dev tsx.`;

interface LaunchOptions extends Omit<AgentConfig, 'masterPort' | 'nprocPerNode'> {
  masterPort: number | undefined;
  nprocPerNode: number | 'auto';
  /** --self-check: NODETRON_SELF_CHECK for the ranks (1, or strict). */
  selfCheck?: '1' | 'strict';
}

const INT_OPTIONS: Record<string, keyof LaunchOptions> = {
  '--nnodes': 'nnodes',
  '--node-rank': 'nodeRank',
  '--master-port': 'masterPort',
  '--max-restarts': 'maxRestarts',
  '--monitor-interval-ms': 'monitorIntervalMs',
  '--join-timeout-ms': 'joinTimeoutMs',
  '--heartbeat-timeout-ms': 'heartbeatTimeoutMs',
  '--stop-grace-ms': 'stopGraceMs',
  '--hang-timeout-ms': 'hangTimeoutMs',
  '--spares': 'spares',
  '--stop-timeout-ms': 'stopTimeoutMs',
  '--max-recoveries': 'maxRecoveries',
};

function parseInt10(flag: string, text: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!/^\d+$/.test(text)) throw new ArgumentError(`${flag} expects an integer, got ${JSON.stringify(text)}`);
  const n = Number(text);
  if (n < min || n > max) throw new ArgumentError(`${flag} must be in [${min}, ${max}], got ${n}`);
  return n;
}

/**
 * Parses the launcher's options; the first argument that is not an option is the script, and the rest
 * are its arguments. Under an srun step (`env` holds SLURM_PROCID), the node count, node rank, master
 * address and port default to Slurm's (readSlurmEnv), MASTER_ADDR/MASTER_PORT from `env` win over
 * those, and flags win over everything.
 */
export function parseLaunchArgs(argv: string[], env: NodeJS.ProcessEnv = process.env): LaunchOptions | 'help' {
  const given = new Set<string>();
  const o: LaunchOptions = {
    script: '',
    scriptArgs: [],
    nprocPerNode: 'auto',
    nnodes: 1,
    nodeRank: 0,
    masterAddr: '127.0.0.1',
    masterPort: undefined,
    maxRestarts: 0,
    monitorIntervalMs: 200,
    joinTimeoutMs: 60_000,
    heartbeatTimeoutMs: 30_000,
    stopGraceMs: 3000,
    hangTimeoutMs: 0,
    stopTimeoutMs: 1000,
    maxRecoveries: 100,
    runId: 'nodetron',
  };
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    if (arg === '-h' || arg === '--help') return 'help';
    if (!arg.startsWith('--')) {
      o.script = arg;
      o.scriptArgs = argv.slice(i + 1);
      break;
    }
    const eq = arg.indexOf('=');
    const flag = eq >= 0 ? arg.slice(0, eq) : arg;
    given.add(flag);
    if (flag === '--shrink') {
      if (eq >= 0) throw new ArgumentError('--shrink takes no value');
      o.shrink = true;
      continue;
    }
    if (flag === '--self-check') {
      const mode = eq >= 0 ? arg.slice(eq + 1) : '1';
      if (mode !== '1' && mode !== 'strict') throw new ArgumentError(`--self-check takes no value or =strict, got ${JSON.stringify(mode)}`);
      o.selfCheck = mode;
      continue;
    }
    let value = eq >= 0 ? arg.slice(eq + 1) : argv[++i];
    if (value === undefined) throw new ArgumentError(`${flag} needs a value`);
    value = value.trim();
    if (flag in INT_OPTIONS) {
      const key = INT_OPTIONS[flag]!;
      const min = key === 'nnodes' || key === 'monitorIntervalMs' || key === 'masterPort' ? 1 : 0;
      (o as unknown as Record<string, number>)[key] = parseInt10(flag, value, min, key === 'masterPort' ? 65535 : key === 'nnodes' ? 65536 : undefined);
    } else if (flag === '--nproc-per-node') {
      o.nprocPerNode = value === 'auto' ? 'auto' : parseInt10(flag, value, 1, 1024);
    } else if (flag === '--master-addr') {
      o.masterAddr = value;
    } else if (flag === '--rdzv') {
      if (!/^redis:\/\/.+:\d+\/?$/.test(value)) throw new ArgumentError(`--rdzv expects redis://host:port, got ${JSON.stringify(value)}`);
      o.rdzvUrl = value.replace(/\/$/, '');
    } else if (flag === '--run-id') {
      if (!/^[\w.-]+$/.test(value)) throw new ArgumentError(`--run-id may hold letters, digits, '_', '.', '-'; got ${JSON.stringify(value)}`);
      o.runId = value;
    } else {
      throw new ArgumentError(`unknown option ${flag}`);
    }
  }
  if (!o.script) throw new ArgumentError('no script given');
  if (o.spares === undefined) {
    for (const flag of ['--stop-timeout-ms', '--max-recoveries', '--shrink']) if (given.has(flag)) throw new ArgumentError(`${flag} applies to in-job recovery mode only: give --spares N too`);
  } else if (o.spares > 1024) {
    throw new ArgumentError(`--spares must be in [0, 1024], got ${o.spares}`);
  }
  applyClusterDefaults(o, given, env);
  if (o.nodeRank >= o.nnodes) throw new ArgumentError(`--node-rank ${o.nodeRank} must be < --nnodes ${o.nnodes}`);
  if (o.nnodes > 1 && o.masterPort === undefined) {
    throw new ArgumentError('--master-port is required with --nnodes > 1 (every node must know where node 0 serves the store)');
  }
  return o;
}

/** Fills --nnodes, --node-rank, --master-addr and --master-port not given as flags from the environment (Slurm, MASTER_ADDR/MASTER_PORT). */
function applyClusterDefaults(o: LaunchOptions, given: Set<string>, env: NodeJS.ProcessEnv): void {
  const slurm = readSlurmEnv(env);
  if (slurm) {
    if (!given.has('--nnodes') && !given.has('--node-rank')) {
      // One launcher per node: srun --ntasks-per-node=1. More tasks than nodes means srun started the ranks themselves.
      if (slurm.worldSize !== slurm.nnodes) {
        throw new ArgumentError(
          `under srun, nodetron launch runs as one task per node, but Slurm started ${slurm.worldSize} tasks on ${slurm.nnodes} node(s); ` +
            'use srun --ntasks-per-node=1 nodetron launch ..., or start the script itself with srun (one task per GPU), or pass --nnodes/--node-rank',
        );
      }
      o.nnodes = slurm.nnodes;
      o.nodeRank = slurm.nodeRank;
    }
    if (!given.has('--master-addr') && o.nnodes > 1 && slurm.masterAddr !== undefined) o.masterAddr = slurm.masterAddr;
    if (!given.has('--master-port') && o.nnodes > 1 && slurm.masterPort !== undefined) o.masterPort = slurm.masterPort;
  }
  // MASTER_ADDR/MASTER_PORT (and Slurm's first host) from the environment only where they name another
  // host's store (several nodes); a single-node launch serves its store on loopback and its ranks dial
  // it there, whatever MASTER_ADDR a batch file exported.
  if (!given.has('--master-addr') && env.MASTER_ADDR?.trim() && o.nnodes > 1) o.masterAddr = env.MASTER_ADDR.trim();
  if (!given.has('--master-port') && o.nnodes > 1) o.masterPort = intOf(env, 'MASTER_PORT', 1, 65535) ?? o.masterPort;
}

/**
 * The job token of this launch and where node 0's store listens (storeSecurity, the policy init() also
 * follows): NODETRON_STORE_TOKEN from `env`, else a random one for a one-node job (the launcher hands
 * it to its ranks); several nodes beyond loopback need a shared one (ArgumentError saying how to set it).
 */
export function launchStoreSecurity(o: Pick<LaunchOptions, 'nnodes' | 'masterAddr' | 'masterPort'>, env: NodeJS.ProcessEnv = process.env): StoreSecurity {
  return storeSecurity({
    masterAddr: o.masterAddr, masterPort: o.masterPort, token: tokenFromEnv(env), makeToken: o.nnodes === 1,
    server: "node 0's launcher", startedBy: 'nodetron launch on every node',
  });
}

/** GPUs on this machine when the cuda backend loads; 1 otherwise (one CPU process). */
async function detectNprocPerNode(): Promise<number> {
  try {
    const { cuda } = await import('../native.js');
    const devices = cuda().deviceInfo?.() as unknown[] | undefined;
    return devices && devices.length > 0 ? devices.length : 1;
  } catch {
    return 1;
  }
}

/** How main looks things up; tests replace it. */
export interface LaunchMainOptions {
  /** Where tsx is looked up for a TypeScript script (lib/launch/workers.ts tsxSearchPath: this package, then the working directory's project). */
  tsxFrom?: readonly string[];
}

export async function main(argv: string[], options: LaunchMainOptions = {}): Promise<number> {
  let parsed: LaunchOptions | 'help';
  try {
    parsed = parseLaunchArgs(argv);
  } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    // One line and a hint, as every nodetron command prints a usage error (lib/cli.ts).
    console.error(`nodetron launch: ${e.message}`);
    console.error('run `nodetron launch --help` for usage');
    return 2;
  }
  if (parsed === 'help') {
    console.log(usage);
    return 0;
  }
  // A TypeScript script needs tsx (an optional peer dependency): checked once here, before any store or
  // worker starts, so a missing tsx is one message and exit 2 rather than a failure per worker group.
  if (isTypeScript(parsed.script)) {
    try {
      scriptCommand(parsed.script, [], options.tsxFrom);
    } catch (e) {
      if (!(e instanceof UsageError)) throw e;
      console.error(`nodetron launch: ${e.message}`);
      return 2;
    }
  }
  let security: StoreSecurity;
  try {
    security = launchStoreSecurity(parsed);
  } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    console.error(`nodetron launch: ${e.message}`);
    return 2;
  }
  const nprocPerNode = parsed.nprocPerNode === 'auto' ? await detectNprocPerNode() : parsed.nprocPerNode;

  // Node 0 serves the store the ranks use (Gloo's rendezvous speaks its protocol), even when the
  // launchers themselves meet through Redis. A taken port is an AddressInUseError (one line).
  let server: StoreServer | undefined;
  if (parsed.nodeRank === 0) {
    server = await StoreServer.start({
      host: security.listenHost, port: parsed.masterPort ?? 0, ...(security.token !== undefined ? { token: security.token } : {}),
    });
  }
  if (security.warning && parsed.nodeRank === 0) process.stderr.write(`[nodetron launch node 0] ${security.warning}\n`);
  const masterPort = server?.port ?? parsed.masterPort!;
  const { selfCheck, ...agentOptions } = parsed;
  // The ranks inherit the launcher's environment; init() runs the check when it sees the variable.
  if (selfCheck) process.env.NODETRON_SELF_CHECK = selfCheck;
  const config: AgentConfig = { ...agentOptions, nprocPerNode, masterPort, ...(security.token !== undefined ? { storeToken: security.token } : {}) };
  const token = security.token !== undefined ? { token: security.token } : {};
  let store: Store | undefined;
  const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM'];
  let agent: LaunchAgent | undefined;
  const onSignal = (signal: NodeJS.Signals) => agent?.interrupt(signal);
  try {
    store = config.rdzvUrl
      ? await createStore(config.rdzvUrl, { timeoutMs: config.joinTimeoutMs })
      : server
        ? await TCPStore.connect({ host: isLoopbackHost(security.listenHost) ? security.listenHost : '127.0.0.1', port: masterPort, timeoutMs: config.joinTimeoutMs, ...token })
        : await TCPStore.connect({ host: config.masterAddr, port: masterPort, timeoutMs: config.joinTimeoutMs, ...token });
    agent = new LaunchAgent(config, store);
    for (const s of signals) process.on(s, onSignal);
    return await agent.run();
  } finally {
    for (const s of signals) process.off(s, onSignal);
    await store?.close();
    await server?.close();
  }
}
