// nt.nn.Llama in one process: its config (camelCase or Hugging Face's snake_case, defaults, typed
// errors), its logits against an independent float64 implementation of LlamaForCausalLM's forward (RMSNorm,
// rotate-half rotary embeddings, grouped-query causal attention, SwiGLU, untied or tied head), the fused
// head's loss against cross-entropy of those logits, training with nt.trainStep, recomputation, a
// replaced MLP, parameter counts, and autocast.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose } from '../helpers/gradcheck.js';

const base: nt.nn.LlamaConfig = {
  vocabSize: 29, hiddenSize: 16, intermediateSize: 24, numHiddenLayers: 2, numAttentionHeads: 4, numKeyValueHeads: 2,
  maxPositionEmbeddings: 12, ropeTheta: 500, rmsNormEps: 1e-5,
};

/** float64 LlamaForCausalLM logits [B·T·V] from the model's parameters (read by name), written from the paper/HF's math. */
function refLogits(m: nt.nn.Llama, ids: number[][]): Float64Array {
  const c = m.config;
  const P = (n: string) => Float64Array.from(m.stateDict()[n]!.toArraySync());
  const C = c.hiddenSize, H = c.numAttentionHeads, KV = c.numKeyValueHeads, D = C / H, F = c.intermediateSize, V = c.vocabSize;
  const lin = (x: Float64Array, w: Float64Array, out: number): Float64Array => {
    const inF = w.length / out, rows = x.length / inF, y = new Float64Array(rows * out);
    for (let r = 0; r < rows; r++) for (let o = 0; o < out; o++) { let s = 0; for (let i = 0; i < inF; i++) s += x[r * inF + i]! * w[o * inF + i]!; y[r * out + o] = s; }
    return y;
  };
  const norm = (x: Float64Array, w: Float64Array) => {
    const y = new Float64Array(x.length);
    for (let r = 0; r < x.length / C; r++) {
      let ms = 0; for (let i = 0; i < C; i++) ms += x[r * C + i]! ** 2;
      const s = 1 / Math.sqrt(ms / C + c.rmsNormEps);
      for (let i = 0; i < C; i++) y[r * C + i] = x[r * C + i]! * s * w[i]!;
    }
    return y;
  };
  const rot = (x: Float64Array, heads: number, T: number) => {
    const y = new Float64Array(x.length), half = D / 2;
    for (let t = 0; t < T; t++) for (let h = 0; h < heads; h++) for (let i = 0; i < half; i++) {
      const a = t * c.ropeTheta ** (-(2 * i) / D), o = (t * heads + h) * D;
      y[o + i] = x[o + i]! * Math.cos(a) - x[o + i + half]! * Math.sin(a);
      y[o + i + half] = x[o + i + half]! * Math.cos(a) + x[o + i]! * Math.sin(a);
    }
    return y;
  };
  const table = P('embedTokens.weight'), head = c.tieWordEmbeddings ? table : P('lmHead.weight');
  const out: number[] = [];
  for (const row of ids) {
    const T = row.length;
    let x = new Float64Array(T * C);
    row.forEach((id, t) => x.set(table.subarray(id * C, (id + 1) * C), t * C));
    for (let l = 0; l < c.numHiddenLayers; l++) {
      const p = (n: string) => P(`layers.${l}.${n}.weight`);
      const h = norm(x, p('inputLayernorm'));
      const q = rot(lin(h, p('selfAttn.qProj'), H * D), H, T), k = rot(lin(h, p('selfAttn.kProj'), KV * D), KV, T), v = lin(h, p('selfAttn.vProj'), KV * D);
      const att = new Float64Array(T * H * D);
      for (let hh = 0; hh < H; hh++) {
        const j = Math.floor(hh / (H / KV));
        for (let i = 0; i < T; i++) {
          const s: number[] = [];
          for (let t = 0; t <= i; t++) { let d = 0; for (let e = 0; e < D; e++) d += q[(i * H + hh) * D + e]! * k[(t * KV + j) * D + e]!; s.push(d / Math.sqrt(D)); }
          const mx = Math.max(...s), ex = s.map((z) => Math.exp(z - mx)), z = ex.reduce((a, b) => a + b);
          for (let e = 0; e < D; e++) { let acc = 0; for (let t = 0; t <= i; t++) acc += (ex[t]! / z) * v[(t * KV + j) * D + e]!; att[(i * H + hh) * D + e] = acc; }
        }
      }
      const o = lin(att, p('selfAttn.oProj'), C);
      x = x.map((u, i) => u + o[i]!);
      const h2 = norm(x, p('postAttentionLayernorm'));
      const g = lin(h2, p('mlp.gateProj'), F), u = lin(h2, p('mlp.upProj'), F);
      const a = g.map((gv, i) => (gv / (1 + Math.exp(-gv))) * u[i]!);
      const d = lin(a, p('mlp.downProj'), C);
      x = x.map((xv, i) => xv + d[i]!);
    }
    out.push(...lin(norm(x, P('norm.weight')), head, V));
  }
  return Float64Array.from(out);
}

