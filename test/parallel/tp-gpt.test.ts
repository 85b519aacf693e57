// The tensor-parallel GPT: over 2 and 4 processes (Gloo, and the file-backed group) it starts from,
// computes and trains to the single-process GPT's numbers; vocabulary-parallel cross-entropy against
// float64 and finite differences; bad splits are ArgumentErrors before any communication.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { tensorParallelLinearFactory } from '../../lib/internal.js';
import { fileWorld, runLocalRanks } from '../../lib/testing/index.js';
import { runRanks } from '../distributed/spawn-ranks.js';

const tiny: nt.nn.GPTConfig = { vocabSize: 96, blockSize: 8, nLayer: 2, nHead: 4, nEmbd: 16, dropout: 0, bias: true };

async function tpRun(size: number, backend: 'gloo' | 'file', variant: 'standard' | 'parallel' | 'sp' | 'sp-parallel') {
  const dir = mkdtempSync(join(tmpdir(), 'nt-tpgpt-'));
  try {
    return await runRanks('../parallel/tp-gpt-rank.ts', size, [backend, dir, variant], { NODETRON_WARN_LEAKS: '0' }, 150_000);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('tensor-parallel GPT (multi-process)', () => {
  // sp: sequence parallelism (norms, residuals and embeddings on T/tp positions per rank) must give the same numbers.
  for (const [size, backend, variant] of [[2, 'gloo', 'standard'], [4, 'gloo', 'standard'], [2, 'file', 'parallel'], [2, 'gloo', 'sp'], [4, 'gloo', 'sp-parallel']] as const) {
    it(`TP${size} over ${backend}, ${variant} block: the single-process model's weights, logits, loss, gradients, norm and 2 AdamW steps`, async () => {
      const res = await tpRun(size, backend, variant);
      for (const r of res) {
        expect(r.code, r.stderr.slice(-3000)).toBe(0);
        const { ce, gpt } = r.result;
        // Cross-entropy: f64 reference, the unsplit op, finite differences of the op itself.
        expect(Math.abs(ce.loss - ce.loss64)).toBeLessThan(1e-5);
        expect(Math.abs(ce.loss - ce.lossSingle)).toBeLessThan(1e-5);
        expect(ce.gradVs64 / ce.gradScale).toBeLessThan(1e-5);
        expect(ce.gradVsSingle / ce.gradScale).toBeLessThan(1e-5);
        expect(ce.fdChecked).toBeGreaterThan(5);
        expect(ce.fdDiff / ce.gradScale).toBeLessThan(2e-3);
        // GPT: the local weights are exact slices; logits are vocab-sharded and gather to the reference.
        expect(gpt.localLogitsShape).toEqual([2, 8, 96 / size]);
        expect(gpt.hiddenShape).toEqual([2, variant.startsWith('sp') ? 8 / size : 8, 16]);
        expect(gpt.names).toBe(variant.endsWith('parallel') ? 2 + 2 * 5 + 1 : 2 + 2 * 12 + 2);
        expect(Object.keys(gpt.grads)).toHaveLength(gpt.names);
        for (const [name, d] of Object.entries(gpt.initial as Record<string, number>)) expect(d, `initial ${name}`).toBe(0);
        expect(gpt.logitsDiff).toBeLessThan(1e-5);
        for (const [ref, par] of gpt.losses as [number, number][]) expect(Math.abs(ref - par)).toBeLessThan(1e-5);
        for (const [name, d] of Object.entries(gpt.grads as Record<string, number>)) expect(d, `grad ${name} (relative)`).toBeLessThan(1e-4);
        const relNorm = ([a, b]: number[]) => Math.abs(a! - b!) / a!;
        expect(relNorm(gpt.gradNorm)).toBeLessThan(1e-5);
        expect(relNorm(gpt.clipNorm)).toBeLessThan(1e-5);
        expect(gpt.moved).toBeGreaterThan(1e-2);
        // Adam's step lr·g/(|g| + eps) turns the f32 rounding differences (~1e-9) of gradient entries near
        // eps into step differences up to lr·Δg/eps: measured at most 7e-6 (TP4), against 2e-2 of movement.
        for (const [name, d] of Object.entries(gpt.params as Record<string, number>)) expect(d, `param ${name} after 2 steps`).toBeLessThan(1e-5);
        expect(gpt.generateSame).toBe(true);
        const drop = r.result.dropout;
        expect(drop !== null).toBe(variant.endsWith('parallel'));
        if (drop) {
          expect(drop.logitsDiff).toBeLessThan(1e-5);
          expect(Math.abs(drop.loss[0] - drop.loss[1])).toBeLessThan(1e-5);
          expect(Math.abs(drop.loss[0] - gpt.losses[0][0])).toBeGreaterThan(1e-3);  // the masks did act
          for (const [name, d] of Object.entries(drop.grads as Record<string, number>)) expect(d, `dropout grad ${name} (relative)`).toBeLessThan(1e-4);
          expect(relNorm(drop.gradNorm)).toBeLessThan(1e-5);
        }
      }
    }, 180_000);
  }
});

describe('tensor-parallel GPT (in process)', () => {
  it('a group of one gives the plain GPT: same weights, logits, loss and gradients', () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-tpgpt1-'));
    try {
      const group = fileWorld(dir, 0, 1);
      const config = { ...tiny, vocabSize: 50 };
      const ref = new nt.nn.GPT(config, { seed: 4 });
      const par = new nt.nn.GPT(config, { seed: 4, ...nt.parallel.tp.tensorParallelGPTOptions(group) });
      expect(par.wte).toBeInstanceOf(nt.parallel.tp.VocabParallelEmbedding);
      const x = nt.tensor(Int32Array.from({ length: 12 }, (_, i) => (i * 7) % 50), [2, 6]);
      const y = nt.tensor(Int32Array.from({ length: 12 }, (_, i) => (i * 5 + 1) % 50), [2, 6]);
      expect(nt.noGrad(() => par.forward(x).logits.toArraySync())).toEqual(nt.noGrad(() => ref.forward(x).logits.toArraySync()));
      const a = ref.forward(x, y), b = par.forward(x, y);
      expect(Math.abs(a.loss!.item() - b.loss!.item())).toBeLessThan(1e-6);
      a.loss!.backward(); b.loss!.backward();
      const refParams = new Map(ref.namedParameters());
      for (const [name, p] of par.namedParameters()) {
        const r = refParams.get(name)!;
        expect(p.toArraySync(), name).toEqual(r.toArraySync());
        const g = p.grad!.toArraySync(), want = r.grad!.toArraySync();
        const scale = Math.max(...Array.from(want, Math.abs));
        expect(Math.max(...Array.from(g, (v, i) => Math.abs(v - want[i]!))) / scale, name).toBeLessThan(1e-5);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the plain and the tensor-parallel linear factories draw the same numbers from the generator', () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-tpgen-'));
    try {
      const group = fileWorld(dir, 0, 1);
      const build = (factory: nt.nn.LinearFactory, role: nt.nn.LinearRole) => {
        const generator = new nt.Generator(9);
        const l = factory(16, 48, { role, bias: true, std: 0.02, layer: { generator }, config: tiny });
        return { offset: generator.offsetBlocks, weight: l.weight.toArraySync() };
      };
      for (const role of ['attn.qkv', 'attn.proj', 'mlp.fc', 'mlp.proj'] as const) {
        const plain = build(nt.nn.defaultLinearFactory, role), split = build(tensorParallelLinearFactory(group), role);
        expect(plain.offset, role).toBe(16 * 48 / 2);  // one normal draw of the weight (2 per Philox block), nothing else
        expect(split.offset, role).toBe(plain.offset);
        expect(split.weight, role).toEqual(plain.weight);
      }
      const generator = new nt.Generator(9);
      const l = new nt.nn.Linear(5, 3, { generator, initialize: false });
      new nt.nn.Embedding(5, 3, { generator, initialize: false });
      expect(generator.offsetBlocks).toBe(0);
      expect(l.bias).not.toBeNull();
      new nt.nn.Linear(5, 3, { generator });
      expect(generator.offsetBlocks).toBe(Math.ceil(15 / 4) + 1);  // Linear's default U(±1/√in) still draws weight and bias
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('checkTensorParallelConfig names every dimension tp does not divide', () => {
    expect(() => nt.parallel.tp.checkTensorParallelConfig(tiny, 4)).not.toThrow();
    expect(() => nt.parallel.tp.checkTensorParallelConfig({ ...tiny, nHead: 6, nEmbd: 18, vocabSize: 97 }, 4))
      .toThrow(/must divide the 6 attention heads, the width 18, the vocabulary of 97 tokens \(pad it: padVocab\(97, 4\) = 100\)/);
    expect(() => nt.parallel.tp.checkTensorParallelConfig({ ...tiny, vocabSize: 50257 }, 2)).toThrow(nt.ArgumentError);
    expect(() => nt.parallel.tp.checkTensorParallelConfig(tiny, 0)).toThrow(nt.ArgumentError);
  });

  it('padVocab rounds up to a multiple', () => {
    expect(nt.nn.padVocab(50257, 64)).toBe(50304);
    expect(nt.nn.padVocab(96, 4)).toBe(96);
    expect(nt.nn.padVocab(1, 8)).toBe(8);
    expect(() => nt.nn.padVocab(10, 0)).toThrow(nt.ArgumentError);
    expect(() => nt.nn.padVocab(-1, 4)).toThrow(nt.ArgumentError);
  });

  // A LocalGroup cannot finish a collective synchronously, so any communication would surface as a
  // StateError: an ArgumentError proves the check came first.
  it('bad splits are ArgumentErrors before any communication, and the process stays usable', async () => {
    await runLocalRanks(3, async (g) => {
      const bad = { ...tiny, nHead: 4, nEmbd: 24, vocabSize: 99 };
      expect(() => nt.parallel.tp.tensorParallelGPT(bad, { group: g })).toThrow(nt.ArgumentError);
      expect(() => nt.parallel.tp.tensorParallelGPT(bad, { group: g })).toThrow(/4 attention heads/);
      // Without the builder the layers check too: the vocabulary in the embedding, the heads in the factory.
      expect(() => new nt.nn.GPT({ ...bad, vocabSize: 98 }, nt.parallel.tp.tensorParallelGPTOptions(g))).toThrow(/vocabulary size \(98\)/);
      expect(() => new nt.nn.GPT(bad, nt.parallel.tp.tensorParallelGPTOptions(g))).toThrow(/4 attention heads/);
      expect(() => new nt.parallel.tp.VocabParallelEmbedding(10, 4, { group: g })).toThrow(nt.ArgumentError);
      expect(nt.ones([2]).add(1).toArraySync()).toEqual(new Float32Array([2, 2]));
    });
  });

  it('vocabParallelCrossEntropy rejects bad targets and shapes before communicating', async () => {
    await runLocalRanks(2, async (g) => {
      const logits = nt.zeros([3, 4]);
      expect(() => nt.parallel.tp.vocabParallelCrossEntropy(logits, nt.tensor(Int32Array.from([0, 8, 1]), [3]), g)).toThrow(/target 8 at row 1 is outside the vocabulary \[0, 8\)/);
      expect(() => nt.parallel.tp.vocabParallelCrossEntropy(logits, nt.tensor(Int32Array.from([0, -1, 1]), [3]), g)).toThrow(nt.ArgumentError);
      expect(() => nt.parallel.tp.vocabParallelCrossEntropy(logits, nt.tensor(Int32Array.from([0, 1, 2]), [3]), g, { ignoreIndex: 0.5 })).toThrow(nt.ArgumentError);
      expect(() => nt.parallel.tp.vocabParallelCrossEntropy(logits, nt.tensor(Int32Array.from([0, 1]), [2]), g)).toThrow(nt.ShapeError);
      expect(() => nt.parallel.tp.vocabParallelCrossEntropy(logits, nt.zeros([3]), g)).toThrow(nt.DTypeError);
      expect(() => new nt.parallel.tp.VocabParallelEmbedding(8, 4, { group: g }).forward(nt.tensor(Int32Array.from([8]), [1]))).toThrow(/id 8 at position 0/);
      expect(nt.ones([2]).toArraySync()).toEqual(new Float32Array([1, 1]));
    });
  });
});
