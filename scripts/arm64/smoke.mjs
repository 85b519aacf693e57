#!/usr/bin/env node
// The arm64 smoke's checks (.ci/arm64-smoke.sh runs them with an arm64 Node.js under qemu-aarch64-static,
// over dist/ and prebuilds/linux-arm64/). Each prints one JSON line and exits non-zero on a failed check.
//   node scripts/arm64/smoke.mjs checks   the addon loads from prebuilds/linux-arm64 with its own libraries;
//                                         GEMM and softmax at each SIMD level against float64; 5 steps of a tiny GPT
//   node scripts/arm64/smoke.mjs rank     one rank of a 2-rank Gloo (TCP) allreduce (RANK, WORLD_SIZE, MASTER_PORT)
//   node scripts/arm64/smoke.mjs train    only the 5 training steps (what the x64 side runs, natively)
//   node scripts/arm64/smoke.mjs compare <x64.json> <arm64.json>   the two runs' losses within the tolerance below
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const U = 2 ** -24; // float32 unit roundoff
const mode = process.argv[2];
const fail = (what) => { console.log(JSON.stringify({ ok: false, mode, error: what })); process.exit(1); };

// A deterministic uniform(-1, 1) stream, the same on both architectures (no Math.random).
function lcg(seed) {
  let s = seed >>> 0;
  return () => { s = (Math.imul(s, 1664525) + 1013904223) >>> 0; return s / 2 ** 31 - 1; };
}

// ---- 5 steps of a tiny GPT -------------------------------------------------------------------------
// SGD, not AdamW: Adam divides by sqrt(v), so a gradient entry near zero whose rounding differs between
// two machines can turn into an update of ±lr either way; SGD's update is lr·g, whose difference stays a
// rounding-sized fraction of the gradient, which is what the comparison's tolerance assumes.
const CFG = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
const BATCH = 4, STEPS = 5, LR = 0.1;

async function train(nt) {
  const model = new nt.nn.GPT(CFG, { seed: 7 });
  const opt = new nt.optim.SGD(model.parameters(), { lr: LR });
  const next = lcg(12345);
  const losses = [];
  for (let s = 0; s < STEPS; s++) {
    const x = new Int32Array(BATCH * CFG.blockSize), y = new Int32Array(BATCH * CFG.blockSize);
    for (let i = 0; i < x.length; i++) {
      x[i] = Math.floor((next() + 1) * 32) % CFG.vocabSize;
      y[i] = (x[i] * 7 + 3) % CFG.vocabSize; // a learnable map, so the loss moves
    }
    const xt = nt.tensor(x, [BATCH, CFG.blockSize]), yt = nt.tensor(y, [BATCH, CFG.blockSize]);
    losses.push(nt.trainStep(model, opt, xt, yt).loss);
    xt.dispose();
    yt.dispose();
  }
  return losses;
}

async function loadNt() {
  return import(pathToFileURL(join(root, 'dist', 'index.js')).href);
}

