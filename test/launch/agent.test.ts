// The launch agent's monitor against a store that answers slowly: a worker that fails while the
// monitor is waiting on the store must still fail the job (the launcher once returned 0 when the
// last worker's failing exit landed between the monitor's failure check and its "all done" check).
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { PrefixStore, TCPStore } from '../../lib/distributed/store.js';
import type { Store } from '../../lib/distributed/store-api.js';
import { StoreServer } from '../../lib/distributed/store-server.js';
import { LaunchAgent, type AgentConfig } from '../../lib/launch/agent.js';

const work = mkdtempSync(join(tmpdir(), 'nt-agent-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const gone = (pid: number) => {
  try {
    process.kill(pid, 0);
    return false;
  } catch {
    return true;
  }
};

/** Holds the agent's first heartbeat until every worker (they write their pids) has exited and been reaped. */
class SlowHeartbeatStore extends PrefixStore {
  held = false;
  constructor(inner: Store, private readonly pidFiles: string[]) {
    super(inner, 'outer');
  }
  override async set(key: string, value: string | Uint8Array): Promise<void> {
    if (!this.held && key.endsWith('/heartbeat/0')) {
      this.held = true;
      for (;;) {
        const pids = this.pidFiles.filter(existsSync).map((f) => Number(readFileSync(f, 'utf8')));
        if (pids.length === this.pidFiles.length && pids.every(gone)) break;
        await sleep(20);
      }
      await sleep(300); // the exit callbacks wait for the workers' output to flush
    }
    return super.set(key, value);
  }
}

describe('launch agent', () => {
  it('fails the job when every worker fails while the monitor waits on the store', async () => {
    const script = join(work, 'fail.mjs');
    writeFileSync(script, `import { writeFileSync } from 'node:fs';
writeFileSync(${JSON.stringify(work)} + '/pid-' + process.env.LOCAL_RANK, String(process.pid));
console.error('failing on purpose');
process.exit(3);
`);
    const server = await StoreServer.start({ host: '127.0.0.1', port: 0 });
    const tcp = await TCPStore.connect({ host: '127.0.0.1', port: server.port, timeoutMs: 10_000 });
    const store = new SlowHeartbeatStore(tcp, [0, 1].map((r) => join(work, `pid-${r}`)));
    const config: AgentConfig = {
      script, scriptArgs: [], nprocPerNode: 2, nnodes: 1, nodeRank: 0, masterAddr: '127.0.0.1', masterPort: server.port,
      maxRestarts: 0, monitorIntervalMs: 50, joinTimeoutMs: 10_000, heartbeatTimeoutMs: 60_000, stopGraceMs: 1000, runId: 'race',
    };
    const lines: string[] = [];
    try {
      const code = await new LaunchAgent(config, store, (l) => lines.push(l)).run();
      expect(store.held).toBe(true);
      expect(code, lines.join('\n')).toBe(1);
      expect(lines.join('\n')).toMatch(/exited with code 3/);
    } finally {
      await tcp.close();
      await server.close();
    }
  }, 120_000);
});
