// Performance steps of the device run, each number beside PyTorch's on the same GPU in the same run:
// a GPT-2 124M training step (T 1024, bf16 autocast) in tokens/s, MFU and peak memory, with the first
// 20 losses of nodetron and PyTorch (eager and torch.compile) from the same weights and tokens; GEMM
// TFLOP/s (bf16, f16, tf32, f32; 4096^3, 8192^3 and GPT-2 124M's shapes NN/NT/TN) vs torch.matmul; GB/s of
// memory-bound kernels vs a device-to-device copy and the torch op; JS dispatch cost per op on cuda.
// Rows: { name, value, unit, torch, ratio = nodetron / torch }.
import { rmSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { findPython, relErr, root, torchPeer } from '../common.mjs';

const DT = { f32: 0, f16: 1, bf16: 2, tf32: 0 };
// NODETRON_GPU_RUN_DRY=1 (rehearsals without a GPU): every step runs on the cpu at small sizes, so its
// code runs here: the GPT-2 steps on a tiny GPT with PyTorch on the cpu (weights and tokens handed to
// torch, losses compared), GEMM, bandwidth and dispatch on the cpu addon's kernels timed by the host
// clock, CUDA graphs in their cpu form (replay calls the function). Left out on the cpu: the per-kernel
// profile of the GPT-2 step (CUDA events around every kernel).
const DRY = ['1', 'full'].includes(process.env.NODETRON_GPU_RUN_DRY ?? '');
const DEV = DRY ? 'cpu' : 'cuda';
const sync = (nt) => { if (!DRY) nt.cuda.synchronize(); };
/** A reason that lets the PyTorch part run: a GPU is there, nodetron's cuda addon does not load. */
const torchOnly = (noGpu) => /^cuda unusable: /.test(noGpu ?? '');
/** The addon whose raw kernels a step times: cuda's, or the cpu's in the dry run. */
const addonOf = async () => { const n = await import('../../../dist/native.js'); return DRY ? n.cpu() : n.cuda(); };
// Dense peak TFLOP/s of bf16 tensor cores, for MFU (SXM parts; PCIe/NVL parts are lower).
const PEAK_BF16 = [[/H200/, 989], [/H100.*PCIe/, 756], [/H100/, 989], [/A100/, 312], [/B200/, 2250]];
// The GPT-2 124M step: batch, context, the losses compared with PyTorch's, the timed steps after them.
const GPT2 = DRY
  ? { cfg: { vocabSize: 512, blockSize: 64, nLayer: 2, nHead: 2, nEmbd: 64, dropout: 0, bias: true }, B: 2, T: 64, losses: 20, timed: 3 }
  : { cfg: { vocabSize: 50257, blockSize: 1024, nLayer: 12, nHead: 12, nEmbd: 768, dropout: 0, bias: true }, B: 16, T: 1024, losses: 20, timed: 10 };
// Both sides' AdamW: scripts/bench/torch_train.py's hyperparameters, weight decay on every parameter.
const ADAMW = { lr: 1e-4, betas: [0.9, 0.95], eps: 1e-8, weightDecay: 0.1 };
// First-20-step losses of bf16 runs from the same weights and tokens: |a - b| / (1 + |b|) at most this.
const LOSS_TOL = 1e-2;
// The steps whose losses must match PyTorch's; the later ones are recorded beside them.
const GATE_STEPS = 5;

const timeCuda = (nt, fn, iters) => {
  fn();
  if (DRY) {
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < iters; i++) fn();
    return Number(process.hrtime.bigint() - t0) / 1e6 / iters;
  }
  const a = new nt.cuda.Event(0, { timing: true }), b = new nt.cuda.Event(0, { timing: true });
  a.record();
  for (let i = 0; i < iters; i++) fn();
  b.record(); b.synchronize();
  const ms = a.elapsedMs(b) / iters;
  a.destroy(); b.destroy();
  return ms;
};
const rowOf = (rec) => (name, value, unit, torchValue, extra = {}) => rec.bench({ name, value, unit, torch: torchValue ?? null, ratio: torchValue ? value / torchValue : undefined, ...extra });

