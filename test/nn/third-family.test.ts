// A third model family, written here with no edit to lib/: a small decoder (RMSNorm, causal attention
// on a packed QKV, a GELU MLP of 3·C, a tied head, rotary-free positions) that implements the CausalLM
// contract out of nodetron's layers and ops and counts itself with lib/nn/counts.ts. nt.train.setup
// takes it (its check is the contract, not a list of classes), trains it one step in one process, and
// the run reports its own counts: the family's name and parameters in the first line, its FLOPs per token
// behind the progress line's MFU. Its Hugging Face reader and writer, registered from here alone
// (registerHFFamily), make importHF and exportHF find it by model_type and class, and give the planner
// the traits its config.json does not spell out.
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import {
  causalLMProblems, generateTokens, isCausalLM, lookUpTokens, modelParts, type CausalLM, type CausalLMOptions, type CausalLMOutput, type ContextLayout,
  type GenerateOptions, type LinearLike, type ModelShape, type ParameterCounts, type SequenceLayout, type StageModules, type TokenEmbedding, type VocabLayout,
} from '../../lib/nn/causal-lm.js';
import { decoderFlopsPerToken, decoderParameterCounts, type DecoderShape } from '../../lib/nn/counts.js';
import { RMSNorm, type LayerOptions } from '../../lib/nn/layers.js';
import { Module, type Parameter } from '../../lib/nn/module.js';
import { add, attentionPacked, gelu, rmsNorm } from '../../lib/ops/index.js';
import type { Generator } from '../../lib/random.js';
import type { Tensor } from '../../lib/tensor.js';
import { fillParameters, HFCheckpoint, hfFamilyOf, registerHFFamily, writeJSONAtomically, type HFFamily } from '../../lib/interop/hf-common.js';
import { SAFETENSORS_DTYPE_OF, writeSafetensors } from '../../lib/io/safetensors.js';
import { bytesOf, loadBytes } from '../../lib/io/tensor-bytes.js';
import { writeAtomically } from '../../lib/io/files.js';

