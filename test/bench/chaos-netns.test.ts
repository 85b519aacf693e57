// `nodetron bench chaos --netns`: the names, addresses and command lines (always), the option checks, and one
// short real run (2 nodes × 2 ranks in network namespaces, 1 spare per node, a link fault) where this machine
// can create network namespaces (root, `ip netns add` working); elsewhere that test is skipped.
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError } from '../../lib/errors.js';
import { analyzeFaults, chaosOptions, checkNetOptions, isNodeFault, launchCommands, runChaos, type ChaosEvent, type ChaosOptions, type Injected } from '../../lib/bench/chaos.js';
import { delayCommands, delayRemoveCommands, linkDownCommand, lossCommands, lossRemoveCommands, lossThreshold, netnsExec, netnsPlan, NetnsTopology, pickSubnet, relayAddressCommand, setupCommands, teardownCommands } from '../../lib/bench/netns.js';

const work = mkdtempSync(join(tmpdir(), 'nt-bench-chaos-netns-test-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

/** Root, and `ip netns add` works here (a container without CAP_SYS_ADMIN or without iproute2 cannot). */
const canNetns = (() => {
  if (process.platform !== 'linux' || process.getuid?.() !== 0) return false;
  const name = `nt-probe-${process.pid}`;
  const add = spawnSync('ip', ['netns', 'add', name]);
  if (add.error || add.status !== 0) return false;
  spawnSync('ip', ['netns', 'del', name]);
  return true;
})();

const listed = () => `${spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout}\n${spawnSync('ip', ['-o', 'link', 'show'], { encoding: 'utf8' }).stdout}`;

describe('bench chaos --netns: names, addresses, command lines', () => {
  it('picks a 10.x.y.0/24 that overlaps no route or address in use', () => {
    // Draws that land on taken subnets are skipped; the default route says nothing.
    const draws = [9 / 254, 3 / 256, 9 / 254, 4 / 256, 9 / 254, 5 / 256];
    let i = 0;
    const rand = () => draws[i++ % draws.length]!;
    expect(pickSubnet(['0.0.0.0/0', '10.10.3.0/24', '10.10.4.7', '192.0.2.0/24'], rand)).toBe('10.10.5');
    expect(pickSubnet(['default'], () => 0)).toBe('10.1.0');
    // A /8 over all of 10/8: nothing is free.
    expect(() => pickSubnet(['10.0.0.0/8'], () => 0)).toThrow(/every 10\.x\.y\.0\/24 overlaps/);
    // A /16 covering the drawn one: the draw moves on.
    let j = 0;
    const r2 = () => [0.5, 0, 0.9, 0][j++ % 4]!;
    const got = pickSubnet(['10.128.0.0/16'], r2);
    expect(got).not.toMatch(/^10\.128\./);
    expect(got).toMatch(/^10\.\d+\.\d+$/);
  });

  it('names every namespace and interface after the run suffix, within 15 characters, and addresses node i as .(i+1)', () => {
    const p = netnsPlan(3, 'a1b2c3', '10.77.5', 1.5);
    expect(p.namespaces).toEqual(['nodetron-a1b2c3-0', 'nodetron-a1b2c3-1', 'nodetron-a1b2c3-2']);
    expect(p.addresses).toEqual(['10.77.5.1', '10.77.5.2', '10.77.5.3']);
    expect(p.bridge).toBe('ntbra1b2c3');
    expect(p.hostVeths).toEqual(['ntva1b2c3n0', 'ntva1b2c3n1', 'ntva1b2c3n2']);
    for (const n of [p.bridge, ...p.hostVeths, ...p.nodeVeths]) expect(n.length).toBeLessThanOrEqual(15);
    expect(netnsPlan(64, 'ffffff', '10.1.1').hostVeths[63]!.length).toBeLessThanOrEqual(15);
    expect(() => netnsPlan(2, 'bad suffix!', '10.1.1')).toThrow(ArgumentError);
    const setup = setupCommands(p).map((c) => c.join(' '));
    expect(setup[0]).toBe('ip link add ntbra1b2c3 type bridge');
    expect(setup).toContain('ip link add ntva1b2c3n1 type veth peer name ntpa1b2c3n1 netns nodetron-a1b2c3-1');
    expect(setup).toContain('ip link set ntva1b2c3n1 master ntbra1b2c3 up');
    expect(setup).toContain('ip -n nodetron-a1b2c3-1 addr add 10.77.5.2/24 dev ntpa1b2c3n1');
    expect(setup).toContain('ip -n nodetron-a1b2c3-2 link set lo up');
    expect(setup.some((c) => c.includes('nft'))).toBe(false); // the loss is set per run (lossCommands)
    expect(lossThreshold(1.5)).toBe(150);
    const loss = lossCommands(p).map((c) => c.join(' '));
    expect(loss).toHaveLength(9);
    expect(loss).toContain('ip netns exec nodetron-a1b2c3-0 nft add rule inet nodetron input iifname != lo numgen random mod 10000 < 150 drop');
    expect(lossRemoveCommands(p).map((c) => c.join(' '))).toContain('ip netns exec nodetron-a1b2c3-2 nft delete table inet nodetron');
    expect(lossCommands(netnsPlan(2, 'x', '10.1.1', 0))).toEqual([]);
    expect(teardownCommands(p).map((c) => c.join(' '))).toEqual([
      'ip link del ntva1b2c3n0', 'ip link del ntva1b2c3n1', 'ip link del ntva1b2c3n2',
      'ip netns del nodetron-a1b2c3-0', 'ip netns del nodetron-a1b2c3-1', 'ip netns del nodetron-a1b2c3-2', 'ip link del ntbra1b2c3']);
    expect(linkDownCommand(p, 2)).toEqual(['ip', 'link', 'set', 'ntva1b2c3n2', 'down']);
    expect(netnsExec(p, 1, ['node', 'x.js'])).toEqual(['ip', 'netns', 'exec', 'nodetron-a1b2c3-1', 'node', 'x.js']);
    // --net-delay: each namespace sends its new TCP connections to other nodes (not to itself, nor to the relay) to the relay.
    expect(delayCommands(p, 4000)).toEqual([]);
    const d = netnsPlan(2, 'a1b2c3', '10.77.5', 0, 25);
    expect(relayAddressCommand(d)).toEqual(['ip', 'addr', 'add', '10.77.5.254/24', 'dev', 'ntbra1b2c3']);
    const delay = delayCommands(d, 4000).map((c) => c.join(' '));
    expect(delay).toHaveLength(6);
    expect(delay).toContain('ip netns exec nodetron-a1b2c3-1 nft add rule ip nodetron_delay output ip daddr != { 10.77.5.2, 10.77.5.254 } ip daddr 10.77.5.0/24 meta l4proto tcp dnat to 10.77.5.254:4000');
    expect(delayRemoveCommands(d).map((c) => c.join(' '))).toEqual([
      'ip netns exec nodetron-a1b2c3-0 nft delete table ip nodetron_delay', 'ip netns exec nodetron-a1b2c3-1 nft delete table ip nodetron_delay', 'ip addr del 10.77.5.254/24 dev ntbra1b2c3']);
  });

  it("runs each node's launcher under `ip netns exec`, with node 0's address as the master's", () => {
    const o = { ...chaosOptions({ nproc: 2, nodes: 2, spares: 1, netns: true, faults: 'link', steps: 8, script: 's.ts', layout: '--dp 2', 'script-args': '' }), launcher: ['L'] };
    const p = netnsPlan(2, 'abc123', '10.9.8');
    const [n0, n1] = launchCommands(o, 'chaos', '/d', 4321, p);
    expect(n0!.join(' ')).toBe('ip netns exec nodetron-abc123-0 L --nproc-per-node 2 --nnodes 2 --node-rank 0 --master-addr 10.9.8.1 --master-port 4321 --spares 1 s.ts --dp 2 --steps 8 --recover memory --save /d/ckpt --save-every 5 --out /d');
    expect(n1!.slice(0, 4)).toEqual(['ip', 'netns', 'exec', 'nodetron-abc123-1']);
    expect(n1).toContain('10.9.8.1');
    expect(n1!.join(' ')).toContain('--node-rank 1 --master-addr 10.9.8.1');
    // Without --netns: on the loopback, no `ip`.
    const [plain] = launchCommands({ ...o, netns: false }, 'chaos', '/d', 4321);
    expect(plain![0]).toBe('L');
    expect(plain).toContain('127.0.0.1');
    // --heartbeat-timeout-ms goes to every launcher.
    expect(launchCommands({ ...o, heartbeatTimeoutMs: 5000 }, 'reference', '/d', 1, p)[1]!.join(' ')).toContain('--heartbeat-timeout-ms 5000');
  });

  it('refuses network options that do not fit together, naming what is missing', () => {
    expect(() => chaosOptions({ faults: 'link', nodes: 2 })).toThrow(/'link' fault .* needs --netns/);
    expect(() => chaosOptions({ netns: true, nodes: 1 })).toThrow(/--netns .* --nodes 2 or more/);
    expect(() => chaosOptions({ netns: true })).toThrow(ArgumentError); // one node by default
    expect(() => chaosOptions({ 'net-loss': 1, nodes: 2 })).toThrow(/--net-loss .* needs --netns/);
    expect(() => chaosOptions({ 'net-loss': 101, nodes: 2, netns: true })).toThrow(/0 to 100/);
    expect(() => chaosOptions({ faults: 'kill,cut' })).toThrow(/unknown fault 'cut' .*link/);
    expect(() => chaosOptions({ 'net-delay': 5, nodes: 2 })).toThrow(/--net-delay .* needs --netns/);
    expect(() => chaosOptions({ 'net-delay': 20_000, nodes: 2, netns: true })).toThrow(/0 to 10000/);
    expect(chaosOptions({ netns: true, nodes: 2, 'net-delay': 5 })).toMatchObject({ netDelayMs: 5 });
    const ok = chaosOptions({ netns: true, nodes: 2, faults: 'link,kill', 'net-loss': 0.5, 'link-grace': 5 });
    expect(ok).toMatchObject({ netns: true, nodes: 2, faults: ['link', 'kill'], netLoss: 0.5, linkGraceSec: 5 });
    expect(() => checkNetOptions({ netns: true, nodes: 2, faults: ['link'], netLoss: 0 })).not.toThrow();
  });

  it('analyzes a link fault as a node fault: all its ranks lost at once, matched to the fault event', () => {
    expect(isNodeFault('link')).toBe(true);
    expect(isNodeFault('node')).toBe(true);
    expect(isNodeFault('kill')).toBe(false);
    const e = (t: number, src: 'agent' | 'rank', event: string, f: Record<string, unknown> = {}): ChaosEvent => ({ t, src, event, node: 0, ...f });
    const injected: Injected[] = [{ i: 0, at: 1000, how: 'link', rank: null, node: 1, pid: 5, ranks: [2, 3] }];
    const rows = analyzeFaults(injected, [
      e(9000, 'agent', 'fault', { generation: 1, lost: [2, 3], how: 'node', lostNode: 1 }),
      e(13000, 'rank', 'recovered', { rank: 0, generation: 1, step: 3, stepsLost: 1 }),
      ...[0, 1, 2, 3].map((r) => e(15000 + r, 'rank', 'first-step', { rank: r, generation: 1, step: 4 })),
    ], 4);
    expect(rows).toEqual([expect.objectContaining({ how: 'link', rank: null, node: 1, ranks: [2, 3], generation: 1, detectMs: 8000, fullStrengthMs: 14003, stepsLost: 1, diskFallback: false, status: 'recovered' })]);
  });
});

/** Runs `code` with node in namespace `ns`; resolves with its stdout (a failure rejects with its stderr). */
function inNamespace(ns: string, code: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', code], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    c.stdout.on('data', (d: Buffer) => { out += d.toString(); });
    c.stderr.on('data', (d: Buffer) => { err += d.toString(); });
    c.on('close', (code) => (code === 0 ? resolve(out) : reject(new Error(`exit ${code}: ${err}`))));
  });
}

