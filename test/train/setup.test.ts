// nt.train.setup, the one entry point: its losses equal the hand-wired ParallelTrainer path (one
// process, and DP2 ZeRO-1 and TP2 through the launcher), the layout comes from the command line or
// NODETRON_* variables, a resumed run continues from its checkpoint exactly, progress prints on rank 0
// only, and bad input fails with clear errors (on every rank under the launcher).
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';
import { CONFIG, createOptimizer, GLOBAL_BATCH, globalBatch, lrAt, MAX_GRAD_NORM, SEED, trainHandWired } from '../fixtures/train/setup-train.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const script = join(root, 'test', 'fixtures', 'train', 'setup-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-train-setup-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const RUN_LIMIT_MS = 240_000;
const pool = new JobPool();

interface Result { rank: number; layout: nt.parallel.TrainingLayout; losses: number[]; gradNorms: number[] }

function launch(name: string, nproc: number, args: string[], env: NodeJS.ProcessEnv = {}) {
  const out = join(work, name);
  return pool.run(async () => {
    const r = await runProcess(process.execPath, [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(script), '--out', out, ...args],
      { cwd: root, limitMs: RUN_LIMIT_MS, env: { ...process.env, ...env } });
    const results: Result[] = r.code !== 0 ? [] : Array.from({ length: nproc }, (_, k) => JSON.parse(readFileSync(join(out, `result-${k}.json`), 'utf8')) as Result);
    return { ...r, results };
  });
}

const quiet = { progress: false as const };

describe('CausalLM.shape carries what the layout checks read', () => {
  it('a GPT\'s window, dropout and experts, and the experts of a Llama\'s MoE layers; the same errors for both', () => {
    const moe: nt.nn.MoEConfig = { experts: 4, topK: 2, hidden: 24 };
    const llamaConfig: nt.nn.LlamaConfig = { vocabSize: 64, maxPositionEmbeddings: 16, numHiddenLayers: 2, numAttentionHeads: 2, hiddenSize: 32, intermediateSize: 48 };
    const gpt = new nt.nn.GPT({ ...CONFIG, window: 4, dropout: 0.1, moe });
    const gptMoE = new nt.nn.GPT({ ...CONFIG, moe });
    const llama = new nt.nn.Llama(llamaConfig);
    const llamaMoE = new nt.nn.Llama(llamaConfig, { mlp: (c, { layer }) => new nt.nn.MoE(c.hiddenSize, moe, layer) });
    try {
      expect(gpt.shape).toMatchObject({ window: 4, dropout: 0.1, moeExperts: 4 });
      expect(new nt.nn.GPT(CONFIG).shape).not.toHaveProperty('moeExperts');
      expect(llama.shape).not.toHaveProperty('moeExperts');
      expect(llama.shape).not.toHaveProperty('window');
      expect(llamaMoE.shape.moeExperts).toBe(4);
      // Both families, same dimensions, same experts: the same problems, word for word.
      for (const flags of [{ ep: 3, dp: 3 }, { cp: 2 }, { tp: 2, sequenceParallel: true }]) {
        const problemOf = (m: nt.nn.CausalLM) => { try { nt.parallel.resolveTrainingLayout(flags, m.shape, 3 * (flags.cp ?? 1), 6); return null; } catch (e) { return (e as Error).message; } };
        expect(problemOf(llamaMoE), JSON.stringify(flags)).toMatch(/experts|MoE layers/);
        expect(problemOf(llamaMoE)).toBe(problemOf(gptMoE));
      }
      expect(() => nt.parallel.resolveTrainingLayout({ ep: 2 }, llama.shape, 2, 4)).toThrow(/--ep 2 splits MoE experts over ranks, but the model has no MoE layers/);
    } finally {
      for (const m of [gpt, gptMoE, llama, llamaMoE]) m.dispose();
    }
  });
});

