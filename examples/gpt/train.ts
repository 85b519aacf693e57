// Trains a small GPT-2 on Moby-Dick with nodetron: GPT-2 BPE token shards read by nt.data.TokenLoader, AdamW with a cosine schedule and
// gradient clipping, periodic validation loss, and a few generated lines at the end. One process, or
// any tensor × pipeline × data-parallel layout (micro-batches, ZeRO 1/2/3) under `nodetron launch`.
// Run: npx tsx examples/gpt/train.ts [--steps 200] [--device cpu|cuda] [--save DIR --resume auto] [--help]
//      node bin/nodetron.js launch --nproc-per-node 2 examples/gpt/train.ts --dp 2 --zero 1
//      node bin/nodetron.js launch --nproc-per-node 4 examples/gpt/train.ts --pp 2 --dp 2 --micro-batches 4
import * as nt from '../../lib/index.js';
import { parseOptions } from '../../lib/bench/util.js';
import { datasetShards, GPT2_VOCAB_SIZE, gpt2Encoder, loadShards } from './data.js';

// nanoGPT's padding of the GPT-2 vocabulary to a multiple of 64, 50304 (faster kernels, and a
// tensor-parallel split for any power-of-two tp up to 64); the padded ids never occur in the data.
const PADDED_VOCAB_SIZE = nt.nn.padVocab(GPT2_VOCAB_SIZE, 64);

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
  --data DIR           train on the shards \`nodetron data tokenize\` wrote in DIR (*_train_*.bin, and
                       *_val_*.bin for validation) instead of the bundled Moby-Dick
Checkpoints (sharded: one file per rank; loadable under any other layout):
  --save DIR           save checkpoints under DIR (DIR/step-N/), in the background while training goes on
  --save-every N       steps between checkpoints (default 50; the last step is always saved)
  --keep K             complete checkpoints kept (default 3)
  --resume auto|DIR    start from the newest complete checkpoint under DIR (auto: under --save);
                       a damaged one is skipped for the one before it; none found: start fresh
  --export-hf DIR      at the end, write the model as a Hugging Face GPT-2 directory (model.safetensors +
                       config.json, loadable by transformers' GPT2LMHeadModel.from_pretrained)
Parallel layouts (run under \`nodetron launch --nproc-per-node N\`; tp·pp·dp must equal N):
  --dp N               data-parallel ranks (default: N / (tp·pp)); each trains batch/dp sequences
  --pp N               pipeline stages: each holds about layers/N layers (embeddings on the first, head on the last)
  --micro-batches M    split each rank's sequences into M micro-batches (default 1); the pipeline
                       overlaps them, and one process accumulates their gradients
  --schedule S         gpipe | 1f1b (default 1f1b: the same numbers, fewer activations held)
  --zero 0|1|2|3       ZeRO stage: shard optimizer state (1), gradients too (2), parameters too (3) over the dp ranks
  --offload            keep ZeRO shards in host memory (needs --zero 1|2|3; no-op for cpu parameters)
  --tp N               tensor-parallel ranks: attention heads, MLP and vocabulary split N ways
                       (N must divide the heads, the width and the padded vocabulary of 50304)
  --sp                 sequence parallelism (needs --tp > 1 dividing --ctx): LayerNorms, residuals and
                       embeddings hold ctx/tp positions per tensor-parallel rank, which cuts their activations`;

