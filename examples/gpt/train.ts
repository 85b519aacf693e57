// Trains a small GPT-2 (or, with --model llama, a small Llama) on Moby-Dick with nodetron: GPT-2 BPE token shards, AdamW with a cosine schedule and
// gradient clipping, periodic validation loss beside the unigram level (the best context-free model), a
// fixed number of steps or as many as a time budget allows, and at the end the loss curve (terminal plot,
// and loss.svg under --out) and a generated sample with the share of its words found in the training text.
// One process, or any tensor × pipeline × data-parallel layout (micro-batches, ZeRO 1/2/3) under
// `nodetron launch`: nt.train.setup reads the layout flags and wires the model, trainer, data loader and
// checkpoints. `npm run demo` (scripts/demo.mjs) holds the demo's settings.
// Run: npx tsx examples/gpt/train.ts [--steps 200 | --time-budget 180] [--out DIR] [--device cpu|cuda] [--save DIR --resume auto] [--help]
//      node bin/nodetron.js launch --nproc-per-node 2 examples/gpt/train.ts --dp 2 --zero 1
//      node bin/nodetron.js launch --nproc-per-node 4 examples/gpt/train.ts --pp 2 --dp 2 --micro-batches 4
//      node bin/nodetron.js launch --nproc-per-node 4 --spares 1 examples/gpt/train.ts --dp 2 --tp 2 --zero 3 --recover memory   (a lost rank is replaced from its peers' memory, docs/recovery.md)
//      node bin/nodetron.js launch --nproc-per-node 2 examples/gpt/train.ts --moe-experts 8 --moe-top-k 2 --ep 2
//      npx tsx examples/gpt/train.ts --model llama --kv-heads 2
//      node bin/nodetron.js launch --nproc-per-node 4 examples/gpt/train.ts --model llama --moe-experts 8 --ep 2   (a Mixtral, EP2 × DP2)
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as nt from '../../lib/index.js';
import { lineChartSvg, terminalPlot, type PlotSeries } from './plot.js';
import { datasetShards, GPT2_VOCAB_SIZE, gpt2Encoder, knownWordShare, loadShards, readTokens, unigramLevel, wordsOf } from './data.js';

// nanoGPT's padding of the GPT-2 vocabulary to a multiple of 64, 50304 (faster kernels, and a
// tensor-parallel split for any power-of-two tp up to 64); the padded ids never occur in the data.
const PADDED_VOCAB_SIZE = nt.nn.padVocab(GPT2_VOCAB_SIZE, 64);

