#!/usr/bin/env node
// On a GPU machine (with the build, dist/ and node carried there): checks every cuda kernel on random inputs
// against the cpu backend or a float64 reference, then times GEMM (next to torch.matmul), memory-bound
// kernels (next to a device-to-device copy) and per-op dispatch. Prints a table, writes JSON.
//   node scripts/gpu_check.mjs [--out DIR]     (needs `npx tsc` output in dist/)
import { spawnSync } from 'node:child_process';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const nt = await import('../dist/index.js');
const { cpu, cuda } = await import('../dist/native.js');
const outDir = process.argv.includes('--out') ? process.argv[process.argv.indexOf('--out') + 1] : 'bench/results';
const G = cuda(), C = cpu();
if (!nt.cuda.isAvailable()) {
  console.error(`no usable GPU: ${nt.cuda.unavailableReason()}`);
  process.exit(2);
}
const DT = { f32: 0, f16: 1, bf16: 2, i32: 3, u8: 4 };
const TOL = { f32: 2e-5, bf16: 2e-2, f16: 4e-3 };
const results = { checks: [], bench: [], machine: { devices: G.deviceInfo(), libraries: G.libraryInfo(), node: process.version } };

// ---- helpers -------------------------------------------------------------------------------------
let seed = 1;
const randn = (shape, dtype = 'f32', device = 'cuda', std = 1) => nt.randn(shape, { seed: seed++, dtype, device, std });
const host = (t) => Float64Array.from(t.toArraySync());
const zerosLike = (shape, dtype, device = 'cuda') => nt.zeros(shape, { dtype, device });
function compare(name, dtype, got, want, tol = TOL[dtype] ?? 0) {
  let maxErr = 0, bad = 0;
  for (let i = 0; i < want.length; i++) {
    const e = Math.abs(got[i] - want[i]) / (1 + Math.abs(want[i]));
    if (!(e <= tol)) bad++;
    if (e > maxErr || Number.isNaN(e)) maxErr = Number.isNaN(e) ? Infinity : e;
  }
  results.checks.push({ name, dtype, n: want.length, maxRelErr: maxErr, bad, ok: bad === 0 });
}
function check(name, fn) {
  try { fn(); } catch (e) { results.checks.push({ name, ok: false, error: String(e?.stack ?? e) }); }
}

