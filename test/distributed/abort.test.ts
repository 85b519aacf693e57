// Communicator abort (in-job recovery, issue #37): GlooCommunicator.abort() wakes an op blocked on
// Gloo's pairs or in the shared-memory segment, a connect() waiting on its store, abortAllCommunicators,
// the native abort-file watcher (also while the JS thread blocks in waitSync), a SIGKILLed peer
// mid-allreduce, and the abort of the staged and NCCL backends. Timings print as "[abort timing]".
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { Worker } from 'node:worker_threads';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { ArgumentError, CommError } from '../../lib/errors.js';
import { cpu, type NativeStorage } from '../../lib/native.js';
import { StoreServer } from '../../lib/distributed/index.js';
import { createGlooBackend, type CommBackend, type CommPromise } from '../../lib/distributed/backend.js';
import { abortAllCommunicators, abortWhileConnecting, readAbortFile, stopAbortWatch, untilAborted, watchAbortFile } from '../../lib/distributed/abort.js';
import { HostStagedBackend } from '../../lib/distributed/host-staging.js';
import { ncclRanksClosedAfterEach } from './fake-nccl.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const F32 = 0, SUM = 0;
const OP_TIMEOUT = 60_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const timing = (what: string, ms: number) => console.log(`[abort timing] ${what}: ${ms.toFixed(1)} ms`);

let server: StoreServer | undefined;
const open: CommBackend[] = [];
const dirs: string[] = [];
let groupId = 0;

async function store(): Promise<StoreServer> {
  server ??= await StoreServer.start({ host: '127.0.0.1', port: 0 });
  return server;
}

/** n connected Gloo communicators of one group, all in this process. */
async function group(n: number, sharedMemory: boolean, verifySizes = false): Promise<CommBackend[]> {
  const s = await store();
  const prefix = `abort-test/${process.pid}/${groupId++}`;
  const make = (rank: number) => createGlooBackend({ storeHost: '127.0.0.1', storePort: s.port, prefix, rank, size: n, timeoutMs: OP_TIMEOUT,
    deviceHost: '127.0.0.1', deviceIface: '', verifySizes, sharedMemory });
  const comms = await Promise.all(Array.from({ length: n }, (_, rank) => make(rank)));
  open.push(...comms);
  for (const c of comms) expect(c.sharedMemory).toBe(sharedMemory);
  return comms;
}
const pair = (sharedMemory: boolean, verifySizes = false) => group(2, sharedMemory, verifySizes) as Promise<[CommBackend, CommBackend]>;

function storage(floats: number): NativeStorage {
  return new (cpu().Storage)(floats * 4, false) as NativeStorage;
}

/** How a promise ends, and when (ms after `since`). */
async function outcome(p: Promise<unknown>, since: number): Promise<{ error: unknown; ms: number }> {
  const error = await p.then(() => undefined, (e: unknown) => e);
  return { error, ms: performance.now() - since };
}

/** Resolves true if `p` is still pending after `ms`. */
async function stillPending(p: Promise<unknown>, ms: number): Promise<boolean> {
  let settled = false;
  p.then(() => { settled = true; }, () => { settled = true; });
  await sleep(ms);
  return !settled;
}

function tmp(): string {
  const d = mkdtempSync(join(tmpdir(), 'nt-abort-'));
  dirs.push(d);
  return d;
}

/** The launcher's way: write a temporary file, then rename it over the abort file. */
function writeAtomically(path: string, text: string): void {
  writeFileSync(`${path}.tmp`, text);
  renameSync(`${path}.tmp`, path);
}

afterEach(async () => {
  for (const c of open.splice(0)) {
    c.abort?.('test cleanup');
    await c.destroy();
  }
});