describe('bench chaos --netns --net-delay: the relay between namespaces', () => {
  it.skipIf(!canNetns)('delays a connection between two nodes by twice the delay per round trip, leaves a node\'s own connections alone, and removes its rules', async () => {
    const delayMs = 40;
    const t = NetnsTopology.create(2, { delayMs });
    try {
      const [a0, a1] = t.plan.addresses as [string, string];
      await t.setDelay(true);
      expect(t.delayActive(0) && t.delayActive(1)).toBe(true);
      // An echo server on node 1 and one on node 0 (each on its node's address); node 0's client times a round trip to each.
      const server = (addr: string) => `require('net').createServer((s) => s.pipe(s)).listen(7001, '${addr}', () => console.log('up')); setTimeout(() => process.exit(0), 20000);`;
      const servers = [spawn('ip', ['netns', 'exec', t.plan.namespaces[1]!, process.execPath, '-e', server(a1)]), spawn('ip', ['netns', 'exec', t.plan.namespaces[0]!, process.execPath, '-e', server(a0)])];
      try {
        await Promise.all(servers.map((c) => new Promise<void>((r) => c.stdout!.once('data', () => r()))));
        const rtt = (addr: string) => inNamespace(t.plan.namespaces[0]!, `const t0 = performance.now(); const s = require('net').connect(7001, '${addr}', () => s.write('x')); s.on('data', () => { console.log(performance.now() - t0); process.exit(0); });`);
        const remote = Number(await rtt(a1)), local = Number(await rtt(a0));
        // The connection's SYN is local (to the relay), the data goes out and back through it: at least 2 × delay.
        expect(remote).toBeGreaterThanOrEqual(2 * delayMs - 2);
        expect(t.delayStats()).toMatchObject({ connections: 1, failed: 0 });
        expect(Number.isFinite(local)).toBe(true);
        expect(t.delayStats()!.connections).toBe(1); // node 0 to its own address: not relayed
      } finally {
        for (const c of servers) c.kill('SIGKILL');
      }
      await t.setDelay(false);
      expect(t.delayActive(0)).toBe(false);
    } finally {
      expect(t.teardown()).toEqual([]);
    }
  }, 60_000);
});

