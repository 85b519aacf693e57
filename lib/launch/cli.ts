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
// and the launcher's own environment otherwise. lib/distributed/env.ts reads it (readLaunchEnv).
//
// Behaviour: output lines are prefixed `[rank N]`; when a rank exits non-zero or is killed, every
// rank of every node is stopped (SIGTERM, then SIGKILL after --stop-grace-ms) and the first failure is
// reported with its stderr tail; with --max-restarts K the whole job restarts up to K times.
import { ArgumentError } from '../errors.js';
import { createStore, StoreServer, TCPStore, type Store } from '../distributed/store.js';
import { LaunchAgent, type AgentConfig } from './agent.js';

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
  --self-check[=strict]      before training (inside distributed.init): an allreduce and an exchange between
                             every pair of ranks, timed; rank 0 prints a summary naming a failed or slow link,
                             rank or host; a failed link stops the job (strict: a slow one too). Give it on every node`;

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
};

function parseInt10(flag: string, text: string, min: number, max = Number.MAX_SAFE_INTEGER): number {
  if (!/^\d+$/.test(text)) throw new ArgumentError(`${flag} expects an integer, got ${JSON.stringify(text)}`);
  const n = Number(text);
  if (n < min || n > max) throw new ArgumentError(`${flag} must be in [${min}, ${max}], got ${n}`);
  return n;
}

/** Parses the launcher's options; the first argument that is not an option is the script, and the rest are its arguments. */
export function parseLaunchArgs(argv: string[]): LaunchOptions | 'help' {
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
      (o as unknown as Record<string, number>)[key] = parseInt10(flag, value, min, key === 'masterPort' ? 65535 : undefined);
    } else if (flag === '--nproc-per-node') {
      o.nprocPerNode = value === 'auto' ? 'auto' : parseInt10(flag, value, 1);
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
  if (o.nodeRank >= o.nnodes) throw new ArgumentError(`--node-rank ${o.nodeRank} must be < --nnodes ${o.nnodes}`);
  if (o.nnodes > 1 && o.masterPort === undefined) {
    throw new ArgumentError('--master-port is required with --nnodes > 1 (every node must know where node 0 serves the store)');
  }
  return o;
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

export async function main(argv: string[]): Promise<number> {
  let parsed: LaunchOptions | 'help';
  try {
    parsed = parseLaunchArgs(argv);
  } catch (e) {
    if (!(e instanceof ArgumentError)) throw e;
    console.error(`nodetron launch: ${e.message}\n\n${usage}`);
    return 2;
  }
  if (parsed === 'help') {
    console.log(usage);
    return 0;
  }
  const nprocPerNode = parsed.nprocPerNode === 'auto' ? await detectNprocPerNode() : parsed.nprocPerNode;

  // Node 0 serves the store the ranks use (Gloo's rendezvous speaks its protocol), even when the
  // launchers themselves meet through Redis.
  let server: StoreServer | undefined;
  if (parsed.nodeRank === 0) {
    server = await StoreServer.start({ host: parsed.nnodes > 1 ? '0.0.0.0' : '127.0.0.1', port: parsed.masterPort ?? 0 });
  }
  const masterPort = server?.port ?? parsed.masterPort!;
  const { selfCheck, ...agentOptions } = parsed;
  // The ranks inherit the launcher's environment; init() runs the check when it sees the variable.
  if (selfCheck) process.env.NODETRON_SELF_CHECK = selfCheck;
  const config: AgentConfig = { ...agentOptions, nprocPerNode, masterPort };
  let store: Store | undefined;
  const signals: NodeJS.Signals[] = ['SIGINT', 'SIGTERM'];
  let agent: LaunchAgent | undefined;
  const onSignal = (signal: NodeJS.Signals) => agent?.interrupt(signal);
  try {
    store = config.rdzvUrl
      ? await createStore(config.rdzvUrl, { timeoutMs: config.joinTimeoutMs })
      : server
        ? await TCPStore.connect({ host: '127.0.0.1', port: masterPort, timeoutMs: config.joinTimeoutMs })
        : await TCPStore.connect({ host: config.masterAddr, port: masterPort, timeoutMs: config.joinTimeoutMs });
    agent = new LaunchAgent(config, store);
    for (const s of signals) process.on(s, onSignal);
    return await agent.run();
  } finally {
    for (const s of signals) process.off(s, onSignal);
    await store?.close();
    await server?.close();
  }
}