const HELP = `usage: npx tsx examples/gpt/train.ts [options]
  --steps N            optimizer steps (default 150; with --time-budget, the most steps)
  --time-budget S      train for S seconds (from the end of set-up, validations included): the cosine
                       schedule is planned for the steps that fit, re-estimated from the step times
                       as training goes, and training stops at the deadline
  --warmup N           learning-rate warm-up steps (default 10% of --steps; 20 with --time-budget)
  --batch B            sequences per step, over all data-parallel ranks (default 8)
  --ctx T              context length (default 64)
  --layers L --heads H --width C   model shape (default 2, 4, 128)
  --model gpt|llama    GPT-2 blocks (default) or Llama blocks (RMSNorm, rotary embeddings, SwiGLU,
                       grouped-query attention, untied head, no biases)
  --kv-heads K         Llama: key/value heads (default: --heads; 1 is multi-query)
  --ffn F              Llama: MLP hidden units (default: 8/3 of the width, rounded up to a multiple of 32)
  --rope-theta X       Llama: base of the rotary angles (default 10000)
  --lr X               peak learning rate (default 3e-3; cosine to lr/10 after the warm-up)
  --weight-decay X     AdamW weight decay (default 0.1)
  --seed N             initialization and data seed (default 1337)
  --eval-interval N    steps between validation losses (default 50)
  --eval-batches N     batches per validation loss (default 4)
  --device D           cpu | cuda | cuda:N (default cpu)
  --parallel-block     MegaScale parallel attention+MLP block
  --window W           sliding-window attention over W positions
  --moe-experts E      mixture of experts in the MLP slot (E SwiGLU experts; --ep N splits them over ranks);
                       with --model llama a Mixtral (or, with --moe-shared, a Qwen2-MoE: gated shared expert)
  --moe-top-k K        experts per token (default 2)    --moe-every N   MoE in every N-th block (default 1)
  --moe-hidden H       expert hidden width (default 4·width; Llama: --ffn)    --moe-shared S   shared experts (default 0)
  --moe-capacity F     capacity factor (drops overflow; default: dropless; GPT only)
  --moe-aux X --moe-z X   load-balancing and router z-loss coefficients (default 0.01 and 0.001)
  --generate N         tokens to generate at the end (default 60)
  --prompt TEXT        the sample's prompt (default "Call me Ishmael.")
  --temperature X --top-k K   sampling (default 0.8 and 40)
  --out DIR            write the loss curve there (loss.svg, losses.json)
  --data DIR           train on the shards \`nodetron data tokenize\` wrote in DIR (*_train_*.bin, and
                       *_val_*.bin for validation) instead of the bundled Moby-Dick
  --progress-every N   steps between progress lines (default 10)
  --peak-flops X       peak FLOP/s per process for the MFU column (default: detected on known GPUs)
Checkpoints (sharded: one file per rank; loadable under any other layout):
  --save DIR           save checkpoints under DIR (DIR/step-N/), in the background while training goes on
  --save-every N       steps between checkpoints (default 50; the last step is always saved)
  --keep K             complete checkpoints kept (default 3)
  --resume auto|DIR    start from the newest complete checkpoint under DIR (auto: under --save);
                       a damaged one is skipped for the one before it; none found: start fresh
  --export-hf DIR      at the end, write the model as a Hugging Face directory (model.safetensors +
                       config.json: GPT-2, or for --model llama LlamaForCausalLM, MixtralForCausalLM or
                       Qwen2MoeForCausalLM, loadable by transformers' from_pretrained)
${nt.train.LAYOUT_HELP}
  (the example pads the vocabulary to ${PADDED_VOCAB_SIZE}, so any power-of-two --tp up to 64 divides it)`;

