// `nodetron bench ops`: forward+backward time of the ops that dominate a small GPT step (LM head
// GEMM, fused cross-entropy over a 50257 vocabulary, attention, layerNorm, gelu), beside PyTorch
// on the same CPU in the same run (scripts/bench/ops_torch.py) when python3 with torch is found: eager
// under each allocator setting installed here (the fastest in total compared) and torch.compile;
// then the GPT block's fused ops (linearGelu, addLayerNorm, attentionPacked) beside their unfused compositions, and
// one AdamW step's bytes per second beside a STREAM triad on the same threads.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { randn, tensor } from '../creation.js';
import { cpu, packageRoot } from '../native.js';
import { add, addLayerNorm, attention, attentionPacked, crossEntropy, gelu, layerNorm, linear, linearGelu, ones, zeros } from '../index.js';
import { AdamW } from '../optim/adamw.js';
import type { Tensor } from '../tensor.js';
import { ArgumentError } from '../errors.js';
import { info } from '../info.js';
import { runTorchPeer, timeIt, TORCH_ALLOCATORS } from './util.js';
import { machineRecord, printTable, writeJson } from '../cmdline/report.js';
import { expectPositionals, parseOptions } from '../cmdline/args.js';
import { gptParameterCount } from '../train/progress.js';
import { gptConfigOf, TRAIN_CONFIGS } from './configs.js';

const N = 1024, V = 50257, C = 128, B = 8, H = 4, T = 128, D = 32;

function leaf(t: Tensor): Tensor { t.requiresGrad = true; return t; }

function clearGrads(...ts: Tensor[]): void {
  for (const t of ts) if (t.grad) { t.grad.dispose(); t.grad = null; }
}

/** fn builds an output from leaves; the case runs it and backward with an all-ones gradient (or a scalar's 1). */
function fwdBwd(leaves: Tensor[], fn: () => Tensor): () => void {
  return () => {
    clearGrads(...leaves);
    const y = fn();
    if (y.size === 1) y.backward();
    else { const g = ones([...y.shape]); y.backward(g); g.dispose(); }
    y.dispose();
  };
}

function cases(): [string, () => void, () => void][] {
  const logits = leaf(randn([N, V], { seed: 1 }));
  const ids = new Int32Array(N);
  for (let i = 0; i < N; i++) ids[i] = (i * 7919) % V;
  const targets = tensor(ids, [N]);
  const x = leaf(randn([N, C], { seed: 2 })), w = leaf(randn([V, C], { seed: 3 }));
  const [q, k, v] = [4, 5, 6].map((s) => leaf(randn([B, H, T, D], { seed: s }))) as [Tensor, Tensor, Tensor];
  const xl = leaf(randn([N, C], { seed: 7 })), wl = leaf(ones([C])), bl = leaf(zeros([C]));
  const xg = leaf(randn([N, 4 * C], { seed: 8 }));
  const all = [logits, targets, x, w, q, k, v, xl, wl, bl, xg];
  const free = () => { clearGrads(...all); all.forEach((t) => t.dispose()); };
  return [
    ['crossEntropy fwd+bwd [1024, 50257]', fwdBwd([logits], () => crossEntropy(logits, targets)), () => {}],
    ['linear fwd+bwd [1024,128]x[50257,128]', fwdBwd([x, w], () => linear(x, w)), () => {}],
    ['linear+crossEntropy fwd+bwd (LM head)', fwdBwd([x, w], () => { const l = linear(x, w); const loss = crossEntropy(l, targets); l.dispose(); return loss; }), () => {}],
    ['attention fwd+bwd [8,4,128,32] causal', fwdBwd([q, k, v], () => attention(q, k, v, { causal: true })), () => {}],
    ['layerNorm fwd+bwd [1024,128]', fwdBwd([xl, wl, bl], () => layerNorm(xl, wl, bl)), () => {}],
    ['gelu fwd+bwd [1024,512]', fwdBwd([xg], () => gelu(xg)), free],
  ];
}

