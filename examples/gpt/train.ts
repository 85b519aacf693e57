// Trains a small GPT-2 on Moby-Dick with nodetron: GPT-2 BPE token shards, AdamW with a cosine schedule and
// gradient clipping, periodic validation loss, and a few generated lines at the end. One process, or
// any tensor × pipeline × data-parallel layout (micro-batches, ZeRO 1/2/3) under `nodetron launch`:
// nt.train.setup reads the layout flags and wires the model, trainer, data loader and checkpoints.
// Run: npx tsx examples/gpt/train.ts [--steps 200] [--device cpu|cuda] [--save DIR --resume auto] [--help]
//      node bin/nodetron.js launch --nproc-per-node 2 examples/gpt/train.ts --dp 2 --zero 1
//      node bin/nodetron.js launch --nproc-per-node 4 examples/gpt/train.ts --pp 2 --dp 2 --micro-batches 4
import * as nt from '../../lib/index.js';
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
  --parallel-block     MegaScale parallel attention+MLP block
  --window W           sliding-window attention over W positions
  --generate N         tokens to generate at the end (default 60)
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
  --export-hf DIR      at the end, write the model as a Hugging Face GPT-2 directory (model.safetensors +
                       config.json, loadable by transformers' GPT2LMHeadModel.from_pretrained)
${nt.train.LAYOUT_HELP}
  (the example pads the vocabulary to ${PADDED_VOCAB_SIZE}, so any power-of-two --tp up to 64 divides it)`;

void nt.train.main('train.ts', async () => {
  const { options: o, layout } = nt.train.parseArgs(process.argv.slice(2), {
    steps: 'number', batch: 'number', ctx: 'number', layers: 'number', heads: 'number', width: 'number', lr: 'number',
    'weight-decay': 'number', seed: 'number', 'eval-interval': 'number', 'eval-batches': 'number', device: 'string',
    'parallel-block': 'boolean', window: 'number', generate: 'number', help: 'boolean', 'progress-every': 'number', 'peak-flops': 'number',
    save: 'string', 'save-every': 'number', keep: 'number', resume: 'string', 'export-hf': 'string', data: 'string',
  });
  if (o.help) { console.log(HELP); return 0; }
  const num = (name: string, fallback: number) => (o[name] as number | undefined) ?? fallback;
  const str = (name: string) => o[name] as string | undefined;
  const steps = num('steps', 150), ctx = num('ctx', 64), maxLr = num('lr', 3e-3), device = str('device') ?? 'cpu';
  const config: nt.nn.GPTConfig = {
    vocabSize: PADDED_VOCAB_SIZE, blockSize: ctx, nLayer: num('layers', 2), nHead: num('heads', 4), nEmbd: num('width', 128),
    dropout: 0, bias: true, parallelBlock: Boolean(o['parallel-block']), ...(o.window !== undefined ? { window: o.window as number } : {}),
  };
  const shards = str('data') ? datasetShards(str('data')!) : loadShards((process.env.RANK ?? '0') === '0' ? console.log : () => {});

  const run = await nt.train.setup({
    model: (shard) => new nt.nn.GPT(config, shard), layout, batchSize: num('batch', 8), steps, seed: num('seed', 1337), device, maxGradNorm: 1.0,
    optimizer: (groups) => new nt.optim.AdamW(groups, { lr: maxLr, betas: [0.9, 0.95], weightDecay: num('weight-decay', 0.1) }),
    lr: { warmup: Math.max(1, Math.floor(steps / 10)), maxLr, minLr: maxLr / 10 },
    data: { train: shards.train, val: shards.val, evalEvery: num('eval-interval', 50), evalBatches: num('eval-batches', 4) },
    checkpoint: { dir: str('save'), every: num('save-every', 50), keep: num('keep', 3), resume: str('resume') },
    progress: { every: num('progress-every', 10), ...(o['peak-flops'] ? { peakFlops: o['peak-flops'] as number } : {}) },
  });
  run.log(`${shards.trainTokens} train / ${shards.valTokens} val tokens`);
  if (run.stepsDone === 0) run.log(`step 0: val loss ${(await run.evaluate()).toFixed(4)} (uniform would be ${Math.log(GPT2_VOCAB_SIZE).toFixed(4)})`);
  while (run.stepsDone < steps) await run.step();

  // What stays allocated between steps is weights, gradients and optimizer state; the rest of the peak is
  // the step's activations and temporaries (what sequence parallelism and recomputation shrink).
  const mem = nt.memoryStats(device), MiB = 2 ** 20;
  run.log(`peak ${device} memory in training on rank 0: ${(mem.peak / MiB).toFixed(1)} MiB ` +
    `(${(mem.allocated / MiB).toFixed(1)} MiB held between steps, ${((mem.peak - mem.allocated) / MiB).toFixed(1)} MiB above it)`);

  const newTokens = num('generate', 60);
  if (newTokens > 0) {
    // Collective: a tensor-parallel group samples together, ZeRO 3 gathers the parameters first.
    const out = await run.generate(gpt2Encoder().encode('Call me Ishmael.'), newTokens, { temperature: 0.8, topK: 40 });
    if (out) run.log(`--- sample ---\n${gpt2Encoder().decode(out.filter((id) => id < GPT2_VOCAB_SIZE))}\n---`);
    else if (run.layout.pp > 1) run.log('(no sample: generation needs every layer in one process, and this layout splits them into pipeline stages)');
  }
  const hf = str('export-hf');
  if (hf) run.log(await run.exportHF(hf) ? `exported the model to ${hf} (Hugging Face GPT-2 layout)` : '(no export: --export-hf needs the whole model in one process: no --pp or --tp)');
  await run.close();
  return 0;
});
