// Flash attention (nt.attention / nt.attentionPacked) against the materializing path it replaced
// (per-(batch, head) GEMMs around the T×T softmax), forward + backward on the cpu backend, same run.
//   npx tsx scripts/bench/flash-attention.ts
import * as nt from '../../lib/index.js';
import { attentionMaterialized } from '../../lib/ops/attention.js';

function time(fn: () => void, iters: number): number {
  fn();
  const t0 = performance.now();
  for (let i = 0; i < iters; i++) fn();
  return (performance.now() - t0) / iters;
}

const shapes: [number, number, number, number][] = [[8, 4, 128, 32], [4, 12, 256, 64], [1, 12, 1024, 64]];
for (const [B, H, T, D] of shapes) {
  const q = nt.randn([B, H, T, D], { seed: 1 }), k = nt.randn([B, H, T, D], { seed: 2 }), v = nt.randn([B, H, T, D], { seed: 3 });
  for (const t of [q, k, v]) t.requiresGrad = true;
  const fwdBwd = (f: () => nt.Tensor) => () => nt.scope(() => { nt.sum(f()).backward(); for (const t of [q, k, v]) { t.grad?.dispose(); t.grad = null; } });
  const iters = T >= 1024 ? 3 : 10;
  const flash = fwdBwd(() => nt.attention(q, k, v, { causal: true }));
  const mat = fwdBwd(() => attentionMaterialized(q, k, v, { causal: true, window: 0, scale: 1 / Math.sqrt(D) }));
  const r: number[][] = [[], []];
  for (let rep = 0; rep < 3; rep++) { r[0]!.push(time(flash, iters)); r[1]!.push(time(mat, iters)); }
  const best = (a: number[]) => Math.min(...a).toFixed(2);
  console.log(`attention fwd+bwd [${B},${H},${T},${D}] causal: flash ${best(r[0]!)} ms, materializing ${best(r[1]!)} ms`);
}
