// Flash attention (nt.attention) against the materializing path it replaced (per-(batch, head) GEMMs
// around the T×T softmax, attentionMaterialized), causal, f32, on the cpu backend, in the same process:
// forward alone and forward + backward, best of 7 rounds of N calls each (the rounds alternate).
//   npx tsx scripts/bench/flash-attention.ts [B,H,T,D ...]   (default: 8,4,128,32 4,12,256,64 1,12,1024,64)
import * as nt from '../../lib/index.js';
import { attentionMaterialized } from '../../lib/ops/attention.js';

const shapes = (process.argv.length > 2 ? process.argv.slice(2) : ['8,4,128,32', '4,12,256,64', '1,12,1024,64'])
  .map((s) => s.split(',').map(Number) as [number, number, number, number]);
const time = (fn: () => void, n: number) => { fn(); const t0 = performance.now(); for (let i = 0; i < n; i++) fn(); return (performance.now() - t0) / n; };
for (const [B, H, T, D] of shapes) {
  const q = nt.randn([B, H, T, D], { seed: 1 }), k = nt.randn([B, H, T, D], { seed: 2 }), v = nt.randn([B, H, T, D], { seed: 3 });
  for (const t of [q, k, v]) t.requiresGrad = true;
  const fwdBwd = (f: () => nt.Tensor) => () => nt.scope(() => { nt.sum(f()).backward(); for (const t of [q, k, v]) { t.grad?.dispose(); t.grad = null; } });
  const fwd = (f: () => nt.Tensor) => () => nt.scope(() => nt.noGrad(() => { f(); }));
  const flash = () => nt.attention(q, k, v, { causal: true });
  const mat = () => attentionMaterialized(q, k, v, { causal: true, window: 0, scale: 1 / Math.sqrt(D) });
  const n = T >= 1024 ? 3 : 20;
  const r = { ff: [] as number[], mf: [] as number[], fb: [] as number[], mb: [] as number[] };
  for (let round = 0; round < 7; round++) {
    r.ff.push(time(fwd(flash), n)); r.mf.push(time(fwd(mat), n));
    r.fb.push(time(fwdBwd(flash), n)); r.mb.push(time(fwdBwd(mat), n));
  }
  const best = (a: number[]) => Math.min(...a).toFixed(2);
  console.log(`[${B},${H},${T},${D}] causal f32 ms: forward flash ${best(r.ff)} materializing ${best(r.mf)} | forward+backward flash ${best(r.fb)} materializing ${best(r.mb)}`);
}
