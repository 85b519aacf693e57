// The bad-input corpus of the `nodetron` command line: every case is a usage error that must exit
// with code 2 and print one line `nodetron <cmd>: ...` (plus a hint to --help), never a stack trace.
// Most cases call the CLI's main() in-process (fast); a representative set runs bin/nodetron.js
// (built dist/) as real processes, a few at a time.
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { main } from '../../lib/cli.js';

const dir = mkdtempSync(join(tmpdir(), 'nt-cli-bad-'));
const emptyDir = join(dir, 'empty');
mkdirSync(emptyDir);
const badTraces = join(dir, 'bad-traces');
mkdirSync(badTraces);
writeFileSync(join(badTraces, 'rank-0.trace.json'), '{ not json');
const text = join(dir, 'a.txt');
writeFileSync(text, 'hello world');
const garbageJson = join(dir, 'garbage.json');
writeFileSync(garbageJson, '[1, 2, 3]');
const script = join(dir, 'script.ts');
writeFileSync(script, 'console.log("never run")\n');

/** Argument lists that must be usage errors, each with a fragment of the one-line message. */
const CASES: Array<[string[], RegExp]> = [
  // top level
  [['frobnicate'], /^nodetron: unknown command "frobnicate"/],
  [['--frob'], /^nodetron: unknown command "--frob"/],
  [['constructor'], /unknown command "constructor"/],
  [['help', 'extra'], /takes no arguments/],
  [['version', 'extra'], /takes no arguments/],
  [[''], /unknown command ""/],
  // info
  [['info', '--jsn'], /^nodetron info: unknown option --jsn/],
  [['info', '--json=maybe'], /--json is a flag/],
  [['info', 'extra'], /unexpected argument "extra"/],
  [['info', '-x'], /unknown option -x/],
  [['info', '--constructor'], /unknown option --constructor/],
  // plan
  [['plan', '--model', 'gpt2', '--gpus', '-8'], /^nodetron plan: --gpus must be at least 1, got -8/],
  [['plan', '--model', 'gpt2', '--gpus', '0'], /--gpus must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '1.5'], /--gpus needs a whole number/],
  [['plan', '--model', 'gpt2', '--gpus', 'abc'], /--gpus needs a number/],
  [['plan', '--model', 'gpt2', '--gpus', ''], /--gpus needs a number/],
  [['plan', '--model', 'gpt2', '--gpus'], /--gpus needs a value/],
  [['plan', '--model', '--gpus', '8'], /--model needs a value/],
  [['plan', '--model', 'gpt2', '--gpus', '1e12'], /--gpus must be at most/],
  [['plan', '--model', 'gpt2', '--gpus', 'Infinity'], /--gpus needs a number/],
  [['plan', '--model', 'gpt5', '--gpus', '8'], /^nodetron plan: unknown model "gpt5"/],
  [['plan', '--model', 'constructor', '--gpus', '8'], /unknown model "constructor"/],
  [['plan', '--model', 'missing.json', '--gpus', '8'], /cannot read the model config/],
  [['plan', '--gpus', '8'], /give --model/],
  [['plan', '--model', 'gpt2'], /give --gpus/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--dtype', 'f16'], /--dtype must be one of bf16, f32/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gpu', 'toString'], /unknown --gpu "toString"/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gpu', 'v100x'], /unknown --gpu "v100x"/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gpu-memory', '80X'], /cannot read --gpu-memory/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gpu-memory', '0'], /is not a device's memory/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gpu-memory', '100000000T'], /is not a device's memory/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--top', '0'], /--top must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--top', '-1'], /--top must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--nodes', '3'], /multiple of --nodes/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--nodes', '0'], /--nodes must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--seq', '-1'], /--seq must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--batch', '0'], /--batch must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--micro-batch-size', '0'], /--micro-batch-size must be at least 1/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--frob'], /unknown option --frob/],
  [['plan', '--model', 'gpt2', '--gpus', '8', 'extra'], /unexpected argument "extra"/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gemm-json', join(dir, 'nope.json')], /--gemm-json: .* is not a file/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--comm-json', garbageJson], /is not a JSON object/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--gemm-json', garbageJson], /is not a JSON object/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--json', join(dir, 'no', 'such', 'dir', 'x.json')], /does not exist/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--json', dir], /is a directory/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--dtype', 'f32', '--memory-model', 'megatron'], /published bf16 recipe: use it with --dtype bf16/],
  [['plan', '--model', 'gpt2', '--gpus', '8', '--memory-model', 'deepspeed'], /--memory-model/],
  [['plan', '--calibrate', '--layouts', 'dp64'], /needs 64 ranks/],
  [['plan', '--calibrate', '--layouts', 'dp=x'], /cannot read "dp=x" \(dpN, tpN/],
  [['plan', '--calibrate', '--layouts', ';'], /at least one layout/],
  [['plan', '--calibrate', '--layouts', 'zero9'], /zero must be 0..3/],
  [['plan', '--calibrate', '--layouts', 'pp2,mb3'], /layout "pp2,mb3" cannot train the calibration model.*dp·micro-batches = 1·3 does not divide the global batch of 8/],
  [['plan', '--help=maybe'], /--help is a flag/],
  // data
  [['data'], /^nodetron data: missing subcommand/],
  [['data', 'frob'], /unknown subcommand "frob"/],
  [['data', 'tokenize'], /give the input files/],
  [['data', 'tokenize', text], /give the output directory/],
  [['data', 'tokenize', '--out', join(dir, 'o')], /give the input files/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--shard-tokens', '0'], /--shard-tokens must be at least 2/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--shard-tokens', '-5'], /--shard-tokens must be at least 2/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--shard-tokens', '1e12'], /--shard-tokens must be at most/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--val-tokens', '-1'], /--val-tokens must be at least 0/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--val-tokens', 'abc'], /--val-tokens needs a number/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--frob'], /unknown option --frob/],
  [['data', 'tokenize', text, '--out', join(dir, 'o'), '--name', 'a/b'], /--name must be letters/],
  [['data', 'tokenize', join(dir, 'missing.txt'), '--out', join(dir, 'o')], /does not exist/],
  [['data', 'tokenize', emptyDir, '--out', join(dir, 'o')], /no .txt or .jsonl files/],
  [['data', 'tokenize', text, '--out'], /--out needs a value/],
  // trace
  [['trace'], /^nodetron trace: missing subcommand/],
  [['trace', 'frob'], /unknown subcommand "frob"/],
  [['dashboard', '--frob'], /^nodetron dashboard: unknown option --frob/],
  [['trace', 'merge'], /missing the trace directory/],
  [['trace', 'merge', emptyDir, 'extra'], /unexpected argument "extra"/],
  [['trace', 'merge', join(dir, 'nope')], /is not a directory/],
  [['trace', 'merge', emptyDir], /no rank-R.trace.json/],
  [['trace', 'merge', badTraces], /is not a trace/],
  [['trace', 'merge', emptyDir, '--frob'], /unknown option --frob/],
  [['trace', 'merge', emptyDir, '--out'], /--out needs a value/],
  [['trace', 'merge', emptyDir, '--out', join(dir, 'no', 'dir', 'x.json')], /does not exist/],
  // bench
  [['bench'], /^nodetron bench: unknown benchmark ""/],
  [['bench', 'frob'], /unknown benchmark "frob"/],
  [['bench', 'constructor'], /unknown benchmark "constructor"/],
  [['bench', 'gemm', '--frob'], /^nodetron bench gemm: unknown option --frob/],
  [['bench', 'gemm', 'extra'], /unexpected argument/],
  [['bench', 'gemm', '--quick=maybe'], /--quick is a flag/],
  [['bench', 'gemm', '--json', join(dir, 'no', 'x.json')], /does not exist/],
  [['bench', 'comm', '-b', '0'], /^nodetron bench comm: -b \(--minbytes\) must be at least 1 bytes/],
  [['bench', 'comm', '-e', '100000G'], /-e \(--maxbytes\) must be at most .*this machine's memory/],
  [['bench', 'comm', '-e', '64Q'], /cannot read "64Q" as a -e \(--maxbytes\) size/],
  [['bench', 'comm', '-e', '-5'], /cannot read "-5"/],
  [['bench', 'comm', '-b', '1M', '-e', '1K'], /must not exceed -e/],
  [['bench', 'comm', '-f', '1'], /-f \(--stepfactor\) must be at least 1.01/],
  [['bench', 'comm', '-f', '0.5'], /must be at least 1.01/],
  [['bench', 'comm', '-f', 'NaN'], /needs a number/],
  [['bench', 'comm', '-n', '0'], /-n \(--iters\) must be at least 1/],
  [['bench', 'comm', '-n', '-5'], /must be at least 1/],
  [['bench', 'comm', '-n', '1e9'], /must be at most/],
  [['bench', 'comm', '-w', '-1'], /-w \(--warmup_iters\) must be at least 0/],
  [['bench', 'comm', '--np', '0'], /--np must be at least 1/],
  [['bench', 'comm', '--np', '100000'], /--np must be at most 256/],
  [['bench', 'comm', '--np', '-2'], /--np must be at least 1/],
  [['bench', 'comm', '--repeat', '0'], /--repeat must be at least 1/],
  [['bench', 'comm', '--op', 'frob'], /--op must be one of/],
  [['bench', 'comm', '--op', 'constructor'], /--op must be one of/],
  [['bench', 'comm', '-d', 'f64'], /-d \(--datatype\) must be one of/],
  [['bench', 'comm', '-o', 'mean'], /-o \(--redop\) must be one of/],
  [['bench', 'comm', '--check', '2'], /--check must be one of 0, 1/],
  [['bench', 'comm', '--transport', 'udp'], /--transport must be one of shm, tcp, both/],
  [['bench', 'comm', '--frob'], /unknown option --frob/],
  [['bench', 'comm', '--plot', join(dir, 'no', 'p.svg')], /does not exist/],
  [['bench', 'train', '--steps', '0'], /^nodetron bench train: --steps must be at least 1/],
  [['bench', 'train', '--steps', '-1'], /--steps must be at least 1/],
  [['bench', 'train', '--steps', 'abc'], /--steps needs a number/],
  [['bench', 'train', '--warmup', '-1'], /--warmup must be at least 0/],
  [['bench', 'train', '--config', 'huge'], /--config must be one of tiny, small, all/],
  [['bench', 'train', '--config', 'constructor'], /--config must be one of/],
  [['bench', 'train', '--frob'], /unknown option --frob/],
  [['bench', 'train', '--device', 'tpu'], /--device must be one of cpu, cuda/],
  [['bench', 'train', '--config', 'gpt2'], /--config gpt2, --batch and --no-kernels go with --device cuda/],
  [['bench', 'train', '--batch', '0', '--device', 'cuda'], /--batch must be at least 1/],
  [['bench', 'train', '--device', 'cuda', '--torch-compile', 'maybe'], /--torch-compile is on or off, got maybe/],
  [['bench', 'train', '--layout', 'dp=0'], /dp must be one integer >= 1/],
  [['bench', 'train', '--layout', 'frob'], /cannot read "frob"/],
  [['bench', 'train', '--layout', 'dp=2', '--steps', '0'], /--steps must be at least 1/],
  [['bench', 'train', '--layout', 'dp=2', '--bucket-mb', '0'], /--bucket-mb must be at least/],
  [['bench', 'train', '--layout', 'dp=2', '--overlap', 'maybe'], /--overlap must be one of on, off, both/],
  [['bench', 'train', '--layout', 'dp=2', '--frob'], /unknown option --frob/],
  [['bench', 'train', '--layout', 'dp=2', 'extra'], /unexpected argument "extra"/],
  [['bench', 'ops', '--threads', '0'], /^nodetron bench ops: --threads must be at least 1/],
  [['bench', 'ops', '--threads', '-2'], /--threads must be at least 1/],
  [['bench', 'ops', '--threads', '1.5'], /--threads needs a whole number/],
  [['bench', 'ops', '--threads', '100000'], /--threads must be at most 1024/],
  [['bench', 'ops', '--frob'], /unknown option --frob/],
  [['bench', 'checkpoint', '--saves', '0'], /^nodetron bench checkpoint: --saves must be at least 1/],
  [['bench', 'checkpoint', '--saves', '-1'], /--saves must be at least 1/],
  [['bench', 'checkpoint', '--layout', 'dp9'], /unknown --layout dp9/],
  [['bench', 'checkpoint', '--layout', 'constructor'], /unknown --layout constructor/],
  [['bench', 'checkpoint', '--config', 'huge'], /--config must be one of small, tiny/],
  [['bench', 'checkpoint', '--frob'], /unknown option --frob/],
  // launch (its own parser, lib/launch/cli.ts)
  [['launch'], /^nodetron launch: no script given/],
  [['launch', '--frob', script], /unknown option --frob/],
  [['launch', '--nproc-per-node', '0', script], /--nproc-per-node must be in \[1, 1024\]/],
  [['launch', '--nproc-per-node', '-1', script], /--nproc-per-node expects an integer/],
  [['launch', '--nproc-per-node', '100000', script], /--nproc-per-node must be in \[1, 1024\]/],
  [['launch', '--nproc-per-node', 'many', script], /expects an integer/],
  [['launch', '--nproc-per-node'], /--nproc-per-node needs a value/],
  [['launch', '--nnodes', '0', script], /--nnodes must be in/],
  [['launch', '--nnodes', '2', '--node-rank', '2', '--master-port', '1234', script], /--node-rank 2 must be < --nnodes 2/],
  [['launch', '--master-port', '70000', script], /--master-port must be in \[1, 65535\]/],
  [['launch', '--max-restarts', '-1', script], /--max-restarts expects an integer/],
  [['launch', '--rdzv', 'http://x', script], /--rdzv expects redis/],
  [['launch', '--run-id', 'a b', script], /--run-id may hold/],
  [['launch', '--nnodes', '2', script], /--master-port is required/],
];