/** nodetron's GPT-2 124M step: writes its initial weights and tokens for the torch steps, records 20 losses, times 10 steps. */
export async function gpt2Step(rec, nt, noGpu, ctx) {
  if (noGpu && !DRY) return rec.skip(noGpu);
  const { cfg, B, T } = GPT2;
  const { cuda } = await import('../../../dist/native.js');
  const gpu = DRY ? 'cpu' : cuda().deviceInfo()[0].name;
  const prefix = join(ctx.work, 'gpt2-init');
  // What an earlier run (or attempt) left would be taken for this one's by the torch steps.
  for (const f of ['gpt2-losses.json', 'gpt2-nodetron.json']) rmSync(join(ctx.work, f), { force: true });
  const attention = DRY ? 'cpu flash attention' : process.env.NODETRON_FLASH_SIMT && process.env.NODETRON_FLASH_SIMT !== '0' ? 'flash SIMT kernels' : 'flash tensor-core kernels (bf16, head dim 64)';
  rec.info('gpt2Attention', attention);
  nt.emptyCache(DEV);
  const model = new nt.nn.GPT(cfg, { seed: 1, device: DEV });
  const named = model.namedParameters();
  const nParams = named.reduce((s, [, p]) => s + p.size, 0);
  let offset = 0;
  const manifest = named.map(([name, p]) => { const m = { name, shape: p.shape, offset }; offset += p.size; return m; });
  const flat = new Float32Array(offset);
  for (const [i, [, p]] of named.entries()) flat.set(p.to('cpu').toArraySync(), manifest[i].offset);
  writeFileSync(`${prefix}.json`, JSON.stringify(manifest));
  writeFileSync(`${prefix}.bin`, new Uint8Array(flat.buffer));
  const tokens = Int32Array.from({ length: 2 * B * T }, (_, i) => ((i * 2654435761) >>> 0) % cfg.vocabSize);
  writeFileSync(`${prefix}-tokens.bin`, new Uint8Array(tokens.buffer));
  const x = nt.tensor(tokens.slice(0, B * T), [B, T]).to(DEV), y = nt.tensor(tokens.slice(B * T), [B, T]).to(DEV);
  const opt = new nt.optim.AdamW(model.parameters(), ADAMW);
  // NODETRON_CUDA_GRAPH=1 (the lever gpt2-step@graph): the whole step captured into one CUDA graph after
  // one eager step (nt.captureTrainStep; a capture that fails falls back to eager steps, and says why).
  const graphed = process.env.NODETRON_CUDA_GRAPH === '1' ? nt.captureTrainStep(model, opt, { device: DEV }) : null;
  const step = graphed
    ? () => nt.autocast({ dtype: 'bf16' }, () => graphed.step(x, y))
    : () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, y));
  const losses = [];
  for (let s = 0; s < GPT2.losses; s++) losses.push(step().loss);
  rec.info('gpt2Losses', losses);
  if (graphed) rec.info('gpt2CapturedStep', { captured: graphed.captured, fallbackReason: graphed.fallbackReason });
  const finite = losses.every(Number.isFinite);
  rec.check({ name: `GPT-2 ${DRY ? 'tiny (dry)' : '124M'} bf16 (${attention}): ${GPT2.losses} finite losses, falling`, ok: finite && losses.at(-1) < losses[0], error: finite && losses.at(-1) < losses[0] ? undefined : JSON.stringify(losses) });
  // Only finite losses go to the torch steps (a failed attempt's NaNs would fail their comparison for
  // the wrong reason; run.mjs then retries on the SIMT kernels, whose losses they get).
  if (finite) writeFileSync(join(ctx.work, 'gpt2-losses.json'), JSON.stringify({ losses, attention, variant: process.env.NODETRON_FLASH_SIMT ?? null }));
  sync(nt);
  nt.resetPeakMemory(DEV);
  const t0 = process.hrtime.bigint();
  for (let s = 0; s < GPT2.timed; s++) step();
  sync(nt);
  const ms = Number(process.hrtime.bigint() - t0) / 1e6 / GPT2.timed;
  const tokS = (B * T) / (ms / 1e3);
  const flopsPerToken = 6 * nParams + 12 * cfg.nLayer * cfg.nEmbd * T;
  const peakTf = PEAK_BF16.find(([re]) => re.test(gpu))?.[1];
  const result = { tokS, ms, mfu: peakTf ? (tokS * flopsPerToken) / (peakTf * 1e12) : null, peakBytes: nt.memoryStats(DEV).peak, params: nParams, flopsPerToken, peakTflops: peakTf ?? null };
  // The planner's bf16 figures for this step (one device, one micro-batch of B): nodetron's own model
  // (measured on the CPU backend; this run measures its cuda side) and the published recipe's.
  try {
    const { plan } = await import('../../../dist/internal.js');
    const pm = plan.modelFromConfig({ ...cfg, n_positions: cfg.blockSize }, 'gpt2-step');
    const layout = plan.parseLayoutSpec('dp1');
    const o = { seq: T, microBatchSize: B, dtype: 'bf16' };
    result.plannerBytes = plan.estimateMemory(pm, layout, { ...o, model: 'nodetron', backend: DEV }).total;
    result.plannerMegatronBytes = plan.estimateMemory(pm, layout, { ...o, model: 'megatron' }).total;
    rec.info('gpt2PlannerMemory', { measuredPeakBytes: result.peakBytes, nodetron: result.plannerBytes, megatron: result.plannerMegatronBytes,
      nodetronError: (result.plannerBytes - result.peakBytes) / result.peakBytes, megatronError: (result.plannerMegatronBytes - result.peakBytes) / result.peakBytes });
  } catch (e) {
    rec.info('gpt2PlannerMemory', { error: String(e) });
  }
  writeFileSync(join(ctx.work, 'gpt2-nodetron.json'), JSON.stringify(result));
  rec.bench({ name: `GPT-2 ${DRY ? 'tiny (dry)' : '124M'} step bf16 B${B} T${T}`, value: tokS, unit: 'tokens/s', msPerStep: ms, mfu: result.mfu, peakBytes: result.peakBytes, params: nParams });
  if (!DRY) {
    // Where the step's GPU time goes: one more step with every cuda kernel call bracketed by events
    // (lib/bench/train-cuda.ts profileKernels, as `nodetron bench train --device cuda` prints it).
    const { profileKernels } = await import('../../../dist/bench/train-cuda.js');
    const table = profileKernels(0, () => { step(); });
    const total = table.reduce((s, t) => s + t.ms, 0);
    rec.info('gpt2Kernels', { totalMs: total, kernels: table });
    console.log(`GPT-2 step per cuda kernel (${total.toFixed(1)} ms):\n` + table.slice(0, 12).map((t) => `  ${t.kernel} ${t.calls} calls ${t.ms.toFixed(2)} ms ${((100 * t.ms) / total).toFixed(1)}%`).join('\n'));
  }
  graphed?.dispose();
  opt.dispose(); model.dispose(); x.dispose(); y.dispose();
}