const work = mkdtempSync(join(tmpdir(), 'nt-third-family-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface ToyConfig { vocabSize: number; blockSize: number; nLayer: number; nHead: number; nEmbd: number }

const STD = 0.02;

/** x + proj(attention(rmsNorm(x))), then + out(gelu(fc(rmsNorm(·)))). */
class ToyBlock extends Module {
  readonly norm1: RMSNorm;
  readonly qkv: LinearLike;
  readonly proj: LinearLike;
  readonly norm2: RMSNorm;
  readonly fc: LinearLike;
  readonly out: LinearLike;
  constructor(readonly c: ToyConfig, layer: LayerOptions, factory: ReturnType<typeof modelParts>['factory']) {
    super();
    const w = c.nEmbd, config = { nHead: c.nHead, nEmbd: w, vocabSize: c.vocabSize };
    this.norm1 = new RMSNorm(w, layer);
    this.qkv = factory(w, 3 * w, { role: 'attn.qkv', bias: false, std: STD, layer, config });
    this.proj = factory(w, w, { role: 'attn.proj', bias: false, std: STD, layer, config });
    this.norm2 = new RMSNorm(w, layer);
    this.fc = factory(w, 3 * w, { role: 'mlp.fc', bias: false, std: STD, layer, config });
    this.out = factory(3 * w, w, { role: 'mlp.proj', bias: false, std: STD, layer, config });
  }
  forward(x: Tensor): Tensor {
    const h = add(x, this.proj.forward(attentionPacked(this.qkv.forward(rmsNorm(x, this.norm1.weight, this.norm1.eps)), this.c.nHead, { causal: true })));
    return add(h, this.out.forward(gelu(this.fc.forward(rmsNorm(h, this.norm2.weight, this.norm2.eps)))));
  }
}

/** The toy family: a CausalLM of its own, built through the seams every family is built through. */
class ToyLM extends Module implements CausalLM {
  readonly family = 'toy';
  readonly blockPrefix = 'blocks';
  readonly table: TokenEmbedding;
  readonly blocks: ToyBlock[];
  readonly norm: RMSNorm;
  readonly generator: Generator;
  readonly vocabLayout: VocabLayout;
  readonly sequenceLayout: SequenceLayout;
  readonly contextLayout: ContextLayout | null = null;
  constructor(readonly config: ToyConfig, opts: CausalLMOptions = {}) {
    super();
    const { generator, layer, factory, vocabLayout, sequenceLayout } = modelParts(opts);
    this.generator = generator; this.vocabLayout = vocabLayout; this.sequenceLayout = sequenceLayout;
    this.table = vocabLayout.embedding(config.vocabSize, config.nEmbd, { std: STD, layer });
    this.blocks = Array.from({ length: config.nLayer }, () => new ToyBlock(config, layer, factory));
    this.norm = new RMSNorm(config.nEmbd, layer);
  }
  /** The family's shape for lib/nn/counts.ts: no biases, RMSNorm scales, an ungated MLP of 3·C, tied, no position table. */
  get decoderShape(): DecoderShape {
    const c = this.config;
    return { layers: c.nLayer, width: c.nEmbd, heads: c.nHead, kvHeads: c.nHead, ffn: 3 * c.nEmbd, vocab: c.vocabSize, gated: false, bias: false, tied: true, positions: 0 };
  }
  get shape(): ModelShape {
    const c = this.config;
    return { nLayer: c.nLayer, nHead: c.nHead, nKvHead: c.nHead, nEmbd: c.nEmbd, ffnHidden: 3 * c.nEmbd, vocabSize: c.vocabSize, blockSize: c.blockSize };
  }
  get parameterCounts(): ParameterCounts { return decoderParameterCounts(this.decoderShape); }
  flopsPerToken(seqLen: number): number { return decoderFlopsPerToken(this.decoderShape, seqLen); }
  get tiedWeight(): Parameter { return this.table.weight; }
  embed(idx: Tensor): Tensor { return lookUpTokens(this, 'ToyLM.forward', idx, this.table, ['blockSize', this.config.blockSize]).tokens; }
  forwardBlocks(x: Tensor, start = 0, end = this.blocks.length): Tensor {
    for (const b of this.blocks.slice(start, end)) x = b.forward(x);
    return x;
  }
  head(x: Tensor, targets?: Tensor): CausalLMOutput {
    const hidden = rmsNorm(x, this.norm.weight, this.norm.eps);
    if (targets !== undefined && this.vocabLayout.headLoss) return { logits: null, loss: this.vocabLayout.headLoss(hidden, this.table.weight, targets) };
    const logits = this.vocabLayout.logits(hidden, this.table.weight);
    if (targets === undefined) return { logits, loss: null };
    const [b, t] = targets.shape as [number, number];
    return { logits, loss: this.vocabLayout.loss(logits.reshape([b * t, logits.shape[2]!]), targets.reshape([b * t])) };
  }
  forward(idx: Tensor, targets?: Tensor): CausalLMOutput { return this.head(this.forwardBlocks(this.embed(idx)), targets); }
  gatherLogits(logits: Tensor): Tensor { return this.vocabLayout.gather(logits); }
  stageModules(first: boolean, last: boolean): StageModules {
    return { before: first || last ? [['table', this.table]] : [], after: last ? [['norm', this.norm]] : [] };
  }
  rebuild(opts: CausalLMOptions): ToyLM { return new ToyLM(this.config, opts); }
  generate(idx: Tensor, maxNewTokens: number, opts?: GenerateOptions): number[][] { return generateTokens(this, idx, maxNewTokens, opts); }
}

/** The toy family's Hugging Face reader and writer: config.json (model_type 'toy', HF_CONFIG_KEYS' names) and model.safetensors. */
const toyHF: HFFamily<ToyLM, { dtype?: 'f32' }> = {
  name: 'Toy', className: 'ToyLM', modelTypes: ['toy'],
  owns: (m): m is ToyLM => m instanceof ToyLM,
  decoder: { gated: false, bias: false, tied: true, learnedPositions: false },
  write(model, dir) {
    const c = model.config;
    mkdirSync(dir, { recursive: true });
    const tensors = model.namedParameters().map(([name, p]) => ({ name, dtype: SAFETENSORS_DTYPE_OF.f32, shape: [...p.shape], data: bytesOf(p, 'f32') }));
    writeAtomically(join(dir, 'model.safetensors'), (tmp) => writeSafetensors(tmp, tensors, { format: 'pt' }));
    writeJSONAtomically(join(dir, 'config.json'), {
      model_type: 'toy', num_hidden_layers: c.nLayer, num_attention_heads: c.nHead, hidden_size: c.nEmbd, intermediate_size: 3 * c.nEmbd,
      vocab_size: c.vocabSize, max_position_embeddings: c.blockSize,
    });
  },
  read({ dir, config }, opts) {
    const j = config as Record<string, number>;
    const model = new ToyLM({ nLayer: j.num_hidden_layers!, nHead: j.num_attention_heads!, nEmbd: j.hidden_size!, vocabSize: j.vocab_size!, blockSize: j.max_position_embeddings! },
      { device: opts.device });
    const ckpt = new HFCheckpoint(dir);
    try {
      return fillParameters(model, model.namedParameters().map(([name]) => ({ name })), (p, { name }) => loadBytes(p, ckpt.where.get(name)!.readBytes(name), 'f32'));
    } finally { ckpt.close(); }
  },
};
registerHFFamily(toyHF);

const CONFIG: ToyConfig = { vocabSize: 37, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 16 };

describe('a third model family, with no edit to lib/', () => {
  it('is a CausalLM by the contract; what is not one is named by what it lacks', () => {
    const m = new ToyLM(CONFIG);
    try {
      expect(isCausalLM(m)).toBe(true);
      expect(causalLMProblems(m)).toEqual([]);
      // Its counts are the parameters it holds.
      expect(m.parameterCounts).toEqual({ total: m.numParameters(), active: m.numParameters() });
    } finally { m.dispose(); }
    expect(causalLMProblems({})).toEqual([
      'it is not an nt.nn.Module', 'family is not a non-empty string', 'blockPrefix is not a non-empty string',
      'it has no config, shape, parameterCounts, blocks, generator, vocabLayout, sequenceLayout, contextLayout, tiedWeight',
      'it has no method flopsPerToken, embed, forwardBlocks, head, forward, gatherLogits, stageModules, rebuild, generate',
    ]);
  });

  it('trains one step through nt.train.setup in one process and reports its own counts', async () => {
    const lines: string[] = [];
    let built: ToyLM | null = null;
    const run = await nt.train.setup({
      // TrainSetupOptions.model is typed as returning a GPT or a Llama (lib/train/options.ts); at run time setup takes any CausalLM.
      model: (shard) => (built = new ToyLM(CONFIG, shard)),
      optimizer: (groups) => new nt.optim.AdamW(groups, { lr: 1e-2 }),
      batchSize: 2, seqLen: 8, steps: 1, layout: {},
      progress: { every: 1, peakFlops: 1e12, log: (l) => lines.push(l) },
    });
    try {
      expect(run.gpt).toBe(built);
      const model = built! as ToyLM;
      const total = model.parameterCounts.total;
      // The first line names the family and its parameters (the stage is the whole model).
      expect(lines[0]).toBe(`ToyLM: 2 layers, 2 heads, width 16, ctx 8, vocab 37; ${(total / 1e6).toFixed(2)}M parameters on cpu`);
      expect(run.model.numParameters()).toBe(total);
      // MFU is reckoned from the family's own FLOPs per token.
      expect(run.flopsPerToken).toBe(model.flopsPerToken(8));
      expect(run.flopsPerToken).toBe(decoderFlopsPerToken(model.decoderShape, 8));
      const before = Array.from(run.model.namedParameters().find(([n]) => n === 'blocks.1.fc.weight')![1].toArraySync());
      const ids = Int32Array.from({ length: 2 * 9 }, (_, i) => (i * 7 + 3) % CONFIG.vocabSize);
      const rows = (from: number) => Int32Array.from({ length: 16 }, (_, i) => ids[Math.floor(i / 8) * 9 + (i % 8) + from]!);
      using inputs = nt.tensor(rows(0), [2, 8], { dtype: 'i32' });
      using targets = nt.tensor(rows(1), [2, 8], { dtype: 'i32' });
      const r = await run.step({ inputs, targets });
      expect(r.step).toBe(1);
      expect(Number.isFinite(r.loss)).toBe(true);
      // About ln(37) at initialization.
      expect(Math.abs(r.loss - Math.log(37))).toBeLessThan(0.5);
      const after = Array.from(run.model.namedParameters().find(([n]) => n === 'blocks.1.fc.weight')![1].toArraySync());
      expect(after).not.toEqual(before);
      const progress = lines.find((l) => /^step +1\/1 /.test(l));
      expect(progress).toMatch(/ MFU \d+\.\d%/);
    } finally {
      await run.close();
    }
  });

  it('its Hugging Face file, registered from here, makes importHF, exportHF and the planner read it', () => {
    const m = new ToyLM(CONFIG, { seed: 5 });
    const dir = join(work, 'toy');
    try {
      expect(hfFamilyOf('toy')).toBe(toyHF);
      nt.interop.exportHF(m, dir);
      const back = nt.interop.importHF(dir);
      try {
        expect(back).toBeInstanceOf(ToyLM);
        const mine = new Map(m.namedParameters());
        for (const [n, p] of back.namedParameters()) expect(Array.from(p.toArraySync()), n).toEqual(Array.from(mine.get(n)!.toArraySync()));
      } finally { back.dispose(); }
      // The planner counts it as the model counts itself: the family says no biases, a tied head and no position table.
      const pm = plan.resolveModel(join(dir, 'config.json'));
      expect(pm).toMatchObject({ gated: false, bias: false, tied: true, positions: 0, ffn: 48 });
      expect(plan.totalParams(pm)).toBe(m.parameterCounts.total);
      expect(plan.totalParams(pm)).toBe(m.numParameters());
      // Without its model_type the keys alone would be read as a Llama's (a gated MLP of intermediate_size).
      expect(plan.modelFromConfig({ num_hidden_layers: 2, num_attention_heads: 2, hidden_size: 16, intermediate_size: 48, vocab_size: 37 }).gated).toBe(true);
      // Another family claiming its model_type is refused.
      expect(() => registerHFFamily({ ...toyHF, name: 'Toy2' })).toThrow(/model_type 'toy' is read by Toy already/);
    } finally { m.dispose(); }
  });
});
