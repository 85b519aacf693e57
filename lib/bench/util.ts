// Shared benchmark plumbing: timing and the PyTorch peers' start (python3 with an allocator setting, one
// JSON line back). Option parsing, tables and the JSON record every bench writes are every command's:
// lib/cmdline/args.ts and lib/cmdline/report.ts.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';

/** Seconds per call of fn: runs for at least minSeconds after warm-up, returns the median of rounds. */
export function timeIt(fn: () => void, opts: { minSeconds?: number; rounds?: number; warmup?: number } = {}): number {
  const { minSeconds = 0.3, rounds = 5, warmup = 1 } = opts;
  for (let i = 0; i < warmup; i++) fn();
  // Calibrate the number of calls per round.
  let calls = 1;
  for (;;) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) fn();
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    if (dt * rounds >= minSeconds || calls > 1e7) break;
    calls *= dt > 0 ? Math.min(10, Math.max(2, Math.ceil(minSeconds / rounds / dt))) : 10;
  }
  const per: number[] = [];
  for (let r = 0; r < rounds; r++) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < calls; i++) fn();
    per.push(Number(process.hrtime.bigint() - t0) / 1e9 / calls);
  }
  per.sort((a, b) => a - b);
  return per[Math.floor(per.length / 2)]!;
}

/**
 * The allocator settings the PyTorch peer is tried with. PyTorch's CPU tensors come from malloc, and
 * glibc's defaults hand large blocks back to the OS on free (mmap for blocks over the threshold, trim
 * of the heap top), so every step page-faults its activations in again; these keep the memory warm.
 */
export const TORCH_ALLOCATORS: Array<{ name: string; env: Record<string, string>; needs?: string[] }> = [
  { name: 'default', env: {} },
  // glibc told to keep its memory: no mmap'd blocks, no trimming, 1 GiB of slack at each heap growth.
  { name: 'glibc-kept', env: { MALLOC_MMAP_MAX_: '0', MALLOC_TRIM_THRESHOLD_: '68719476736', MALLOC_TOP_PAD_: '1073741824' } },
  // jemalloc (Debian libjemalloc2) without returning dirty pages to the OS.
  { name: 'jemalloc', env: { MALLOC_CONF: 'dirty_decay_ms:-1,muzzy_decay_ms:-1' }, needs: ['/usr/lib/x86_64-linux-gnu/libjemalloc.so.2', '/usr/lib/aarch64-linux-gnu/libjemalloc.so.2', '/usr/lib64/libjemalloc.so.2'] },
  // tcmalloc (Debian libtcmalloc-minimal4) without releasing memory to the OS.
  { name: 'tcmalloc', env: { TCMALLOC_RELEASE_RATE: '0' }, needs: ['/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4', '/usr/lib/aarch64-linux-gnu/libtcmalloc_minimal.so.4', '/usr/lib64/libtcmalloc_minimal.so.4'] },
];

/** The environment of an allocator choice (LD_PRELOAD of the library found), or why it cannot be used here. */
export function torchAllocatorEnv(name: string): Record<string, string> | string {
  const a = TORCH_ALLOCATORS.find((x) => x.name === name);
  if (!a) return `unknown allocator ${name}`;
  if (!a.needs) return a.env;
  const lib = a.needs.find((p) => existsSync(p));
  if (!lib) return `${name}: not installed (none of ${a.needs.join(', ')})`;
  return { ...a.env, LD_PRELOAD: [lib, process.env.LD_PRELOAD].filter(Boolean).join(':') };
}

/**
 * Runs a PyTorch peer (`python3 args...`) under an allocator setting of {@link TORCH_ALLOCATORS}, from
 * this process's environment less its own malloc settings, and parses the last line it prints as JSON.
 */
export function runTorchPeer(args: string[], allocator: string, timeoutMs: number): { result: Record<string, unknown> } | { error: string } {
  const env = torchAllocatorEnv(allocator);
  if (typeof env === 'string') return { error: env };
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(MALLOC_|TCMALLOC_)/.test(k)));
  const r = spawnSync('python3', args, { encoding: 'utf8', env: { ...base, ...env }, timeout: timeoutMs, maxBuffer: 64 * 2 ** 20 });
  if (r.error) return { error: (r.error as NodeJS.ErrnoException).code === 'ETIMEDOUT' ? `timed out after ${timeoutMs / 60_000} min` : `python3 not runnable: ${r.error.message}` };
  if (r.status !== 0) {
    const lines = (r.stderr || '').trim().split('\n');
    return { error: (lines.filter((l) => /Error\b|error:/.test(l)).at(-1) ?? lines.at(-1) ?? `exit ${r.status}`).trim().slice(0, 300) };
  }
  try {
    return { result: JSON.parse(r.stdout.trim().split('\n').at(-1)!) as Record<string, unknown> };
  } catch {
    return { error: `unreadable output: ${r.stdout.trim().split('\n').at(-1)?.slice(0, 200)}` };
  }
}

/** The median of a list (the mean of the middle two for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b), m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}
