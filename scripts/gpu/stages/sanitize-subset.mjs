// The small subset stage 1 runs under compute-sanitizer (memcheck, racecheck): one of each kernel
// family at small, odd sizes, forward and backward, and an optimizer step. Exits 0 when it ran.
// NODETRON_GPU_RUN_DRY=1: the same on the cpu (the dry run checks this file's code without a GPU).
const nt = await import('../../../dist/index.js');
const device = process.env.NODETRON_GPU_RUN_DRY ? 'cpu' : 'cuda';
const r = (s, dtype = 'f32') => { const t = nt.randn(s, { seed: s.length + s[0], dtype, device }); t.requiresGrad = true; return t; };
for (const dtype of ['f32', 'bf16']) {
  nt.scope(() => {
    const x = r([37, 96], dtype), w = r([80, 96], dtype), b = r([80], dtype), g = r([80], dtype), lb = r([80], dtype);
    const h = nt.layerNorm(nt.gelu(nt.linear(x, w, b)), g, lb);
    const q = r([1, 2, 33, 40], dtype), att = nt.attention(q, q, q, { causal: true });
    const logits = nt.linear(h, r([1001, 80], dtype));
    const loss = nt.add(nt.crossEntropy(logits, nt.tensor(Int32Array.from({ length: 37 }, (_, i) => (i * 13) % 1001), [37], { device })), nt.mean(nt.softmax(att)));
    // Two-stage reductions: bias+GELU and RMSNorm gradients (column sums), sums over dim 0 (column
    // sums), over a long last dim (several blocks per row, then the partials kernel) and of everything.
    const rn = nt.rmsNorm(nt.linearGelu(x, w, b), g);
    const sums = [nt.sum(r([131, 7], dtype), 0), nt.sum(r([3, 20011], dtype), -1), nt.sum(r([70001], dtype))];
    const total = sums.reduce((acc, s) => nt.add(acc, nt.mean(s)), nt.add(loss, nt.mean(rn)));
    total.backward();
    nt.optim.clipGradNorm([x, w, b, g, lb, q], 1);
    console.log(dtype, loss.item());
  });
}
const ps = [new nt.nn.Parameter(nt.randn([1001], { seed: 1, device }))];
ps[0].grad = nt.randn([1001], { seed: 2, device });
new nt.optim.AdamW(ps, { lr: 1e-3 }).step();
if (device === 'cuda') nt.cuda.synchronize();
console.log('subset done');
