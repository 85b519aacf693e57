// npx tsx scripts/bench/step-profile.ts [--config tiny|small] [--modes f32,bf16] [--steps N] [--cpu-time] [--json FILE]
//
// Where one training step of a bench GPT (`nodetron bench train`'s tiny or small config) spends its time,
// beside the FLOPs each part does: every kernel of the cpu addon is wrapped with a timer, keyed by
// kernel and dtype (GEMMs also by shape and transposes, with their FLOPs, GFLOP/s and share of the FMA
// peak), best step of N (default 3). The summary splits the step into GEMM time, the time the same GEMMs
// would take at the FMA peak, other kernels, and time outside kernels (JavaScript: autograd, allocation,
// dispatch): what stands between the step and the peak.
//
// --cpu-time: one kernel thread and one OpenBLAS thread, timed by the process's CPU time instead of the
// wall clock, against one thread's FMA peak: what stays meaningful on a machine other processes load.
// Without it: all kernel threads, wall clock, against the all-thread peak (meaningful on a quiet machine).
import { writeFileSync } from 'node:fs';
import * as nt from '../../lib/index.js';
import { dtypeCode } from '../../lib/dtype.js';
import { BACKEND_KERNELS, cpu } from '../../lib/native.js';
import { measureFmaPeak } from '../../lib/bench/gemm.js';
import { gptConfigOf, selectConfigs } from '../../lib/bench/configs.js';
import { stepFlops } from '../../lib/bench/train.js';

const args = process.argv.slice(2);
const opt = (name: string, dflt: string): string => { const i = args.indexOf(`--${name}`); return i >= 0 && args[i + 1] ? args[i + 1]! : dflt; };
const cpuTime = args.includes('--cpu-time');
const steps = Number(opt('steps', '3'));
const modesWanted = opt('modes', 'f32,bf16').split(',');
const json = opt('json', '');
if (!Number.isInteger(steps) || steps < 1) throw new Error(`--steps must be a positive integer (got ${opt('steps', '')})`);
for (const m of modesWanted) if (m !== 'f32' && m !== 'bf16') throw new Error(`--modes: unknown mode ${m} (f32, bf16)`);
const [bench] = selectConfigs(opt('config', 'small'));

const DT: Record<number, string> = {};
for (const d of ['f32', 'bf16', 'f16', 'i32', 'u8'] as const) DT[dtypeCode(d)] = d;
const addon = cpu() as unknown as Record<string, (...a: unknown[]) => unknown>;
if (cpuTime) { addon.setKernelThreads!(1); addon.setBlasThreads!(1); }
const now = cpuTime ? () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; } : () => performance.now();

interface Acc { ms: number; calls: number; flops: number }
let acc = new Map<string, Acc>();
// gemm (dtype at index 3, batch at 4, m n k at 5-7, transposes at 8-9, optional outDtype at 15) and
// cast are keyed explicitly; other kernels by their last small integer argument, which is their dtype
// code for most of them (a rough label, for reading).
for (const name of BACKEND_KERNELS) {
  const f = addon[name];
  if (typeof f !== 'function' || name === 'Storage' || name === 'setErrorFactory') continue;
  addon[name] = (...a: unknown[]) => {
    const t0 = now();
    try { return f.apply(addon, a); } finally {
      const ms = now() - t0;
      let key = name, flops = 0;
      if (name === 'gemm') {
        const batch = Math.max(1, a[4] as number), m = a[5] as number, n = a[6] as number, k = a[7] as number;
        flops = 2 * batch * m * n * k;
        key += ` ${DT[a[3] as number]}${a.length > 15 ? `->${DT[a[15] as number]}` : ''} ${m}x${n}x${k}${batch > 1 ? ` b${batch}` : ''} ${a[8] ? 'T' : 'N'}${a[9] ? 'T' : 'N'}`;
      } else if (name === 'cast') key += ` ${DT[a[1] as number]}->${DT[a[3] as number]}`;
      else { const d = [...a].reverse().find((x) => typeof x === 'number' && x >= 0 && x < 8 && Number.isInteger(x)); if (d !== undefined && DT[d as number]) key += ` ${DT[d as number]}`; }
      const e = acc.get(key) ?? { ms: 0, calls: 0, flops: 0 };
      e.ms += ms; e.calls += 1; e.flops += flops;
      acc.set(key, e);
    }
  };
}

