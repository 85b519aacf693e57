// Stage 1: every kernel lib/ops and lib/optim call, forward and backward, in f32/bf16/f16, on cuda against
// the cpu backend at training shapes (1024+ rows, vocabulary 50257, T = 1024, sizes past one grid);
// the raw kernels (casts, GEMM in every transpose, the GEMM epilogue, the vocabulary-parallel loss);
// every kernel of the interface is called at least once (counted); the allocator on real streams;
// streams and events; AMP; OOM as a typed error with the process usable after; NCCL on a one-rank
// communicator (every collective); a GPT step; a subset under compute-sanitizer.
// NODETRON_GPU_RUN_DRY=1 (rehearsals without a GPU) runs every block with the cpu as the "device" at
// small shapes, the device-only blocks included, through the stand-ins of dry.mjs where a call has no
// cpu equivalent: streams and events (no-ops on the cpu), cuBLASLt's gemm_epilogue (a composition of cpu
// ops), the OOM block under a host memory limit in 64 MiB tensors; left out on the cpu are only the raw
// NcclComm calls (the ProcessGroup block runs over Gloo instead), the interface-coverage count of cuda
// kernels and compute-sanitizer itself (the subset runs without it). NODETRON_GPU_RUN_SIZES=full makes
// the dry run use the device run's shapes: the cpu side of the correctness phase, measured (each check
// logs its time and the part spent on the cpu references and comparisons; the step records the total
// as info cpuSideMs).
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { relErr, root, tensorRelErr } from '../common.mjs';
import { cpuGemmEpilogue, cpuStreams } from './dry.mjs';

const DRY = ['1', 'full'].includes(process.env.NODETRON_GPU_RUN_DRY ?? '');
const SMALL = DRY && process.env.NODETRON_GPU_RUN_SIZES !== 'full';
const DT = { f32: 0, f16: 1, bf16: 2, i32: 3, u8: 4 };
const TOL = { f32: 1e-4, bf16: 3e-2, f16: 1e-2 };

