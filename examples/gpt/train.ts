// Trains a small GPT-2 on Moby-Dick with nodetron: GPT-2 BPE tokens, AdamW with a cosine schedule and
// gradient clipping, periodic validation loss, and a few generated lines at the end. One process, or
// data parallel (optionally ZeRO 1/2/3) under `nodetron launch`.
// Run: npx tsx examples/gpt/train.ts [--steps 200] [--device cpu|cuda] [--help]
//      node bin/nodetron.js launch --nproc-per-node 2 examples/gpt/train.ts --dp 2 --zero 1
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/bench/util.js';
import { evaluate } from '../../lib/training.js';
import { BatchSampler, GPT2_VOCAB_SIZE, gpt2Encoder, loadShards } from './data.js';

const HELP = `usage: npx tsx examples/gpt/train.ts [options]
  --steps N            optimizer steps (default 150)
  --batch B            sequences per step, over all data-parallel ranks (default 8)
  --ctx T              context length (default 64)
  --layers L --heads H --width C   model shape (default 2, 4, 128)
  --lr X               peak learning rate (default 3e-3; cosine to lr/10 after 10% warm-up)
  --weight-decay X     AdamW weight decay (default 0.1)
  --seed N             initialization and data seed (default 1337)
  --eval-interval N    steps between validation losses (default 50)
  --eval-batches N     batches per validation loss (default 4)
  --device D           cpu | cuda | cuda:N (default cpu)
  --recompute          recompute each block's activations in backward
  --parallel-block     MegaScale parallel attention+MLP block
  --window W           sliding-window attention over W positions
  --generate N         tokens to generate at the end (default 60)
Parallel layouts (run under \`nodetron launch --nproc-per-node N\`; tp·pp·dp must equal N):
  --dp N               data-parallel ranks (default: N / (tp·pp)); each trains batch/dp sequences
  --zero 0|1|2|3       ZeRO stage: shard optimizer state (1), gradients too (2), parameters too (3) over the dp ranks
  --offload            keep ZeRO shards in host memory (needs --zero 1|2|3; no-op for cpu parameters)
  --tp N --pp N        checked against the model (heads, width, layers) but not trained yet: must be 1`;