describe('bad input: the command line', () => {
  let err: string[];
  let out: string[];
  beforeEach(() => {
    err = []; out = [];
    vi.spyOn(console, 'error').mockImplementation((...a: unknown[]) => { err.push(a.map(String).join(' ')); });
    vi.spyOn(console, 'log').mockImplementation((...a: unknown[]) => { out.push(a.map(String).join(' ')); });
  });
  afterEach(() => { vi.restoreAllMocks(); });

  it(`holds over 100 usage errors (${CASES.length})`, () => {
    expect(CASES.length).toBeGreaterThan(100);
  });

  for (const [argv, message] of CASES) {
    it(`nodetron ${argv.map((a) => (a === '' ? "''" : a.replace(dir, 'TMP'))).join(' ')}`, async () => {
      const code = await main(argv);
      const stderr = err.join('\n');
      expect(code, stderr).toBe(2);
      const first = stderr.split('\n')[0]!;
      expect(first).toMatch(/^nodetron( [a-z]+){0,2}: /);
      expect(first).toMatch(message);
      expect(stderr).not.toMatch(/^\s+at /m);
      // One line and the hint.
      expect(err).toHaveLength(2);
      expect(err[1]).toMatch(/^run `nodetron( [a-z]+){0,2} --help` for usage$/);
      expect(out.join('\n')).toBe('');
    });
  }

  it('a runtime failure is one line with exit code 1; help and version exit 0', async () => {
    // Nothing listens on port 1: the store connection fails with a CommError after the join timeout.
    const code = await main(['launch', '--nnodes', '2', '--node-rank', '1', '--master-port', '1', '--join-timeout-ms', '200', script]);
    expect(code).toBe(1);
    expect(err).toHaveLength(1);
    expect(err[0]).toMatch(/^nodetron launch: CommError: could not reach the rendezvous store/);
    expect(await main(['--help'])).toBe(0);
    expect(await main(['bench', '--help'])).toBe(0);
    expect(await main(['plan', '--help'])).toBe(0);
    expect(await main(['data', 'tokenize', '--help'])).toBe(0);
    expect(await main(['trace', 'merge', '--help'])).toBe(0);
    expect(await main(['bench', 'ops', '--help'])).toBe(0);
    expect(await main(['version'])).toBe(0);
    expect(out.join('\n')).toMatch(/usage: nodetron/);
  });
});