// ---- correctness ---------------------------------------------------------------------------------
for (const dtype of ['f32', 'bf16', 'f16', 'i32', 'u8']) {
  check(`cast/write/read ${dtype}`, () => {
    const x = nt.randn([4099], { seed: 9, std: 100 });
    compare('cast f32->' + dtype, dtype, host(x.to({ dtype, device: 'cuda' })), host(x.to(dtype)), 0);
  });
}
check('fill/arange', () => {
  for (const dtype of ['f32', 'bf16', 'f16', 'i32']) {
    compare('fill ' + dtype, dtype, host(nt.full([1000], 3.3, { dtype, device: 'cuda' })), host(nt.full([1000], 3.3, { dtype })), 0);
    compare('arange ' + dtype, dtype, host(nt.arange(0, 50, 0.25, { dtype, device: 'cuda' })), host(nt.arange(0, 50, 0.25, { dtype })), 0);
  }
});
check('random_fill', () => {
  compare('rand', 'f32', host(nt.rand([10007], { seed: 3, device: 'cuda' })), host(nt.rand([10007], { seed: 3 })), 0);
  compare('randn', 'f32', host(nt.randn([10007], { seed: 3, device: 'cuda' })), host(nt.randn([10007], { seed: 3 })), 1e-5);
});
for (const dtype of ['f32', 'bf16', 'f16']) {
  check(`gemm ${dtype}`, () => {
    for (const [ta, tb] of [[false, false], [true, false], [false, true], [true, true]]) {
      const [B, M, N, K] = [3, 67, 45, 129];
      const a = randn([B, M, K], dtype, 'cpu'), b = randn([B, K, N], dtype, 'cpu');
      const cc = zerosLike([B, M, N], dtype, 'cpu'), gc = zerosLike([B, M, N], dtype);
      const ga = a.to('cuda'), gb = b.to('cuda');
      const args = [dtype === 'f32' ? 0 : DT[dtype], B, M, N, K, ta, tb, 1, 0, M * K, K * N, M * N];
      C.gemm(a.storage, b.storage, cc.storage, ...args);
      G.gemm(ga.storage, gb.storage, gc.storage, ...args);
      compare(`gemm ${dtype} tA=${ta} tB=${tb}`, dtype, host(gc), host(cc), dtype === 'f32' ? 1e-4 : TOL[dtype] * 4);
    }
  });
}
check('gemm_epilogue bias+gelu', () => {
  const [M, N, K] = [64, 96, 80];
  const a = randn([M, K]), b = randn([K, N]), bias = randn([N]), c = zerosLike([M, N], 'f32'), aux = zerosLike([M, N], 'f32');
  G.gemm_epilogue(a.storage, b.storage, c.storage, 0, 1, M, N, K, false, false, 1, 0, 0, 0, 0, bias.storage, 3, aux.storage);
  const A = host(a), Bm = host(b), bi = host(bias), want = new Float64Array(M * N), pre = new Float64Array(M * N);
  for (let i = 0; i < M; i++) for (let j = 0; j < N; j++) {
    let s = bi[j];
    for (let k = 0; k < K; k++) s += A[i * K + k] * Bm[k * N + j];
    pre[i * N + j] = s;
    want[i * N + j] = 0.5 * s * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (s + 0.044715 * s ** 3)));
  }
  compare('gemm_epilogue gelu_bias', 'f32', host(c), want, 1e-3);
  compare('gemm_epilogue aux', 'f32', host(aux), pre, 1e-3);
});
for (const dtype of ['f32', 'bf16']) {
  check(`layernorm ${dtype}`, () => {
    const [R, D] = [37, 769];
    const x = randn([R, D], dtype, 'cuda', 3), w = randn([D], dtype), b = randn([D], dtype);
    const y = zerosLike([R, D], dtype), mean = zerosLike([R], 'f32'), rstd = zerosLike([R], 'f32');
    G.layernorm_forward(x.storage, w.storage, b.storage, y.storage, mean.storage, rstd.storage, R, D, 1e-5, DT[dtype]);
    const X = host(x), W = host(w), Bb = host(b), want = new Float64Array(R * D);
    for (let r = 0; r < R; r++) {
      let m = 0, v = 0;
      for (let j = 0; j < D; j++) m += X[r * D + j];
      m /= D;
      for (let j = 0; j < D; j++) v += (X[r * D + j] - m) ** 2;
      const rs = 1 / Math.sqrt(v / D + 1e-5);
      for (let j = 0; j < D; j++) want[r * D + j] = (X[r * D + j] - m) * rs * W[j] + Bb[j];
    }
    compare(`layernorm_forward ${dtype}`, dtype, host(y), want, dtype === 'f32' ? 1e-4 : 3e-2);
  });
  check(`softmax cross-entropy ${dtype}`, () => {
    const [R, V] = [19, 50257];
    const logits = randn([R, V], dtype, 'cuda', 2);
    const targets = nt.tensor(Int32Array.from({ length: R }, (_, i) => (i * 7919) % V), [R], { device: 'cuda' });
    const losses = zerosLike([R], 'f32'), lse = zerosLike([R], 'f32');
    G.cross_entropy_forward(logits.storage, targets.storage, losses.storage, lse.storage, R, V, -100, DT[dtype]);
    const L = host(logits), want = new Float64Array(R);
    for (let r = 0; r < R; r++) {
      let mx = -Infinity, s = 0;
      for (let j = 0; j < V; j++) mx = Math.max(mx, L[r * V + j]);
      for (let j = 0; j < V; j++) s += Math.exp(L[r * V + j] - mx);
      want[r] = mx + Math.log(s) - L[r * V + ((r * 7919) % V)];
    }
    compare(`cross_entropy_forward ${dtype}`, 'f32', host(losses), want, 1e-4);
  });
}
check('attention forward (causal, window)', () => {
  for (const window of [0, 5]) {
    const [BH, T, D] = [3, 70, 64], scale = 1 / Math.sqrt(D);
    const q = randn([1, BH, T, D]), k = randn([1, BH, T, D]), v = randn([1, BH, T, D]);
    const o = nt.attention(q, k, v, { causal: true, window, scale });
    const Q = host(q), K = host(k), Vv = host(v), want = new Float64Array(BH * T * D);
    for (let h = 0; h < BH; h++) for (let i = 0; i < T; i++) {
      const js = [];
      for (let j = 0; j <= i; j++) if (window === 0 || i - j < window) js.push(j);
      const s = js.map((j) => { let d = 0; for (let c = 0; c < D; c++) d += Q[(h * T + i) * D + c] * K[(h * T + j) * D + c]; return d * scale; });
      const mx = Math.max(...s), e = s.map((x) => Math.exp(x - mx)), z = e.reduce((p, x) => p + x, 0);
      for (let c = 0; c < D; c++) want[(h * T + i) * D + c] = js.reduce((p, j, n) => p + (e[n] / z) * Vv[(h * T + j) * D + c], 0);
    }
    compare(`attention window=${window}`, 'f32', host(o), want, 1e-4);
  }
});
check('adamw multi-tensor', () => {
  const sizes = [1, 1000, 70001];
  const ps = sizes.map((n) => new nt.nn.Parameter(randn([n]))), gs = sizes.map((n) => randn([n]));
  const P0 = ps.map(host), G0 = gs.map(host);
  const [lr, b1, b2, eps, wd] = [1e-3, 0.9, 0.95, 1e-8, 0.1];
  ps.forEach((p, i) => { p.grad = gs[i]; });
  new nt.optim.AdamW(ps, { lr, betas: [b1, b2], eps, weightDecay: wd }).step();
  ps.forEach((p, t) => {
    const want = P0[t].map((w, i) => {
      const g = G0[t][i], m = (1 - b1) * g, v = (1 - b2) * g * g;
      return w - lr * ((m / (1 - b1)) / (Math.sqrt(v / (1 - b2)) + eps) + wd * w);
    });
    compare(`adamw tensor ${t}`, 'f32', host(p), want, 1e-5);
  });
});
// ---- NCCL (single rank: one GPU cannot host two NCCL ranks; multi-rank algorithms run on the cpu
// backend's tests). Raw NcclComm first, then every collective through nt.distributed's ProcessGroup.
check('nccl NcclComm raw allReduce + bad input', () => {
  const comm = new G.NcclComm(G.ncclUniqueId(), 0, 1, 0);
  const deadline = Date.now() + 30_000;
  while (comm.asyncError() === 'inProgress' && Date.now() < deadline);
  const x = randn([1 << 16]), y = zerosLike([1 << 16], 'f32');
  const ev = comm.allReduce(x.storage, 0, y.storage, 0, 1 << 16, 0, 0);
  comm.synchronize(ev, 30_000);
  G.eventDestroy(ev);
  compare('nccl raw allReduce (1 rank)', 'f32', host(y), host(x), 0);
  const expectThrow = (name, cls, fn) => {
    let e; try { fn(); } catch (err) { e = err; }
    results.checks.push({ name, ok: e instanceof cls, error: e instanceof cls ? undefined : `expected ${cls.name}, got ${e}` });
  };
  expectThrow('nccl raw: count past the buffer', nt.NodetronError, () => comm.allReduce(x.storage, 0, y.storage, 0, (1 << 16) + 1, 0, 0));
  expectThrow('nccl raw: unknown reduce op', nt.ArgumentError, () => comm.allReduce(x.storage, 0, y.storage, 0, 16, 0, 9));
  expectThrow('nccl raw: cpu storage', nt.NodetronError, () => comm.allReduce(nt.zeros([16]).storage, 0, y.storage, 0, 16, 0, 0));
  comm.destroy();
  expectThrow('nccl raw: op after destroy', nt.CommError, () => comm.allReduce(x.storage, 0, y.storage, 0, 16, 0, 0));
});
async function checkAsync(name, fn) {
  try { await fn(); } catch (e) { results.checks.push({ name, ok: false, error: String(e?.stack ?? e) }); }
}
await checkAsync('nccl ProcessGroup (1 rank)', async () => {
  const { world } = await nt.distributed.init({ backend: 'nccl', timeoutMs: 30_000, env: nt.distributed.readLaunchEnv({}) });
  const REDUCE = ['sum', 'avg', 'max', 'min', 'prod'];
  for (const dtype of ['f32', 'bf16', 'f16', 'i32', 'u8']) {
    const src = dtype === 'i32' || dtype === 'u8' ? nt.rand([4099], { seed: 4 }).mul(60).to(dtype).to('cuda') : randn([4099], dtype);
    const want = host(src);
    for (const op of REDUCE) {
      const x = src.clone(), out = zerosLike([4099], dtype);
      await world.allReduce(x, { op, out });
      compare(`nccl allReduce ${op} ${dtype} out-of-place`, dtype, host(out), want, 0);
      world.allReduce(x, { op }).waitSync();  // stream-ordered: the read below runs after it
      compare(`nccl allReduce ${op} ${dtype} in-place`, dtype, host(x), want, 0);
    }
    const b = src.clone();
    await world.broadcast(b);
    compare(`nccl broadcast ${dtype}`, dtype, host(b), want, 0);
    const r = src.clone();
    await world.reduce(r, { op: 'sum' });
    compare(`nccl reduce ${dtype}`, dtype, host(r), want, 0);
    const g = zerosLike([4099], dtype);
    await world.allGather(g, src);
    compare(`nccl allGather ${dtype}`, dtype, host(g), want, 0);
    const gl = [zerosLike([4099], dtype)];
    await world.allGather(gl, src);
    compare(`nccl allGather list ${dtype}`, dtype, host(gl[0]), want, 0);
    const rs = zerosLike([4099], dtype);
    await world.reduceScatter(rs, src);
    compare(`nccl reduceScatter ${dtype}`, dtype, host(rs), want, 0);
    const a2a = zerosLike([4099], dtype);
    await world.allToAll(a2a, src);
    compare(`nccl allToAll ${dtype}`, dtype, host(a2a), want, 0);
  }
  await world.barrier();
  // A batch (one ncclGroupStart/End) of two collectives, then compute ordered after them.
  const a = randn([1000]), c = randn([777], 'bf16'), wa = host(a), wc = host(c);
  await Promise.all(world.batch(() => [world.allReduce(a), world.allReduce(c, { op: 'max' })]));
  compare('nccl batch allReduce f32', 'f32', host(a.mul(2)), wa.map((v) => 2 * v), 0);
  compare('nccl batch allReduce bf16', 'bf16', host(c), wc, 0);
  // Error paths: typed, and the communicator keeps working after them.
  const expectReject = (name, cls, fn) => {
    let e; try { fn(); } catch (err) { e = err; }
    results.checks.push({ name, ok: e instanceof cls, error: e instanceof cls ? undefined : `expected ${cls.name}, got ${e}` });
  };
  expectReject('nccl group: cpu tensor', nt.ArgumentError, () => world.allReduce(nt.zeros([4])));
  const d = zerosLike([4], 'f32'); d.dispose();
  expectReject('nccl group: disposed tensor', nt.DisposedError, () => world.allReduce(d));
  expectReject('nccl group: wrong out size', nt.ShapeError, () => world.allReduce(zerosLike([4], 'f32'), { out: zerosLike([5], 'f32') }));
  expectReject('nccl group: wrong out dtype', nt.DTypeError, () => world.allReduce(zerosLike([4], 'f32'), { out: zerosLike([4], 'bf16') }));
  expectReject('nccl group: uneven reduceScatter split', nt.ShapeError, () => world.reduceScatter(zerosLike([1], 'f32'), zerosLike([3], 'f32'), { counts: [2] }));
  const after = randn([333]), wAfter = host(after);
  await world.allReduce(after);
  compare('nccl allReduce after errors', 'f32', host(after), wAfter, 0);
  // One rank's allreduce time (a device copy through NCCL's kernels), 64 MiB f32.
  const big = zerosLike([16 << 20], 'f32');
  await world.allReduce(big);
  nt.cuda.synchronize();
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < 20; i++) world.allReduce(big);
  nt.cuda.synchronize();
  const ms = Number(process.hrtime.bigint() - t0) / 1e6 / 20;
  results.bench.push({ name: 'nccl allReduce 1 rank 64 MiB f32', ms, gbps: (64 << 20) / ms / 1e6 });
  await nt.distributed.destroy();
  let destroyedErr;
  try { world.allReduce(after); } catch (e) { destroyedErr = e; }
  results.checks.push({ name: 'nccl group: op after destroy', ok: destroyedErr instanceof nt.StateError, error: destroyedErr instanceof nt.StateError ? undefined : String(destroyedErr) });
});

