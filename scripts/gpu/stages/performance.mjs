// Stage 3: performance, each number beside PyTorch's on the same GPU in the same run: GEMM TFLOP/s
// (bf16, f16, tf32, f32; 4096^3, 8192^3 and GPT-2 124M's shapes, NN/NT/TN) vs torch.matmul; GB/s of
// memory-bound kernels vs a device-to-device copy and the torch op; a GPT-2 124M training step
// (T = 1024, B = 8/16/32, bf16 autocast): tokens/s, MFU, peak memory vs torch eager and torch.compile;
// JS dispatch cost per op on cuda. Rows: { name, value, unit, torch, ratio = nodetron / torch }.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { findPython, root, torchPeer } from '../common.mjs';

const DT = { f32: 0, f16: 1, bf16: 2, tf32: 0 };
// Dense peak TFLOP/s of bf16 tensor cores, for MFU (SXM parts; PCIe/NVL parts are lower).
const PEAK_BF16 = [[/H200/, 989], [/H100.*PCIe/, 756], [/H100/, 989], [/A100/, 312], [/B200/, 2250]];

export async function run(rec, nt, noGpu) {
  if (noGpu) return rec.skip(noGpu);
  const started = Date.now();
  const { cuda } = await import('../../../dist/native.js');
  const G = cuda();
  const gpu = G.deviceInfo()[0].name;
  const { python, torch } = findPython();
  rec.info('torch', torch);
  const row = (name, value, unit, torchValue, extra = {}) => rec.bench({ name, value, unit, torch: torchValue ?? null, ratio: torchValue ? value / torchValue : undefined, ...extra });
  const timeCuda = (fn, iters) => {
    fn();
    const a = new nt.cuda.Event(0, { timing: true }), b = new nt.cuda.Event(0, { timing: true });
    a.record();
    for (let i = 0; i < iters; i++) fn();
    b.record(); b.synchronize();
    const ms = a.elapsedMs(b) / iters;
    a.destroy(); b.destroy();
    return ms;
  };

  // ---- GEMM ----
  const shapes = [[4096, 4096, 4096, 'NN'], [8192, 8192, 8192, 'NN']];
  // GPT-2 124M at B*T = 8192 rows: QKV, attention proj, MLP up, MLP down, LM head; forward NN-like
  // (x @ W^T = NT), the two backward products (dX: NN, dW: TN).
  for (const [n, k] of [[2304, 768], [768, 768], [3072, 768], [768, 3072], [50304, 768]]) {
    shapes.push([8192, n, k, 'NT'], [8192, k, n, 'NN'], [n, k, 8192, 'TN']);
  }
  const dtypes = ['bf16', 'f16', 'tf32', 'f32'];
  const peer = torchPeer(python, ['gemm', '--shapes', JSON.stringify(shapes), '--dtypes', dtypes.join(',')], 400_000);
  if (peer.error) rec.info('torchGemmError', peer.error);
  for (const dtype of dtypes) {
    nt.cuda.setFloat32MatmulPrecision(dtype === 'tf32' ? 'high' : 'highest');
    for (const [m, n, k, layout] of shapes) {
      const ta = layout[0] === 'T', tb = layout[1] === 'T';
      const st = dtype === 'tf32' ? 'f32' : dtype;
      const a = nt.randn(ta ? [k, m] : [m, k], { seed: 1, dtype: st, device: 'cuda' }), b = nt.randn(tb ? [n, k] : [k, n], { seed: 2, dtype: st, device: 'cuda' });
      const c = nt.zeros([m, n], { dtype: st, device: 'cuda' });
      const iters = Math.max(3, Math.min(50, Math.floor(2e13 / (2 * m * n * k))));
      const ms = timeCuda(() => G.gemm(a.storage, b.storage, c.storage, DT[dtype], 1, m, n, k, ta, tb, 1, 0, 0, 0, 0), iters);
      const t = peer.result?.find((r) => r.dtype === dtype && r.m === m && r.n === n && r.k === k && r.layout === layout);
      row(`gemm ${dtype} ${m}x${n}x${k} ${layout}`, (2 * m * n * k) / ms / 1e9, 'TFLOP/s', t?.tflops);
      a.dispose(); b.dispose(); c.dispose();
    }
  }
  nt.cuda.setFloat32MatmulPrecision('highest');

  // ---- memory-bound kernels (bf16 16384 x 4096: 128 MiB in, 128 MiB out) ----
  {
    const [R, D] = [16384, 4096], bytes = R * D * 2;
    const x = nt.randn([R, D], { seed: 3, dtype: 'bf16', device: 'cuda' }), y = nt.zeros([R, D], { dtype: 'bf16', device: 'cuda' });
    const w = nt.randn([D], { seed: 4, dtype: 'bf16', device: 'cuda' }), bb = nt.randn([D], { seed: 5, dtype: 'bf16', device: 'cuda' });
    const mean = nt.zeros([R], { device: 'cuda' }), rstd = nt.zeros([R], { device: 'cuda' });
    const s1 = nt.zeros([1], { dtype: 'bf16', device: 'cuda' }), sD = nt.zeros([D], { dtype: 'bf16', device: 'cuda' }), sR = nt.zeros([R], { dtype: 'bf16', device: 'cuda' });
    const gw = nt.zeros([D], { dtype: 'bf16', device: 'cuda' }), gb = nt.zeros([D], { dtype: 'bf16', device: 'cuda' });
    const tp = torchPeer(python, ['membw', '--rows', String(R), '--cols', String(D)]);
    if (tp.error) rec.info('torchMembwError', tp.error);
    const copyMs = timeCuda(() => G.copy(y.storage, 0, x.storage, 0, bytes), 50);
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
      const ms = key === 'copy' ? copyMs : timeCuda(fn, 50);
      const gbps = (2 * bytes * f) / ms / 1e6;
      row(`${name} bf16 ${R}x${D}`, gbps, 'GB/s', tp.result?.[key]?.gbps, { ms, ofCopy: copyMs / ms });
    }
  }

  // ---- dispatch cost per op (16 elements: launch + JS) ----
  {
    const t = nt.randn([16], { seed: 6, device: 'cuda' }), o = nt.zeros([16], { device: 'cuda' });
    const iters = 20000;
    let t0 = process.hrtime.bigint();
    for (let i = 0; i < iters; i++) G.noop();
    rec.bench({ name: 'dispatch: addon noop', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
    t0 = process.hrtime.bigint();
    for (let i = 0; i < iters; i++) G.unary(6, t.storage, o.storage, 16, 0, 2);
    nt.cuda.synchronize();
    rec.bench({ name: 'dispatch: raw unary kernel (16 elems)', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
    t0 = process.hrtime.bigint();
    for (let i = 0; i < iters; i++) nt.scope(() => nt.add(t, t));
    nt.cuda.synchronize();
    rec.bench({ name: 'dispatch: nt.add through lib/ops (16 elems)', value: Number(process.hrtime.bigint() - t0) / 1e3 / iters, unit: 'us' });
  }

  // ---- GPT-2 124M training step, bf16 autocast ----
  const cfg = { vocabSize: 50257, blockSize: 1024, nLayer: 12, nHead: 12, nEmbd: 768, dropout: 0, bias: true };
  const peakTf = PEAK_BF16.find(([re]) => re.test(gpu))?.[1];
  for (const B of [8, 16, 32]) {
    const T = 1024;
    let nParams = 0;
    try {
      nt.emptyCache('cuda');
      const model = new nt.nn.GPT(cfg, { seed: 1, device: 'cuda' });
      nParams = model.parameters().reduce((s, p) => s + p.numel, 0);
      const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, weightDecay: 0.1 });
      const ids = (k) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => ((i + k) * 2654435761 >>> 0) % cfg.vocabSize), [B, T]).to('cuda');
      const x = ids(0), y = ids(1);
      const step = () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, y, { maxGradNorm: 1 }));
      step(); step();
      nt.cuda.synchronize();
      nt.resetPeakMemory('cuda');
      const steps = 5, t0 = process.hrtime.bigint();
      for (let s = 0; s < steps; s++) step();
      nt.cuda.synchronize();
      const ms = Number(process.hrtime.bigint() - t0) / 1e6 / steps;
      const tokS = (B * T) / (ms / 1e3);
      const flopsPerToken = 6 * nParams + 12 * cfg.nLayer * cfg.nEmbd * T;
      const peak = nt.memoryStats('cuda').peak;
      opt.dispose(); model.dispose(); x.dispose(); y.dispose();
      nt.emptyCache('cuda');
      const peers = {};
      for (const mode of ['eager', 'compile']) {
        // torch.compile takes a minute or more per shape: only while the stage has time left.
        if (mode === 'compile' && (Date.now() - started) / 1000 > 330) { peers[mode] = { error: 'skipped: not enough of the stage limit left' }; continue; }
        peers[mode] = torchPeer(python, ['--layers', '12', '--heads', '12', '--width', '768', '--ctx', String(T), '--batch', String(B),
          '--vocab', '50257', '--steps', '5', '--warmup', mode === 'compile' ? '3' : '2', '--device', 'cuda', '--dtype', 'bf16', ...(mode === 'compile' ? ['--compile'] : [])], 240_000, join(root, 'scripts', 'bench', 'torch_train.py'));
      }
      const mfu = peakTf ? (tokS * flopsPerToken) / (peakTf * 1e12) : null;
      rec.bench({ name: `GPT-2 124M step bf16 B${B} T${T}`, value: tokS, unit: 'tokens/s', msPerStep: ms, mfu, peakBytes: peak, params: nParams,
        torch: peers.eager.tokensPerSec ?? null, ratio: peers.eager.tokensPerSec ? tokS / peers.eager.tokensPerSec : undefined,
        torchPeakBytes: peers.eager.peakBytes ?? null, torchError: peers.eager.error,
        torchCompile: peers.compile.tokensPerSec ?? null, ratioCompile: peers.compile.tokensPerSec ? tokS / peers.compile.tokensPerSec : undefined,
        torchCompilePeakBytes: peers.compile.peakBytes ?? null, torchCompileError: peers.compile.error });
      if (peers.compile.tokensPerSec) rec.bench({ name: `GPT-2 124M step bf16 B${B} vs torch.compile`, value: tokS, unit: 'tokens/s', torch: peers.compile.tokensPerSec, ratio: tokS / peers.compile.tokensPerSec });
    } catch (e) {
      rec.bench({ name: `GPT-2 124M step bf16 B${B} T${T}`, error: String(e?.message ?? e).split('\n')[0], oom: e instanceof nt.OutOfMemoryError });
      nt.emptyCache('cuda');
    }
  }
}