const bin = join(__dirname, '..', '..', 'bin', 'nodetron.js');

/** Runs bin/nodetron.js; resolves with its exit code and output. */
function runBin(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { encoding: 'utf8', timeout: 120_000 }, (e, stdout, stderr) => {
      done({ code: e ? (typeof e.code === 'number' ? e.code : -1) : 0, stdout, stderr });
    });
  });
}

/** Runs jobs at most `width` at a time. */
async function pool<T, R>(items: T[], width: number, fn: (x: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < items.length) { const i = next++; results[i] = await fn(items[i]!); }
  }));
  return results;
}

describe.skipIf(!existsSync(join(__dirname, '..', '..', 'dist', 'cli.js')))('bad input: bin/nodetron.js as a process', () => {
  it('exits 2 with one line and no stack trace for a representative set', async () => {
    const picks = CASES.filter((_, i) => i % 10 === 0);
    expect(picks.length).toBeGreaterThan(10);
    const results = await pool(picks, 3, ([argv]) => runBin(argv));
    results.forEach((r, i) => {
      const [argv, message] = picks[i]!;
      expect(r.code, `${argv.join(' ')}: ${r.stderr}`).toBe(2);
      expect(r.stderr.split('\n')[0]).toMatch(message);
      expect(r.stderr).not.toMatch(/^\s+at /m);
    });
  }, 300_000);
});