/** PyTorch's GPT-2 124M step (ctx.args.mode: eager or compile) from nodetron's weights and tokens, beside nodetron's. */
export async function gpt2Torch(rec, nt, noGpu, ctx) {
  if (noGpu && !DRY && !torchOnly(noGpu)) return rec.skip(noGpu);
  const { cfg, B, T } = GPT2;
  const mode = ctx.args.mode;
  const prefix = join(ctx.work, 'gpt2-init');
  let mine = null, ourLosses = null;
  try { mine = JSON.parse(readFileSync(join(ctx.work, 'gpt2-nodetron.json'), 'utf8')); } catch { /* the nodetron step did not finish */ }
  let ours = null;
  try { ours = JSON.parse(readFileSync(join(ctx.work, 'gpt2-losses.json'), 'utf8')); ourLosses = ours.losses; } catch { /* idem */ }
  const { python, torch } = findPython();
  if (DRY && !torch) return rec.skip('dry run: no python with torch here');
  // Without nodetron's finite losses (its step failed, or the cuda addon did not load), torch still runs
  // from its own initialization: its speed and memory are the baseline.
  const init = ourLosses ? ['--init', prefix, '--losses', String(GPT2.losses)] : [];
  // torch.compile: Inductor compiles with as many workers as the machine has cores (the device: 16).
  const env = mode === 'compile' ? { TORCHINDUCTOR_COMPILE_THREADS: process.env.TORCHINDUCTOR_COMPILE_THREADS ?? String(Math.max(1, (await import('node:os')).availableParallelism())) } : {};
  rec.info(`torch${mode}Env`, env);
  const peer = torchPeer(python, ['--layers', String(cfg.nLayer), '--heads', String(cfg.nHead), '--width', String(cfg.nEmbd), '--ctx', String(T), '--batch', String(B),
    '--vocab', String(cfg.vocabSize), '--steps', String(GPT2.timed), '--warmup', '3', '--device', DEV, '--dtype', 'bf16', ...(DRY ? ['--threads', '2', '--no-memory'] : []), ...init, ...(mode === 'compile' ? ['--compile'] : [])],
  600_000, join(root, 'scripts', 'bench', 'torch_train.py'), env);
  if (peer.error) { rec.check({ name: `torch ${mode} GPT-2 step ran`, ok: false, error: peer.error }); return; }
  rec.info(`torch${mode}`, { torch: peer.torch, msPerStep: peer.msPerStep, firstStepSeconds: peer.firstStepSeconds, peakStepBytes: peer.peakStepBytes, losses: peer.losses });
  const tokS = mine?.tokS;
  rec.bench({ name: `GPT-2 ${DRY ? 'tiny (dry)' : '124M'} step bf16 B${B} vs torch ${mode}`, value: tokS ?? null, unit: 'tokens/s', torch: peer.tokensPerSec, ratio: tokS ? tokS / peer.tokensPerSec : undefined,
    peakBytes: mine?.peakBytes ?? null, torchPeakBytes: peer.peakStepBytes ?? null, mfu: mine?.mfu ?? null, torchMfu: mine?.flopsPerToken && mine.peakTflops ? (peer.tokensPerSec * mine.flopsPerToken) / (mine.peakTflops * 1e12) : null });
  if (ourLosses && peer.losses?.length) {
    // Steps 1-5 gate (the same weights and tokens, bf16 rounding apart: the runs have not diverged yet);
    // steps 6-20 are reported (bf16 runs drift apart as updates compound; a trend, not a verdict).
    const c = relErr(ourLosses.slice(0, GATE_STEPS), peer.losses.slice(0, GATE_STEPS), LOSS_TOL);
    const later = relErr(ourLosses.slice(GATE_STEPS), peer.losses.slice(GATE_STEPS, ourLosses.length), LOSS_TOL);
    rec.info(`lossesVsTorch${mode}`, { nodetronAttention: ours.attention, gateSteps: GATE_STEPS, maxRelErrFirst: c.maxRelErr, maxRelErrLater: later.maxRelErr, laterPastTol: later.bad, tol: LOSS_TOL, nodetron: ourLosses, torch: peer.losses });
    rec.check({ name: `GPT-2 ${DRY ? 'tiny (dry)' : '124M'} bf16: losses of steps 1-${GATE_STEPS} = torch ${mode}'s (same weights and tokens; steps ${GATE_STEPS + 1}-${ourLosses.length}: max rel err ${later.maxRelErr.toPrecision(2)})`, ok: c.bad === 0, maxRelErr: c.maxRelErr, tol: LOSS_TOL, error: c.bad ? JSON.stringify({ nodetron: ourLosses, torch: peer.losses }) : undefined });
  }
}