const peak = measureFmaPeak('auto', 0.6);
const peakGflops = cpuTime ? peak.gflopsOneThreadCpuTime : peak.gflops;
const cfg = gptConfigOf(bench!);
const B = bench!.batch, T = bench!.ctx;
const model = new nt.nn.GPT(cfg, { seed: 1 });
const optim = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
const ids = (k: number) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => ((i + k) * 2654435761 >>> 0) % cfg.vocabSize), [B, T]);
const x = ids(0), y = ids(1);
const modes: Record<string, () => unknown> = {
  f32: () => nt.trainStep(model, optim, x, y),
  bf16: () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, optim, x, y)),
};
const modelFlops = stepFlops(bench!);
const results: Record<string, unknown> = {};
console.log(`# ${bench!.name}: L${bench!.layers} C${bench!.width} T${T} B${B} V${bench!.vocab}; model FLOPs per step ${(modelFlops / 1e9).toFixed(2)} GFLOP`);
console.log(`# FMA peak measured in this run: ${peakGflops.toFixed(1)} GFLOP/s (${cpuTime ? 'one thread, per second of its CPU time' : `${peak.threads} threads, wall clock; load lowers it`}, ${peak.isa})`);
console.log(`# ${cpuTime ? 'one kernel thread, process CPU time' : 'all kernel threads, wall clock'}; best step of ${steps}; load average ${(await import('node:os')).loadavg().map((l) => l.toFixed(1)).join(' ')}`);
for (const mode of modesWanted) {
  const f = modes[mode]!;
  f();
  let best: { total: number; per: Map<string, Acc> } | undefined;
  for (let s = 0; s < steps; s++) {
    acc = new Map();
    const t0 = now(); f(); const total = now() - t0;
    if (!best || total < best.total) best = { total, per: acc };
  }
  const rows = [...best!.per.entries()].sort((p, q) => q[1].ms - p[1].ms);
  const inKernels = rows.reduce((s, r) => s + r[1].ms, 0);
  const gemms = rows.filter(([k]) => k.startsWith('gemm '));
  const gemmMs = gemms.reduce((s, r) => s + r[1].ms, 0);
  const gemmFlops = gemms.reduce((s, r) => s + r[1].flops, 0);
  // bf16 GEMMs on the AVX512_BF16 kernel do twice the f32 FMA's work per instruction.
  const gemmPeakMs = gemms.reduce((s, [k, r]) => s + (r.flops / 1e9) / (peakGflops * (k.startsWith('gemm bf16') ? 2 : 1)) * 1e3, 0);
  const outside = best!.total - inKernels;
  const stepAtPeakMs = (modelFlops / 1e9) / peakGflops * 1e3;
  console.log(`\n## ${mode}: step ${best!.total.toFixed(0)} ms = ${(100 * stepAtPeakMs / best!.total).toFixed(1)}% of the f32 FMA peak (model FLOPs at that peak: ${stepAtPeakMs.toFixed(0)} ms${mode === 'bf16' ? '; bf16 GEMMs peak at twice it' : ''})`);
  const summary: [string, number, string][] = [
    ['GEMMs', gemmMs, `${(gemmFlops / 1e9).toFixed(2)} GFLOP at ${(gemmFlops / 1e6 / gemmMs).toFixed(1)} GFLOP/s; ${gemmPeakMs.toFixed(0)} ms at the peak`],
    ['other kernels', inKernels - gemmMs, 'element-wise, norms, attention, softmax and loss, optimizer, casts, copies'],
    ['outside kernels', outside, 'JavaScript: autograd, allocation, dispatch'],
  ];
  for (const [what, ms, note] of summary) console.log(`${ms.toFixed(1).padStart(8)} ms ${(100 * ms / best!.total).toFixed(1).padStart(5)}%  ${what.padEnd(16)} ${note}`);
  console.log(`\n      ms  calls  GFLOP/s  % peak  kernel`);
  for (const [k, r] of rows.slice(0, 30)) {
    const g = r.flops ? r.flops / 1e6 / r.ms : 0;
    const p = r.flops ? (100 * g) / (peakGflops * (k.startsWith('gemm bf16') ? 2 : 1)) : 0;
    console.log(`${r.ms.toFixed(1).padStart(8)} ${String(r.calls).padStart(6)} ${r.flops ? g.toFixed(1).padStart(8) : '       -'} ${r.flops ? p.toFixed(0).padStart(6) + '%' : '      -'}  ${k}`);
  }
  results[mode] = {
    stepMs: best!.total, stepAtPeakMs, peakPercent: (100 * stepAtPeakMs) / best!.total,
    gemmMs, gemmGflop: gemmFlops / 1e9, gemmAtPeakMs: gemmPeakMs, otherKernelsMs: inKernels - gemmMs, outsideKernelsMs: outside,
    kernels: rows.map(([k, r]) => ({ kernel: k, ms: r.ms, calls: r.calls, gflop: r.flops / 1e9 })),
  };
}
if (json) {
  writeFileSync(json, JSON.stringify({ config: bench, cpuTime, steps, fmaPeak: peak, peakGflopsUsed: peakGflops, modelFlopsPerStep: modelFlops,
    loadavg: (await import('node:os')).loadavg(), date: new Date().toISOString(), results }, null, 2) + '\n');
  console.log(`\n# wrote ${json}`);
}