// ---- benchmarks ----------------------------------------------------------------------------------
function timeCuda(fn, iters) {
  fn();
  const start = new nt.cuda.Event(0, { timing: true }), end = new nt.cuda.Event(0, { timing: true });
  start.record();
  for (let i = 0; i < iters; i++) fn();
  end.record();
  end.synchronize();
  const ms = start.elapsedMs(end) / iters;
  start.destroy(); end.destroy();
  return ms;
}
for (const [dtype, n] of [['bf16', 8192], ['f16', 8192], ['f32', 4096]]) {
  const a = randn([n, n], dtype), b = randn([n, n], dtype), c = zerosLike([n, n], dtype);
  const ms = timeCuda(() => G.gemm(a.storage, b.storage, c.storage, DT[dtype], 1, n, n, n, false, false, 1, 0, 0, 0, 0), 20);
  results.bench.push({ name: `gemm ${dtype} ${n}^3`, ms, tflops: (2 * n ** 3) / ms / 1e9 });
  a.dispose(); b.dispose(); c.dispose();
}
const torch = spawnSync('python3', ['-c', `
import torch, json
out = []
for dt, n in [('bfloat16', 8192), ('float16', 8192), ('float32', 4096)]:
    a = torch.randn(n, n, device='cuda', dtype=getattr(torch, dt)); b = torch.randn_like(a)
    torch.matmul(a, b); torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20): torch.matmul(a, b)
    e.record(); torch.cuda.synchronize()
    ms = s.elapsed_time(e) / 20
    out.append({'name': f'torch.matmul {dt} {n}^3', 'ms': ms, 'tflops': 2 * n**3 / ms / 1e9})
print(json.dumps(out))`], { encoding: 'utf8' });
if (torch.status === 0) results.bench.push(...JSON.parse(torch.stdout.trim().split('\n').pop()));
else results.bench.push({ name: 'torch.matmul', error: torch.stderr.slice(-500) });
{
  const [R, D] = [16384, 4096], bytes = R * D * 2;
  const x = randn([R, D], 'bf16'), y = zerosLike([R, D], 'bf16'), w = randn([D], 'bf16'), bb = randn([D], 'bf16');
  const mean = zerosLike([R], 'f32'), rstd = zerosLike([R], 'f32');
  const copy = timeCuda(() => G.copy(y.storage, 0, x.storage, 0, bytes), 50);
  const ln = timeCuda(() => G.layernorm_forward(x.storage, w.storage, bb.storage, y.storage, mean.storage, rstd.storage, R, D, 1e-5, DT.bf16), 50);
  const gelu = timeCuda(() => G.gelu_forward(x.storage, y.storage, R * D, DT.bf16), 50);
  for (const [name, ms] of [['d2d copy', copy], ['layernorm_forward', ln], ['gelu_forward', gelu]]) {
    results.bench.push({ name: `${name} bf16 ${R}x${D}`, ms, gbps: (2 * bytes) / ms / 1e6 });
  }
}
{
  const t = randn([16]), o = zerosLike([16], 'f32');
  const iters = 20000;
  let t0 = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) G.noop();
  results.bench.push({ name: 'dispatch noop', us: Number(process.hrtime.bigint() - t0) / 1e3 / iters });
  t0 = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) G.unary(6, t.storage, o.storage, 16, DT.f32, 2);  // op 6: scale
  nt.cuda.synchronize();
  results.bench.push({ name: 'dispatch unary kernel (16 elems)', us: Number(process.hrtime.bigint() - t0) / 1e3 / iters });
}
// A GPT training step through lib/ops on cuda: the loss must match the same step on cpu (small model),
// then the GPT-2 124M step is timed (bf16 weights would halve memory; f32 here, as the cpu reference).
check('GPT step cuda vs cpu (lib/ops)', () => {
  const cfg = { vocabSize: 64, blockSize: 32, nLayer: 2, nHead: 4, nEmbd: 64, dropout: 0, bias: true };
  const ids = (n, k) => Int32Array.from({ length: n }, (_, i) => (i * 7 + k * 13 + ((i * i) % 5)) % cfg.vocabSize);
  const losses = {};
  for (const device of ['cpu', 'cuda']) {
    const model = new nt.nn.GPT(cfg, { seed: 1, device });
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-3 });
    const x = nt.tensor(ids(128, 1), [4, 32]).to(device), y = nt.tensor(ids(128, 2), [4, 32]).to(device);
    losses[device] = [0, 1, 2].map(() => nt.trainStep(model, opt, x, y, { maxGradNorm: 1 }).loss);
    opt.dispose(); model.dispose();
  }
  compare('GPT step losses', 'f32', Float64Array.from(losses.cuda), Float64Array.from(losses.cpu), 1e-3);
});
try {
  const cfg = { vocabSize: 50304, blockSize: 1024, nLayer: 12, nHead: 12, nEmbd: 768, dropout: 0, bias: true };
  const [B, T] = [4, 1024];
  const model = new nt.nn.GPT(cfg, { seed: 1, device: 'cuda' });
  const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4 });
  const tokens = () => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => (i * 2654435761) % cfg.vocabSize), [B, T]).to('cuda');
  const x = tokens(), y = tokens();
  nt.trainStep(model, opt, x, y, { maxGradNorm: 1 });  // warm-up: allocator, cuBLASLt plans
  nt.cuda.synchronize();
  const steps = 3, t0 = process.hrtime.bigint();
  for (let s = 0; s < steps; s++) nt.trainStep(model, opt, x, y, { maxGradNorm: 1 });
  nt.cuda.synchronize();
  const ms = Number(process.hrtime.bigint() - t0) / 1e6 / steps;
  results.bench.push({ name: 'GPT-2 124M step (f32, B4 T1024)', ms, tokensPerS: (B * T) / (ms / 1e3) });
  opt.dispose(); model.dispose();
} catch (e) {
  results.bench.push({ name: 'GPT-2 124M step (f32, B4 T1024)', error: String(e?.message ?? e) });
}