/** GEMM TFLOP/s beside torch.matmul (torch's alone where nodetron's cuda addon does not load). */
export async function gemmPerf(rec, nt, noGpu) {
  if (noGpu && !DRY && !torchOnly(noGpu)) return rec.skip(noGpu);
  const G = noGpu && !DRY ? null : await addonOf();
  const { python, torch } = findPython();
  const row = rowOf(rec);
  const shapes = DRY ? [[256, 256, 256, 'NN'], [192, 96, 64, 'NT'], [64, 96, 192, 'TN']] : [[4096, 4096, 4096, 'NN'], [8192, 8192, 8192, 'NN']];
  // GPT-2 124M at B*T = 8192 rows: QKV, attention proj, MLP up, MLP down, LM head; forward NN-like
  // (x @ W^T = NT), the two backward products (dX: NN, dW: TN).
  if (!DRY) for (const [n, k] of [[2304, 768], [768, 768], [3072, 768], [768, 3072], [50304, 768]]) {
    shapes.push([8192, n, k, 'NT'], [8192, k, n, 'NN'], [n, k, 8192, 'TN']);
  }
  const dtypes = DRY ? ['bf16', 'f32'] : ['bf16', 'f16', 'tf32', 'f32'];
  const peer = DRY && !torch ? { error: 'dry run: no python with torch here' }
    : torchPeer(python, ['gemm', '--shapes', JSON.stringify(shapes), '--dtypes', dtypes.join(','), '--device', DEV], 80_000);
  if (peer.error) rec.info('torchGemmError', peer.error);
  for (const dtype of dtypes) {
    if (G && !DRY) nt.cuda.setFloat32MatmulPrecision(dtype === 'tf32' ? 'high' : 'highest');
    for (const [m, n, k, layout] of shapes) {
      const t = peer.result?.find((r) => r.dtype === dtype && r.m === m && r.n === n && r.k === k && r.layout === layout);
      if (!G) { rec.bench({ name: `gemm ${dtype} ${m}x${n}x${k} ${layout}`, value: null, unit: 'TFLOP/s', torch: t?.tflops ?? null }); continue; }
      const ta = layout[0] === 'T', tb = layout[1] === 'T';
      const st = dtype === 'tf32' ? 'f32' : dtype;
      const a = nt.randn(ta ? [k, m] : [m, k], { seed: 1, dtype: st, device: DEV }), b = nt.randn(tb ? [n, k] : [k, n], { seed: 2, dtype: st, device: DEV });
      const c = nt.zeros([m, n], { dtype: st, device: DEV });
      const iters = DRY ? 3 : Math.max(3, Math.min(50, Math.floor(2e13 / (2 * m * n * k))));
      const ms = timeCuda(nt, () => G.gemm(a.storage, b.storage, c.storage, DT[dtype], 1, m, n, k, ta, tb, 1, 0, 0, 0, 0), iters);
      row(`gemm ${dtype} ${m}x${n}x${k} ${layout}`, (2 * m * n * k) / ms / 1e9, 'TFLOP/s', t?.tflops);
      a.dispose(); b.dispose(); c.dispose();
    }
  }
  if (G && !DRY) nt.cuda.setFloat32MatmulPrecision('highest');
}

