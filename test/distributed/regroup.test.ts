// regroup (lib/distributed/init.ts, in-job recovery): a regroup waiting for a peer of its generation that
// never comes (a replacement that died while it started) ends within a second or two once the next
// generation is in the abort file, whether the file says so while the regroup connects or already did
// before it began; a joining process's unconnected group throws NotConnectedError (a CommError); check
// mode's keys carry the generation, so the collective #0 of a new generation is never compared with the
// old generation's #0. Ranks run test/distributed/regroup-rank.mjs in child processes.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { StoreServer } from '../../lib/distributed/index.js';
import { nodeArgs } from '../helpers/node-script.js';

const here = dirname(fileURLToPath(import.meta.url));
const script = join(here, 'regroup-rank.mjs');
const dirs: string[] = [];
const children: ChildProcess[] = [];
let server: StoreServer | undefined;

afterEach(() => {
  for (const c of children.splice(0)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
});
afterAll(async () => {
  await server?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Rank { lines: Array<Record<string, any>>; exited: Promise<number | null>; stderr: () => string; next(): Promise<Record<string, any>> }

let prefixes = 0;
/** Starts rank `rank` of a world of `size` running `mode`, against the test's store. */
async function startRank(mode: string, rank: number, size: number, env: Record<string, string>, prefix: string): Promise<Rank> {
  server ??= await StoreServer.start({ host: '127.0.0.1', port: 0 });
  const child = spawn(process.execPath, [...nodeArgs(script), mode], {
    env: { ...process.env, RANK: String(rank), LOCAL_RANK: String(rank), WORLD_SIZE: String(size), LOCAL_WORLD_SIZE: String(size),
      MASTER_ADDR: '127.0.0.1', MASTER_PORT: String(server.port), NODETRON_STORE_PREFIX: prefix, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  const lines: Array<Record<string, any>> = [];
  const waiters: Array<() => void> = [];
  let buf = '', err = '';
  child.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    let nl: number;
    while ((nl = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      try { lines.push(JSON.parse(line)); } catch { continue; }
      for (const w of waiters.splice(0)) w();
    }
  });
  child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
  const exited = new Promise<number | null>((r) => child.once('exit', (c) => { for (const w of waiters.splice(0)) w(); r(c); }));
  let read = 0;
  const next = async (): Promise<Record<string, any>> => {
    while (read >= lines.length) {
      if (child.exitCode !== null || child.signalCode !== null) throw new Error(`rank ${rank} exited (${child.exitCode ?? child.signalCode}) without another line; stderr:\n${err}`);
      await new Promise<void>((r) => waiters.push(r));
    }
    return lines[read++]!;
  };
  return { lines, exited, stderr: () => err, next };
}

function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), 'nt-regroup-'));
  dirs.push(d);
  return d;
}

/** The launcher's way: a temporary file renamed over the abort file. */
function writeAbort(dir: string, generation: number): void {
  writeFileSync(join(dir, 'abort.tmp'), `${generation}\n`);
  renameSync(join(dir, 'abort.tmp'), join(dir, 'abort'));
}

/** Rank 0 of two, a replacement of generation 1 (its peer never starts), with the recovery directory `dir`. */
const joining = (dir: string) => startRank('join-never', 0, 2, {
  NODETRON_RECOVERY: '1', NODETRON_RECOVERY_DIR: dir, NODETRON_GENERATION: '1', NODETRON_JOIN: '1',
}, `regroup-${process.pid}-${prefixes++}`);

describe('regroup waiting for a peer that never comes', () => {
  it('rejects with CommError within 2 s of the next generation reaching the abort file while it connects', async () => {
    const dir = tmp();
    const r = await joining(dir);
    const pending = await r.next();
    // A joining process's group is not connected: its ops throw NotConnectedError, a CommError.
    expect(pending.notConnected, r.stderr()).toBe(true);
    expect(pending.pending).toMatchObject({ name: 'NotConnectedError', code: 'ERR_COMM', call: 'notConnected', comm: true });
    expect((await r.next()).joined).toBe(true);
    // regroup(1) is now waiting in the world group's rendezvous for rank 1, which never comes.
    await new Promise((res) => setTimeout(res, 1500));
    expect(r.lines.length).toBe(2);
    const written = Date.now();
    writeAbort(dir, 2);
    const out = await r.next();
    console.log(`[regroup timing] abort file written while connecting -> regroup rejected: ${out.at - written} ms`);
    expect(out.error, r.stderr()).toMatchObject({ comm: true });
    expect(out.error.message).toMatch(/generation 2/);
    expect(out.at - written).toBeLessThan(2000);
    expect(await r.exited).toBe(0);
  }, 120_000);

  it('rejects at once when the abort file already says a later generation when it begins', async () => {
    const dir = tmp();
    writeAbort(dir, 2);
    const r = await joining(dir);
    await r.next();
    expect((await r.next()).joined, r.stderr()).toBe(true);
    const out = await r.next();
    console.log(`[regroup timing] abort file already at the next generation -> regroup rejected after ${out.ms} ms`);
    expect(out.error, r.stderr()).toMatchObject({ comm: true });
    expect(out.error.message).toMatch(/generation 2/);
    expect(out.ms).toBeLessThan(2000);
    expect(await r.exited).toBe(0);
  }, 120_000);
});

describe('check mode across a regroup', () => {
  it("compares a new generation's collective #0 with the same generation's only", async () => {
    const prefix = `regroup-check-${process.pid}-${prefixes++}`;
    const ranks = await Promise.all([0, 1].map((rank) => startRank('check', rank, 2, { NODETRON_COMM_CHECK: '1' }, prefix)));
    const outs = await Promise.all(ranks.map((r) => r.next()));
    for (const [i, out] of outs.entries()) {
      expect(out, ranks[i]!.stderr()).toMatchObject({ ok: true, generation: 1, seq: 1 });
      expect(out.out).toEqual([[10]]);
    }
    expect(await Promise.all(ranks.map((r) => r.exited))).toEqual([0, 0]);
  }, 120_000);
});
