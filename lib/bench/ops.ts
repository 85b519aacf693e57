// `nodetron bench ops`: forward+backward time of the ops that dominate a small GPT step (LM head
// GEMM, fused cross-entropy over a 50257 vocabulary, attention, layerNorm, gelu), beside PyTorch
// on the same CPU in the same run (scripts/bench/ops_torch.py) when python3 with torch is found: eager
// under each allocator setting installed here (the fastest in total compared) and torch.compile.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { randn, tensor } from '../creation.js';
import { cpu, packageRoot } from '../native.js';
import { attention, crossEntropy, gelu, layerNorm, linear, ones, zeros } from '../index.js';
import type { Tensor } from '../tensor.js';
import { ArgumentError } from '../errors.js';
import { machineRecord, parseOptions, printTable, runTorchPeer, timeIt, TORCH_ALLOCATORS, writeJson } from './util.js';

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

/** What the PyTorch peer printed (scripts/bench/ops_torch.py), under one allocator setting. */
interface OpsPeer { allocator: string; torch: string; threads: number; compileMode: string | null; allocatorEnv: Record<string, string>; seconds: Record<string, number>; firstCallSeconds: Record<string, number> }

function torchPeer(threads: number | undefined, allocator: string, compile?: string): OpsPeer | string {
  const script = join(packageRoot, 'scripts', 'bench', 'ops_torch.py');
  const r = runTorchPeer([script, ...(threads ? [String(threads)] : []), ...(compile ? ['--compile', compile] : [])], allocator, (compile ? 30 : 10) * 60_000);
  return 'error' in r ? `${allocator}: ${r.error}` : { allocator, ...(r.result as unknown as Omit<OpsPeer, 'allocator'>) };
}

const total = (p: OpsPeer) => Object.values(p.seconds).reduce((a, b) => a + b, 0);

export async function main(argv: string[]): Promise<number> {
  const opts = parseOptions(argv, { json: 'string', 'no-torch': 'boolean', threads: 'number', 'torch-alloc': 'string', 'torch-compile': 'string' });
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
  const mine: Record<string, number> = {};
  for (const [name, fn, after] of cases()) {
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
  writeJson(opts.json as string | undefined, { bench: 'ops', machine: machineRecord(), nodetronSeconds: mine, torch: peer, torchEager: eager, torchCompile: compiled ?? null, torchAllocators: TORCH_ALLOCATORS });
  return 0;
}