/** GB/s of memory-bound kernels beside a device copy and the torch op (torch's alone where nodetron's cuda addon does not load). */
export async function membw(rec, nt, noGpu) {
  if (noGpu && !DRY && !torchOnly(noGpu)) return rec.skip(noGpu);
  const G = noGpu && !DRY ? null : await addonOf();
  const { python, torch } = findPython();
  const row = rowOf(rec);
  // bf16 16384 x 4096: 128 MiB in, 128 MiB out (dry: 256 x 512 on the cpu)
  const [R, D] = DRY ? [256, 512] : [16384, 4096], bytes = R * D * 2;
  const tp = DRY && !torch ? { error: 'dry run: no python with torch here' } : torchPeer(python, ['membw', '--rows', String(R), '--cols', String(D), '--device', DEV], 30_000);
  if (tp.error) rec.info('torchMembwError', tp.error);
  if (!G) {
    for (const [key, r] of Object.entries(tp.result ?? {})) rec.bench({ name: `${key} bf16 ${R}x${D} (torch)`, value: null, unit: 'GB/s', torch: r.gbps });
    return;
  }
  const x = nt.randn([R, D], { seed: 3, dtype: 'bf16', device: DEV }), y = nt.zeros([R, D], { dtype: 'bf16', device: DEV });
  const w = nt.randn([D], { seed: 4, dtype: 'bf16', device: DEV }), bb = nt.randn([D], { seed: 5, dtype: 'bf16', device: DEV });
  const mean = nt.zeros([R], { device: DEV }), rstd = nt.zeros([R], { device: DEV });
  const s1 = nt.zeros([1], { dtype: 'bf16', device: DEV }), sD = nt.zeros([D], { dtype: 'bf16', device: DEV }), sR = nt.zeros([R], { dtype: 'bf16', device: DEV });
  const gw = nt.zeros([D], { dtype: 'bf16', device: DEV }), gb = nt.zeros([D], { dtype: 'bf16', device: DEV });
  const iters = DRY ? 5 : 50;
  const copyMs = timeCuda(nt, () => G.copy(y.storage, 0, x.storage, 0, bytes), iters);
  const kernels = [
    ['copy', 'd2d copy', () => G.copy(y.storage, 0, x.storage, 0, bytes), 1],
    ['gelu', 'gelu_forward', () => G.gelu_forward(x.storage, y.storage, R * D, DT.bf16), 1],
    ['layernorm', 'layernorm_forward', () => G.layernorm_forward(x.storage, w.storage, bb.storage, y.storage, mean.storage, rstd.storage, R, D, 1e-5, DT.bf16), 1],
    ['add', 'binary add', () => nt.add(x, x).dispose(), 1.5],
    ['softmax', 'softmax_forward', () => G.softmax_forward(x.storage, y.storage, R, D, DT.bf16, false), 1],
    // Two-stage deterministic reductions (reads only: f = 0.5; the norm and bias gradients read two
    // [R, D] inputs and write one: f = 1.5).
    ['sum', 'sum_to all', () => G.sum_to(x.storage, s1.storage, DT.bf16, new Int32Array([R, D]), new Int32Array([0, 0]), 1), 0.5],
    ['colsum', 'sum_to over rows', () => G.sum_to(x.storage, sD.storage, DT.bf16, new Int32Array([R, D]), new Int32Array([0, 1]), D), 0.5],
    ['rowsum', 'sum_to over columns', () => G.sum_to(x.storage, sR.storage, DT.bf16, new Int32Array([R, D]), new Int32Array([1, 0]), R), 0.5],
    ['layernorm_backward', 'layernorm_backward', () => G.layernorm_backward(x.storage, w.storage, mean.storage, rstd.storage, x.storage, y.storage, gw.storage, gb.storage, R, D, DT.bf16), 1.5],
    ['bias_gelu_backward', 'bias_gelu_backward', () => G.bias_gelu_backward(x.storage, x.storage, y.storage, gb.storage, R, D, DT.bf16), 1.5],
  ];
  for (const [key, name, fn, f] of kernels) {
    const ms = key === 'copy' ? copyMs : timeCuda(nt, fn, iters);
    const gbps = (2 * bytes * f) / ms / 1e6;
    row(`${name} bf16 ${R}x${D}`, gbps, 'GB/s', tp.result?.[key]?.gbps, { ms, ofCopy: copyMs / ms });
  }
}

