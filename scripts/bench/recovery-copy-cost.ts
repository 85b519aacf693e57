// The CPU cost of one in-memory copy of in-job recovery (issue #37's "copy overhead at most 3%"), split
// by who pays it: the rank copies its state out of the live tensors into an image buffer (one memcpy,
// takeLayoutImage) and sends it (HolderClient.put over TCP); the holder (ImageHolder, another process,
// here on the same cores) receives it. Each side's process.cpuUsage() over N puts of B bytes; the
// rank's share is what slows training where the holder runs elsewhere (another node's cores), the
// holder's what it adds where both share the cores (this 2-core machine). Beside them, the memcpy
// alone (the floor of any copy).
//   npx tsx scripts/bench/recovery-copy-cost.ts [--bytes 20.6e6] [--puts 30] [--json F]
import { fork } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath } from 'node:url';
import { HolderClient } from '../../lib/distributed/holder-client.js';
import { ImageHolder } from '../../lib/distributed/holder.js';

const arg = (k: string, d: string) => { const i = process.argv.indexOf(k); return i >= 0 ? process.argv[i + 1]! : d; };
const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

if (process.argv[2] === 'holder') {
  const holder = await ImageHolder.start({ keep: 2 });
  let u0 = process.cpuUsage();
  process.on('message', async (m: { cmd: string }) => {
    if (m.cmd === 'reset') { u0 = process.cpuUsage(); process.send!({ ok: true }); }
    if (m.cmd === 'usage') { process.send!({ cpuMs: cpuMs(process.cpuUsage(u0)) }); await holder.close(); process.exit(0); }
  });
  process.send!({ port: holder.port });
} else {
  const bytes = Number(arg('--bytes', '20.6e6')), puts = Number(arg('--puts', '30')), json = arg('--json', '');
  const child = fork(fileURLToPath(import.meta.url), ['holder'], { execArgv: process.execArgv });
  const next = () => new Promise<Record<string, number>>((r) => child.once('message', (m) => r(m as Record<string, number>)));
  const { port } = await next();
  const client = await HolderClient.connect(`127.0.0.1:${port}`);
  const live = Buffer.alloc(bytes, 7), image = Buffer.allocUnsafe(bytes);
  // Warm-up: the first puts grow the sockets' buffers and the holder's pools.
  for (let s = 0; s < 3; s++) { live.copy(image); await client.put(0, s, 0, image); }
  child.send({ cmd: 'reset' }); await next();
  let copy = 0, send = 0;
  for (let s = 0; s < puts; s++) {
    let u = process.cpuUsage(); live.copy(image); copy += cpuMs(process.cpuUsage(u));
    u = process.cpuUsage(); await client.put(0, 3 + s, 0, image); send += cpuMs(process.cpuUsage(u));
  }
  child.send({ cmd: 'usage' });
  const holderMs = (await next()).cpuMs / puts;
  await client.close();
  const row = { bytes, puts, copyMs: copy / puts, sendMs: send / puts, rankMs: (copy + send) / puts, holderMs, totalMs: (copy + send) / puts + holderMs };
  console.log('# in-memory copy of one rank, CPU ms per copy (process.cpuUsage, user + system)');
  console.log('bytes       puts  memcpy  send   rank total  holder receive  all');
  console.log(`${String(bytes).padEnd(11)} ${String(puts).padEnd(5)} ${row.copyMs.toFixed(2).padStart(6)} ${row.sendMs.toFixed(2).padStart(6)} ${row.rankMs.toFixed(2).padStart(10)} ${row.holderMs.toFixed(2).padStart(15)} ${row.totalMs.toFixed(2).padStart(6)}`);
  if (json) writeFileSync(json, JSON.stringify({ bench: 'recovery-copy-cost', machine: { date: new Date().toISOString(), node: process.version, cpu: cpus()[0]?.model, cores: cpus().length, loadAverage: loadavg() }, command: process.argv.slice(1).join(' '), ...row }, null, 2));
}