if (mode === 'checks') {
  if (process.arch !== 'arm64') fail(`this is ${process.arch}, not arm64`);
  const nt = await loadNt();
  const native = await import(pathToFileURL(join(root, 'dist', 'native.js')).href);
  const addon = native.cpu();
  // (a) the addon and its libraries come from prebuilds/linux-arm64 (qemu-user's /proc/self/maps lists the guest's mappings).
  const prebuilt = join(root, 'prebuilds', 'linux-arm64');
  const file = native.cpuAddonFile();
  if (file !== join(prebuilt, 'nodetron.napi.node')) fail(`loaded ${file}, not the arm64 prebuilt binary`);
  const maps = readFileSync('/proc/self/maps', 'utf8');
  for (const lib of ['nodetron.napi.node', 'libopenblas.so.0', 'libgloo.so.0']) {
    if (!maps.includes(join(prebuilt, lib))) fail(`${lib} was not loaded from ${prebuilt}`);
  }
  const isa = addon.cpuIsa();
  if (isa.best !== 'neon' || isa.supported.join(',') !== 'baseline,neon') fail(`cpuIsa ${JSON.stringify(isa)}`);
  let badIsa = '';
  try { addon.setCpuIsa('avx2'); } catch (e) { badIsa = e.message; }
  if (!/x86-64 level.*auto, baseline, neon/.test(badIsa)) fail(`setCpuIsa('avx2') said: ${badIsa || 'nothing'}`);
  const peak = addon.fmaPeak('neon', 0.05), scalarPeak = addon.fmaPeak('baseline', 0.05);
  if (!(peak.gflops > 0) || peak.lanes !== 4 || peak.chains !== 16) fail(`fmaPeak neon ${JSON.stringify(peak)}`);
  if (!(scalarPeak.gflops > 0) || scalarPeak.lanes !== 1) fail(`fmaPeak baseline ${JSON.stringify(scalarPeak)}`);

  // (b) GEMM (OpenBLAS) against float64. For a dot product of length K in float32 the computed value is
  // within γ_K·Σ|a_k·b_k| of the exact one, γ_K = K·u/(1 − K·u) (Higham, Accuracy and Stability, §3.1),
  // whatever the summation order or FMA use; the reference is the float64 product of the same
  // float32 inputs, exact to far below that.
  const M = 37, K = 53, N = 29, next = lcg(99);
  const a = Float32Array.from({ length: M * K }, next), b = Float32Array.from({ length: K * N }, next);
  const c = nt.matmul(nt.tensor(a, [M, K]), nt.tensor(b, [K, N])).toArraySync();
  const gamma = (K * U) / (1 - K * U);
  let gemmWorst = 0;
  for (let i = 0; i < M; i++) {
    for (let j = 0; j < N; j++) {
      let ref = 0, abs = 0;
      for (let k = 0; k < K; k++) { ref += a[i * K + k] * b[k * N + j]; abs += Math.abs(a[i * K + k] * b[k * N + j]); }
      const err = Math.abs(c[i * N + j] - ref), bound = gamma * abs;
      if (!(err <= bound)) fail(`gemm C[${i},${j}] = ${c[i * N + j]}, float64 ${ref}: error ${err} > bound ${bound}`);
      gemmWorst = Math.max(gemmWorst, err / bound);
    }
  }

  // Softmax rows at each level (scalar baseline, NEON) against float64: exp to about 1 ulp (util.h fastExp)
  // plus its rounding, the row sum of n terms (γ_n relative), and the division (1 ulp): each
  // probability within (n + 4)·u relative of the exact one.
  const rows = 6, cols = 100;
  const xs = Float32Array.from({ length: rows * cols }, () => 8 * next());
  const softBound = (cols + 4) * U;
  const softWorst = {};
  for (const level of ['baseline', 'neon']) {
    addon.setCpuIsa(level);
    const p = nt.softmax(nt.tensor(xs, [rows, cols]), -1).toArraySync();
    softWorst[level] = 0;
    for (let r = 0; r < rows; r++) {
      const row = Array.from(xs.subarray(r * cols, (r + 1) * cols));
      const m = Math.max(...row), z = row.reduce((s, v) => s + Math.exp(v - m), 0);
      for (let j = 0; j < cols; j++) {
        const ref = Math.exp(row[j] - m) / z, rel = Math.abs(p[r * cols + j] - ref) / ref;
        if (!(rel <= softBound)) fail(`softmax at ${level}: p[${r},${j}] = ${p[r * cols + j]}, float64 ${ref}: relative error ${rel} > ${softBound}`);
        softWorst[level] = Math.max(softWorst[level], rel / softBound);
      }
    }
  }
  addon.setCpuIsa('auto');

  // (d, the arm64 half) the training run.
  const losses = await train(nt);
  console.log(JSON.stringify({ ok: true, mode, arch: process.arch, isa, blas: addon.blasInfo().config.trim(), gflops: peak.gflops,
    gemmWorstOfBound: gemmWorst, softmaxWorstOfBound: softWorst, losses }));
} else if (mode === 'train') {
  const nt = await loadNt();
  console.log(JSON.stringify({ ok: true, mode, arch: process.arch, losses: await train(nt) }));
} else if (mode === 'rank') {
  // (c) a 2-rank allreduce through Gloo over loopback TCP (sharedMemory off: the shared-memory path
  // would bypass Gloo's transport). Integers in float32: the sums are exact.
  // The launcher would start the ranks with process.execPath, which without a binfmt handler for arm64
  // cannot be executed directly: .ci/arm64-smoke.sh starts both under qemu, and rank 0 serves the
  // rendezvous store on MASTER_PORT (loopback) itself, as the launcher would.
  const nt = await loadNt();
  const server = process.env.RANK === '0' ? await nt.distributed.StoreServer.start({ host: '127.0.0.1', port: Number(process.env.MASTER_PORT) }) : undefined;
  const { world, rank } = await nt.distributed.init({ backend: 'gloo', sharedMemory: false, timeoutMs: 120_000 });
  const n = 1000;
  const mine = () => nt.tensor(Float32Array.from({ length: n }, (_, i) => (rank + 1) * i), [n]);
  // allReduce reduces in place: a fresh tensor for each op.
  const sum = (await world.allReduce(mine(), { op: 'sum' })).toArraySync();
  const max = (await world.allReduce(mine(), { op: 'max' })).toArraySync();
  await nt.distributed.destroy();
  await server?.close();
  for (let i = 0; i < n; i++) {
    if (sum[i] !== 3 * i) fail(`rank ${rank}: allreduce sum[${i}] = ${sum[i]}, expected ${3 * i}`);
    if (max[i] !== 2 * i) fail(`rank ${rank}: allreduce max[${i}] = ${max[i]}, expected ${2 * i}`);
  }
  console.log(JSON.stringify({ ok: true, mode, arch: process.arch, rank, worldSize: world.size }));
} else if (mode === 'compare') {
  const x64 = JSON.parse(readFileSync(process.argv[3], 'utf8')).losses, arm = JSON.parse(readFileSync(process.argv[4], 'utf8')).losses;
  if (x64.length !== STEPS || arm.length !== STEPS) fail(`expected ${STEPS} losses on each side, got ${x64.length} and ${arm.length}`);
  // The two machines run the same float32 arithmetic in different orders (OpenBLAS's kernels, AVX-512 vs
  // NEON lanes, FMA contraction), so every result may differ by rounding. Step 0's loss is a forward pass:
  // its longest reductions are the GEMMs' K ≤ 4·nEmbd = 128 terms (γ_128 ≈ 128·u ≈ 7.6e-6 relative to
  // Σ|a·b|, whose scale at this initialization is about the values' own), chained through 2 layers × 6
  // dependent GEMMs + the head ≈ 13 of them, then a log-sum-exp over 64 logits and a mean: about
  // 13 × 128·u ≈ 1e-4 of the loss. Each SGD step (lr 0.1) moves the parameters by lr·g with g differing by the
  // same relative amount, adding at most as much again to the next loss: step s may differ by (s + 1)·1e-4·loss.
  const perStep = 13 * 128 * U;
  const rows = x64.map((l, s) => ({ step: s, x64: l, arm64: arm[s], diff: Math.abs(l - arm[s]), tol: (s + 1) * perStep * Math.abs(l) }));
  const bad = rows.filter((r) => !(r.diff <= r.tol));
  if (bad.length) fail(`losses differ beyond the rounding tolerance: ${JSON.stringify(bad)}`);
  // The losses must also move (a run that did nothing would match itself trivially).
  if (!(x64[STEPS - 1] < x64[0] - 0.01)) fail(`the x64 losses did not fall: ${x64.join(', ')}`);
  console.log(JSON.stringify({ ok: true, mode, steps: rows }));
} else {
  console.error('usage: node scripts/arm64/smoke.mjs checks|train|rank|compare <x64.json> <arm64.json>');
  process.exit(2);
}