async function main(argv: string[]): Promise<number> {
  const o = parseOptions(argv, {
    steps: 'number', batch: 'number', ctx: 'number', layers: 'number', heads: 'number', width: 'number', lr: 'number',
    'weight-decay': 'number', seed: 'number', 'eval-interval': 'number', 'eval-batches': 'number', device: 'string',
    recompute: 'boolean', 'parallel-block': 'boolean', window: 'number', generate: 'number', help: 'boolean',
    tp: 'number', pp: 'number', dp: 'number', sp: 'boolean', zero: 'number', offload: 'boolean', 'micro-batches': 'number', schedule: 'string',
    save: 'string', 'save-every': 'number', keep: 'number', resume: 'string', 'export-hf': 'string', data: 'string',
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
    vocabSize: PADDED_VOCAB_SIZE, blockSize: ctx, nLayer: (o.layers as number | undefined) ?? 2, nHead: (o.heads as number | undefined) ?? 4,
    nEmbd: (o.width as number | undefined) ?? 128, dropout: 0, bias: true,
    parallelBlock: Boolean(o['parallel-block']), recompute: Boolean(o.recompute),
    ...(o.window !== undefined ? { window: o.window as number } : {}),
  };

  let par: nt.parallel.ParallelTraining;
  try {
    par = await nt.parallel.initParallelTraining({
      tp: o.tp as number | undefined, pp: o.pp as number | undefined, dp: o.dp as number | undefined, zero: o.zero as number | undefined,
      sequenceParallel: o.sp as boolean | undefined, offload: o.offload as boolean | undefined, microBatches: o['micro-batches'] as number | undefined, schedule: o.schedule as string | undefined,
    }, config, batch);
  } catch (e) {
    if (!(e instanceof nt.ArgumentError)) throw e;
    console.error(`train.ts: ${e.message}`);
    // Leaving the job closes this rank's communicators, so the process can exit.
    await nt.distributed.destroy();
    return 2;
  }
  const { layout, mesh } = par;
  // Rank 0 (first stage, first replica) reports; every rank trains.
  const log = par.rank === 0 ? console.log : () => {};
  const shards = o.data ? datasetShards(o.data as string) : loadShards(log);
  // Every rank builds the model from the seed (its tensor-parallel slices) and keeps its pipeline stage of it.
  const tensorParallel = mesh && layout.tp > 1 ? nt.parallel.tensorParallelGPTOptions(mesh.tpGroup, { sequenceParallel: layout.sequenceParallel }) : {};
  const full = new nt.nn.GPT(config, { seed, device, ...tensorParallel });
  const model = new nt.parallel.GPTStage(full, mesh?.ppRank ?? 0, layout.pp);
  // No weight decay on biases, LayerNorm parameters and position embeddings (nanoGPT's grouping).
  const named = model.namedParameters();
  const decay = named.filter(([n, p]) => p.ndim >= 2 && n !== 'wpe.weight').map(([, p]) => p);
  const noDecay = named.map(([, p]) => p).filter((p) => !decay.includes(p));
  let trainer: nt.parallel.ParallelTrainer<nt.optim.AdamWOptions>;
  try {
    trainer = await nt.parallel.ParallelTrainer.create<nt.optim.AdamWOptions>(model, [{ params: decay }, { params: noDecay, weightDecay: 0 }], {
      mesh, zero: layout.zero, offload: layout.offload, microBatches: layout.microBatches, schedule: layout.schedule, maxGradNorm: 1.0,
      createOptimizer: (groups) => new nt.optim.AdamW(groups, { lr: maxLr, betas: [0.9, 0.95], weightDecay: (o['weight-decay'] as number | undefined) ?? 0.1 }),
    });
  } catch (e) {
    if (!(e instanceof nt.ArgumentError)) throw e;
    console.error(`train.ts: ${e.message}`);
    // Leaving the job closes this rank's communicators, so the process can exit.
    if (mesh) await nt.distributed.destroy();
    return 2;
  }
  // Each data-parallel replica trains its rows of every global batch.
  const slice = nt.parallel.batchSlice(batch, mesh?.dpRank ?? 0, layout.dp);
  const schedule = { warmup: Math.max(1, Math.floor(steps / 10)), maxSteps: steps, maxLr, minLr: maxLr / 10 };
  log(`GPT: ${config.nLayer} layers, ${config.nHead} heads, width ${config.nEmbd}, ctx ${ctx}, vocab ${config.vocabSize}; ` +
    `${(model.numParameters() / 1e6).toFixed(2)}M parameters${layout.tp * layout.pp > 1 ? ' on rank 0 (its part of the model)' : ''} on ${device}; ` +
    `${shards.trainTokens} train / ${shards.valTokens} val tokens`);
  log(`layout ${nt.parallel.describeLayout(layout)}: ${layout.tp * layout.pp * layout.dp} process(es), ${slice.count} sequences per replica per step` +
    (layout.pp > 1 ? `, layers ${model.layers[0]}..${model.layers[1] - 1} on rank 0` : ''));

  // This replica's rows of each global batch, in a seeded order over the train shard's windows; one
  // reader per tensor-parallel group. Its position is part of every checkpoint.
  const loaderOptions = { batchSize: slice.count, seqLen: ctx, dpRank: mesh?.dpRank ?? 0, dpSize: layout.dp, tpGroup: mesh?.tpGroup ?? null, device };
  const train = new nt.data.TokenLoader({ ...loaderOptions, files: shards.train, seed });
  // Collective: every rank runs its part of the pipeline; the mean comes back on every rank.
  const valLoss = async (): Promise<number> => {
    // The same validation windows every time (a fresh loader, fixed seed), so the curve compares like with like.
    const val = new nt.data.TokenLoader({ ...loaderOptions, files: shards.val, seed: 7 });
    let total = 0;
    for (let i = 0; i < evalBatches; i++) {
      const { inputs, targets } = await val.next();
      try { total += await trainer.evaluate(inputs, targets); } finally { inputs.dispose(); targets.dispose(); }
    }
    val.close();
    return total / evalBatches;
  };

  // Checkpoints: the trainer (model and optimizer as this rank holds them), the data position, the layout for the record.
  const ckptItems = { model: trainer, loader: train, rng: { model: full.generator }, layout };
  const resumeFrom = o.resume === 'auto' ? (o.save as string | undefined) : (o.resume as string | undefined);
  if (o.resume === 'auto' && !o.save) { console.error('train.ts: --resume auto resumes from the --save directory; give --save DIR'); return 2; }
  let first = 0;
  if (resumeFrom) {
    const loaded = await new nt.ckpt.Checkpointer(resumeFrom).loadLatest(ckptItems);
    if (loaded) {
      first = loaded.step;
      log(`resumed from ${loaded.dir} (step ${loaded.step}${loaded.optimizerLoaded ? '' : ', no optimizer state'})`);
    } else log(`no complete checkpoint under ${resumeFrom}: starting from step 0`);
  }
  const saveEvery = (o['save-every'] as number | undefined) ?? 50;
  const checkpointer = o.save ? new nt.ckpt.Checkpointer(o.save as string, { keep: (o.keep as number | undefined) ?? 3 }) : null;

  if (first === 0) log(`step 0: val loss ${(await valLoss()).toFixed(4)} (uniform would be ${Math.log(GPT2_VOCAB_SIZE).toFixed(4)})`);
  // The peak from here on is training's (weights, gradients, optimizer state, activations), not set-up's.
  nt.resetPeakMemory(device);
  const t0 = performance.now();
  let smoothed: number | undefined;
  for (let step = first; step < steps; step++) {
    const { inputs, targets } = await train.next();
    const lr = nt.optim.cosineWithWarmup(step, schedule);
    const { loss, gradNorm } = await trainer.step(inputs, targets, { lr });
    inputs.dispose(); targets.dispose();
    const avg: number = smoothed === undefined ? loss : 0.9 * smoothed + 0.1 * loss;
    smoothed = avg;
    const elapsedS = (performance.now() - t0) / 1000;
    const tokPerS = ((step + 1 - first) * batch * ctx) / elapsedS;
    const etaS = (elapsedS / (step + 1 - first)) * (steps - step - 1);
    if (step % 10 === 0 || step === steps - 1) {
      log(`step ${String(step + 1).padStart(4)}/${steps}  loss ${loss.toFixed(4)} (avg ${avg.toFixed(4)})  ` +
        `norm ${gradNorm!.toFixed(2)}  lr ${lr.toExponential(2)}  ${Math.round(tokPerS)} tok/s  ETA ${etaS.toFixed(0)} s`);
    }
    if ((step + 1) % evalInterval === 0 || step === steps - 1) {
      const v = await valLoss();
      log(`step ${step + 1}: val loss ${v.toFixed(4)}`);
    }
    if (checkpointer && ((step + 1) % saveEvery === 0 || step === steps - 1)) {
      const saved = await checkpointer.save(step + 1, ckptItems);
      log(`checkpoint step ${step + 1}: training held ${saved.stallMs.toFixed(1)} ms, writing ${saved.dir} in the background`);
    }
  }
  await checkpointer?.close();
  train.close();

  // What stays allocated between steps is weights, gradients and optimizer state; the rest of the peak is
  // the step's activations and temporaries (what sequence parallelism and recomputation shrink).
  const mem = nt.memoryStats(device), MiB = 2 ** 20;
  log(`peak ${device} memory in training on rank 0: ${(mem.peak / MiB).toFixed(1)} MiB ` +
    `(${(mem.allocated / MiB).toFixed(1)} MiB held between steps, ${((mem.peak - mem.allocated) / MiB).toFixed(1)} MiB above it)`);

  const newTokens = (o.generate as number | undefined) ?? 60;
  // Sampling needs every layer in this process; a tensor-parallel group samples together (generate gathers the logits).
  // Under ZeRO 3 each rank holds a shard: every rank gathers the parameters (collective) into a plain copy to sample from.
  const sampleFrom = layout.zero === 3 && model.model && newTokens > 0 ? await gatheredCopy() : model.model;
  if (newTokens > 0 && sampleFrom && (par.rank === 0 || layout.tp > 1)) {
    const enc = gpt2Encoder();
    const prompt = enc.encode('Call me Ishmael.');
    const idx = nt.tensor(Int32Array.from(prompt), [1, prompt.length], { device });
    const [out] = sampleFrom.generate(idx, newTokens, { temperature: 0.8, topK: 40, seed });
    idx.dispose();
    log(`--- sample ---\n${enc.decode(out!.filter((id) => id < GPT2_VOCAB_SIZE))}\n---`);
  } else if (newTokens > 0 && !sampleFrom) {
    log('(no sample: generation needs every layer in one process, and this layout splits them into pipeline stages)');
  }
  if (o['export-hf']) {
    const whole = layout.zero === 3 && model.model ? await gatheredCopy() : model.model;
    if (whole && layout.tp === 1 && par.rank === 0) {
      nt.interop.exportHF(whole, o['export-hf'] as string);
      log(`exported the model to ${o['export-hf'] as string} (Hugging Face GPT-2 layout)`);
    } else if (par.rank === 0) log('(no export: --export-hf needs the whole model in one process: no --pp or --tp)');
    if (whole !== model.model) whole?.dispose();
  }
  if (sampleFrom !== model.model) sampleFrom?.dispose();

  async function gatheredCopy(): Promise<nt.nn.GPT> {
    const values = await trainer.fullParameters();
    const copy = new nt.nn.GPT(config, { seed, device, ...tensorParallel });
    copy.loadStateDict(Object.fromEntries(model.namedParameters().map(([n], i) => [n, values[i]!])));
    for (const v of values) v.dispose();
    return copy;
  }
  trainer.dispose();
  model.dispose();
  if (mesh) await nt.distributed.destroy();
  return 0;
}

main(process.argv.slice(2)).then((code) => { process.exitCode = code; }, (e) => { console.error(e); process.exitCode = 1; });