/** JS dispatch cost per op on the device (16 elements: launch + JS). */
export async function dispatch(rec, nt, noGpu) {
  if (noGpu && !DRY) return rec.skip(noGpu);
  const G = await addonOf();
  const t = nt.randn([16], { seed: 6, device: DEV }), o = nt.zeros([16], { device: DEV });
  const iters = DRY ? 2000 : 20000;
  let t0 = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) G.noop();
  rec.bench({ name: 'dispatch: addon noop', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
  t0 = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) G.unary(6, t.storage, o.storage, 16, 0, 2);
  sync(nt);
  rec.bench({ name: 'dispatch: raw unary kernel (16 elems)', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
  t0 = process.hrtime.bigint();
  for (let i = 0; i < iters; i++) nt.scope(() => nt.add(t, t));
  sync(nt);
  rec.bench({ name: 'dispatch: nt.add through lib/ops (16 elems)', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
}

/**
 * CUDA graphs (nt.cuda.graph): a GPT-2 124M forward (logits) + backward of a fixed probe, captured and
 * replayed, against the same eagerly (gradients equal, ms per step of each); and whether a whole loss
 * step captures (the fused head counts the targets on the host, so GraphCaptureError naming that op is
 * the expected answer today, recorded as info).
 */
export async function gpt2Graph(rec, nt, noGpu) {
  if (noGpu && !DRY) return rec.skip(noGpu);
  const { cfg, T } = GPT2;
  const B = DRY ? 2 : 4;
  const model = new nt.nn.GPT(cfg, { seed: 1, device: DEV });
  const tokens = Int32Array.from({ length: B * T }, (_, i) => ((i * 2654435761) >>> 0) % cfg.vocabSize);
  const x = nt.tensor(tokens, [B, T]).to(DEV);
  const params = model.parameters();
  const fwdBwd = () => nt.autocast({ dtype: 'bf16' }, () => nt.scope(() => {
    model.zeroGrad();
    const { logits } = model.forward(x);
    nt.sum(nt.mul(logits, 1e-3)).backward();
  }));
  const grads = () => params.slice(0, 4).map((p) => Float64Array.from(p.grad.to('cpu').toArraySync()));
  const eagerMs = timeCuda(nt, fwdBwd, 5);
  const want = grads();
  let g;
  try {
    g = nt.cuda.graph(fwdBwd, { warmup: 1, device: DEV });
  } catch (e) {
    rec.check({ name: 'CUDA graph: GPT-2 forward + backward captures', ok: false, error: `${e?.name}: ${e?.op ?? ''} ${String(e?.message ?? e).slice(0, 600)}` });
    return;
  }
  const graphMs = timeCuda(nt, () => g.replay(), 5);
  sync(nt);
  const got = grads();
  got.forEach((gr, i) => { const c = relErr(gr, want[i], 1e-3); rec.check({ name: `CUDA graph: GPT-2 replayed gradient ${i} = eager`, ok: c.bad === 0, maxRelErr: c.maxRelErr, tol: 1e-3 }); });
  rec.bench({ name: `GPT-2 ${DRY ? 'tiny (dry, cpu form)' : '124M'} fwd+bwd B${B} T${T} bf16: CUDA graph replay vs eager`, value: graphMs, unit: 'ms', torch: null, eagerMs, speedup: eagerMs / graphMs });
  g.dispose();
  const y = nt.tensor(tokens, [B, T]).to(DEV);
  try {
    const h = nt.cuda.graph(() => nt.autocast({ dtype: 'bf16' }, () => nt.scope(() => { model.zeroGrad(); model.forward(x, y).loss.backward(); })), { warmup: 0, device: DEV });
    rec.info('gpt2GraphLossStep', { captured: true });
    h.dispose();
  } catch (e) {
    rec.info('gpt2GraphLossStep', { captured: false, error: e?.name, op: e?.op, message: String(e?.message ?? e).slice(0, 400) });
  }
  model.dispose(); x.dispose(); y.dispose();
}