afterAll(async () => {
  stopAbortWatch();
  await server?.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('GlooCommunicator.abort', () => {
  for (const shm of [true, false]) {
    it(`rejects an allReduce blocked on a peer that never joins, promptly, with the reason (shared memory ${shm ? 'on' : 'off'})`, async () => {
      const [a] = await pair(shm);
      const buf = storage(1024);
      const p = a.allReduce(buf, buf, F32, 1024, SUM, 0, OP_TIMEOUT);
      expect(await stillPending(p, 300)).toBe(true);
      const t0 = performance.now();
      a.abort!('rank 3 was lost in generation 1');
      const { error, ms } = await outcome(p, t0);
      timing(`blocked allReduce rejected after abort (shm ${shm ? 'on' : 'off'})`, ms);
      expect(error).toBeInstanceOf(CommError);
      expect((error as Error).message).toMatch(/allReduce\(sum\) #0 \(4096 bytes\) on rank 0 of group '.*' \(size 2\) failed: the communicator was aborted: rank 3 was lost in generation 1$/);
      expect(ms).toBeLessThan(2000);
      // Later ops fail at once, naming the abort; a second abort is a no-op.
      a.abort!('another reason');
      const later = await outcome(a.allReduce(buf, buf, F32, 1024, SUM, 1, OP_TIMEOUT), performance.now());
      expect(later.error).toBeInstanceOf(CommError);
      expect((later.error as Error).message).toContain('the communicator was aborted: rank 3 was lost in generation 1');
      expect(later.ms).toBeLessThan(1000);
      const d0 = performance.now();
      await a.destroy();
      expect(performance.now() - d0).toBeLessThan(2000);
      expect(() => a.abort!('after destroy')).not.toThrow();
    });
  }

  it('wakes a barrier, a broadcast with verified sizes and a pending recv at once, each with the reason', async () => {
    const [a, b] = await pair(false, true);
    const buf = storage(16), r = storage(16);
    // The peer joins the first barrier only, so the second blocks on a pair.
    await Promise.all([a.barrier(0, OP_TIMEOUT), b.barrier(0, OP_TIMEOUT)]);
    const ops: CommPromise[] = [a.barrier(1, OP_TIMEOUT), a.broadcast(buf, buf, F32, 16, 1, 2, OP_TIMEOUT), a.recv(r, F32, 16, 1, 7, OP_TIMEOUT)];
    expect(await stillPending(Promise.all(ops), 300)).toBe(true);
    const t0 = performance.now();
    a.abort!('stop now');
    const results = await Promise.all(ops.map((p) => outcome(p, t0)));
    for (const { error, ms } of results) {
      expect(error).toBeInstanceOf(CommError);
      expect((error as Error).message).toContain('the communicator was aborted: stop now');
      expect(ms).toBeLessThan(2000);
    }
    expect((results[0]!.error as Error).message).toMatch(/^barrier #1/);
    expect((results[2]!.error as Error).message).toMatch(/^recv from rank 1 \(tag 7\)/);
  });

  it('wakes an op on a healthy pair when the pair to the next rank failed before (a dead peer)', async () => {
    const [a, b] = await group(3, false);
    // Rank 1 goes away: rank 0's pair to it fails on its own, without signalling the pair to rank 2.
    b!.abort!('rank 1 leaves');
    await sleep(300);
    const r = storage(4);
    const p = a!.recv(r, F32, 4, 2, 1, OP_TIMEOUT);
    expect(await stillPending(p, 300)).toBe(true);
    const t0 = performance.now();
    a!.abort!('rank 1 was lost');
    const { error, ms } = await outcome(p, t0);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain('the communicator was aborted: rank 1 was lost');
    expect(ms).toBeLessThan(2000);
  });

  it('wakes a connect() waiting on the TCP store for a peer that never comes', async () => {
    const s = await store();
    const Ctor = cpu().GlooCommunicator as new (...args: unknown[]) => CommBackend;
    const c = new Ctor('127.0.0.1', s.port, `abort-test/${process.pid}/lonely`, 0, 2, OP_TIMEOUT, '127.0.0.1', '', true, true, null);
    const p = c.connect();
    expect(await stillPending(p, 300)).toBe(true);
    const t0 = performance.now();
    c.abort!('gave up waiting');
    const { error, ms } = await outcome(p, t0);
    timing('connect on the TCP store rejected after abort', ms);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain('the communicator was aborted: gave up waiting');
    expect(ms).toBeLessThan(2000);
    await c.destroy();
  });

  it('wakes a connect() waiting on a JS store that never answers', async () => {
    const Ctor = cpu().GlooCommunicator as new (...args: unknown[]) => CommBackend;
    const calls: string[] = [];
    // set succeeds; get and wait never call done.
    const storeOp = (op: string, key: string, _v: unknown, done: (e: string | null) => void) => {
      calls.push(`${op} ${key}`);
      if (op === 'set') done(null);
    };
    const c = new Ctor('127.0.0.1', 1, 'js-lonely', 1, 2, OP_TIMEOUT, '127.0.0.1', '', true, true, storeOp);
    const p = c.connect();
    expect(await stillPending(p, 300)).toBe(true);
    expect(calls.some((x) => x.startsWith('get ') || x.startsWith('wait '))).toBe(true);
    const t0 = performance.now();
    c.abort!('js store abandoned');
    const { error, ms } = await outcome(p, t0);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain('the communicator was aborted: js store abandoned');
    expect(ms).toBeLessThan(2000);
    await c.destroy();
  });
});

describe('abortAllCommunicators', () => {
  it('aborts every live communicator of the process and counts them; destroyed and aborted ones are not counted', async () => {
    const [a, b] = await pair(false);
    const [c, d] = await pair(true);
    await d.destroy();
    c.abort!('earlier');
    const buf = storage(8), buf2 = storage(8);
    const p = a.allReduce(buf, buf, F32, 8, SUM, 0, OP_TIMEOUT);
    expect(abortAllCommunicators('the job lost rank 5')).toBe(2);
    const { error } = await outcome(p, 0);
    expect((error as Error).message).toContain('the communicator was aborted: the job lost rank 5');
    expect((await outcome(b.allReduce(buf2, buf2, F32, 8, SUM, 0, OP_TIMEOUT), 0)).error).toBeInstanceOf(CommError);
    expect(abortAllCommunicators('again')).toBe(0);
  });

  it('checks its argument', () => {
    expect(() => abortAllCommunicators('')).toThrow(ArgumentError);
    expect(() => watchAbortFile('', 0)).toThrow(ArgumentError);
    expect(() => watchAbortFile('/tmp/x', -1)).toThrow(ArgumentError);
    expect(() => watchAbortFile('/tmp/x', 1.5)).toThrow(ArgumentError);
  });
});

describe('the abort-file watcher', () => {
  it('aborts on a generation above the one watched, then watches above it; retargets; stops', async () => {
    const dir = tmp();
    const path = join(dir, 'abort');
    watchAbortFile(path, 0);
    const [a] = await pair(false);
    const buf = storage(64);
    const p = a.allReduce(buf, buf, F32, 64, SUM, 0, OP_TIMEOUT);
    writeAtomically(path, '0\n');
    expect(await stillPending(p, 300)).toBe(true);
    const t0 = performance.now();
    writeAtomically(path, '1\n');
    const { error, ms } = await outcome(p, t0);
    timing('blocked allReduce rejected after the abort file was written', ms);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain(`the communicator was aborted: generation 1 started (abort file ${path})`);
    expect(ms).toBeLessThan(2000);

    // Generation 1 is now the one watched: the same file leaves new communicators alone, 2 aborts them.
    const [c] = await pair(true);
    const q = c.allReduce(buf, buf, F32, 64, SUM, 0, OP_TIMEOUT);
    writeAtomically(path, '1');
    expect(await stillPending(q, 300)).toBe(true);
    writeAtomically(path, '2');
    expect(((await outcome(q, 0)).error as Error).message).toContain(`generation 2 started (abort file ${path})`);

    // Retargeted to another file and generation.
    const other = join(dir, 'abort-b');
    watchAbortFile(other, 5);
    const [e] = await pair(false);
    const r = e.allReduce(buf, buf, F32, 64, SUM, 0, OP_TIMEOUT);
    writeAtomically(path, '9');
    writeAtomically(other, '5');
    expect(await stillPending(r, 300)).toBe(true);
    writeAtomically(other, 'not a number');
    expect(await stillPending(r, 100)).toBe(true);
    writeAtomically(other, '6');
    expect(((await outcome(r, 0)).error as Error).message).toContain(`generation 6 started (abort file ${other})`);

    // Stopped: a newer generation aborts nothing.
    stopAbortWatch();
    const [f] = await pair(false);
    const s = f.allReduce(buf, buf, F32, 64, SUM, 0, OP_TIMEOUT);
    writeAtomically(other, '7');
    expect(await stillPending(s, 300)).toBe(true);
    f.abort!('cleanup');
    await outcome(s, 0);
  });

  it('releases a waitSync() blocking the JS thread: the file is written by a worker thread started before', async () => {
    const dir = tmp();
    const path = join(dir, 'abort');
    watchAbortFile(path, 3);
    const [a] = await pair(false);
    const buf = storage(256);
    // The worker sleeps on its own thread and then writes generation 4 atomically.
    const worker = new Worker(`
      const { writeFileSync, renameSync } = require('node:fs');
      const { parentPort, workerData } = require('node:worker_threads');
      parentPort.postMessage('ready');
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, workerData.delayMs);
      writeFileSync(workerData.path + '.tmp', '4');
      renameSync(workerData.path + '.tmp', workerData.path);
    `, { eval: true, workerData: { path, delayMs: 400 } });
    await new Promise((r) => worker.once('message', r));
    // A timeout of 8 s: without the native watcher the wait would end only then, with TimeoutError.
    const p = a.allReduce(buf, buf, F32, 256, SUM, 0, 8000);
    p.catch(() => {});
    const t0 = performance.now();
    let error: unknown;
    try { p.waitSync(); } catch (e) { error = e; }
    const ms = performance.now() - t0;
    timing('waitSync released by the watcher (incl. the worker\'s 400 ms delay)', ms);
    await new Promise((r) => worker.once('exit', r));
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain(`the communicator was aborted: generation 4 started (abort file ${path})`);
    expect(ms).toBeLessThan(400 + 2000);
    stopAbortWatch();
  });
});

describe('abortWhileConnecting (a regroup connecting after the watcher read the file)', () => {
  it('aborts a connect() made after the watcher moved past the generation, which the watcher alone leaves waiting', async () => {
    const s = await store();
    const dir = tmp();
    const path = join(dir, 'abort');
    const Ctor = cpu().GlooCommunicator as new (...args: unknown[]) => CommBackend;
    const lonely = (name: string) => new Ctor('127.0.0.1', s.port, `abort-test/${process.pid}/${name}`, 0, 2, OP_TIMEOUT, '127.0.0.1', '', true, false, null);
    // The watcher reads generation 2 and moves on to watching above it.
    writeAtomically(path, '2\n');
    watchAbortFile(path, 1);
    await sleep(200);
    expect(readAbortFile(path)).toBe(2);
    // A communicator of generation 1 made now (a regroup's next group) is not the watcher's target.
    const before = lonely('after-read-a');
    const p = before.connect();
    expect(await stillPending(p, 300)).toBe(true);
    // Polling the file while connecting aborts it, and any made later, until stopped.
    const t0 = performance.now();
    const stop = abortWhileConnecting(path, 1);
    const { error, ms } = await outcome(p, t0);
    timing('connect made after the watcher read the file, rejected by abortWhileConnecting', ms);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain(`generation 2 started while generation 1 connected (abort file ${path})`);
    expect(ms).toBeLessThan(2000);
    const later = lonely('after-read-b');
    expect((await outcome(later.connect(), 0)).error).toBeInstanceOf(CommError);
    stop();
    const after = lonely('after-stop');
    const q = after.connect();
    expect(await stillPending(q, 300)).toBe(true);
    after.abort!('cleanup');
    await outcome(q, 0);
    for (const c of [before, later, after]) await c.destroy();
    stopAbortWatch();
  });

  it('reads the abort file as the watcher does, and checks its arguments', () => {
    const dir = tmp();
    const path = join(dir, 'abort');
    expect(readAbortFile(path)).toBe(-1);
    for (const [text, g] of [['3\n', 3], [' 12 ', 12], ['', -1], ['x1', -1], ['12x', -1], ['1 2', 1]] as const) {
      writeAtomically(path, text);
      expect(readAbortFile(path)).toBe(g);
    }
    expect(() => abortWhileConnecting('', 0)).toThrow(ArgumentError);
    expect(() => abortWhileConnecting(path, -1)).toThrow(ArgumentError);
  });
});

describe('untilAborted (a wait no communicator abort reaches: a copy on its way to a cut-off holder)', () => {
  it('rejects a wait that never ends once the file says a later generation, and only then', async () => {
    const path = join(tmp(), 'abort');
    const never = new Promise<void>(() => undefined);
    // No file, or the same generation: it waits.
    const p = untilAborted(never, path, 3, 'sending the copy of step 5');
    expect(await stillPending(p, 150)).toBe(true);
    writeAtomically(path, '3\n');
    expect(await stillPending(p, 150)).toBe(true);
    const t0 = performance.now();
    writeAtomically(path, '4\n');
    const { error, ms } = await outcome(p, t0);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toBe(`sending the copy of step 5: generation 4 started (abort file ${path}) while this rank waited`);
    expect(ms).toBeLessThan(2000);
    // A later generation already out: rejected at once, even for work that would end.
    await expect(untilAborted(Promise.resolve(1), path, 2, 'x')).rejects.toBeInstanceOf(CommError);
  });

  it('passes the work through (its value or its error) while no later generation comes', async () => {
    const path = join(tmp(), 'abort');
    writeAtomically(path, '1\n');
    expect(await untilAborted(new Promise((r) => setTimeout(() => r(7), 60)), path, 1, 'x')).toBe(7);
    await expect(untilAborted(Promise.reject(new RangeError('own')), path, 1, 'x')).rejects.toBeInstanceOf(RangeError);
    await expect(untilAborted(Promise.resolve(0), '', 1, 'x')).rejects.toBeInstanceOf(ArgumentError);
    await expect(untilAborted(Promise.resolve(0), path, -1, 'x')).rejects.toBeInstanceOf(ArgumentError);
  });
});

describe('the watcher and process exit', () => {
  for (const how of ['the event loop ends', 'process.exit()']) {
    it(`does not hold the process up when ${how}`, async () => {
      const dir = tmp();
      const script = join(dir, 'exit.mjs');
      writeFileSync(script, `
        const { watchAbortFile } = await import(process.argv[2]);
        watchAbortFile(process.argv[3], 0);
        console.log('watching');
        ${how === 'process.exit()' ? 'process.exit(0);' : ''}
      `);
      const t0 = performance.now();
      const child = spawn(process.execPath, ['--import', 'tsx', script, pathToFileURL(join(root, 'lib/distributed/abort.ts')).href, join(dir, 'abort')],
        { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '', err = '';
      child.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
      child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
      const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
      const [code, signal] = await new Promise<[number | null, string | null]>((r) => child.once('exit', (c, s) => r([c, s])));
      clearTimeout(timer);
      expect({ code, signal, out: out.trim() }, err).toEqual({ code: 0, signal: null, out: 'watching' });
      expect(performance.now() - t0).toBeLessThan(60_000);
    }, 90_000);
  }
});

// A rank in a child process (through tsx), looping allReduces with the test's rank 0 until it is killed.
const PEER = `
const [backendUrl, nativeUrl, port, prefix, shm, floats, op] = process.argv.slice(2);
const { createGlooBackend } = await import(backendUrl);
const { cpu } = await import(nativeUrl);
const comm = await createGlooBackend({ storeHost: '127.0.0.1', storePort: Number(port), prefix, rank: 1, size: 2, timeoutMs: 60000,
  deviceHost: '127.0.0.1', deviceIface: '', verifySizes: false, sharedMemory: shm === '1' });
const buf = new (cpu().Storage)(Number(floats) * 4, false);
console.log('ready ' + comm.sharedMemory);
for (let i = 0; ; i++) {
  await (op === 'broadcast' ? comm.broadcast(buf, buf, 0, Number(floats), 1, i, 60000) : comm.allReduce(buf, buf, 0, Number(floats), 0, i, 60000));
}
`;

describe('a peer SIGKILLed mid-allreduce', () => {
  for (const shm of [true, false]) {
    it(`fails the survivor's op promptly (shared memory ${shm ? 'on' : 'off'})`, async () => {
      const s = await store();
      const dir = tmp();
      const script = join(dir, 'peer.mjs');
      writeFileSync(script, PEER);
      const prefix = `abort-test/${process.pid}/kill-${shm ? 'shm' : 'tcp'}`;
      const floats = 1 << 20;  // 4 MiB per allReduce
      const url = (p: string) => pathToFileURL(join(root, p)).href;
      const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', script, url('lib/distributed/backend.ts'), url('lib/native.ts'),
        String(s.port), prefix, shm ? '1' : '0', String(floats)], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '', err = '';
      child.stdout!.on('data', (d: Buffer) => { out += d.toString(); });
      child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
      const exited = new Promise((r) => child.once('exit', r));
      try {
        const a = await createGlooBackend({ storeHost: '127.0.0.1', storePort: s.port, prefix, rank: 0, size: 2, timeoutMs: OP_TIMEOUT,
          deviceHost: '127.0.0.1', deviceIface: '', verifySizes: false, sharedMemory: shm });
        open.push(a);
        expect(a.sharedMemory).toBe(shm);
        const buf = storage(floats);
        let killedAt = 0, error: unknown, i = 0;
        for (; i < 1000; i++) {
          const p = a.allReduce(buf, buf, F32, floats, SUM, i, OP_TIMEOUT);
          if (i === 10) {
            child.kill('SIGKILL');
            killedAt = performance.now();
          }
          try { await p; } catch (e) { error = e; break; }
        }
        const ms = performance.now() - killedAt;
        timing(`survivor's allReduce failed after the peer's SIGKILL (shm ${shm ? 'on' : 'off'}, op #${i})`, ms);
        expect(killedAt, `${out}\n${err}`).toBeGreaterThan(0);
        expect(error).toBeInstanceOf(CommError);
        expect((error as Error).message).toMatch(/allReduce\(sum\) #\d+ \(4194304 bytes\) on rank 0/);
        expect(ms).toBeLessThan(5000);
      } finally {
        child.kill('SIGKILL');
        await exited;
      }
    }, 120_000);
  }
});

describe('a peer SIGSTOPped mid-transfer', () => {
  // Gloo 0.5 does not signal a transfer in progress when its pair closes: the op then sleeps until
  // its timeout, and abort abandons it once its thread is seen blocked (WorkQueue::abandon).
  it('the survivor\'s op, blocked on a half-received message, is released by abort; destroy resolves', async () => {
    const s = await store();
    const dir = tmp();
    const script = join(dir, 'peer.mjs');
    writeFileSync(script, PEER);
    const prefix = `abort-test/${process.pid}/stop`;
    const floats = 64 << 20;  // a 256 MiB broadcast from the peer: one message, most of the op's time in transfer
    const url = (p: string) => pathToFileURL(join(root, p)).href;
    const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', script, url('lib/distributed/backend.ts'), url('lib/native.ts'),
      String(s.port), prefix, '0', String(floats), 'broadcast'], { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
    let err = '';
    child.stderr!.on('data', (d: Buffer) => { err += d.toString(); });
    const exited = new Promise((r) => child.once('exit', r));
    try {
      const a = await createGlooBackend({ storeHost: '127.0.0.1', storePort: s.port, prefix, rank: 0, size: 2, timeoutMs: OP_TIMEOUT,
        deviceHost: '127.0.0.1', deviceIface: '', verifySizes: false, sharedMemory: false });
      open.push(a);
      const buf = storage(floats);
      for (let i = 0; i < 3; i++) await a.broadcast(buf, buf, F32, floats, 1, i, OP_TIMEOUT);
      const p = a.broadcast(buf, buf, F32, floats, 1, 3, OP_TIMEOUT);
      await sleep(20);
      child.kill('SIGSTOP');
      expect(await stillPending(p, 500), err).toBe(true);
      const t0 = performance.now();
      a.abort!('rank 1 stopped');
      const { error, ms } = await outcome(p, t0);
      timing('broadcast blocked on a SIGSTOPped peer rejected after abort', ms);
      expect(error).toBeInstanceOf(CommError);
      expect((error as Error).message).toContain('the communicator was aborted: rank 1 stopped');
      expect(ms).toBeLessThan(2000);
      const d0 = performance.now();
      await a.destroy();
      expect(performance.now() - d0).toBeLessThan(1000);
    } finally {
      child.kill('SIGKILL');
      await exited;
    }
  }, 120_000);
});

describe('abort of the other backends', () => {
  it('HostStagedBackend delegates abort to its host communicator', async () => {
    const [a] = await pair(false);
    const staged = new HostStagedBackend(a, { read: () => {}, write: () => {} });
    const dev = storage(32);
    const p = staged.allReduce(dev, dev, F32, 32, SUM, 0, OP_TIMEOUT);
    expect(await stillPending(p, 200)).toBe(true);
    staged.abort('staged stop');
    const { error } = await outcome(p, 0);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toContain('the communicator was aborted: staged stop');
  });

  const makeRanks = ncclRanksClosedAfterEach();
  it('NcclBackend.abort calls ncclCommAbort and rejects the ops in flight with the reason; destroy resolves', async () => {
    const { backends, fake } = await makeRanks(2);
    fake.hang = true;
    const buf = storage(5);
    const p = backends[0]!.allReduce(buf, buf, F32, 5, SUM, 3, OP_TIMEOUT);
    expect(await stillPending(p, 100)).toBe(true);
    backends[0]!.abort('nccl stop');
    const { error } = await outcome(p, 0);
    expect(error).toBeInstanceOf(CommError);
    expect((error as Error).message).toMatch(/allReduce #3 \(20 bytes\) on rank 0 of nccl group 'world'.* failed: the communicator was aborted: nccl stop/);
    expect(fake.calls).toContain('abort');
    expect(() => backends[0]!.allReduce(buf, buf, F32, 5, SUM, 4, OP_TIMEOUT)).toThrow(/aborted: nccl stop/);
    await backends[0]!.destroy();
    backends[1]!.abort('nccl stop');
  });
});