export async function run(rec, nt, noGpu, ctx = {}) {
  if (noGpu && !DRY) return rec.skip(noGpu);
  // The device run (run.mjs) runs this file in several steps, each naming its sections; a block
  // belongs to the last section() before it. Without ctx.sections every section runs.
  let current = null;
  const section = (name) => { current = name; };
  const on = (name = current) => !ctx.sections || ctx.sections.includes(name);
  const { cpu, cuda, BACKEND_KERNELS } = await import('../../../dist/native.js');
  const I = await import('../../../dist/internal.js');
  const DEV = DRY ? 'cpu' : 'cuda';
  const C = cpu(), G = DRY ? cpu() : cuda();
  const big = (n, small) => (SMALL ? small : n);
  // Streams and events: nt.cuda's, or their cpu stand-ins (dry.mjs).
  const S = DRY ? cpuStreams() : nt.cuda;
  // cuBLASLt's gemm_epilogue on tensors (the addon takes their storages), or its cpu composition.
  const gemmEpilogue = DRY ? cpuGemmEpilogue(nt, C)
    : ({ a, b, c, dtype, M, N, K, transA = false, transB = false, beta = 0, bias = null, epilogue, aux = null, cDtype }) =>
      G.gemm_epilogue(a.storage, b.storage, c.storage, DT[dtype], 1, M, N, K, transA, transB, 1, beta, 0, 0, 0, bias?.storage ?? null, epilogue, aux?.storage ?? null, ...(cDtype ? [DT[cDtype]] : []));

  // Count every kernel call on the device addon (the interface's names), to prove coverage at the end
  // (the cpu addon is not wrapped: the one addon would count the references' calls too).
  const calls = new Map();
  if (!DRY) for (const k of BACKEND_KERNELS) {
    const f = G[k];
    if (typeof f !== 'function' || k === 'Storage') continue;
    G[k] = function (...a) { calls.set(k, (calls.get(k) ?? 0) + 1); return f.apply(this, a); };
  }

  // A leaf copy on device (never the same tensor, so cpu-vs-cpu runs keep their gradients apart).
  const fresh = (t, device) => (device === 'cpu' && t.device === 'cpu' ? t.clone() : t.to(device));
  const host = (t) => Float64Array.from(t.to('cpu').toArraySync());
  // The cpu side of the run (references and comparisons), timed: on the GPU machine it is most of the
  // correctness phase's time.
  // Wall time and the process's CPU time (all threads; a measure a loaded machine does not inflate).
  let cpuMs = 0, cpuTotalMs = 0, cpuUs = 0, cpuTotalUs = 0;
  const ref = (fn) => {
    const t = performance.now(), u = process.cpuUsage();
    try { return fn(); } finally {
      cpuMs += performance.now() - t;
      const d = process.cpuUsage(u);
      cpuUs += d.user + d.system;
    }
  };
  const isTensor = (v) => v !== null && typeof v === 'object' && 'storage' in v && 'shape' in v;
  // Tensors are compared by cpu kernels (tensorRelErr), arrays of numbers in JS.
  const compare = (name, dtype, got, want, tol = TOL[dtype] ?? 0, extra = {}) => ref(() => {
    const { maxRelErr, bad } = isTensor(got) && isTensor(want) ? tensorRelErr(nt, C, got, want, tol)
      : relErr(isTensor(got) ? host(got) : got, isTensor(want) ? host(want) : want, tol);
    rec.check({ name, dtype, n: isTensor(want) ? want.size : want.length, maxRelErr, tol, bad, ok: bad === 0, ...extra });
  });
  const check = async (name, fn) => {
    if (!on()) return;
    const t0 = performance.now();
    cpuMs = 0; cpuUs = 0;
    try { await nt.scope(fn); } catch (e) { rec.check({ name, ok: false, error: String(e?.stack ?? e) }); }
    cpuTotalMs += cpuMs; cpuTotalUs += cpuUs;
    console.log(`${name} (${(performance.now() - t0).toFixed(0)} ms, cpu side ${cpuMs.toFixed(0)} ms wall, ${(cpuUs / 1e3).toFixed(0)} ms CPU time)`);
  };
  let seed = 1;
  const randn = (shape, dtype = 'f32', device = 'cpu', std = 1) => nt.randn(shape, { seed: seed++, dtype, device, std });

  // ---- lib/ops forward and backward against cpu ---------------------------------------------------
  const R = big(1024, 64), D = big(768, 48), T = big(1024, 32), V = big(50257, 1001), H = big(12, 2), HD = 64;
  const cases = [
    { name: `add/sub/mul/div broadcast [${R},${D}]`, shapes: [[R, D], [D]], run: ([a, b]) => nt.sub(nt.div(nt.mul(a, b), nt.add(nt.mul(b, b), 1)), nt.add(a, b)) },
    { name: `exp/tanh/pow/scale/neg [${R},${D}]`, shapes: [[R, D]], std: 0.5, run: ([a]) => nt.add(nt.tanh(nt.exp(nt.scale(a, 0.3))), nt.neg(nt.pow(a, 3))) },
    { name: `log/sqrt [${R},${D}]`, shapes: [[R, D]], positive: true, run: ([a]) => nt.add(nt.log(a), nt.sqrt(a)) },
    { name: `sum/mean/max [8,${R / 8},${D}]`, shapes: [[8, R / 8, D]], run: ([a]) => nt.add(nt.add(nt.sum(a, 1), nt.mean(a, 1)), nt.max(a, 1)) },
    { name: `gelu [${R},${4 * D}]`, shapes: [[R, 4 * D]], run: ([a]) => nt.gelu(a) },
    { name: `softmax/logSoftmax [${R},${T}]`, shapes: [[R, T]], run: ([a]) => nt.add(nt.softmax(a), nt.logSoftmax(a)) },
    { name: `layerNorm [${R},${D}]`, shapes: [[R, D], [D], [D]], run: ([x, w, b]) => nt.layerNorm(x, w, b) },
    { name: `rmsNorm [${R},${D}]`, shapes: [[R, D], [D]], run: ([x, w]) => nt.rmsNorm(x, w) },
    { name: `linear [2,${R / 2},${D}]x[${3 * D},${D}]`, shapes: [[2, R / 2, D], [3 * D, D], [3 * D]], std: 1 / Math.sqrt(D), run: ([x, w, b]) => nt.linear(x, w, b) },
    { name: `matmul batched [${H},${R},${HD}]x[${H},${HD},${R}]`, shapes: [[H, R, HD], [H, HD, R]], std: 0.3, run: ([a, b]) => nt.matmul(a, b) },
    { name: `permute/slice/cat/transpose [4,${R / 4},${D}]`, shapes: [[4, R / 4, D]], run: ([a]) => nt.cat([nt.permute(a, [2, 0, 1]), nt.slice(nt.permute(a, [2, 0, 1]), 1, 1, 3)], 1) },
    { name: `attention causal [1,${H},${T},${HD}]`, shapes: [[1, H, T, HD], [1, H, T, HD], [1, H, T, HD]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: true }) },
    { name: `attention window 128 [1,2,${T},${HD}]`, shapes: [[1, 2, T, HD], [1, 2, T, HD], [1, 2, T, HD]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: true, window: 128 }) },
    // Flash attention (flash_attention_forward/backward): the GPT block's packed QKV layout, windows, head dim 128, odd T, T < Tk.
    { name: `attentionPacked causal [2,${T},3x${H}x${HD}]`, shapes: [[2, T, 3 * H * HD]], run: ([x]) => nt.attentionPacked(x, H, { causal: true }) },
    { name: `attentionPacked window 256 [2,${T},3x${H}x${HD}]`, shapes: [[2, T, 3 * H * HD]], run: ([x]) => nt.attentionPacked(x, H, { causal: true, window: big(256, 9) }) },
    { name: `attention causal D=128 [1,4,${T},128]`, shapes: [[1, 4, T, 128], [1, 4, T, 128], [1, 4, T, 128]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: true }) },
    { name: `attentionPacked causal odd T D=128 [2,${T + 1},3x2x128]`, shapes: [[2, T + 1, 3 * 2 * 128]], run: ([x]) => nt.attentionPacked(x, 2, { causal: true }) },
    { name: 'attention causal T<Tk [2,3,77|129,64]', shapes: [[2, 3, 77, 64], [2, 3, 129, 64], [2, 3, 129, 64]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: true }) },
    // Head dims above 256 take the materializing path (attention_softmax_forward/backward around per-head GEMMs).
    { name: `attention causal D=288 materializing [1,2,${T},288]`, shapes: [[1, 2, T, 288], [1, 2, T, 288], [1, 2, T, 288]], std: 0.5, run: ([q, k, v]) => nt.attention(q, k, v, { causal: true }) },
    { name: 'attention non-causal window 5 [1,2,33,32]', shapes: [[1, 2, 33, 32], [1, 2, 33, 32], [1, 2, 33, 32]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: false, window: 5 }) },
    // Norm parameter gradients and bias gradients are two-stage column sums over 64-row blocks
    // (launchColumnSums): training shapes with many row blocks, and odd shapes (one partial block,
    // columns not a multiple of the 16-byte vector width).
    { name: `layerNorm [${big(8192, 200)},${D}]`, shapes: [[big(8192, 200), D], [D], [D]], run: ([x, w, b]) => nt.layerNorm(x, w, b) },
    { name: 'layerNorm [3,5]', shapes: [[3, 5], [5], [5]], run: ([x, w, b]) => nt.layerNorm(x, w, b) },
    { name: `rmsNorm [${big(8192, 200)},${D}]`, shapes: [[big(8192, 200), D], [D]], run: ([x, w]) => nt.rmsNorm(x, w) },
    { name: 'rmsNorm [3,5]', shapes: [[3, 5], [5]], run: ([x, w]) => nt.rmsNorm(x, w) },
    { name: `linearGelu [${R},${D}]x[${4 * D},${D}]`, shapes: [[R, D], [4 * D, D], [4 * D]], std: 1 / Math.sqrt(D), run: ([x, w, b]) => nt.linearGelu(x, w, b) },
    { name: 'linearGelu [67,13]x[29,13]', shapes: [[67, 13], [29, 13], [29]], std: 0.3, run: ([x, w, b]) => nt.linearGelu(x, w, b) },
    // geluMlp: on cuda its GEMMs carry cuBLASLt's GELU_AUX_BIAS, BIAS, BGRADB and DGELU_BGRAD epilogues; a
    // hidden size that is not a multiple of 8 takes the addon's kernel fallbacks; linear's bias gradient (BGRADB).
    { name: `geluMlp [2,${R / 2},${D}]x[${4 * D},${D}]x[${D},${4 * D}]`, shapes: [[2, R / 2, D], [4 * D, D], [4 * D], [D, 4 * D], [D]], std: 1 / Math.sqrt(D), run: ([x, w1, b1, w2, b2]) => I.geluMlp(x, w1, b1, w2, b2) },
    { name: 'geluMlp fallback [67,13]x[29,13]x[11,29]', shapes: [[67, 13], [29, 13], [29], [11, 29], [11]], std: 0.3, run: ([x, w1, b1, w2, b2]) => I.geluMlp(x, w1, b1, w2, b2) },
    { name: 'geluMlp no biases [40,16]x[24,16]x[8,24]', shapes: [[40, 16], [24, 16], [8, 24]], std: 0.3, run: ([x, w1, w2]) => I.geluMlp(x, w1, null, w2, null) },
    { name: 'linear odd [67,13]x[29,13]+[29]', shapes: [[67, 13], [29, 13], [29]], std: 0.3, run: ([x, w, b]) => nt.linear(x, w, b) },
    // sum_to's contiguous patterns: column sums [S, K] (sum over dim 0), row sums [K, S] with one
    // block per row and with several blocks per long row, and odd sizes.
    { name: `sum dim 0 [${big(8192, 300)},${big(3072, 96)}]`, shapes: [[big(8192, 300), big(3072, 96)]], run: ([a]) => nt.sum(a, 0) },
    { name: 'sum dim 0 [131,7]', shapes: [[131, 7]], run: ([a]) => nt.sum(a, 0) },
    { name: `sum dim -1 [${R},${D}]`, shapes: [[R, D]], run: ([a]) => nt.sum(a, -1) },
    { name: `sum dim -1 [3,${big(300007, 20011)}]`, shapes: [[3, big(300007, 20011)]], run: ([a]) => nt.sum(a, -1) },
    { name: 'sum dim -1 [5,3]', shapes: [[5, 3]], run: ([a]) => nt.sum(a, -1) },
    // binary's paths: a column broadcast (2-d kernel; its gradient a row sum), a broadcast over a
    // middle dim (strided kernel), a one-element operand and odd sizes.
    { name: `add/mul column broadcast [${R},${D}] [${R},1]`, shapes: [[R, D], [R, 1]], run: ([a, c]) => nt.mul(nt.add(a, c), c) },
    { name: `div/sub broadcast [4,${R / 4},${D}] [4,1,${D}]`, shapes: [[4, R / 4, D], [4, 1, D]], run: ([x, y]) => nt.sub(nt.div(x, nt.add(nt.mul(y, y), 1)), y) },
    { name: 'mul/add broadcast [7,9] [1] [9]', shapes: [[7, 9], [1], [9]], run: ([a, b, c]) => nt.mul(nt.add(a, c), b) },
    { name: 'sum dims 0,2 (strided path) [6,5,7]', shapes: [[6, 5, 7]], run: ([a]) => nt.sum(nt.sum(a, 2), 0) },
    // Llama's ops: silu/swiglu (swiglu_forward/backward), rotary embeddings (rope: an offset, explicit [B, T]
    // positions, odd sizes), grouped-query and multi-query flash attention (kv heads shared by index).
    { name: `silu/swiglu [${R},${4 * D}]`, shapes: [[R, 4 * D], [R, 4 * D]], run: ([g, u]) => nt.add(nt.swiglu(g, u), nt.silu(g)) },
    { name: 'swiglu [67,13]', shapes: [[67, 13], [67, 13]], run: ([g, u]) => nt.swiglu(g, u) },
    { name: `rope offset theta 5e5 [2,${T},${H},${HD}]`, shapes: [[2, T, H, HD]], run: ([x]) => nt.rope(x, { offset: 3, theta: 500000 }) },
    { name: 'rope positions [3,7,5,6]', shapes: [[3, 7, 5, 6]],
      run: ([x]) => nt.rope(x, { positions: nt.tensor(Int32Array.from({ length: 21 }, (_, i) => (i * 37) % 101), [3, 7], { device: x.device }) }) },
    { name: `groupedQueryAttention kv ${H / 2} [2,${T},${H},${HD}]`, shapes: [[2, T, H, HD], [2, T, H / 2, HD], [2, T, H / 2, HD]], run: ([q, k, v]) => nt.groupedQueryAttention(q, k, v) },
    { name: `groupedQueryAttention multi-query [2,${T},${H},${HD}]`, shapes: [[2, T, H, HD], [2, T, 1, HD], [2, T, 1, HD]], run: ([q, k, v]) => nt.groupedQueryAttention(q, k, v) },
    { name: 'attention [B,H,T,D] kv 1 odd T [2,4,37,32]', shapes: [[2, 4, 37, 32], [2, 1, 37, 32], [2, 1, 37, 32]], run: ([q, k, v]) => nt.attention(q, k, v, { causal: true }) },
  ];
  for (const dtype of ['f32', 'bf16', 'f16']) {
    section(`ops-${dtype}`);
    for (const c of cases) {
      await check(`${c.name} ${dtype}`, () => {
        const inputs = c.shapes.map((s) => {
          const r = randn(s, dtype, 'cpu', c.std ?? 1);
          return c.positive ? nt.add(nt.mul(r, r), 0.5) : r;
        });
        let gy;
        const onDevice = (device) => {
          const xs = inputs.map((t) => { const d = fresh(t, device); d.requiresGrad = true; return d; });
          const y = c.run(xs);
          gy ??= randn(y.shape, dtype);
          nt.sum(nt.mul(y, gy.to(device))).backward();
          return { y, grads: xs.map((x) => x.grad) };
        };
        const want = ref(() => onDevice('cpu')), got = onDevice(DEV);
        compare(`${c.name} ${dtype} forward`, dtype, got.y, want.y);
        got.grads.forEach((g, i) => compare(`${c.name} ${dtype} grad ${i}`, dtype, g, want.grads[i], TOL[dtype] * 4));
      });
    }
    await check(`embedding [${R}] of ${V}x${D} + crossEntropy [${R},${V}] ${dtype}`, () => {
      const ids = nt.tensor(Int32Array.from({ length: R }, (_, i) => (i * 7919) % V), [R]);
      const targets = nt.tensor(Int32Array.from({ length: R }, (_, i) => (i % 97 === 3 ? -100 : (i * 104729) % V)), [R]);
      const table = randn([V, D], dtype), logits = randn([R, V], dtype, 'cpu', 2);
      const on = (device) => {
        const w = fresh(table, device), l = fresh(logits, device);
        w.requiresGrad = true; l.requiresGrad = true;
        const e = nt.embedding(ids.to(device), w);
        // The mean of the squares as a mean of row means: nt.mean of all 786,432 f16 squares overflows
        // (the sum is kept in f16 before the division: Infinity at any size past ~65,504 elements of ~1).
        const loss = nt.add(nt.crossEntropy(l, targets.to(device)), nt.mean(nt.mean(nt.mul(e, e), -1)));
        loss.backward();
        return { loss, gw: w.grad, gl: l.grad, e };
      };
      const want = ref(() => on('cpu')), got = on(DEV);
      compare(`embedding forward ${dtype}`, dtype, got.e, want.e, 0);
      // The loss is in the logits' dtype: one rounding of a value near 13 (bf16 2^-8, f16 2^-11 relative).
      compare(`crossEntropy loss ${dtype}`, dtype, got.loss, want.loss, dtype === 'f32' ? 1e-4 : TOL[dtype]);
      compare(`embedding grad ${dtype}`, dtype, got.gw, want.gw, TOL[dtype] * 4);
      compare(`crossEntropy grad ${dtype}`, dtype, got.gl, want.gl, TOL[dtype] * 4);
    });
    // The fused LM head in chunks (16-bit: dW and the bias gradient accumulated in f32 by cuBLASLt from
    // the 16-bit block, BGRADB; the loss summed on the device; the upstream gradient 3 applied on the device).
    const HV = big(8192, 1001);  // a smaller vocabulary keeps the cpu reference of all three dtypes within the step's limit
    await check(`linearCrossEntropy [${R},${D}]x[${HV},${D}]+bias in 3 chunks ${dtype}`, () => {
      const targets = nt.tensor(Int32Array.from({ length: R }, (_, i) => (i % 89 === 5 ? -100 : (i * 7919) % HV)), [R]);
      const x0 = randn([R, D], dtype), w0 = randn([HV, D], dtype, 'cpu', 0.05), b0 = randn([HV], dtype, 'cpu', 0.1);
      const on = (device) => {
        const x = fresh(x0, device), w = fresh(w0, device), b = fresh(b0, device);
        for (const t of [x, w, b]) t.requiresGrad = true;
        const loss = nt.linearCrossEntropy(x, w, targets.to(device), { bias: b, chunkRows: Math.ceil(R / 3) });
        nt.scale(loss, 3).backward();
        return { loss, gx: x.grad, gw: w.grad, gb: b.grad };
      };
      const want = ref(() => on('cpu')), got = on(DEV);
      compare(`linearCrossEntropy loss ${dtype}`, dtype, got.loss, want.loss, TOL[dtype]);
      compare(`linearCrossEntropy grad x ${dtype}`, dtype, got.gx, want.gx, TOL[dtype] * 4);
      compare(`linearCrossEntropy grad weight ${dtype}`, dtype, got.gw, want.gw, TOL[dtype] * 4);
      compare(`linearCrossEntropy grad bias ${dtype}`, dtype, got.gb, want.gb, TOL[dtype] * 4);
    });
  }
  // Grid-stride loops (native/cuda/kernels/common.cuh gridFor) cap the grid at 65535 x 8 blocks of 256
  // threads; a packed f32 kernel takes 4 elements (16 bytes) a thread, so one grid covers 536,862,720 f32.
  // One case passes that: add, 2 GiB a tensor, compared on three windows (the head, across the one-grid
  // boundary, the odd tail), so the cpu moves and computes only those. The other ops run at 4M + 7 (their
  // full-size cpu references at 67M elements were most of this step's time) and at odd small sizes
  // (vector tails).
  section('kernels');
  for (const n of [big((1 << 22) + 7, 100003), 1, 3, 4097]) {
    await check(`elementwise exp/gelu/pow/add/sum n=${n}`, () => {
      const x = randn([n], 'f32', 'cpu', 0.5), d = x.to(DEV);
      compare(`exp n=${n}`, 'f32', nt.exp(d), ref(() => nt.exp(x)), 1e-5);
      compare(`gelu bf16 n=${n}`, 'bf16', nt.gelu(d.to('bf16')), ref(() => nt.gelu(x.to('bf16'))));
      // Without --use_fast_math: tanhf is not tanh.approx (~5e-4) and powf of a negative base is not NaN.
      compare(`gelu f32 n=${n}`, 'f32', nt.gelu(d), ref(() => nt.gelu(x)), 1e-5);
      compare(`pow(x, 3) f32 n=${n} (negative x)`, 'f32', nt.pow(d, 3), ref(() => nt.pow(x, 3)), 1e-5);
      compare(`add n=${n}`, 'f32', nt.add(d, d), ref(() => nt.add(x, x)), 0);
      compare(`sum n=${n}`, 'f32', nt.sum(d), ref(() => nt.sum(x)), 1e-4);
    });
  }
  const ONE_GRID_F32 = 65535 * 8 * 256 * 4;
  const nPast = big(ONE_GRID_F32 + 4103, 100003);
  await check(`grid-stride add past one grid n=${nPast} (3 windows)`, () => {
    const x = nt.randn([nPast], { seed: seed++, device: DEV }), y = nt.add(x, x);
    const W = 4096;
    for (const [what, at] of [['head', 0], ['one-grid boundary', Math.min(ONE_GRID_F32, nPast - W / 2) - W / 2], ['tail', nPast - W]]) {
      const xs = nt.slice(x, 0, at, at + W).to('cpu');
      compare(`add past one grid n=${nPast}: ${what} [${at}, ${at + W})`, 'f32', nt.slice(y, 0, at, at + W), ref(() => nt.add(xs, xs)), 0);
    }
  });

  // binary's op codes past div (native/core/op_codes.h): max, min (fmax/fmin) and pow (a tensor exponent),
  // raw kernel calls on the broadcast paths (row-major, a row bias, a column), cuda against cpu.
  await check('binary max/min/pow (every op code of op_codes.h)', async () => {
    const { BINARY } = await import('../../../dist/kernel-codes.js');
    const rows = big(4096, 64), cols = D;
    const strides = (shape, out) => Int32Array.from(out, (_, i) => {
      const d = i - (out.length - shape.length);
      return d < 0 || shape[d] === 1 ? 0 : shape.slice(d + 1).reduce((x, y) => x * y, 1);
    });
    for (const dtype of ['f32', 'bf16']) {
      for (const [as, bs] of [[[rows, cols], [rows, cols]], [[rows, cols], [cols]], [[rows, cols], [rows, 1]]]) {
        const r = randn(as, dtype), a = nt.add(nt.sqrt(nt.mul(r, r)), 0.25), b = randn(bs, dtype);  // positive bases for pow
        for (const op of ['max', 'min', 'pow']) {
          const run = (addon, device) => {
            const out = nt.zeros([rows, cols], { dtype, device }), A = a.to(device), B = b.to(device);
            addon.binary(BINARY[op], A.storage, B.storage, out.storage, DT[dtype], new Int32Array([rows, cols]), strides(as, [rows, cols]), strides(bs, [rows, cols]));
            return out;
          };
          compare(`binary ${op} ${dtype} [${as}] [${bs}]`, dtype, run(G, DEV), ref(() => run(C, 'cpu')), op !== 'pow' ? 0 : dtype === 'f32' ? 1e-5 : TOL.bf16);
        }
      }
    }
  });

  // The two-stage reductions add their partials in a fixed order: the same inputs give the same bits.
  await check('deterministic reductions (sum, norm and bias gradients, sum_squares)', () => {
    const n = big((1 << 26) + 7, 100003), rows = big(8192, 200), cols = D;
    const x = randn([n], 'f32', DEV), xn = randn([rows, cols], 'bf16', DEV), g = randn([rows, cols], 'bf16', DEV);
    const w = randn([cols], 'bf16', DEV), b = randn([cols], 'bf16', DEV);
    const once = () => {
      const [xs, ws, bs] = [xn, w, b].map((t) => { const c = t.clone(); c.requiresGrad = true; return c; });
      nt.sum(nt.mul(nt.layerNorm(xs, ws, bs), g)).backward();
      return [host(nt.sum(x)), host(nt.sum(g, 0)), host(ws.grad), host(bs.grad), Array.from(G.sum_squares([x.storage], [x.size], [DT.f32]))];
    };
    const first = once(), second = once();
    const names = ['sum', 'column sums', 'layerNorm dW', 'layerNorm dB', 'sum_squares'];
    first.forEach((v, i) => compare(`${names[i]} run twice`, 'f32', second[i], v, 0));
  });

  // ---- raw kernels --------------------------------------------------------------------------------
  for (const dtype of ['f32', 'bf16', 'f16', 'i32', 'u8']) {
    await check(`cast f32->${dtype}`, () => {
      const x = nt.randn([4099], { seed: 9, std: 100 });
      compare(`cast f32->${dtype}`, dtype, x.to({ dtype, device: DEV }), ref(() => x.to(dtype)), 0);
    });
  }
  await check('fill/arange', () => {
    for (const dtype of ['f32', 'bf16', 'f16', 'i32']) {
      // i32 holds integers only (full and arange refuse 3.3 and a step of 0.25 for it); 1003: a vector tail.
      const [v, step] = dtype === 'i32' ? [-7, 3] : [3.3, 0.25];
      compare(`fill ${dtype}`, dtype, nt.full([1003], v, { dtype, device: DEV }), nt.full([1003], v, { dtype }), 0);
      compare(`arange ${dtype}`, dtype, nt.arange(0, 50, step, { dtype, device: DEV }), nt.arange(0, 50, step, { dtype }), 0);
    }
  });
  await check('random_fill', () => {
    compare('rand (same stream as cpu)', 'f32', nt.rand([10007], { seed: 3, device: DEV }), nt.rand([10007], { seed: 3 }), 0);
    compare('randn (same stream as cpu)', 'f32', nt.randn([10007], { seed: 3, device: DEV }), nt.randn([10007], { seed: 3 }), 1e-5);
  });
  const gemmShapes = [[3, 67, 45, 129], [1, big(1024, 64), big(2304, 96), big(768, 48)], [1, big(1024, 64), big(768, 48), big(3072, 96)]];
  section('gemm');
  for (const dtype of ['f32', 'bf16', 'f16']) {
    for (const [B, M, N, K] of gemmShapes) {
      await check(`gemm ${dtype} ${B}x${M}x${N}x${K}`, () => {
        for (const [ta, tb] of [[false, false], [true, false], [false, true], [true, true]]) {
          const a = randn([B, M, K], dtype, 'cpu', 1 / Math.sqrt(K)), b = randn([B, K, N], dtype);
          const cc = nt.zeros([B, M, N], { dtype }), gc = nt.zeros([B, M, N], { dtype, device: DEV });
          const ga = a.to(DEV), gb = b.to(DEV);
          const args = [DT[dtype], B, M, N, K, ta, tb, 1, 0, M * K, K * N, M * N];
          ref(() => C.gemm(a.storage, b.storage, cc.storage, ...args));
          G.gemm(ga.storage, gb.storage, gc.storage, ...args);
          compare(`gemm ${dtype} ${B}x${M}x${N}x${K} tA=${ta} tB=${tb}`, dtype, gc, cc, dtype === 'f32' ? 1e-4 : TOL[dtype] * 2);
        }
      });
    }
  }
  await check('gemm_epilogue bias+gelu (+aux)', () => {
    const [M, N, K] = [256, 384, 192];
    const a = randn([M, K], 'f32', DEV), b = randn([K, N], 'f32', DEV), bias = randn([N], 'f32', DEV);
    const c = nt.zeros([M, N], { device: DEV }), aux = nt.zeros([M, N], { device: DEV });
    gemmEpilogue({ a, b, c, dtype: 'f32', M, N, K, bias, epilogue: 3, aux });
    const pre = ref(() => nt.add(nt.matmul(a.to('cpu'), b.to('cpu')), bias.to('cpu')));
    compare('gemm_epilogue gelu_bias', 'f32', c, ref(() => nt.gelu(pre)), 1e-3);
    compare('gemm_epilogue aux (pre-activation)', 'f32', aux, pre, 1e-3);
  });
  // The bias-gradient epilogues and f32 output from 16-bit operands, against cpu compositions:
  // bgrad (BGRADB: bias[M] = row sums of op(A), with beta = 1 accumulating C), dgelu+bgrad
  // (DGELU_BGRAD: C = op(A)op(B)·gelu'(aux), bias[N] = C's column sums), at GPT-2 shapes and odd ones
  // (N not a multiple of 8: the kernel fallback).
  for (const dtype of ['f32', 'bf16']) {
    for (const [M, N, K] of [[big(768, 48), big(3072, 96), big(1024, 64)], [29, 13, 67]]) {
      await check(`gemm_epilogue bgrad ${dtype} ${M}x${N}x${K} (and f32 output, beta 1)`, () => {
        const g = randn([K, M], dtype), x = randn([K, N], dtype), c0 = randn([M, N], 'f32');
        const prod = ref(() => nt.matmul(g.to('f32'), x.to('f32'), { transA: true }));
        const want = ref(() => nt.add(prod, c0)), wantB = ref(() => nt.sum(g.to('f32'), 0));
        const gd = g.to(DEV), xd = x.to(DEV);
        const c = nt.zeros([M, N], { dtype, device: DEV }), bias = nt.zeros([M], { dtype, device: DEV });
        gemmEpilogue({ a: gd, b: xd, c, dtype, M, N, K, transA: true, bias, epilogue: 4 });
        compare(`gemm_epilogue bgrad ${dtype} ${M}x${N}x${K} C`, dtype, c, prod, TOL[dtype] * 2);
        compare(`gemm_epilogue bgrad ${dtype} ${M}x${N}x${K} bias`, dtype, bias, wantB, TOL[dtype] * 2);
        if (dtype !== 'f32') {
          const c32 = c0.to(DEV), b32 = nt.zeros([M], { device: DEV });
          gemmEpilogue({ a: gd, b: xd, c: c32, dtype, M, N, K, transA: true, beta: 1, bias: b32, epilogue: 4, cDtype: 'f32' });
          compare(`gemm_epilogue bgrad ${dtype}->f32 beta 1 ${M}x${N}x${K} C`, 'f32', c32, want, 1e-3);
          compare(`gemm_epilogue bgrad ${dtype}->f32 ${M}x${N}x${K} bias`, 'f32', b32, wantB, 1e-3);
        }
      });
      await check(`gemm_epilogue dgelu+bgrad ${dtype} ${M}x${N}x${K}`, () => {
        const a = randn([M, K], dtype, 'cpu', 1 / Math.sqrt(K)), b = randn([K, N], dtype), pre = randn([M, N], dtype);
        const dh = ref(() => nt.matmul(a, b)), dPre = nt.zeros([M, N], { dtype }), db = nt.zeros([N], { dtype });
        ref(() => C.bias_gelu_backward(pre.storage, dh.storage, dPre.storage, db.storage, M, N, DT[dtype]));
        const c = nt.zeros([M, N], { dtype, device: DEV }), bias = nt.zeros([N], { dtype, device: DEV });
        gemmEpilogue({ a: a.to(DEV), b: b.to(DEV), c, dtype, M, N, K, bias, epilogue: 5, aux: pre.to(DEV) });
        compare(`gemm_epilogue dgelu+bgrad ${dtype} ${M}x${N}x${K} C`, dtype, c, dPre, TOL[dtype] * 2);
        compare(`gemm_epilogue dgelu+bgrad ${dtype} ${M}x${N}x${K} bias`, dtype, bias, db, TOL[dtype] * 4);
      });
    }
  }
  section('kernels');
  // Flash attention's tensor-core kernels (bf16/f16 at head dims 64/128) and its SIMT kernels
  // (NODETRON_FLASH_SIMT=1, read on every call), each against cpu, forward and the packed qkv gradient.
  for (const dtype of ['bf16', 'f16']) {
    for (const hd of [64, 128]) {
      await check(`flash attention tensor cores and SIMT ${dtype} [2,${T},3x${H}x${hd}] window ${big(200, 7)}`, () => {
        const x = randn([2, T, 3 * H * hd], dtype), gy = randn([2, T, H * hd], dtype);
        // NODETRON_FLASH_SIMT is read on every call: set for the SIMT pass, then put back as it was (a
        // step run with the @simt variant has it set for every check).
        const go = (device, simt) => {
          const before = process.env.NODETRON_FLASH_SIMT;
          process.env.NODETRON_FLASH_SIMT = simt ? '1' : '0';
          try {
            const d = fresh(x, device);
            d.requiresGrad = true;
            const y = nt.attentionPacked(d, H, { causal: true, window: big(200, 7) });
            nt.sum(nt.mul(y, gy.to(device))).backward();
            return { y, g: d.grad };
          } finally {
            if (before === undefined) delete process.env.NODETRON_FLASH_SIMT;
            else process.env.NODETRON_FLASH_SIMT = before;
          }
        };
        const want = ref(() => go('cpu', false));
        for (const [path, got] of [['tensor cores', go(DEV, false)], ['SIMT', go(DEV, true)]]) {
          compare(`flash attention ${path} ${dtype} D=${hd} forward`, dtype, got.y, want.y);
          compare(`flash attention ${path} ${dtype} D=${hd} dqkv`, dtype, got.g, want.g, TOL[dtype] * 4);
        }
      });
    }
  }
  for (const dtype of ['f32', 'bf16']) {
    await check(`cross_entropy_shard_backward ${dtype} [${R},${big(25152, 500)}]`, () => {
      const [rows, vocab] = [R, big(25152, 500)];
      const logits = randn([rows, vocab], dtype, 'cpu', 2);
      const targets = nt.tensor(Int32Array.from({ length: rows }, (_, i) => (i % 5 === 0 ? -100 : (i * 31) % (2 * vocab) - (i % 3 ? 0 : vocab))), [rows]);
      const lse = nt.add(randn([rows], 'f32', 'cpu', 0.1), 9), gl = randn([rows], 'f32');
      const outC = nt.zeros([rows, vocab], { dtype }), outG = nt.zeros([rows, vocab], { dtype, device: DEV });
      ref(() => C.cross_entropy_shard_backward(logits.storage, targets.storage, lse.storage, gl.storage, outC.storage, rows, vocab, -100, 0.5, DT[dtype]));
      const [l2, t2, s2, g2] = [logits, targets, lse, gl].map((t) => t.to(DEV));
      G.cross_entropy_shard_backward(l2.storage, t2.storage, s2.storage, g2.storage, outG.storage, rows, vocab, -100, 0.5, DT[dtype]);
      compare(`cross_entropy_shard_backward ${dtype}`, dtype, outG, outC);
    });
  }
  // ---- optimizers (multi-tensor kernels), clipping, GradScaler -------------------------------------
  section('optim');
  for (const Opt of ['AdamW', 'Lamb', 'SGD']) {
    for (const pdtype of ['f32', 'bf16']) {
      await check(`${Opt} ${pdtype} params, 3 steps, clipGradNorm`, () => {
        const sizes = [1, 1000, 70001, big((1 << 22) + 1, 5003)];
        const init = sizes.map((n) => randn([n], pdtype));
        const gradsPerStep = [0, 1, 2].map(() => sizes.map((n) => randn([n], pdtype)));
        const go = (device) => {
          const ps = init.map((t) => new nt.nn.Parameter(fresh(t, device)));
          const opt = Opt === 'AdamW' ? new nt.optim.AdamW(ps, { lr: 1e-3, weightDecay: 0.1 })
            : Opt === 'Lamb' ? new nt.optim.Lamb(ps, { lr: 1e-3, weightDecay: 0.1 }) : new nt.optim.SGD(ps, { lr: 1e-2, momentum: 0.9, nesterov: true });
          const norms = [];
          for (const gs of gradsPerStep) {
            ps.forEach((p, i) => { p.grad = fresh(gs[i], device); });
            norms.push(nt.optim.clipGradNorm(ps, 50));
            opt.step();
          }
          return { ps, norms };
        };
        const want = ref(() => go('cpu')), got = go(DEV);
        compare(`${Opt} ${pdtype} grad norms`, 'f32', got.norms, want.norms, 1e-4);
        got.ps.forEach((p, i) => compare(`${Opt} ${pdtype} param ${i} (n=${sizes[i]})`, pdtype, p, want.ps[i], pdtype === 'f32' ? 1e-5 : 1e-2));
      });
    }
  }
  section('amp');
  await check('AMP: autocast bf16/f16 linear + GradScaler f16 steps', () => {
    for (const dtype of ['bf16', 'f16']) {
      const x = randn([R, D], 'f32', 'cpu', 1), w = randn([D, D], 'f32', 'cpu', 1 / Math.sqrt(D));
      const on = (device) => nt.autocast({ dtype }, () => nt.linear(x.to(device), w.to(device)));
      const yg = on(DEV), yc = ref(() => on('cpu'));
      rec.info(`autocast ${dtype} linear output dtype (device / cpu)`, `${yg.dtype} / ${yc.dtype}`);
      compare(`autocast ${dtype} linear`, dtype, yg, yc);
    }
    const cfg = { vocabSize: 64, blockSize: 32, nLayer: 2, nHead: 4, nEmbd: 64, dropout: 0, bias: true };
    const ids = (k) => nt.tensor(Int32Array.from({ length: 128 }, (_, i) => (i * 7 + k * 13 + ((i * i) % 5)) % 64), [4, 32]);
    // Keyed ref/dev, not by device name: in the dry run both are 'cpu'.
    const result = {};
    const runOn = (device) => {
      const model = new nt.nn.GPT(cfg, { seed: 1, device });
      const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-3 });
      const scaler = new nt.GradScaler({ initScale: 2 ** 16, growthInterval: 2 });
      const x = ids(1).to(device), y = ids(2).to(device), losses = [], scales = [];
      for (let s = 0; s < 4; s++) {
        nt.scope(() => {
          const { loss } = nt.autocast({ dtype: 'f16' }, () => model.forward(x, y));
          nt.scale(loss, scaler.scale).backward();
          losses.push(loss.item());
          scaler.step(model.parameters().map((p) => p.grad), () => opt.step());
          scaler.update();
          scales.push(scaler.scale);
          opt.zeroGrad();
        });
      }
      opt.dispose(); model.dispose();
      return { losses, scales };
    };
    result.ref = ref(() => runOn('cpu'));
    result.dev = runOn(DEV);
    compare('GradScaler f16 GPT losses', 'f32', result.dev.losses, result.ref.losses, 2e-2);
    rec.check({ name: 'GradScaler scales agree', ok: JSON.stringify(result.dev.scales) === JSON.stringify(result.ref.scales), error: JSON.stringify(result) });
  });
  section('gpt');
  await check('GPT step (f32) losses and grad norms on device = cpu', () => {
    const cfg = { vocabSize: 64, blockSize: 32, nLayer: 2, nHead: 4, nEmbd: 64, dropout: 0, bias: true };
    const ids = (k) => nt.tensor(Int32Array.from({ length: 128 }, (_, i) => (i * 7 + k * 13 + ((i * i) % 5)) % 64), [4, 32]);
    const runOn = (device) => {
      const model = new nt.nn.GPT(cfg, { seed: 1, device });
      const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-3 });
      const x = ids(1).to(device), y = ids(2).to(device);
      const r = [0, 1, 2].map(() => nt.trainStep(model, opt, x, y, { maxGradNorm: 1 })).flatMap((o) => [o.loss, o.gradNorm]);
      opt.dispose(); model.dispose();
      return r;
    };
    const want = ref(() => runOn('cpu'));
    compare('GPT step losses, grad norms', 'f32', runOn(DEV), want, 1e-3);
  });

  // ---- streams, events, the allocator on real streams -----------------------------------------------
  // (dry run: the cpu stand-ins of dry.mjs, under which every wait is a no-op; the checks' arithmetic,
  // the allocator's counters and the API calls run.)
  section('streams');
  await check('streams/events: ordering, query, timing', () => {
    const s1 = S.newStream(), s2 = S.newStream();
    const n = big(4096, 256);
    const x = randn([n, n], 'f32', DEV, 1 / Math.sqrt(n));
    let y;
    const done = new S.Event(0);
    S.withStream(s1, () => { for (let i = 0; i < 4; i++) y = nt.matmul(x, x); done.record(s1); });
    s2.waitEvent(done);
    const z = S.withStream(s2, () => nt.scale(y, 2));
    s2.synchronize();
    rec.check({ name: 'event completed after s2 waited on it', ok: done.query() && s1.query() && s2.query() });
    compare('stream-ordered result (s2 after s1)', 'f32', z, nt.scale(y, 2), 0);
    const a = new S.Event(0, { timing: true }), b = new S.Event(0, { timing: true });
    a.record(); nt.matmul(x, x); b.record(); b.synchronize();
    const ms = a.elapsedMs(b);
    rec.check({ name: 'event timing positive', ok: ms > 0 && ms < 10_000, maxRelErr: ms });
    a.destroy(); b.destroy(); done.destroy(); s1.destroy(); s2.destroy();
  });
  section('allocator');
  await check('allocator on real streams: reuse, cross-stream free, stats, emptyCache', () => {
    S.synchronize();
    nt.emptyCache(DEV);
    const base = nt.memoryStats(DEV);
    const s = S.newStream();
    const U = big(1 << 20, 1 << 16);
    const made = S.withStream(s, () => Array.from({ length: 8 }, (_, i) => nt.zeros([(i + 1) * U], { device: DEV })));
    const mid = nt.memoryStats(DEV);
    rec.check({ name: `allocated grew by the tensors (36 x ${U} f32)`, ok: mid.allocated - base.allocated >= 36 * 4 * U, error: JSON.stringify({ base, mid }) });
    // The allocator's contract (PyTorch's): a tensor made on s and used on another stream needs that
    // stream to wait for s before it reads, and recordStream before it is freed, so that s does not
    // reuse the block while the other stream's work is still queued.
    const main = S.currentStream();
    main.waitStream(s);
    // Every tensor made from here on lives in an inner scope or is disposed by hand: the check's own
    // scope holds until it returns, so a temporary left there (the nt.add results are 36 x U f32) would
    // still be allocated when the baseline is compared below.
    const sums = nt.scope(() => made.map((t) => nt.sum(nt.add(t, 1))));
    made.forEach((t) => { S.recordStream(t, main); t.dispose(); });
    const again = S.withStream(s, () => nt.full([8 * U], 2, { device: DEV }));
    main.waitStream(s);
    nt.scope(() => {
      compare('sums of freed cross-stream tensors', 'f32', sums.map((t) => t.item()), made.map((_, i) => (i + 1) * U), 0);
      compare('reused block holds new data', 'f32', [nt.sum(again).item()], [16 * U], 0);
    });
    again.dispose(); sums.forEach((t) => t.dispose());
    S.synchronize();
    nt.emptyCache(DEV);
    const end = nt.memoryStats(DEV);
    rec.check({ name: 'memory returns to the baseline; emptyCache releases', ok: end.allocated <= base.allocated && end.reserved <= mid.reserved, error: JSON.stringify({ base, mid, end }) });
    s.destroy();
  });
  section('oom');
  await check('OOM: typed error, process usable after', () => {
    // The dry run puts a host memory limit (NODETRON_MEMORY_LIMIT's setting) of 1 GiB above what is
    // allocated, in place of the device's memory, and fills it in 64 MiB tensors instead of 256 MiB.
    const chunk = big(1 << 28, 1 << 26);
    const total = DRY ? nt.memoryStats('cpu').allocated + (1 << 30) : G.deviceInfo()[0].totalMemory;
    if (DRY) C.setHostMemoryLimit(total);
    try {
      let e1;
      try { new G.Storage(total * 2, false, 0); } catch (e) { e1 = e; }
      rec.check({ name: 'one allocation of 2x device memory: OutOfMemoryError', ok: e1 instanceof nt.OutOfMemoryError, error: String(e1) });
      const held = [];
      let e2;
      try { for (let i = 0; i < 4096; i++) held.push(nt.zeros([chunk], { dtype: 'u8', device: DEV })); } catch (e) { e2 = e; }
      rec.check({ name: `exhausting memory in ${chunk >> 20} MiB tensors: OutOfMemoryError after ${held.length}`, ok: e2 instanceof nt.OutOfMemoryError, error: String(e2) });
      held.forEach((t) => t.dispose());
    } finally {
      if (DRY) C.setHostMemoryLimit(0);
    }
    nt.emptyCache(DEV);
    const x = randn([513, 257], 'f32');
    compare('an op after OOM', 'f32', nt.gelu(x.to(DEV)), ref(() => nt.gelu(x)), 1e-5);
  });

  // ---- NCCL: one rank (one GPU cannot host two NCCL ranks); multi-rank algorithms are checked on cpu ---
  // (dry run: the raw NcclComm block has no cpu equivalent and is left out; the ProcessGroup block runs
  // over Gloo on one rank, less the check that a cpu tensor is refused, which Gloo takes.)
  section('nccl');
  const expectThrow = (name, cls, fn) => { let e; try { fn(); } catch (err) { e = err; } rec.check({ name, ok: e instanceof cls, error: e instanceof cls ? undefined : `expected ${cls.name}, got ${e}` }); };
  if (!DRY) await check('NCCL raw NcclComm (1 rank): allReduce and typed errors', () => {
    const comm = new G.NcclComm(G.ncclUniqueId(), 0, 1, 0);
    const deadline = Date.now() + 20_000;
    while (comm.asyncError() === 'inProgress' && Date.now() < deadline);
    const n = 1 << 16, x = randn([n], 'f32', DEV), y = nt.zeros([n], { device: DEV });
    const ev = comm.allReduce(x.storage, 0, y.storage, 0, n, 0, 0);
    comm.synchronize(ev, 20_000);
    G.eventDestroy(ev);
    compare('nccl raw allReduce', 'f32', y, x, 0);
    expectThrow('nccl raw: count past the buffer', nt.NodetronError, () => comm.allReduce(x.storage, 0, y.storage, 0, n + 1, 0, 0));
    expectThrow('nccl raw: unknown reduce op', nt.ArgumentError, () => comm.allReduce(x.storage, 0, y.storage, 0, 16, 0, 9));
    expectThrow('nccl raw: cpu storage', nt.NodetronError, () => comm.allReduce(nt.zeros([16]).storage, 0, y.storage, 0, 16, 0, 0));
    comm.destroy();
    expectThrow('nccl raw: op after destroy', nt.CommError, () => comm.allReduce(x.storage, 0, y.storage, 0, 16, 0, 0));
  });
  const backend = DRY ? 'gloo' : 'nccl';
  await check(`${backend} ProcessGroup (1 rank): every collective, every dtype and op`, async () => {
    const { world } = await nt.distributed.init({ backend, timeoutMs: 20_000, env: nt.distributed.readLaunchEnv({}) });
    try {
      const n = 4099;
      for (const dtype of ['f32', 'bf16', 'f16', 'i32', 'u8']) {
        const src = dtype === 'i32' || dtype === 'u8' ? nt.scale(nt.rand([n], { seed: 4 }), 60).to(dtype).to(DEV) : randn([n], dtype, DEV);
        const want = src.clone();
        for (const op of ['sum', 'avg', 'max', 'min', 'prod']) {
          const x = src.clone(), out = nt.zeros([n], { dtype, device: DEV });
          await world.allReduce(x, { op, out });
          compare(`${backend} allReduce ${op} ${dtype} out-of-place`, dtype, out, want, 0);
          world.allReduce(x, { op }).waitSync();
          compare(`${backend} allReduce ${op} ${dtype} in-place`, dtype, x, want, 0);
        }
        const b = src.clone(); await world.broadcast(b); compare(`${backend} broadcast ${dtype}`, dtype, b, want, 0);
        const r = src.clone(); await world.reduce(r, { op: 'sum' }); compare(`${backend} reduce ${dtype}`, dtype, r, want, 0);
        const g = nt.zeros([n], { dtype, device: DEV }); await world.allGather(g, src); compare(`${backend} allGather ${dtype}`, dtype, g, want, 0);
        const gl = [nt.zeros([n], { dtype, device: DEV })]; await world.allGather(gl, src); compare(`${backend} allGather list ${dtype}`, dtype, gl[0], want, 0);
        const rs = nt.zeros([n], { dtype, device: DEV }); await world.reduceScatter(rs, src); compare(`${backend} reduceScatter ${dtype}`, dtype, rs, want, 0);
        const a2a = nt.zeros([n], { dtype, device: DEV }); await world.allToAll(a2a, src); compare(`${backend} allToAll ${dtype}`, dtype, a2a, want, 0);
      }
      await world.barrier();
      const a = randn([1000], 'f32', DEV), c = randn([777], 'bf16', DEV), wa = a.clone(), wc = c.clone();
      await Promise.all(world.batch(() => [world.allReduce(a), world.allReduce(c, { op: 'max' })]));
      compare(`${backend} batch allReduce f32 (then compute)`, 'f32', nt.scale(a, 2), nt.scale(wa, 2), 0);
      compare(`${backend} batch allReduce bf16`, 'bf16', c, wc, 0);
      if (!DRY) expectThrow(`${backend} group: cpu tensor`, nt.ArgumentError, () => world.allReduce(nt.zeros([4])));
      const d = nt.zeros([4], { device: DEV }); d.dispose();
      expectThrow(`${backend} group: disposed tensor`, nt.DisposedError, () => world.allReduce(d));
      expectThrow(`${backend} group: wrong out size`, nt.ShapeError, () => world.allReduce(nt.zeros([4], { device: DEV }), { out: nt.zeros([5], { device: DEV }) }));
      expectThrow(`${backend} group: wrong out dtype`, nt.DTypeError, () => world.allReduce(nt.zeros([4], { device: DEV }), { out: nt.zeros([4], { dtype: 'bf16', device: DEV }) }));
      const after = randn([333], 'f32', DEV), wAfter = after.clone();
      await world.allReduce(after);
      compare(`${backend} allReduce after errors`, 'f32', after, wAfter, 0);
      await nt.distributed.destroy();
      expectThrow(`${backend} group: op after destroy`, nt.StateError, () => world.allReduce(after));
    } finally {
      if (nt.distributed.isInitialized?.()) await nt.distributed.destroy();
    }
  });

  // ---- coverage: the kernels this step called; run.mjs unites every step's and checks that each
  // kernel of the interface ran at least once (cuda only: the dry run's one cpu addon also runs the
  // references).
  const skipNames = new Set(['Storage', 'setErrorFactory', 'memoryStats', 'resetPeakMemory', 'emptyCache', 'noop', 'read', 'write', 'copy']);
  if (!DRY) {
    rec.info('interfaceKernels', BACKEND_KERNELS.filter((k) => !skipNames.has(k)));
    rec.info('kernelCalls', Object.fromEntries(calls));
    if (!ctx.sections) {
      const missed = BACKEND_KERNELS.filter((k) => !skipNames.has(k) && !calls.has(k));
      rec.check({ name: `every interface kernel called on cuda (${calls.size} seen)`, ok: missed.length === 0, error: missed.length ? `never called: ${missed.join(', ')}` : undefined });
    }
  }
  rec.info('cpuSideMs', Math.round(cpuTotalMs));
  rec.info('cpuSideCpuMs', Math.round(cpuTotalUs / 1e3));

  // ---- compute-sanitizer on a small subset ----------------------------------------------------------
  // (dry run: no compute-sanitizer for the cpu; the subset itself runs on the cpu, so its code is checked.)
  section('sanitizer');
  if (!on()) return;
  const subset = join(root, 'scripts', 'gpu', 'stages', 'sanitize-subset.mjs');
  if (DRY) {
    const t0 = Date.now();
    const r = spawnSync(process.execPath, [subset], { encoding: 'utf8', timeout: 120_000, cwd: root, env: { ...process.env, NODETRON_GPU_RUN_DRY: '1' } });
    rec.check({ name: 'sanitizer subset runs (dry: on the cpu, without compute-sanitizer)', ok: r.status === 0 && /subset done/.test(r.stdout), error: r.status === 0 ? undefined : `exit ${r.status}: ${(r.stdout + r.stderr).slice(-1500)}`, wallS: (Date.now() - t0) / 1000 });
    return;
  }
  const cs = ['compute-sanitizer', '/usr/local/cuda/bin/compute-sanitizer', ...(process.env.CUDA_HOME ? [join(process.env.CUDA_HOME, 'bin', 'compute-sanitizer')] : [])]
    .find((p) => spawnSync(p, ['--version'], { stdio: 'ignore' }).status === 0);
  if (!cs) { rec.info('computeSanitizer', 'not found: skipped'); return; }
  for (const tool of ['memcheck', 'racecheck']) {
    const t0 = Date.now();
    const r = spawnSync(cs, ['--tool', tool, '--error-exitcode', '9', '--target-processes', 'all', process.execPath, subset],
      { encoding: 'utf8', timeout: 70_000, cwd: root, maxBuffer: 64 << 20 });
    const summary = (r.stdout + r.stderr).match(/ERROR SUMMARY: \d+ errors?/)?.[0];
    rec.check({ name: `compute-sanitizer ${tool} on the subset`, ok: r.status === 0 && /ERROR SUMMARY: 0 errors/.test(r.stdout + r.stderr), error: r.status === 0 ? summary : `exit ${r.status}${r.error ? ' ' + r.error : ''}: ${(r.stdout + r.stderr).slice(-1500)}`, wallS: (Date.now() - t0) / 1000 });
  }
}
