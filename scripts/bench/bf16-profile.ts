// npx tsx scripts/bench/bf16-profile.ts [steps] [--cpu-time]: per-kernel time of the `small` bench GPT's
// training step (L6 C384 T256 B4, V 50257) in f32 and under bf16 autocast: every kernel of the cpu addon
// is wrapped with a timer, keyed by kernel and dtype (gemm: also by shape and transposes), best step of
// `steps` (default 3). --cpu-time: one kernel thread and one OpenBLAS thread, timed by the process's
// CPU time instead of the wall clock (what stays meaningful on a machine other processes load).
import * as nt from '../../lib/index.js';
import { dtypeCode } from '../../lib/dtype.js';
import { BACKEND_KERNELS, cpu } from '../../lib/native.js';
const DT: Record<number, string> = {};
for (const d of ['f32', 'bf16', 'f16', 'i32', 'u8'] as const) { DT[dtypeCode(d)] = d; }
const addon = cpu() as unknown as Record<string, (...a: unknown[]) => unknown>;
const cpuTime = process.argv.includes('--cpu-time');
if (cpuTime) { addon.setKernelThreads!(1); addon.setBlasThreads!(1); }
const now = cpuTime ? () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; } : () => performance.now();
let acc: Map<string, number> = new Map();
// gemm (dtype at index 3, optional outDtype at 15) and cast are keyed explicitly; other kernels by their
// last small integer argument, which is their dtype code for most of them (a rough label, for reading).
for (const name of BACKEND_KERNELS) {
  const f = addon[name];
  if (typeof f !== 'function' || name === 'Storage' || name === 'setErrorFactory') continue;
  addon[name] = (...a: unknown[]) => {
    const t0 = now();
    try { return f.apply(addon, a); } finally {
      let key = name;
      if (name === 'gemm') key += ` ${DT[a[3] as number]}${a.length > 15 ? `->${DT[a[15] as number]}` : ''} ${a[5]}x${a[6]}x${a[7]}${(a[4] as number) > 1 ? ` b${a[4]}` : ''} ${a[8] ? 'T' : 'N'}${a[9] ? 'T' : 'N'}`;
      else if (name === 'cast') key += ` ${DT[a[1] as number]}->${DT[a[3] as number]}`;
      else { const d = [...a].reverse().find((x) => typeof x === 'number' && x >= 0 && x < 8 && Number.isInteger(x)); if (d !== undefined && DT[d as number]) key += ` ${DT[d as number]}`; }
      acc.set(key, (acc.get(key) ?? 0) + now() - t0);
    }
  };
}
const steps = Number(process.argv.slice(2).find((a) => !a.startsWith('--')) ?? 3);
const cfg = { vocabSize: 50257, blockSize: 256, nLayer: 6, nHead: 6, nEmbd: 384, dropout: 0, bias: true };
const B = 4, T = 256;
const model = new nt.nn.GPT(cfg, { seed: 1 });
const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
const ids = (k: number) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => ((i + k) * 2654435761 >>> 0) % cfg.vocabSize), [B, T]);
const x = ids(0), y = ids(1);
const modes = { f32: () => nt.trainStep(model, opt, x, y), bf16: () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, y)) };
for (const [mode, f] of Object.entries(modes)) {
  f();
  let best: { total: number; per: Map<string, number> } | undefined;
  for (let s = 0; s < steps; s++) {
    acc = new Map();
    const t0 = now(); f(); const total = now() - t0;
    if (!best || total < best.total) best = { total, per: acc };
  }
  const rows = [...best!.per.entries()].sort((p, q) => q[1] - p[1]);
  const inKernels = rows.reduce((s, r) => s + r[1], 0);
  console.log(`\n${mode}${cpuTime ? ' (1 thread, CPU time)' : ''}: step ${best!.total.toFixed(0)} ms, in kernels ${inKernels.toFixed(0)} ms, outside ${(best!.total - inKernels).toFixed(0)} ms`);
  for (const [k, v] of rows.slice(0, 30)) console.log(`${v.toFixed(1).padStart(8)} ms  ${k}`);
}