/** The fused ops of a GPT block beside their unfused compositions, and one AdamW step over a tiny GPT's parameter count. */
function fusedCases(): [string, () => void, () => void][] {
  const x = leaf(randn([N, C], { seed: 9 })), w = leaf(randn([4 * C, C], { seed: 10 })), b = leaf(zeros([4 * C]));
  const xr = leaf(randn([N, C], { seed: 11 })), r = leaf(randn([N, C], { seed: 12 })), wl = leaf(ones([C])), bl = leaf(zeros([C]));
  const sumBoth = (o: { sum: Tensor; out: Tensor }) => { const s = add(o.sum, o.out); o.sum.dispose(); o.out.dispose(); return s; };
  const qkv = leaf(randn([B, T, 3 * C], { seed: 15 }));
  const unpacked = () => {
    const r5 = qkv.reshape([B, T, 3, H, D]), p5 = r5.permute([2, 0, 3, 1, 4]), parts = p5.chunk(3, 0);
    const [q, k, v] = parts.map((h) => h.reshape([B, H, T, D]));
    const a = attention(q!, k!, v!), ap = a.permute([0, 2, 1, 3]), out = ap.reshape([B, T, C]);
    for (const t of [r5, p5, ...parts, q!, k!, v!, a, ap]) if (t !== out) t.dispose();
    return out;
  };
  const p = leaf(randn([ADAM_PARAMS], { seed: 13 }));
  p.grad = randn([ADAM_PARAMS], { seed: 14 });
  const opt = new AdamW([p], { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
  const all = [x, w, b, xr, r, wl, bl, qkv];
  const free = () => { clearGrads(...all, p); all.forEach((t) => t.dispose()); opt.dispose(); p.dispose(); };
  return [
    ['linearGelu fwd+bwd [1024,128]x[512,128] (fused)', fwdBwd([x, w, b], () => linearGelu(x, w, b)), () => {}],
    ['linear+gelu fwd+bwd [1024,128]x[512,128] (unfused)', fwdBwd([x, w, b], () => { const h = linear(x, w, b); const y = gelu(h); h.dispose(); return y; }), () => {}],
    ['addLayerNorm fwd+bwd [1024,128] (fused)', fwdBwd([xr, r, wl, bl], () => sumBoth(addLayerNorm(xr, r, wl, bl))), () => {}],
    ['add+layerNorm fwd+bwd [1024,128] (unfused)', fwdBwd([xr, r, wl, bl], () => { const s = add(xr, r); return sumBoth({ sum: s, out: layerNorm(s, wl, bl) }); }), () => {}],
    ['attentionPacked fwd+bwd [8,128,3x128] 4 heads (fused)', fwdBwd([qkv], () => attentionPacked(qkv, H)), () => {}],
    ['split+attention+merge fwd+bwd [8,128,3x128] (unfused)', fwdBwd([qkv], unpacked), () => {}],
    [ADAM_CASE, () => opt.step(), free],
  ];
}

const TINY = TRAIN_CONFIGS.find((c) => c.name === 'tiny')!;
/** The tiny GPT's parameter count (`bench train`'s tiny config, biases on, the tied head once): AdamW reads p, g, m, v and writes p, m, v once. */
export const ADAM_PARAMS = gptParameterCount(gptConfigOf(TINY));
const ADAM_CASE = `AdamW step [${(ADAM_PARAMS / 1e6).toFixed(1)}M params]`;

/** STREAM triad (a = b + 3c) over as many f32 as one AdamW step: bytes per second, the bandwidth AdamW is held to. */
function triadBytesPerSecond(n: number): number {
  const [a, b, c] = [0, 1, 2].map((s) => randn([n], { seed: 20 + s }));
  try {
    const sec = timeIt(() => cpu().streamTriadLoop(a!.storage, b!.storage, c!.storage, n, 1), { minSeconds: 0.5, rounds: 3 });
    return (12 * n) / sec;
  } finally {
    [a, b, c].forEach((t) => t!.dispose());
  }
}

/** What the PyTorch peer printed (scripts/bench/ops_torch.py), under one allocator setting. */
interface OpsPeer { allocator: string; torch: string; threads: number; compileMode: string | null; allocatorEnv: Record<string, string>; seconds: Record<string, number>; firstCallSeconds: Record<string, number> }

function torchPeer(threads: number | undefined, allocator: string, compile?: string): OpsPeer | string {
  const script = join(packageRoot, 'scripts', 'bench', 'ops_torch.py');
  const r = runTorchPeer([script, ...(threads ? [String(threads)] : []), ...(compile ? ['--compile', compile] : [])], allocator, (compile ? 30 : 10) * 60_000);
  return 'error' in r ? `${allocator}: ${r.error}` : { allocator, ...(r.result as unknown as Omit<OpsPeer, 'allocator'>) };
}

const total = (p: OpsPeer) => Object.values(p.seconds).reduce((a, b) => a + b, 0);

export async function main(argv: string[]): Promise<number> {
  const opts = parseOptions(argv, {
    json: 'outfile', 'no-torch': 'boolean', threads: { kind: 'positive', max: 1024 }, 'torch-alloc': 'string', 'torch-compile': 'string', help: 'boolean',
  }, { h: 'help' });
  if (opts.help) {
    console.log('usage: nodetron bench ops [--threads N] [--no-torch] [--torch-alloc auto|default|glibc-kept|jemalloc|tcmalloc (auto)] [--torch-compile MODE|off (default)] [--json F]\n  fused and plain ops (forward + backward) beside PyTorch eager (under its fastest allocator setting) and torch.compile on the same threads');
    return 0;
  }
  expectPositionals(opts, 'nothing', 0);
  const threads = opts.threads as number | undefined;
  const alloc = (opts['torch-alloc'] as string | undefined) ?? 'auto';
  const names = TORCH_ALLOCATORS.map((a) => a.name);
  if (alloc !== 'auto' && !names.includes(alloc)) throw new ArgumentError(`bench ops: unknown --torch-alloc ${alloc} (auto, ${names.join(', ')})`);
  const compileMode = (opts['torch-compile'] as string | undefined) ?? 'default';
  if (threads !== undefined) {
    // One thread count for every engine in the comparison: OpenBLAS, nodetron's kernels, PyTorch.
    cpu().setBlasThreads(threads);
    cpu().setKernelThreads(threads);
  }
  const cpuIsa = info().cpu.isa;
  console.log(`# nodetron bench ops — cpu kernels at SIMD level ${cpuIsa.active} (best here: ${cpuIsa.best}${cpuIsa.env ? `; NODETRON_CPU_ISA=${cpuIsa.env}` : ''})`);
  const mine: Record<string, number> = {};
  for (const [name, fn, after] of [...cases(), ...fusedCases()]) {
    mine[name] = timeIt(fn, { minSeconds: 0.5, rounds: 3 });
    after();
  }
  // PyTorch eager under each allocator setting installed here (its CPU memory comes from malloc); the
  // setting with the lowest total is compared, and torch.compile runs under it.
  let eager: Array<OpsPeer | string> = [], peer: OpsPeer | string = 'skipped (--no-torch)', compiled: OpsPeer | string | undefined;
  if (!opts['no-torch']) {
    eager = (alloc === 'auto' ? names : [alloc]).map((a) => torchPeer(threads, a));
    const runs = eager.filter((p): p is OpsPeer => typeof p !== 'string');
    peer = runs.length ? runs.reduce((a, b) => (total(b) < total(a) ? b : a)) : `torch peer unavailable: ${eager.join('; ')}`;
    if (compileMode !== 'off' && typeof peer !== 'string') compiled = torchPeer(threads, peer.allocator, compileMode);
  }
  const ms = (s: number) => (Number.isFinite(s) ? (s * 1e3).toFixed(2) : '-');
  const rows = Object.entries(mine).map(([name, s]) => {
    const p = typeof peer === 'string' ? NaN : peer.seconds[name] ?? NaN;
    const c = compiled === undefined || typeof compiled === 'string' ? NaN : compiled.seconds[name] ?? NaN;
    return [name, ms(s), ms(p), Number.isNaN(p) ? '-' : (p / s).toFixed(2), ms(c), Number.isNaN(c) ? '-' : (c / s).toFixed(2)];
  });
  printTable(['op', 'nodetron ms', 'torch eager ms', 'eager/ours', 'torch.compile ms', 'compile/ours'], rows);
  if (typeof peer === 'string') console.log(peer);
  else {
    const env = Object.entries(peer.allocatorEnv).map(([k, v]) => `${k}=${v}`).join(' ') || 'none';
    console.log(`torch ${peer.torch}, ${peer.threads} threads, allocator ${peer.allocator} (env: ${env}; fastest in total of ${eager.map((p) => typeof p === 'string' ? p : `${p.allocator} ${(total(p) * 1e3).toFixed(1)} ms`).join(', ')}); ` +
      `nodetron ${cpu().kernelThreads()} kernel threads`);
    if (typeof compiled === 'string') console.log(`torch.compile failed: ${compiled}`);
    else if (compiled) console.log(`torch.compile mode ${compiled.compileMode}: first calls (compilation, or hits in inductor's cache) ${Object.values(compiled.firstCallSeconds).map((s) => s.toFixed(1)).join(', ')} s`);
  }
  const adamBytesPerSec = (28 * ADAM_PARAMS) / mine[ADAM_CASE]!, triad = triadBytesPerSecond(ADAM_PARAMS);
  console.log(`AdamW: ${(adamBytesPerSec / 1e9).toFixed(1)} GB/s (28 bytes per parameter); STREAM triad on the same threads: ${(triad / 1e9).toFixed(1)} GB/s (12 bytes per element as STREAM counts them; the output's write-allocate moves 16); AdamW at ${((100 * adamBytesPerSec) / triad).toFixed(0)}% of it`);
  writeJson(opts.json as string | undefined, { bench: 'ops', machine: machineRecord(), cpuIsa, nodetronSeconds: mine, torch: peer, torchEager: eager, torchCompile: compiled ?? null, torchAllocators: TORCH_ALLOCATORS,
    adamw: { params: ADAM_PARAMS, bytesPerSecond: adamBytesPerSec, triadBytesPerSecond: triad } });
  return 0;
}