const IDS = [[3, 1, 4, 1, 5, 9, 2, 6], [27, 18, 28, 18, 28, 4, 5, 0]];

describe('nt.nn.Llama', () => {
  it('reads a config in camelCase or snake_case and fills the defaults', () => {
    const snake = nt.nn.llamaConfig({ vocab_size: 10, hidden_size: 8, intermediate_size: 12, num_hidden_layers: 1, num_attention_heads: 2, max_position_embeddings: 4, architectures: ['LlamaForCausalLM'] });
    expect(snake).toMatchObject({ vocabSize: 10, hiddenSize: 8, numKeyValueHeads: 2, ropeTheta: 10000, rmsNormEps: 1e-6, tieWordEmbeddings: false, initializerRange: 0.02 });
    expect(nt.nn.llamaConfig({ ...base, rope_theta: 500 })).toMatchObject({ ropeTheta: 500 });
  });
  it('rejects bad configs with typed errors naming the problem', () => {
    expect(() => new nt.nn.Llama({ ...base, numKeyValueHeads: 3 })).toThrow(/numKeyValueHeads \(3\) must divide numAttentionHeads \(4\)/);
    expect(() => new nt.nn.Llama({ ...base, numAttentionHeads: 3 })).toThrow(/numAttentionHeads \(3\) must divide hiddenSize \(16\)/);
    expect(() => new nt.nn.Llama({ ...base, hiddenSize: 12, numAttentionHeads: 4 })).toThrow(/head dim .* must be even/);
    expect(() => new nt.nn.Llama({ ...base, vocabSize: 0 })).toThrow(nt.ArgumentError);
    expect(() => new nt.nn.Llama({ ...base, ropeTheta: -1 })).toThrow(/ropeTheta must be a finite number > 0/);
    expect(() => new nt.nn.Llama({ ...base, vocab_size: 30 } as nt.nn.LlamaConfig)).toThrow(/given twice/);
    expect(() => new nt.nn.Llama(null as unknown as nt.nn.LlamaConfig)).toThrow(nt.ArgumentError);
    const m = new nt.nn.Llama(base);
    expect(() => m.forward(nt.zeros([1, 13], { dtype: 'i32' }))).toThrow(/exceeds maxPositionEmbeddings 12/);
    expect(() => m.forward(nt.zeros([1, 4]))).toThrow(nt.ArgumentError);
    m.dispose();
  });
  for (const [what, cfg] of [['untied, 2 kv heads', base], ['tied, multi-query', { ...base, numKeyValueHeads: 1, tieWordEmbeddings: true }], ['no grouping', { ...base, numKeyValueHeads: 4 }]] as const) {
    it(`${what}: logits equal a float64 LlamaForCausalLM; the fused head's loss is their cross-entropy`, () => {
      // A larger init than 0.02 so every part of the block moves the logits measurably.
      const big = new nt.nn.Llama({ ...cfg, initializerRange: 0.3 }, { seed: 5 });
      nt.scope(() => {
        const idx = nt.tensor(Int32Array.from(IDS.flat()), [2, 8], { dtype: 'i32' });
        const { logits } = nt.noGrad(() => big.forward(idx));
        expect(logits!.shape).toEqual([2, 8, cfg.vocabSize]);
        const ref = refLogits(big, IDS);
        expectClose(logits!.toArraySync(), ref, 2e-5, 1e-4, 'logits');
        const targets = nt.tensor(Int32Array.from(IDS.flat().map((v) => (v * 7 + 3) % cfg.vocabSize)), [2, 8], { dtype: 'i32' });
        const { loss } = nt.noGrad(() => big.forward(idx, targets));
        let want = 0;
        const t = targets.toArraySync();
        for (let r = 0; r < 16; r++) {
          const row = ref.subarray(r * cfg.vocabSize, (r + 1) * cfg.vocabSize);
          const mx = Math.max(...row);
          want += Math.log(row.reduce((a, v) => a + Math.exp(v - mx), 0)) + mx - row[t[r]!]!;
        }
        expect(loss!.item()).toBeCloseTo(want / 16, 5);
      });
      const names = big.namedParameters().map(([n]) => n);
      expect(names.includes('lmHead.weight')).toBe(!cfg.tieWordEmbeddings);
      expect(big.numParameters()).toBe(nt.nn.llamaParameterCount(big.config));
      big.dispose();
    });
  }
  it('trains with nt.trainStep; recomputation gives the same gradients; the MLP is replaceable', () => {
    const data = nt.tensor(Int32Array.from(IDS.flat()), [2, 8], { dtype: 'i32' });
    const targets = nt.tensor(Int32Array.from(IDS.flat().map((v) => (v + 1) % 29)), [2, 8], { dtype: 'i32' });
    const run = (recompute: boolean) => {
      const m = new nt.nn.Llama(base, { seed: 3, recompute });
      const opt = new nt.optim.AdamW(m.parameters(), { lr: 1e-2 });
      const losses = Array.from({ length: 4 }, () => nt.trainStep(m, opt, data, targets, { maxGradNorm: 1 }).loss);
      const params = m.parameters().map((p) => p.toArraySync());
      m.dispose();
      return { losses, params };
    };
    const a = run(false), b = run(true);
    expect(a.losses[3]!).toBeLessThan(a.losses[0]!);
    expect(b.losses).toEqual(a.losses);
    a.params.forEach((p, i) => expect(Array.from(b.params[i]!)).toEqual(Array.from(p)));
    // A custom MLP (as a mixture of experts plugs in): called once per block with the block's index.
    const seen: number[] = [];
    const m = new nt.nn.Llama(base, {
      mlp: (config, { layer, factory, index }) => { seen.push(index); return new nt.nn.LlamaMLP(config, layer, factory); },
    });
    expect(seen).toEqual([0, 1]);
    expect(m.layers[1]!.mlp).toBeInstanceOf(nt.nn.LlamaMLP);
    m.dispose();
  });
  it('nt.train.setup trains a Llama as trainStep does; progress names it; the run exports a LlamaForCausalLM directory', async () => {
    const { mkdtempSync, rmSync, readFileSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const { join } = await import('node:path');
    const batch = (step: number) => ({
      inputs: nt.tensor(Int32Array.from(IDS.flat().map((v) => (v + step) % 29)), [2, 8], { dtype: 'i32' }),
      targets: nt.tensor(Int32Array.from(IDS.flat().map((v) => (v + step + 1) % 29)), [2, 8], { dtype: 'i32' }),
    });
    const lines: string[] = [];
    const run = await nt.train.setup({
      model: (shard) => new nt.nn.Llama({ ...base, maxPositionEmbeddings: 8 }, shard), batchSize: 2, seed: 4, steps: 3, layout: {},
      paramGroups: (named) => [{ params: named.map(([, p]) => p) }], optimizer: (groups) => new nt.optim.AdamW(groups, { lr: 1e-2 }), lr: 1e-2,
      progress: { every: 1, log: (l) => lines.push(l) },
    });
    expect(run.gpt.family).toBe('llama');
    expect(run.flopsPerToken).toBe(nt.nn.llamaFlopsPerToken(base, 8));
    const losses: number[] = [];
    for (let step = 0; step < 3; step++) { const b = batch(step); losses.push((await run.step(b)).loss); b.inputs.dispose(); b.targets.dispose(); }
    const dir = mkdtempSync(join(tmpdir(), 'nt-llama-run-'));
    expect(await run.exportHF(dir)).toBe(true);
    expect(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8')).model_type).toBe('llama');
    await run.close();
    rmSync(dir, { recursive: true, force: true });
    expect(lines.some((l) => /^Llama: 2 layers, 4 heads \(2 kv\), width 16/.test(l))).toBe(true);
    const m = new nt.nn.Llama({ ...base, maxPositionEmbeddings: 8 }, { seed: 4 });
    const opt = new nt.optim.AdamW(m.parameters(), { lr: 1e-2 });
    const hand = [0, 1, 2].map((step) => { const b = batch(step); const l = nt.trainStep(m, opt, b.inputs, b.targets, { lr: 1e-2 }).loss; b.inputs.dispose(); b.targets.dispose(); return l; });
    m.dispose();
    expect(losses).toEqual(hand);
  }, 120_000);
  it('generates tokens and trains under bf16 autocast close to f32', () => {
    const m = new nt.nn.Llama(base, { seed: 1 });
    const out = m.generate(nt.tensor(Int32Array.from([1, 2, 3]), [1, 3], { dtype: 'i32' }), 4, { seed: 2 });
    expect(out[0]).toHaveLength(7);
    expect(out[0]!.every((t) => t >= 0 && t < 29)).toBe(true);
    nt.scope(() => {
      const idx = nt.tensor(Int32Array.from(IDS.flat()), [2, 8], { dtype: 'i32' });
      const tg = nt.tensor(Int32Array.from(IDS.flat().map((v) => (v + 1) % 29)), [2, 8], { dtype: 'i32' });
      const f = m.forward(idx, tg).loss!;
      const lo = nt.autocast({ dtype: 'bf16' }, () => m.forward(idx, tg).loss!);
      lo.backward();
      expect(Math.abs(lo.item() - f.item())).toBeLessThan(2e-2);
      expect(m.parameters().every((p) => p.grad !== null && Number.isFinite(p.grad.toArraySync()[0]!))).toBe(true);
    });
    m.dispose();
  });
});