async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    steps: 'number', batch: 'number', ctx: 'number', layers: 'number', heads: 'number', width: 'number', lr: 'number',
    'weight-decay': 'number', seed: 'number', 'eval-interval': 'number', 'eval-batches': 'number', device: 'string',
    recompute: 'boolean', 'parallel-block': 'boolean', window: 'number', generate: 'number', help: 'boolean',
    tp: 'number', pp: 'number', dp: 'number', zero: 'number', offload: 'boolean',
  });
  if (o.help) { console.log(HELP); return 0; }
  const steps = (o.steps as number | undefined) ?? 150;
  const batch = (o.batch as number | undefined) ?? 8;
  const ctx = (o.ctx as number | undefined) ?? 64;
  const seed = (o.seed as number | undefined) ?? 1337;
  const maxLr = (o.lr as number | undefined) ?? 3e-3;
  const evalInterval = (o['eval-interval'] as number | undefined) ?? 50;
  const evalBatches = (o['eval-batches'] as number | undefined) ?? 4;
  const device = (o.device as string | undefined) ?? 'cpu';
  const config: nt.nn.GPTConfig = {
    vocabSize: GPT2_VOCAB_SIZE, blockSize: ctx, nLayer: (o.layers as number | undefined) ?? 2, nHead: (o.heads as number | undefined) ?? 4,
    nEmbd: (o.width as number | undefined) ?? 128, dropout: 0, bias: true,
    parallelBlock: Boolean(o['parallel-block']), recompute: Boolean(o.recompute),
    ...(o.window !== undefined ? { window: o.window as number } : {}),
  };

  let par: nt.parallel.ParallelTraining;
  try {
    par = await nt.parallel.initParallelTraining({ tp: o.tp as number | undefined, pp: o.pp as number | undefined,
      dp: o.dp as number | undefined, zero: o.zero as number | undefined, offload: o.offload as boolean | undefined }, config, batch);
  } catch (e) {
    if (!(e instanceof nt.ArgumentError)) throw e;
    console.error(`train.ts: ${e.message}`);
    return 2;
  }
  const { layout, mesh } = par;
  // Rank 0 reports; every rank trains.
  const log = par.rank === 0 ? console.log : () => {};
  const shards = loadShards(log);
  const model = new nt.nn.GPT(config, { seed, device });
  // No weight decay on biases, LayerNorm parameters and position embeddings (nanoGPT's grouping).
  const decay = model.namedParameters().filter(([n, p]) => p.ndim >= 2 && n !== 'wpe.weight').map(([, p]) => p);
  const noDecay = model.parameters().filter((p) => !decay.includes(p));
  const trainer = new nt.parallel.DataParallelTrainer<nt.optim.AdamWOptions>(model, [{ params: decay }, { params: noDecay, weightDecay: 0 }], {
    group: mesh?.dpGroup ?? null, zero: layout.zero, offload: layout.offload, maxGradNorm: 1.0,
    createOptimizer: (groups) => new nt.optim.AdamW(groups, { lr: maxLr, betas: [0.9, 0.95], weightDecay: (o['weight-decay'] as number | undefined) ?? 0.1 }),
  });
  // Every rank draws the same global batch and trains its rows of it.
  const slice = nt.parallel.batchSlice(batch, mesh?.dpRank ?? 0, layout.dp);
  const schedule = { warmup: Math.max(1, Math.floor(steps / 10)), maxSteps: steps, maxLr, minLr: maxLr / 10 };
  log(`GPT: ${config.nLayer} layers, ${config.nHead} heads, width ${config.nEmbd}, ctx ${ctx}, vocab ${config.vocabSize}; ` +
    `${(model.numParameters() / 1e6).toFixed(2)}M parameters on ${device}; ${shards.train.length} train / ${shards.val.length} val tokens; ` +
    `layout dp=${layout.dp} zero=${layout.zero}${layout.offload ? ' offload' : ''}, ${slice.count} sequences per rank`);

  const train = new BatchSampler(shards.train, batch, ctx, seed);
  const toTensors = (b: { x: Int32Array; y: Int32Array }) => ({
    inputs: nt.tensor(b.x, [batch, ctx], { device }), targets: nt.tensor(b.y, [batch, ctx], { device }),
  });
  const valLoss = (): number => {
    // The same validation windows every time, so the curve compares like with like.
    const sampler = new BatchSampler(shards.val, batch, ctx, 7);
    const batches = Array.from({ length: evalBatches }, () => toTensors(sampler.next()));
    try { return evaluate(model, batches); } finally { for (const b of batches) { b.inputs.dispose(); b.targets.dispose(); } }
  };

  // Under ZeRO 3 every forward gathers parameters from all ranks, so every rank evaluates and generates (rank 0 prints).
  const evaluates = par.rank === 0 || layout.zero === 3;
  if (evaluates) log(`step 0: val loss ${valLoss().toFixed(4)} (uniform would be ${Math.log(config.vocabSize).toFixed(4)})`);
  const t0 = performance.now();
  let smoothed: number | undefined;
  for (let step = 0; step < steps; step++) {
    const b = train.next();
    const rows = (a: Int32Array) => a.subarray(slice.start * ctx, (slice.start + slice.count) * ctx);
    const inputs = nt.tensor(rows(b.x), [slice.count, ctx], { device }), targets = nt.tensor(rows(b.y), [slice.count, ctx], { device });
    const lr = nt.optim.cosineWithWarmup(step, schedule);
    const { loss, gradNorm } = await trainer.step(inputs, targets, { lr });
    inputs.dispose(); targets.dispose();
    smoothed = smoothed === undefined ? loss : 0.9 * smoothed + 0.1 * loss;
    const elapsedS = (performance.now() - t0) / 1000;
    const tokPerS = ((step + 1) * batch * ctx) / elapsedS;
    const etaS = (elapsedS / (step + 1)) * (steps - step - 1);
    if (step % 10 === 0 || step === steps - 1) {
      log(`step ${String(step + 1).padStart(4)}/${steps}  loss ${loss.toFixed(4)} (avg ${smoothed.toFixed(4)})  ` +
        `norm ${gradNorm!.toFixed(2)}  lr ${lr.toExponential(2)}  ${Math.round(tokPerS)} tok/s  ETA ${etaS.toFixed(0)} s`);
    }
    if (evaluates && ((step + 1) % evalInterval === 0 || step === steps - 1)) log(`step ${step + 1}: val loss ${valLoss().toFixed(4)}`);
  }

  const newTokens = (o.generate as number | undefined) ?? 60;
  if (newTokens > 0 && evaluates) {
    const enc = gpt2Encoder();
    const prompt = enc.encode('Call me Ishmael.');
    const idx = nt.tensor(Int32Array.from(prompt), [1, prompt.length], { device });
    const [out] = model.generate(idx, newTokens, { temperature: 0.8, topK: 40, seed });
    idx.dispose();
    log(`--- sample ---\n${enc.decode(out!)}\n---`);
  }
  trainer.dispose();
  model.dispose();
  if (mesh) await nt.distributed.destroy();
  return 0;
}

main(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (e) => { console.error(e); process.exitCode = 1; });
