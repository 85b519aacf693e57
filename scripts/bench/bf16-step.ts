// npx tsx scripts/bench/bf16-step.ts: f32 vs bf16-autocast training step of the `small` bench GPT (L6 C384 T256 B4, V 50257), alternating rounds.
import * as nt from '../../lib/index.js';
const cfg = { vocabSize: 50257, blockSize: 256, nLayer: 6, nHead: 6, nEmbd: 384, dropout: 0, bias: true };
const B = 4, T = 256;
const model = new nt.nn.GPT(cfg, { seed: 1 });
const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-4, betas: [0.9, 0.95], weightDecay: 0.1 });
const ids = (k: number) => nt.tensor(Int32Array.from({ length: B * T }, (_, i) => ((i + k) * 2654435761 >>> 0) % cfg.vocabSize), [B, T]);
const x = ids(0), y = ids(1);
const f32 = () => nt.trainStep(model, opt, x, y);
const bf16 = () => nt.autocast({ dtype: 'bf16' }, () => nt.trainStep(model, opt, x, y));
for (const f of [f32, bf16, f32, bf16]) f();
const t: Record<string, number[]> = { f32: [], bf16: [] };
for (let r = 0; r < 6; r++) for (const [name, f] of [['f32', f32], ['bf16', bf16]] as const) {
  const t0 = performance.now(); f(); t[name]!.push(performance.now() - t0);
}
const med = (a: number[]) => [...a].sort((p, q) => p - q)[a.length >> 1]!;
console.log(JSON.stringify({ f32: t.f32!.map(Math.round), bf16: t.bf16!.map(Math.round), medianF32: med(t.f32!), medianBf16: med(t.bf16!), ratio: med(t.f32!) / med(t.bf16!) }));