describe('layout flags', () => {
  it('come from the command line over NODETRON_* variables', () => {
    expect(nt.train.layoutFromArgs(['--steps', '5', '--tp', '2', '--sp', '--micro-batches=4', '--schedule', 'gpipe', '--recompute'], {}))
      .toEqual({ tp: 2, microBatches: 4, schedule: 'gpipe', sequenceParallel: true, recompute: true });
    expect(nt.train.layoutFromArgs(['--zero', '1'], { NODETRON_DP: '2', NODETRON_ZERO: '3', NODETRON_OFFLOAD: 'yes', NODETRON_PP: '' }))
      .toEqual({ dp: 2, zero: 1, offload: true });
    expect(() => nt.train.layoutFromArgs(['--tp', 'x'], {})).toThrow(/--tp needs a number, got "x"/);
    expect(() => nt.train.layoutFromArgs(['--tp'], {})).toThrow(/--tp needs a value/);
    expect(() => nt.train.layoutFromArgs([], { NODETRON_SP: 'maybe' })).toThrow(/NODETRON_SP="maybe" must be 1\/true/);
  });

  it('parseArgs: the script\'s options and the layout together; unknown flags are errors naming the known ones', () => {
    const { options, layout } = nt.train.parseArgs(['--steps', '7', '--pp', '2', 'x'], { steps: 'number' }, { NODETRON_TP: '2' });
    expect(options).toEqual({ _: ['x'], steps: 7 });
    expect(layout).toEqual({ tp: 2, pp: 2 });
    expect(() => nt.train.parseArgs(['--stpes', '7'], { steps: 'number' }, {})).toThrow(/unknown option --stpes \(known options: --steps --tp --pp/);
    expect(() => nt.train.parseArgs([], { tp: 'number' }, {})).toThrow(/--tp is a layout flag/);
  });
});

describe('progress arithmetic', () => {
  it('counts a GPT\'s parameters and model FLOPs', () => {
    for (const config of [CONFIG, { ...CONFIG, bias: false, parallelBlock: true }]) {
      const gpt = new nt.nn.GPT(config);
      expect(nt.nn.gptParameterCount(config)).toBe(gpt.numParameters());
      gpt.dispose();
    }
    const n = nt.nn.gptParameterCount(CONFIG) - CONFIG.blockSize * CONFIG.nEmbd;
    expect(nt.nn.gptFlopsPerToken(CONFIG, 16)).toBe(6 * n + 12 * 2 * 32 * 16);
    expect(nt.nn.gptFlopsPerToken({ ...CONFIG, window: 4 }, 16)).toBe(6 * n + 12 * 2 * 32 * 4);
    expect(nt.train.detectPeakFlops('cpu')).toBeUndefined();
    expect(nt.train.formatProgress({ step: 10, steps: 150, loss: 5.12345, avgLoss: 5.3, gradNorm: 1.234, lr: 3e-3, tokensPerSecond: 1234.4, mfu: 0.412, peakBytes: 2 ** 20 * 123.4, etaSeconds: 65 }))
      .toBe('step   10/150  loss 5.1235 (avg 5.3000)  norm 1.23  lr 3.00e-3  | 1234 tok/s  MFU 41.2%  mem 123.4 MiB  ETA 1m05s');
  });
});

describe('nt.train.setup in one process', () => {
  it('trains to the hand-wired ParallelTrainer path\'s losses bit for bit; progress lines and MFU with a given peak', async () => {
    const lines: string[] = [];
    const run = await nt.train.setup({
      model: (shard) => new nt.nn.GPT(CONFIG, shard), optimizer: createOptimizer, batchSize: GLOBAL_BATCH, seed: SEED, steps: 3,
      maxGradNorm: MAX_GRAD_NORM, lr: lrAt, layout: {}, progress: { every: 2, peakFlops: 1e12, log: (l) => lines.push(l) },
    });
    const losses: number[] = [];
    for (let step = 0; step < 3; step++) {
      const batch = globalBatch(step);
      losses.push((await run.step(batch)).loss);
      batch.inputs.dispose(); batch.targets.dispose();
    }
    await run.close();
    const hand = await trainHandWired({}, 3);
    expect(losses).toEqual(hand.losses);
    const progress = lines.filter((l) => l.startsWith('step'));
    expect(progress.map((l) => l.slice(0, 11))).toEqual(['step    1/3', 'step    3/3']);
    expect(progress[1]).toMatch(/tok\/s {2}MFU \d+\.\d+% {2}mem \d+\.\d MiB {2}ETA 0s$/);
  }, 120_000);

  it('a resumed run continues from its checkpoint: the same losses as an uninterrupted one', async () => {
    const shards = join(work, 'shards');
    mkdirSync(shards, { recursive: true });
    const tokens = Uint16Array.from({ length: 4000 }, (_, i) => (i * 7 + (i >> 3)) % 64);
    nt.data.writeTokenShard(join(shards, 'tok_train_000001.bin'), tokens.slice(0, 3500));
    nt.data.writeTokenShard(join(shards, 'tok_val_000000.bin'), tokens.slice(3500));
    const data = { train: [join(shards, 'tok_train_000001.bin')], val: [join(shards, 'tok_val_000000.bin')], evalBatches: 2 };
    const options = (steps: number, checkpoint?: nt.train.CheckpointOptions) => ({
      model: (shard: nt.train.ModelShard) => new nt.nn.GPT({ ...CONFIG, dropout: 0.1 }, shard), optimizer: createOptimizer, batchSize: GLOBAL_BATCH, seed: SEED,
      steps, maxGradNorm: MAX_GRAD_NORM, lr: { warmup: 1, maxLr: 1e-2, minLr: 1e-3 }, data, layout: {}, ...quiet, ...(checkpoint ? { checkpoint } : {}),
    });
    const whole = await nt.train.setup(options(4));
    const expected: number[] = [];
    while (whole.stepsDone < 4) expected.push((await whole.step()).loss);
    const expectedVal = await whole.evaluate();
    await whole.close();

    const dir = join(work, 'ckpt');
    const first = await nt.train.setup(options(4, { dir, every: 2 }));
    const got = [(await first.step()).loss, (await first.step()).loss];
    await first.close();  // "crashes" after the checkpoint of step 2
    expect(nt.ckpt.listCheckpoints(dir).map((c) => c.step)).toEqual([2]);
    expect(nt.ckpt.readManifest(join(dir, 'step-00000002')).state).toMatchObject({ loader: { batch: 2 }, scheduler: { step: 2 } });

    const lines: string[] = [];
    const second = await nt.train.setup({ ...options(4, { dir, every: 2, resume: 'auto' }), progress: { log: (l) => lines.push(l) } });
    expect(second.stepsDone).toBe(2);
    expect(lines.join('\n')).toMatch(/resumed from .*step-00000002 \(step 2\)/);
    while (second.stepsDone < 4) got.push((await second.step()).loss);
    expect(got).toEqual(expected);
    expect(await second.evaluate()).toBe(expectedVal);
    const sample = await second.generate([1, 2, 3], 4, { temperature: 0.8, topK: 5 });
    expect(sample).toHaveLength(7);
    await second.close();
    expect(nt.ckpt.listCheckpoints(dir).map((c) => c.step)).toEqual([4, 2]);
  }, 120_000);

  it('rejects bad input with clear errors', async () => {
    const base = { model: (shard: nt.train.ModelShard) => new nt.nn.GPT(CONFIG, shard), optimizer: createOptimizer, batchSize: GLOBAL_BATCH, ...quiet };
    await expect(nt.train.setup({ ...base, layout: { tp: 2 } })).rejects.toThrow(/tp·pp·dp = 2·1·1 = 2 but the job has 1 processes/);
    await expect(nt.train.setup({ ...base, argv: ['--zero', '1'] })).rejects.toThrow(/--zero 1 shards over the data-parallel ranks, but dp = 1/);
    await expect(nt.train.setup({ ...base, argv: ['--schedule', 'zigzag'] })).rejects.toThrow(/--schedule must be gpipe, 1f1b, interleaved, zb-h1, zb-v, got zigzag/);
    await expect(nt.train.setup({ ...base, argv: ['--virtual-stages', '2', '--micro-batches', '2'] })).rejects.toThrow(/--schedule interleaved needs --pp >= 2/);
    // The early check (before the model exists) does not hold virtual stages against a made-up layer count.
    const early = await nt.train.setup({ ...base, argv: ['--pp', '2', '--virtual-stages', '2', '--micro-batches', '2'] }).catch((e: Error) => e);
    expect(String((early as Error).message)).toMatch(/tp·pp·dp = 1·2·1 = 2 but the job has 1 processes/);
    expect(String((early as Error).message)).not.toMatch(/model chunks/);
    await expect(nt.train.setup({ ...base, argv: ['--pp'] })).rejects.toThrow(/option --pp needs a value/);
    await expect(nt.train.setup({ ...base, layout: {}, model: () => ({}) as nt.nn.GPT })).rejects.toThrow(/the factory must return an nt\.nn\.GPT .*got Object/);
    await expect(nt.train.setup({ ...base, layout: {}, model: () => new nt.nn.GPT({ ...CONFIG, nHead: 3 }) })).rejects.toThrow(/the factory threw ArgumentError: GPTConfig: nEmbd \(32\) must be divisible by nHead \(3\)/);
    await expect(nt.train.setup({ ...base, layout: {}, batchSize: 0 })).rejects.toThrow(/batchSize .* must be an integer >= 1, got 0/);
    await expect(nt.train.setup({ ...base, layout: {}, data: { train: [join(work, 'missing.bin')] } })).rejects.toThrow(/data: .*missing\.bin/);
    await expect(nt.train.setup({ ...base, layout: {}, checkpoint: { resume: 'auto' } })).rejects.toThrow(/resume 'auto' resumes from checkpoint\.dir/);
    const run = await nt.train.setup({ ...base, layout: {} });
    await expect(run.step()).rejects.toThrow(/no batch given and the run has no data/);
    const wrong = { inputs: nt.zeros([3, 16], { dtype: 'i32' }), targets: nt.zeros([3, 16], { dtype: 'i32' }) };
    await expect(run.step(wrong)).rejects.toThrow(/a batch must be the global batch, \[4, T\]/);
    wrong.inputs.dispose(); wrong.targets.dispose();
    await run.close();
  }, 120_000);

  it('releases what it built when it fails part-way, and everything on close', async () => {
    const base = { model: (shard: nt.train.ModelShard) => new nt.nn.GPT(CONFIG, shard), optimizer: createOptimizer, batchSize: GLOBAL_BATCH, layout: {}, ...quiet };
    const live = () => nt.memoryStats().liveTensors;
    const before = live();
    // Fails after the model and the trainer are built: the token shards are missing.
    await expect(nt.train.setup({ ...base, data: { train: [join(work, 'missing.bin')] } })).rejects.toThrow(/data: .*missing\.bin/);
    expect(live()).toBe(before);
    // Fails after the whole run is built: the checkpoint to resume from is another model's.
    const dir = join(work, 'another-model');
    const other = new nt.nn.Linear(2, 2, { seed: 1 });
    await nt.ckpt.save(dir, 1, { model: other });
    other.dispose();
    await expect(nt.train.setup({ ...base, checkpoint: { resume: dir } })).rejects.toThrow(/has no 'model\//);
    expect(live()).toBe(before);
    const run = await nt.train.setup(base);
    expect(live()).toBeGreaterThan(before);
    await run.close();
    expect(live()).toBe(before);
  }, 120_000);
});

describe('nt.train.setup through the launcher', () => {
  it('DP2 ZeRO-1 (flags on the command line) and TP2 (NODETRON_TP) equal the hand-wired path; progress on rank 0 only', async () => {
    const [dpEntry, dpHand, tpEntry, tpHand] = await Promise.all([
      launch('dp-entry', 2, ['--mode', 'entry', '--zero', '1']),
      launch('dp-hand', 2, ['--mode', 'hand', '--zero', '1']),
      launch('tp-entry', 2, ['--mode', 'entry'], { NODETRON_TP: '2' }),
      launch('tp-hand', 2, ['--mode', 'hand', '--tp', '2']),
    ]);
    for (const r of [dpEntry, dpHand, tpEntry, tpHand]) expect(r.code, r.output).toBe(0);
    expect(dpEntry.results[0]!.layout).toMatchObject({ tp: 1, dp: 2, zero: 1 });
    expect(tpEntry.results[1]!.layout).toMatchObject({ tp: 2, dp: 1, zero: 0 });
    for (const [entry, hand] of [[dpEntry, dpHand], [tpEntry, tpHand]] as const) {
      for (let rank = 0; rank < 2; rank++) {
        const a = entry.results[rank]!, b = hand.results[rank]!;
        a.losses.forEach((l, i) => expect(Math.abs(l - b.losses[i]!)).toBeLessThanOrEqual(1e-6));
        a.gradNorms.forEach((g, i) => expect(Math.abs(g - b.gradNorms[i]!)).toBeLessThanOrEqual(1e-6 * Math.max(1, b.gradNorms[i]!)));
      }
      // Every step's line, from rank 0 alone.
      expect(entry.output.match(/^\[rank 0\] step +\d\/3 +loss/gm)).toHaveLength(3);
      expect(entry.output).not.toMatch(/^\[rank 1\] (step|GPT|layout)/m);
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it('bad input fails with a clear error on every rank', async () => {
    const [badModel, badLayout] = await Promise.all([
      launch('bad-model', 2, ['--mode', 'entry', '--dp', '2', '--bad-model']),
      launch('bad-layout', 2, ['--mode', 'entry', '--tp', '3']),
    ]);
    for (const r of [badModel, badLayout]) expect(r.code, r.output).not.toBe(0);
    for (const rank of [0, 1]) {
      expect(badModel.output).toMatch(new RegExp(`\\[rank ${rank}\\] setup-train\\.ts: nt\\.train\\.setup: model: the factory must return an nt\\.nn\\.GPT`));
      expect(badLayout.output).toMatch(new RegExp(`\\[rank ${rank}\\] setup-train\\.ts: nt\\.train\\.setup: training layout: .*tp·pp·dp = 3·1·1 = 3 but the job has 2 processes`));
    }
  }, QUEUED_TEST_TIMEOUT_MS);

  it('a Llama is checked by its shape as a GPT is: the same layout error, on every rank', async () => {
    // MoE layers under cp: a GPT with config.moe, and a Llama whose MLP factory builds MoE layers.
    const [gptMoE, llamaMoE] = await Promise.all([
      launch('gpt-moe-cp', 2, ['--mode', 'entry', '--cp', '2', '--model', 'gpt-moe']),
      launch('llama-moe-cp', 2, ['--mode', 'entry', '--cp', '2', '--model', 'llama-moe']),
    ]);
    const errorOf = (output: string, rank: number) => output.split('\n').find((l) => l.startsWith(`[rank ${rank}] setup-train.ts: nt.train.setup:`));
    for (const r of [gptMoE, llamaMoE]) expect(r.code, r.output).not.toBe(0);
    for (const rank of [0, 1]) {
      expect(errorOf(llamaMoE.output, rank), llamaMoE.output).toMatch(/training layout: --cp 2 with MoE layers is not supported yet/);
      expect(errorOf(llamaMoE.output, rank)).toBe(errorOf(gptMoE.output, rank));
    }
  }, QUEUED_TEST_TIMEOUT_MS);
});