void nt.train.main('train.ts', async () => {
  const { options: o, layout } = nt.train.parseArgs(process.argv.slice(2), {
    steps: 'number', batch: 'number', ctx: 'number', layers: 'number', heads: 'number', width: 'number', lr: 'number',
    'weight-decay': 'number', seed: 'number', 'eval-interval': 'number', 'eval-batches': 'number', device: 'string',
    'parallel-block': 'boolean', window: 'number', generate: 'number', help: 'boolean', 'progress-every': 'number', 'peak-flops': 'number',
    save: 'string', 'save-every': 'number', keep: 'number', resume: 'string', 'export-hf': 'string', data: 'string',
    'time-budget': 'number', warmup: 'number', out: 'string', prompt: 'string', temperature: 'number', 'top-k': 'number',
    'moe-experts': 'number', 'moe-top-k': 'number', 'moe-every': 'number', 'moe-hidden': 'number', 'moe-shared': 'number', 'moe-capacity': 'number',
    'moe-aux': 'number', 'moe-z': 'number',
    model: 'string', 'kv-heads': 'number', ffn: 'number', 'rope-theta': 'number',
  });
  if (o.help) { console.log(HELP); return 0; }
  const num = (name: string, fallback: number) => (o[name] as number | undefined) ?? fallback;
  const str = (name: string) => o[name] as string | undefined;
  const budget = o['time-budget'] as number | undefined;
  if (budget !== undefined && !(budget > 0)) throw new nt.ArgumentError(`--time-budget must be a number of seconds > 0, got ${budget}`);
  const steps = num('steps', budget ? 1_000_000 : 150), ctx = num('ctx', 64), maxLr = num('lr', 3e-3), device = str('device') ?? 'cpu';
  const warmup = num('warmup', budget ? Math.min(20, steps) : Math.max(1, Math.floor(steps / 10)));
  const config: nt.nn.GPTConfig = {
    vocabSize: PADDED_VOCAB_SIZE, blockSize: ctx, nLayer: num('layers', 2), nHead: num('heads', 4), nEmbd: num('width', 128),
    dropout: 0, bias: true, parallelBlock: Boolean(o['parallel-block']), ...(o.window !== undefined ? { window: o.window as number } : {}),
  };
  if (o['moe-experts'] !== undefined) {
    const opt = (name: string) => o[name] as number | undefined;
    config.moe = {
      experts: o['moe-experts'] as number, topK: num('moe-top-k', 2), every: num('moe-every', 1),
      ...(opt('moe-hidden') !== undefined ? { hidden: opt('moe-hidden') } : {}), ...(opt('moe-shared') !== undefined ? { sharedExperts: opt('moe-shared') } : {}),
      ...(opt('moe-capacity') !== undefined ? { capacityFactor: opt('moe-capacity') } : {}),
      ...(opt('moe-aux') !== undefined ? { auxLossCoef: opt('moe-aux') } : {}), ...(opt('moe-z') !== undefined ? { zLossCoef: opt('moe-z') } : {}),
    };
  }
  const family = str('model') ?? 'gpt';
  if (family !== 'gpt' && family !== 'llama') throw new nt.ArgumentError(`--model must be gpt or llama, got ${family}`);
  if (family === 'gpt' && config.moe && str('export-hf')) throw new nt.ArgumentError('--export-hf writes a Hugging Face GPT-2 directory, which has no experts: leave it out with --moe-experts (or train --model llama, which exports as Mixtral or Qwen2-MoE)');
  if (family === 'llama' && o['moe-capacity'] !== undefined) throw new nt.ArgumentError('--moe-capacity: a Llama\'s MoE blocks (Mixtral, Qwen2-MoE) route dropless; leave it out with --model llama');
  const width = config.nEmbd;
  const ffn = num('ffn', Math.ceil((8 * width) / 3 / 32) * 32);
  const moe = config.moe;
  const llamaConfig: nt.nn.LlamaConfig = {
    vocabSize: PADDED_VOCAB_SIZE, maxPositionEmbeddings: ctx, numHiddenLayers: config.nLayer, numAttentionHeads: config.nHead, hiddenSize: width,
    numKeyValueHeads: num('kv-heads', config.nHead), intermediateSize: ffn, ropeTheta: num('rope-theta', 10000),
    // --moe-*: Mixtral (every block, no shared expert) or Qwen2-MoE (--moe-shared S: a gated shared expert of S experts' width; --moe-every N).
    ...(moe ? {
      numLocalExperts: moe.experts, numExpertsPerTok: moe.topK, moeIntermediateSize: moe.hidden ?? ffn, decoderSparseStep: moe.every ?? 1,
      sharedExpertIntermediateSize: (moe.sharedExperts ?? 0) * (moe.hidden ?? ffn), routerAuxLossCoef: moe.auxLossCoef ?? 0.01, routerZLossCoef: moe.zLossCoef ?? 0.001,
    } : {}),
  };
  const build = (shard: nt.train.ModelShard) => (family === 'llama' ? new nt.nn.Llama(llamaConfig, shard) : new nt.nn.GPT(config, shard));
  const shards = str('data') ? datasetShards(str('data')!) : loadShards((process.env.RANK ?? '0') === '0' ? console.log : () => {});

  // Under a time budget the number of steps is what fits: `planned` starts at the most allowed and is
  // re-estimated from the measured step times; the cosine runs to it.
  const started = performance.now();
  const elapsed = () => (performance.now() - started) / 1000;
  let planned = steps;
  const lr: nt.train.LearningRate = budget
    ? (step: number) => nt.optim.cosineWithWarmup(step, { warmup, maxSteps: Math.max(planned, warmup), maxLr, minLr: maxLr / 10 })
    : { warmup, maxLr, minLr: maxLr / 10 };
  let estimated = false;
  const log = (line: string) => console.log(budget && / tok\/s/.test(line)
    ? `${line}  (${nt.train.formatDuration(budget - elapsed())} of the budget left${estimated ? `, ~${planned} steps in all` : ''})` : line);

  const run = await nt.train.setup({
    model: build, layout, batchSize: num('batch', 8), ...(budget ? {} : { steps }), seed: num('seed', 1337), device, maxGradNorm: 1.0,
    optimizer: (groups) => new nt.optim.AdamW(groups, { lr: maxLr, betas: [0.9, 0.95], weightDecay: num('weight-decay', 0.1) }),
    lr,
    data: { train: shards.train, val: shards.val, evalEvery: num('eval-interval', 50), evalBatches: num('eval-batches', 4) },
    checkpoint: { dir: str('save'), every: num('save-every', 50), keep: num('keep', 3), resume: str('resume') },
    progress: { every: num('progress-every', 10), log, ...(o['peak-flops'] ? { peakFlops: o['peak-flops'] as number } : {}) },
  });
  run.log(`${shards.trainTokens} train / ${shards.valTokens} val tokens`);
  // The bar to clear: a model that ignores context can do no better than the token frequencies (counted
  // on the first 50M training tokens of a large dataset, and scored on the first 5M validation tokens).
  // Counted by the rank that prints, when it first needs them (under --recover memory a shrunk job's rank 0
  // may be another process than at the start).
  let trainIds: Uint16Array = new Uint16Array(0), unigram: ReturnType<typeof unigramLevel> | undefined;
  const countUnigram = () => {
    if (!run.isLogger || unigram) return;
    trainIds = readTokens(shards.train, 50e6);
    unigram = unigramLevel(trainIds, readTokens(shards.val, 5e6), GPT2_VOCAB_SIZE);
  };
  countUnigram();
  if (unigram) {
    run.log(`unigram level (token frequencies of the training split${trainIds.length < shards.trainTokens ? `'s first ${trainIds.length} tokens` : ''}, no context): ` +
      `${unigram.valCrossEntropy.toFixed(4)} nats on val, entropy ${unigram.trainEntropy.toFixed(4)} on train`);
  }
  // The loss curves are the run's history (run.history: every step's loss and every validation), which
  // under --recover memory goes back with a lost rank's state, so a replaced rank 0 writes the whole record.
  // The cost of one validation, kept back from the budget for the one after the last step.
  let evalSeconds = 0;
  // (A rank that joined a running job, --recover memory, skips what the others did before it came.)
  if (run.stepsDone === 0 && !run.joined) {
    const t0 = performance.now();
    const v = await run.evaluate();
    evalSeconds = (performance.now() - t0) / 1000;
    run.log(`step 0: val loss ${v.toFixed(4)} (uniform would be ${Math.log(GPT2_VOCAB_SIZE).toFixed(4)})`);
  }
  const first = run.stepsDone, trainStart = elapsed();
  let last: nt.train.StepResult | undefined;
  while (run.stepsDone < planned) {
    last = await run.step();
    if (budget) {
      // Seconds per step so far, the periodic validations included; the steps that fit in what is left,
      // less the final validation and half a step of slack for a step slower than the average.
      const spent = elapsed(), done = run.stepsDone - first, perStep = (spent - trainStart) / done;
      const fit = Math.floor((budget - spent - evalSeconds) / perStep - 0.5);
      if (fit <= 0) planned = run.stepsDone;
      else if (done >= 3) { planned = Math.min(steps, run.stepsDone + fit); estimated = true; }
      // The ranks of a layout must stop together: rank 0's plan (its clock, its measured validation) is everyone's.
      if (run.mesh && run.worldSize > 1) planned = (await nt.distributed.rangeAcrossRanks(run.mesh.world, [run.rank === 0 ? planned : 0]))?.max[0] ?? planned;
    }
  }
  if (last && last.valLoss === undefined && run.stepsDone > first) {
    const v = await run.evaluate();
    run.log(`step ${run.stepsDone}: val loss ${v.toFixed(4)}`);
  }
  if (budget && str('save') && last && !last.saved) await run.save();
  if (budget) run.log(`trained ${run.stepsDone - first} steps in ${elapsed().toFixed(1)} s (budget ${budget} s)`);

  // What stays allocated between steps is weights, gradients and optimizer state; the rest of the peak is
  // the step's activations and temporaries (what sequence parallelism and recomputation shrink).
  const mem = nt.memoryStats(device), MiB = 2 ** 20;
  run.log(`peak ${device} memory in training on rank 0: ${(mem.peak / MiB).toFixed(1)} MiB ` +
    `(${(mem.allocated / MiB).toFixed(1)} MiB held between steps, ${((mem.peak - mem.allocated) / MiB).toFixed(1)} MiB above it)`);

  countUnigram();
  const trainCurve = run.history.train.map(([s, l]) => [s, l] as [number, number]);
  const valCurve = run.history.val.map(([s, l]) => [s, l] as [number, number]);
  if (run.isLogger && unigram && trainCurve.length > 1) {
    const series: PlotSeries[] = [{ name: 'train loss', points: trainCurve }, { name: 'val loss', points: valCurve, marker: '●' }];
    const plot = { xLabel: 'step', yLabel: 'loss (nats/token)', references: [{ y: unigram.valCrossEntropy, label: 'unigram level' }] };
    run.log(`\n${terminalPlot(series, { ...plot, title: 'loss' })}\n`);
    const out = str('out');
    if (out) {
      mkdirSync(out, { recursive: true });
      const c = config;
      writeFileSync(join(out, 'loss.svg'), lineChartSvg(series, { ...plot, title: `${family === 'llama' ? 'Llama' : 'GPT'} ${c.nLayer}×${c.nEmbd}, ctx ${ctx}, on Moby-Dick: loss per step` }));
      writeFileSync(join(out, 'losses.json'), `${JSON.stringify({ model: family, config: family === 'llama' ? llamaConfig : c, batch: num('batch', 8), unigram, train: trainCurve, val: valCurve }, null, 1)}\n`);
      run.log(`wrote ${join(out, 'loss.svg')} and losses.json`);
    }
  }
  const finalVal = valCurve.at(-1);
  if (unigram && finalVal && finalVal[0] > 0) {
    const gap = unigram.valCrossEntropy - finalVal[1];
    run.log(`final val loss ${finalVal[1].toFixed(4)}: ${Math.abs(gap).toFixed(3)} nats ${gap >= 0 ? 'below' : 'above'} the unigram level ${unigram.valCrossEntropy.toFixed(4)} ` +
      `(perplexity ${Math.exp(finalVal[1]).toFixed(0)} against ${Math.exp(unigram.valCrossEntropy).toFixed(0)})`);
  }

  const newTokens = num('generate', 60);
  if (newTokens > 0) {
    // Collective: a tensor-parallel group samples together, ZeRO 3 gathers the parameters first.
    const prompt = str('prompt') ?? 'Call me Ishmael.';
    const out = await run.generate(gpt2Encoder().encode(prompt), newTokens, { temperature: num('temperature', 0.8), topK: num('top-k', 40) });
    if (out) {
      const text = gpt2Encoder().decode(out.filter((id) => id < GPT2_VOCAB_SIZE));
      run.log(`--- sample ---\n${text}\n---`);
      if (run.isLogger) {
        // The words of the training text (its first 2M tokens for a large dataset).
        const known = knownWordShare(text.slice(prompt.length), new Set(wordsOf(gpt2Encoder().decode(Array.from(trainIds.subarray(0, 2e6))))));
        run.log(`${(100 * known.share).toFixed(0)}% of the sample's ${known.words} generated words occur in the training text` +
          (known.unknown.length ? ` (not found: ${known.unknown.slice(0, 8).join(', ')})` : ''));
      }
    } else if (run.layout.pp > 1) run.log('(no sample: generation needs every layer in one process, and this layout splits them into pipeline stages)');
  }
  const hf = str('export-hf');
  if (hf) {
    const layoutName = family === 'llama' ? nt.interop.llamaHFArchitecture(nt.nn.llamaConfig(llamaConfig)) : 'GPT-2';
    run.log(await run.exportHF(hf) ? `exported the model to ${hf} (Hugging Face ${layoutName} layout)` : '(no export: --export-hf needs the whole model in one process: no --pp, --tp or --ep)');
  }
  await run.close();
  return 0;
});
