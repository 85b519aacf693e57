// How the benchmarks start their PyTorch peers (lib/bench/util.ts): each allocator setting's environment
// reaches the child, the caller's own malloc settings do not, a missing allocator library or a failing
// peer is a reason string instead of a crash, and the peer's last output line is its result.
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { main as opsMain } from '../../lib/bench/ops.js';
import { main as trainMain } from '../../lib/bench/train.js';
import { runTorchPeer, TORCH_ALLOCATORS, torchAllocatorEnv } from '../../lib/bench/util.js';
import { ArgumentError } from '../../lib/errors.js';

const work = mkdtempSync(join(tmpdir(), 'nt-torch-peer-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const hasPython = spawnSync('python3', ['-c', 'print(1)'], { encoding: 'utf8' }).status === 0;

describe('torch allocator settings', () => {
  it('keeps glibc\'s memory with the documented variables, and names what is not installed', () => {
    expect(torchAllocatorEnv('default')).toEqual({});
    expect(torchAllocatorEnv('glibc-kept')).toEqual({ MALLOC_MMAP_MAX_: '0', MALLOC_TRIM_THRESHOLD_: '68719476736', MALLOC_TOP_PAD_: '1073741824' });
    expect(torchAllocatorEnv('nope')).toBe('unknown allocator nope');
    for (const name of ['jemalloc', 'tcmalloc']) {
      const env = torchAllocatorEnv(name);
      const libs = TORCH_ALLOCATORS.find((a) => a.name === name)!.needs!;
      if (libs.some((p) => existsSync(p))) {
        expect(typeof env).toBe('object');
        expect((env as Record<string, string>).LD_PRELOAD.split(':')[0]).toBe(libs.find((p) => existsSync(p)));
      } else expect(env).toMatch(/not installed/);
    }
  });
});

describe('bench train and bench ops options', () => {
  it('reject an unknown allocator before measuring anything', async () => {
    await expect(trainMain(['--torch-alloc', 'nope'])).rejects.toThrow(ArgumentError);
    await expect(trainMain(['--torch-alloc', 'nope'])).rejects.toThrow(/unknown --torch-alloc nope \(auto, default, glibc-kept, jemalloc, tcmalloc\)/);
    await expect(opsMain(['--torch-alloc', 'nope'])).rejects.toThrow(/bench ops: unknown --torch-alloc nope/);
    await expect(trainMain(['--steps', '0'])).rejects.toThrow(/--steps must be at least 1, got 0/);
    await expect(trainMain(['--steps', '1.5'])).rejects.toThrow(ArgumentError);
    await expect(opsMain(['--threads', '0'])).rejects.toThrow(/--threads must be at least 1/);
  });
});

describe.skipIf(!hasPython)('runTorchPeer', () => {
  const script = join(work, 'peer.py');
  writeFileSync(script, [
    'import json, os, sys',
    'if sys.argv[1:] == ["fail"]:',
    '    print("Traceback (most recent call last):", file=sys.stderr)',
    '    print("RuntimeError: no good", file=sys.stderr)',
    '    sys.exit(1)',
    'print("noise first")',
    'print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "TCMALLOC_"))}))',
  ].join('\n'));

  it('passes the setting\'s environment and strips the caller\'s malloc variables', () => {
    process.env.MALLOC_ARENA_MAX = '1';
    try {
      expect(runTorchPeer([script], 'glibc-kept', 60_000)).toEqual({ result: { MALLOC_MMAP_MAX_: '0', MALLOC_TRIM_THRESHOLD_: '68719476736', MALLOC_TOP_PAD_: '1073741824' } });
      expect(runTorchPeer([script], 'default', 60_000)).toEqual({ result: {} });
    } finally {
      delete process.env.MALLOC_ARENA_MAX;
    }
  });

  it('reports a failing peer by its error line, and an unknown setting without running anything', () => {
    expect(runTorchPeer([script, 'fail'], 'default', 60_000)).toEqual({ error: 'RuntimeError: no good' });
    expect(runTorchPeer([script], 'nope', 60_000)).toEqual({ error: 'unknown allocator nope' });
  });
});