// ---- report --------------------------------------------------------------------------------------
mkdirSync(outDir, { recursive: true });
const gpu = results.machine.devices[0]?.name?.replace(/\s+/g, '-') ?? 'gpu';
const file = join(outDir, `${new Date().toISOString().slice(0, 10)}-${gpu}.json`);
writeFileSync(file, JSON.stringify(results, null, 2));
const failed = results.checks.filter((c) => !c.ok);
console.log('\ncheck                                   ok    maxRelErr');
for (const c of results.checks) console.log(`${c.name.padEnd(40)}${String(c.ok).padEnd(6)}${c.error ? c.error.split('\n')[0] : c.maxRelErr?.toExponential(2)}`);
console.log('\nbenchmark                               result');
for (const b of results.bench) {
  const v = b.tflops ? `${b.tflops.toFixed(1)} TFLOP/s (${b.ms.toFixed(3)} ms)` : b.tokensPerS ? `${b.ms.toFixed(1)} ms/step, ${b.tokensPerS.toFixed(0)} tokens/s` : b.gbps ? `${b.gbps.toFixed(0)} GB/s` : b.us ? `${b.us.toFixed(2)} us` : (b.skipped ?? b.error);
  console.log(`${b.name.padEnd(40)}${v}`);
}
console.log(`\n${results.checks.length - failed.length} checks passed, ${failed.length} failed; JSON: ${file}`);
process.exit(failed.length ? 1 : 0);