describe('bench chaos --netns: a real run', () => {
  // Leaves the namespaces for nothing else: refused as a user error on a machine that cannot make them.
  it.skipIf(!canNetns)('cuts a node off (link down): the job replaces its ranks from memory, the cut node ends by itself, nothing is left behind', async () => {
    const before = listed();
    const out = join(work, 'link');
    const o: ChaosOptions = {
      ...chaosOptions({ nproc: 2, nodes: 2, spares: 1, netns: true, faults: 'link', kills: 1, 'kill-every': 3, steps: 8, baseline: 'none',
        'heartbeat-timeout-ms': 5000, 'link-grace': 20, timeout: 240, out }),
      log: () => undefined,
    };
    const r = await runChaos(o);
    expect(r.network?.namespaces).toHaveLength(2);
    expect(r.network?.left).toEqual([]);
    // Everything this run made is gone (and nothing else was touched).
    const after = listed();
    for (const n of [...r.network!.namespaces, r.network!.bridge, ...r.network!.hostVeths]) {
      expect(before.includes(n)).toBe(false);
      expect(after.includes(n)).toBe(false);
    }
    expect(r.runs.chaos!.commands[1]!.slice(0, 4)).toEqual(['ip', 'netns', 'exec', r.network!.namespaces[1]]);
    expect(r.injected.chaos).toHaveLength(1);
    expect(r.injected.chaos[0]).toMatchObject({ how: 'link', node: 1, rank: null, ranks: [2, 3] });
    expect(r.faults).toHaveLength(1);
    const log = () => readFileSync(join(out, 'chaos.log'), 'utf8').slice(-6000);
    expect(r.faults[0], log()).toMatchObject({ how: 'link', status: 'recovered', diskFallback: false, fallbackRestart: false });
    // The cut-off launcher lost the store, stopped its workers and exited on its own (the bench did not kill it).
    expect(r.injected.chaos[0]!.cutLauncherExitMs).not.toBeNull();
    expect(r.runs.chaos!.exitCodes[0]).toBe(0);
    // The job lost nothing: the losses are the failure-free run's, bit for bit.
    expect(r.losses).toMatchObject({ equal: true, stepsCompared: 8 });
    // The survivors whose holder was on the cut node (node 0's ranks: their copies went to node 1) send
    // their copies to a live holder from the recovery on, instead of waiting out puts to the cut one.
    const events = readFileSync(join(out, 'chaos-events.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as ChaosEvent);
    expect(events.filter((e) => e.event === 'rehomed').map((e) => e.rank).sort()).toEqual([0, 1]);
    expect(readFileSync(join(out, 'chaos.log'), 'utf8')).not.toMatch(/could not send its in-memory copy/);
  }, 300_000);
});
