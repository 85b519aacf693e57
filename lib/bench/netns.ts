// `nodetron bench chaos --netns`: each simulated node in a network namespace of its own (issue #37, item 7).
// One namespace per node (its launcher runs under `ip netns exec`), a bridge in the root namespace, one veth
// pair per node (the node's end, with the node's address, in its namespace; the other end on the bridge),
// loopback up in each. Faults: a node's link set down (its root-side veth), and packet loss on every
// namespace's input (nftables: `numgen random mod 10000 < N drop`), and delay (this kernel has no sch_netem:
// every connection between nodes goes through a relay in the root namespace that holds each chunk,
// lib/bench/delay-relay.ts; the namespaces' nat rule sends it there). The names carry a random per-run suffix (parallel runs cannot collide) and everything is torn down
// by {@link NetnsTopology.teardown} (which runs again on the process's exit, so an interrupted run leaves nothing).
import { execFile, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { ArgumentError, StateError } from '../errors.js';
import { DelayRelay, namespaceDestination } from './delay-relay.js';

/** The names and addresses of one run's namespaces. */
export interface NetnsPlan {
  suffix: string;
  /** Network namespace of each node. */
  namespaces: string[];
  /** The bridge in the root namespace. */
  bridge: string;
  /** Each node's veth end in the root namespace (on the bridge): the link fault sets it down. */
  hostVeths: string[];
  /** Each node's veth end in its namespace (with its address). */
  nodeVeths: string[];
  /** The /24 the nodes share, as its first three octets ('10.x.y'). */
  subnet: string;
  /** Each node's address: subnet.(node+1). */
  addresses: string[];
  /** --net-loss: the percentage of packets dropped on entering each namespace (0: none). */
  lossPercent: number;
  /** --net-delay: the ms the relay holds each chunk of a connection between nodes, each way (0: no relay). */
  delayMs: number;
  /** The relay's address: subnet.254, on the bridge in the root namespace (with --net-delay). */
  relayAddress: string;
}

const IFNAMSIZ = 15;

/** A random suffix for one run's names: 6 hex digits (an interface name has at most 15 characters). */
export function netnsSuffix(): string {
  return randomBytes(3).toString('hex');
}

/** The first three octets of a 10.x.y.0/24 that overlaps none of `taken` (CIDRs or bare addresses: the routes and addresses in use). */
export function pickSubnet(taken: readonly string[], rand: () => number = Math.random): string {
  const ranges = taken.flatMap((c) => {
    const m = /^(\d+)\.(\d+)\.(\d+)\.(\d+)(?:\/(\d+))?$/.exec(c.trim());
    if (!m) return [];
    const bits = m[5] === undefined ? 32 : Number(m[5]);
    if (bits === 0) return []; // the default route overlaps everything and says nothing
    const ip = ((Number(m[1]) << 24) >>> 0) + (Number(m[2]) << 16) + (Number(m[3]) << 8) + Number(m[4]);
    const size = 2 ** (32 - bits), start = Math.floor(ip / size) * size;
    return [[start, start + size - 1] as const];
  });
  const free = (x: number, y: number) => {
    const start = ((10 << 24) >>> 0) + (x << 16) + (y << 8), end = start + 255;
    return ranges.every(([a, b]) => b < start || a > end);
  };
  // Random draws first (parallel runs pick different subnets), then a sweep.
  for (let i = 0; i < 64; i++) {
    const x = 1 + Math.floor(rand() * 254), y = Math.floor(rand() * 256);
    if (free(x, y)) return `10.${x}.${y}`;
  }
  for (let x = 1; x < 255; x++) for (let y = 0; y < 256; y++) if (free(x, y)) return `10.${x}.${y}`;
  throw new StateError('bench chaos --netns: every 10.x.y.0/24 overlaps a route or address of this machine');
}

/** The names and addresses of `nodes` namespaces with this suffix in this subnet. */
export function netnsPlan(nodes: number, suffix: string, subnet: string, lossPercent = 0, delayMs = 0): NetnsPlan {
  if (!/^[0-9a-z]{1,6}$/.test(suffix)) throw new ArgumentError(`bench chaos --netns: the name suffix must be 1 to 6 of [0-9a-z], got '${suffix}'`);
  if (nodes < 1 || nodes > 64) throw new ArgumentError(`bench chaos --netns: 1 to 64 nodes, got ${nodes}`);
  const plan: NetnsPlan = {
    suffix, subnet, lossPercent, delayMs, relayAddress: `${subnet}.254`,
    namespaces: Array.from({ length: nodes }, (_, i) => `nodetron-${suffix}-${i}`),
    bridge: `ntbr${suffix}`,
    hostVeths: Array.from({ length: nodes }, (_, i) => `ntv${suffix}n${i}`),
    nodeVeths: Array.from({ length: nodes }, (_, i) => `ntp${suffix}n${i}`),
    addresses: Array.from({ length: nodes }, (_, i) => `${subnet}.${i + 1}`),
  };
  for (const n of [plan.bridge, ...plan.hostVeths, ...plan.nodeVeths]) if (n.length > IFNAMSIZ) throw new ArgumentError(`bench chaos --netns: interface name '${n}' is longer than ${IFNAMSIZ} characters`);
  return plan;
}

/** `cmd` run in node `node`'s namespace. */
export function netnsExec(plan: NetnsPlan, node: number, cmd: readonly string[]): string[] {
  return ['ip', 'netns', 'exec', plan.namespaces[node]!, ...cmd];
}

/** The packets-dropped-on-entry rule's threshold: PCT% of 10000. */
export function lossThreshold(percent: number): number {
  return Math.round(percent * 100);
}

/** The commands that build the topology, in order (each an argv). */
export function setupCommands(plan: NetnsPlan): string[][] {
  const cmds: string[][] = [['ip', 'link', 'add', plan.bridge, 'type', 'bridge'], ['ip', 'link', 'set', plan.bridge, 'up']];
  plan.namespaces.forEach((ns, i) => {
    cmds.push(['ip', 'netns', 'add', ns]);
    cmds.push(['ip', 'link', 'add', plan.hostVeths[i]!, 'type', 'veth', 'peer', 'name', plan.nodeVeths[i]!, 'netns', ns]);
    cmds.push(['ip', 'link', 'set', plan.hostVeths[i]!, 'master', plan.bridge, 'up']);
    cmds.push(['ip', '-n', ns, 'addr', 'add', `${plan.addresses[i]}/24`, 'dev', plan.nodeVeths[i]!]);
    cmds.push(['ip', '-n', ns, 'link', 'set', plan.nodeVeths[i]!, 'up']);
    cmds.push(['ip', '-n', ns, 'link', 'set', 'lo', 'up']);
  });
  return cmds;
}

/** --net-loss: in each namespace, a table whose input chain drops lossPercent% of the packets entering from its link (not its own loopback traffic). */
export function lossCommands(plan: NetnsPlan): string[][] {
  if (plan.lossPercent <= 0) return [];
  return plan.namespaces.flatMap((_, i) => {
    const nft = (...a: string[]) => netnsExec(plan, i, ['nft', ...a]);
    return [nft('add', 'table', 'inet', 'nodetron'), nft('add', 'chain', 'inet', 'nodetron', 'input', '{ type filter hook input priority 0; policy accept; }'),
      nft('add', 'rule', 'inet', 'nodetron', 'input', 'iifname', '!=', 'lo', 'numgen', 'random', 'mod', '10000', '<', String(lossThreshold(plan.lossPercent)), 'drop')];
  });
}

/** Removes the --net-loss tables again. */
export function lossRemoveCommands(plan: NetnsPlan): string[][] {
  return plan.lossPercent <= 0 ? [] : plan.namespaces.map((_, i) => netnsExec(plan, i, ['nft', 'delete', 'table', 'inet', 'nodetron']));
}

/**
 * --net-delay: in each namespace a nat output chain that sends
 * every new TCP connection to another node (not to its own address, nor to the relay) to the relay at
 * `relayPort`.
 */
export function delayCommands(plan: NetnsPlan, relayPort: number): string[][] {
  if (plan.delayMs <= 0) return [];
  return plan.namespaces.flatMap((_, i) => {
    const nft = (...a: string[]) => netnsExec(plan, i, ['nft', ...a]);
    return [nft('add', 'table', 'ip', 'nodetron_delay'), nft('add', 'chain', 'ip', 'nodetron_delay', 'output', '{ type nat hook output priority -100; policy accept; }'),
      nft('add', 'rule', 'ip', 'nodetron_delay', 'output', 'ip', 'daddr', '!=', `{ ${plan.addresses[i]}, ${plan.relayAddress} }`, 'ip', 'daddr', `${plan.subnet}.0/24`,
        'meta', 'l4proto', 'tcp', 'dnat', 'to', `${plan.relayAddress}:${relayPort}`)];
  });
}

/** --net-delay: the relay's address on the bridge (added before the relay listens there). */
export function relayAddressCommand(plan: NetnsPlan): string[] {
  return ['ip', 'addr', 'add', `${plan.relayAddress}/24`, 'dev', plan.bridge];
}

/** Removes the --net-delay chains and the relay's address again. */
export function delayRemoveCommands(plan: NetnsPlan): string[][] {
  if (plan.delayMs <= 0) return [];
  return [...plan.namespaces.map((_, i) => netnsExec(plan, i, ['nft', 'delete', 'table', 'ip', 'nodetron_delay'])), ['ip', 'addr', 'del', `${plan.relayAddress}/24`, 'dev', plan.bridge]];
}

/** The commands that remove it all (each may fail when that part is already gone). */
export function teardownCommands(plan: NetnsPlan): string[][] {
  // Deleting the root-side veth deletes its pair even when a namespace lingers (a process still in it).
  return [...plan.hostVeths.map((v) => ['ip', 'link', 'del', v]), ...plan.namespaces.map((ns) => ['ip', 'netns', 'del', ns]), ['ip', 'link', 'del', plan.bridge]];
}

/** The link fault: node `node`'s root-side veth down (the node is cut off from the bridge). */
export function linkDownCommand(plan: NetnsPlan, node: number): string[] {
  return ['ip', 'link', 'set', plan.hostVeths[node]!, 'down'];
}

function run(cmd: readonly string[]): { ok: boolean; out: string } {
  const r = spawnSync(cmd[0]!, cmd.slice(1), { encoding: 'utf8', timeout: 30_000 });
  if (r.error) return { ok: false, out: r.error.message };
  return { ok: r.status === 0, out: `${r.stdout ?? ''}${r.stderr ?? ''}`.trim() };
}

/** What --netns (and --net-loss) need on this machine that it lacks, or null: Linux, root, `ip` (and `nft`). */
export function netnsMissing(needNft: boolean): string | null {
  if (process.platform !== 'linux') return `Linux (this is ${process.platform})`;
  if (typeof process.getuid !== 'function' || process.getuid() !== 0) return 'root (network namespaces are created with `ip netns add`)';
  if (!run(['ip', '-V']).ok) return 'the `ip` command (iproute2)';
  if (needNft && !run(['nft', '--version']).ok) return 'the `nft` command (nftables), for --net-loss and --net-delay';
  return null;
}

/** The routes and addresses in use in the root namespace (what the subnet must avoid). */
export function takenNetworks(): string[] {
  const out: string[] = [];
  for (const cmd of [['ip', '-4', 'route', 'show', 'table', 'all'], ['ip', '-4', '-o', 'addr', 'show']]) {
    const r = run(cmd);
    if (!r.ok) continue;
    for (const m of r.out.matchAll(/\b(\d+\.\d+\.\d+\.\d+(?:\/\d+)?)\b/g)) out.push(m[1]!);
  }
  return out;
}

/** One run's namespaces, bridge and veths: built by {@link NetnsTopology.create}, removed by teardown(). */
export class NetnsTopology {
  private down = false;
  private relay: DelayRelay | null = null;
  private readonly onExit = () => this.teardown();
  private constructor(readonly plan: NetnsPlan, private readonly log: (line: string) => void) {}

  /** Builds it (StateError naming what is missing or what failed; whatever was built is removed again). */
  static create(nodes: number, opts: { lossPercent?: number; delayMs?: number; log?: (line: string) => void } = {}): NetnsTopology {
    const missing = netnsMissing((opts.lossPercent ?? 0) > 0 || (opts.delayMs ?? 0) > 0);
    if (missing) throw new StateError(`bench chaos --netns needs ${missing}`);
    const plan = netnsPlan(nodes, netnsSuffix(), pickSubnet(takenNetworks()), opts.lossPercent ?? 0, opts.delayMs ?? 0);
    const t = new NetnsTopology(plan, opts.log ?? (() => undefined));
    process.on('exit', t.onExit);
    for (const cmd of setupCommands(plan)) {
      const r = run(cmd);
      if (!r.ok) {
        t.teardown();
        throw new StateError(`bench chaos --netns: \`${cmd.join(' ')}\` failed: ${r.out || 'no output'}`);
      }
    }
    t.log(`[bench chaos] --netns: ${nodes} namespaces ${plan.namespaces.join(', ')} on bridge ${plan.bridge}, ${plan.subnet}.0/24${plan.lossPercent > 0 ? `; ${plan.lossPercent}% of incoming packets to be dropped in each during the runs with faults` : ''}`);
    return t;
  }

  /** Starts (true) or stops (false) dropping --net-loss of the incoming packets in every namespace. */
  setLoss(on: boolean): void {
    for (const cmd of on ? lossCommands(this.plan) : lossRemoveCommands(this.plan)) {
      const r = run(cmd);
      if (!r.ok) throw new StateError(`bench chaos --net-loss: \`${cmd.join(' ')}\` failed: ${r.out || 'no output'}`);
    }
  }

  /** Whether the loss rule is in place in node `node`'s namespace (its nft ruleset lists it). */
  lossActive(node: number): boolean {
    return /numgen random mod 10000 < \d+ drop/.test(this.ruleset(node));
  }

  /**
   * --net-delay: starts (true) the relay in this process and the namespaces' rules that send every
   * connection between nodes through it, or removes both (false). New connections only: turn it on
   * before the launchers start.
   */
  async setDelay(on: boolean): Promise<void> {
    if (this.plan.delayMs <= 0) return;
    if (on && !this.relay) {
      const address = run(relayAddressCommand(this.plan));
      if (!address.ok) throw new StateError(`bench chaos --net-delay: \`${relayAddressCommand(this.plan).join(' ')}\` failed: ${address.out || 'no output'}`);
      const relay = await DelayRelay.start({ host: this.plan.relayAddress, delayMs: this.plan.delayMs, destination: namespaceDestination(this.plan.namespaces, this.plan.addresses), log: this.log });
      this.relay = relay;
      for (const cmd of delayCommands(this.plan, relay.port)) {
        const r = run(cmd);
        if (!r.ok) throw new StateError(`bench chaos --net-delay: \`${cmd.join(' ')}\` failed: ${r.out || 'no output'}`);
      }
      if (this.plan.namespaces.length >= 2) await this.probeDelay();
      relay.connections = relay.failed = relay.bytes = 0; // (the record counts the runs' connections)
    } else if (!on && this.relay) {
      for (const cmd of delayRemoveCommands(this.plan)) run(cmd);
      await this.relay.close();
      this.relay = null;
    }
  }

  /**
   * One connection from node 0 to node 1 through the relay, echoed back; a StateError when it does not
   * come back within 10 s (no /proc/net/nf_conntrack, or a firewall in the root namespace that drops
   * what comes to the relay: every connection between nodes would then fail, and the run stall).
   */
  private async probeDelay(): Promise<void> {
    // (Node 1's namespace is the benchmark's own and nothing listens there yet: any port is free.)
    const a1 = this.plan.addresses[1]!, port = 40_123;
    const node = (ns: string, code: string) => new Promise<string>((resolve, reject) => {
      execFile('ip', ['netns', 'exec', ns, process.execPath, '-e', code], { timeout: 10_000 }, (e, out, err) => (e ? reject(new Error(`${e.message} ${err}`.trim())) : resolve(out)));
    });
    const server = node(this.plan.namespaces[1]!, `const s = require('net').createServer((c) => { c.pipe(c); c.on('end', () => { s.close(); }); }).listen(${port}, '${a1}', () => console.log('up'));`);
    try {
      // (The server may take a moment to listen: the client retries a refused connection.)
      const out = await node(this.plan.namespaces[0]!, `const net = require('net'); const go = () => { const c = net.connect(${port}, '${a1}', () => c.end('probe')); let got = ''; c.on('data', (d) => { got += d; }); c.on('end', () => { console.log(got); }); c.on('error', () => setTimeout(go, 50)); }; go();`);
      if (out.trim() !== 'probe') throw new Error(`the echo came back as '${out.trim()}'`);
      await server;
    } catch (e) {
      server.catch(() => undefined);
      throw new StateError(`bench chaos --net-delay: a test connection from node 0 to node 1 through the relay failed (${(e as Error).message}); ` +
        `relaying needs /proc/net/nf_conntrack in the namespaces and a root namespace that accepts connections to ${this.plan.relayAddress}`);
    }
  }

  /** What the relay carried (null without --net-delay or before it started). */
  delayStats(): { connections: number; failed: number; bytes: number } | null {
    return this.relay ? { connections: this.relay.connections, failed: this.relay.failed, bytes: this.relay.bytes } : null;
  }

  /** Whether the delay rule is in place in node `node`'s namespace (its nft ruleset lists it). */
  delayActive(node: number): boolean {
    return new RegExp(`dnat to ${this.plan.relayAddress.replace(/\./g, '\\.')}:\\d+`).test(this.ruleset(node));
  }

  /** Node `node`'s nftables ruleset, as `nft list ruleset` prints it (its error output when that fails, which no rule pattern matches). */
  private ruleset(node: number): string {
    return run(netnsExec(this.plan, node, ['nft', 'list', 'ruleset'])).out;
  }

  /** Sets node `node`'s link down. */
  linkDown(node: number): void {
    const r = run(linkDownCommand(this.plan, node));
    if (!r.ok) throw new StateError(`bench chaos --netns: \`${linkDownCommand(this.plan, node).join(' ')}\` failed: ${r.out}`);
  }

  /** Removes everything (idempotent); what is left afterwards (names still listed) is returned. */
  teardown(): string[] {
    if (!this.down) {
      this.down = true;
      process.off('exit', this.onExit);
      if (this.relay) { void this.relay.close(); this.relay = null; }
      for (const cmd of teardownCommands(this.plan)) run(cmd);
    }
    return leftovers(this.plan);
  }
}

/** The plan's namespaces and interfaces that still exist. */
export function leftovers(plan: NetnsPlan): string[] {
  const ns = run(['ip', 'netns', 'list']).out, links = run(['ip', '-o', 'link', 'show']).out;
  const linkNames = new Set([...links.matchAll(/^\d+:\s+([^:@\s]+)/gm)].map((m) => m[1]!));
  const nsNames = new Set(ns.split('\n').map((l) => l.split(/\s/)[0]!).filter(Boolean));
  return [...plan.namespaces.filter((n) => nsNames.has(n)), ...[plan.bridge, ...plan.hostVeths].filter((n) => linkNames.has(n))];
}
