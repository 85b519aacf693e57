// Test helper: runs a rank script in N processes against a StoreServer of the test, with the
// launcher's environment contract, and collects each rank's exit code, stdout and stderr.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { StoreServer } from '../../lib/distributed/index.js';
import { nodeArgs } from '../helpers/node-script.js';

export const fixtures = join(dirname(fileURLToPath(import.meta.url)), '..', 'fixtures', 'dist');

export interface RankResult {
  rank: number;
  code: number | null;
  stdout: string;
  stderr: string;
  /** The last stdout line parsed as JSON (rank scripts print their result there), or undefined. */
  result: any;
}

/** Spawns `script` (a file in test/fixtures/dist) as ranks 0..n-1; `args` go to every rank. */
export async function runRanks(script: string, n: number, args: string[] = [], env: Record<string, string> = {},
  timeoutMs = 150_000): Promise<RankResult[]> {
  const server = await StoreServer.start({ host: '127.0.0.1', port: 0 });
  try {
    const runs = Array.from({ length: n }, (_, rank) => new Promise<RankResult>((resolve) => {
      const child = spawn(process.execPath, [...nodeArgs(join(fixtures, script)), ...args], {
        env: { ...process.env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: String(n), LOCAL_WORLD_SIZE: String(n),
          MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(server.port), NODETRON_STORE_PREFIX: 'test', ...env },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let stdout = '', stderr = '';
      child.stdout.on('data', (d: Buffer) => { stdout += d.toString(); });
      child.stderr.on('data', (d: Buffer) => { stderr += d.toString(); });
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      child.on('close', (code) => {
        clearTimeout(timer);
        const last = stdout.trim().split('\n').pop() ?? '';
        let result: any;
        try { result = JSON.parse(last); } catch { result = undefined; }
        resolve({ rank, code, stdout, stderr, result });
      });
    }));
    return await Promise.all(runs);
  } finally {
    await server.close();
  }
}
