// Restoring under another layout from in-memory images (lib/ckpt/reshard-image.ts, issue #37 item 4):
// a tiny GPT trains 2 steps under layout X, every rank takes an image (takeLayoutImage, sent through
// encodeImage/decodeImage as over the network) and the job saves a disk checkpoint; layout Y is built
// anew, restores from the images (fetching only those its parts need: planned from the heads) and trains
// 3 more steps. The same Y built again and loaded from the disk checkpoint must hold the same bytes
// (an image taken after either restore hashes the same: tensors, step counts, options, generators,
// positions) and train the same losses bit for bit; both agree with one process's 5 steps within the
// layout-equivalence tolerance (1e-5 relative, as test/parallel/gpt-equivalence.test.ts). In one
// process (nodetron/testing's local ranks) for DP4 ZeRO-1 → DP2 ZeRO-1, PP2×DP2 1F1B → PP2×DP1, DP2
// ZeRO-2 → DP1 and DP1 → DP2 ZeRO-1 (growing back); DP2×TP2 ZeRO-3 → DP1×TP2 and DP4 ZeRO-3 → DP2
// ZeRO-3 need synchronous collectives (tensor parallelism, ZeRO-3's gathers), so they run through the
// launcher (test/fixtures/ckpt/reshard-image-rank.ts). f32 images restore a bf16 model (and back) with the
// disk load's conversions, bit for bit. Then the refusals: an element no image holds is a
// StateError naming the tensor and range and changes nothing, as do images without their splits and
// images of two steps.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { decodeImage, encodeImage, takeImage, type RankImage } from '../../lib/ckpt/image.js';
import type { CheckpointItems } from '../../lib/ckpt/items.js';
import { imagesNeeded, restoreFromImages, takeLayoutImage, type ImageHead } from '../../lib/ckpt/reshard-image.js';
import type { WorldGroup } from '../../lib/distributed/group.js';
import { localWorld } from '../../lib/testing/index.js';
import { lcgGlobalBatch } from '../helpers/token-batch.js';
import { bytesOf } from '../../lib/io/tensor-bytes.js';
import { relDiff, root } from '../helpers/equivalence.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';

const work = mkdtempSync(join(tmpdir(), 'nt-reshard-image-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
const GLOBAL_BATCH = 4, CTX = 16, SEED = 11, LR = 1e-2, BEFORE = 2, AFTER = 3;
const TOLERANCE = 1e-5;

interface Layout { name: string; pp: number; dp: number; zero: 0 | 1 | 2; microBatches?: number }

/** The data position and a schedule position (both restored from old rank 0's, as from disk). */
class Position implements nt.ckpt.Stateful {
  step = 0;
  state() { return { step: this.step }; }
  loadState(s: { step: number }) { this.step = s.step; }
}

/** One rank of `layout`: a GPT stage under a ParallelTrainer (a one-rank world has no mesh: the trainer runs alone). */
async function buildRank(world: WorldGroup | null, layout: Layout) {
  const mesh = world ? await nt.parallel.initializeParallel({ tp: 1, pp: layout.pp, dp: layout.dp }, { world, install: false }) : null;
  const gpt = new nt.nn.GPT(config, { seed: SEED });
  gpt.generator.manualSeed(1000 + (mesh?.dpRank ?? 0));
  const stage = new nt.parallel.pp.GPTStage(gpt, mesh?.ppRank ?? 0, layout.pp);
  const named = stage.namedParameters();
  const decay = named.filter(([n, p]) => p.ndim >= 2 && n !== 'wpe.weight').map(([, p]) => p);
  const trainer = await nt.parallel.ParallelTrainer.create(stage, [{ params: decay }, { params: named.map(([, p]) => p).filter((p) => !decay.includes(p)), weightDecay: 0 }], {
    mesh, zero: layout.zero, microBatches: layout.microBatches ?? 1, maxGradNorm: 1.0, bucketBytes: 16 * 1024,
    createOptimizer: (groups) => new nt.optim.AdamW(groups, { lr: LR, betas: [0.9, 0.95], weightDecay: 0.1 }),
  });
  const pos = new Position();
  const items: CheckpointItems = { model: trainer, loader: pos, rng: { dropout: gpt.generator } };
  const { start, count } = nt.parallel.batchSlice(GLOBAL_BATCH, mesh?.dpRank ?? 0, layout.dp);
  const train = async (n: number): Promise<number[]> => {
    const losses: number[] = [];
    for (let i = 0; i < n; i++) {
      const { x, y } = lcgGlobalBatch(pos.step, GLOBAL_BATCH, CTX, config.vocabSize);
      using inputs = nt.tensor(x.slice(start * CTX, (start + count) * CTX), [count, CTX], { dtype: 'i32' });
      using targets = nt.tensor(y.slice(start * CTX, (start + count) * CTX), [count, CTX], { dtype: 'i32' });
      losses.push((await trainer.step(inputs, targets, { lr: LR * (pos.step + 1) / 4 })).loss);
      pos.step++;
    }
    return losses;
  };
  const dispose = () => { trainer.dispose(); stage.dispose(); };
  return { mesh, trainer, items, pos, train, dispose };
}

/** Runs `fn` on every rank of a fresh in-process world of `layout` (one rank: no world). */
async function onRanks<T>(layout: Layout, fn: (rank: Awaited<ReturnType<typeof buildRank>>, r: number) => Promise<T>): Promise<T[]> {
  const size = layout.pp * layout.dp;
  const worlds: Array<WorldGroup | null> = size === 1 ? [null] : await localWorld(size);
  return Promise.all(worlds.map(async (w, r) => {
    const rank = await buildRank(w, layout);
    try { return await fn(rank, r); } finally { rank.dispose(); }
  }));
}

const hash = (image: RankImage): string => {
  const h = createHash('sha256');
  for (const piece of encodeImage(image)) h.update(piece);
  return h.digest('hex');
};
const wire = (image: RankImage): Uint8Array => Buffer.concat(encodeImage(image));
/** Every rank's state as bytes (an image of it: every tensor it loads, step counts, options, generators, positions). */
const stateHash = (items: CheckpointItems): string => hash(takeImage(items, 0));

/** X's images (as bytes) after BEFORE steps, its disk checkpoint, and its losses. */
async function source(layout: Layout, dir: string): Promise<{ images: Uint8Array[]; losses: number[][] }> {
  const out = await onRanks(layout, async (rank) => {
    const losses = await rank.train(BEFORE);
    const image = wire(takeLayoutImage(rank.items, BEFORE));
    await nt.ckpt.save(dir, BEFORE, rank.items);
    return { image, losses };
  });
  return { images: out.map((o) => o.image), losses: out.map((o) => o.losses) };
}

let singleLosses: Promise<number[]> | null = null;
/** One process, BEFORE + AFTER steps: the reference every layout agrees with. */
const single = () => (singleLosses ??= onRanks({ name: 'one process', pp: 1, dp: 1, zero: 0 }, (r) => r.train(BEFORE + AFTER)).then((l) => l[0]!));

const cases: Array<[Layout, Layout]> = [
  [{ name: 'DP4 ZeRO-1', pp: 1, dp: 4, zero: 1 }, { name: 'DP2 ZeRO-1', pp: 1, dp: 2, zero: 1 }],
  [{ name: 'PP2×DP2 1F1B', pp: 2, dp: 2, zero: 0, microBatches: 2 }, { name: 'PP2×DP1 1F1B', pp: 2, dp: 1, zero: 0, microBatches: 2 }],
  [{ name: 'DP2 ZeRO-2', pp: 1, dp: 2, zero: 2 }, { name: 'DP1', pp: 1, dp: 1, zero: 0 }],
  [{ name: 'DP1', pp: 1, dp: 1, zero: 0 }, { name: 'DP2 ZeRO-1 (growing back)', pp: 1, dp: 2, zero: 1 }],
];

describe('restoring under another layout from in-memory images (in one process)', () => {
  for (const [x, y] of cases) {
    it(`${x.name} → ${y.name}: the images restore the disk checkpoint's bytes, and training goes on within the layout tolerance`, async () => {
      const dir = join(work, `${x.name}-${y.name}`.replace(/[^\w-]+/g, '_'));
      const oldWorld = x.pp * x.dp;
      const src = await source(x, dir);
      const heads: ImageHead[] = src.images.map((b) => { const { step, parts, state } = decodeImage(b); return { step, parts, state }; });
      const fetched: number[][] = [];
      const fromImages = await onRanks(y, async (rank, r) => {
        // Each new rank reads its own old rank's image first (as a survivor would).
        const prefer = [Math.min(r, oldWorld - 1)];
        const needed = await imagesNeeded(rank.items, (k) => heads[k]!, oldWorld, { prefer });
        const got: number[] = [];
        const result = await restoreFromImages(rank.items, async (k) => { got.push(k); return decodeImage(src.images[k]!); }, oldWorld, { heads: (k) => heads[k]!, prefer });
        fetched[r] = got.sort((a, b) => a - b);
        expect(result.step).toBe(BEFORE);
        expect(result.ranks).toEqual(needed);
        expect(rank.pos.step).toBe(BEFORE);
        return { hash: stateHash(rank.items), losses: await rank.train(AFTER), needed };
      });
      const fromDisk = await onRanks(y, async (rank) => {
        const r = await nt.ckpt.load(dir, rank.items);
        expect(r.step).toBe(BEFORE);
        return { hash: stateHash(rank.items), losses: await rank.train(AFTER) };
      });
      fromImages.forEach((m, r) => {
        // Only the images a rank needs were fetched.
        expect(fetched[r]).toEqual(m.needed);
        expect(m.hash, `rank ${r}: memory and disk restore the same bytes`).toBe(fromDisk[r]!.hash);
        expect(m.losses).toEqual(fromDisk[r]!.losses);
        expect(m.losses).toEqual(fromImages[0]!.losses);
      });
      const ref = await single();
      expect(relDiff([...src.losses[0]!, ...fromImages[0]!.losses], ref)).toBeLessThan(TOLERANCE);
      // Training moved the loss (agreement is not of an untrained model).
      expect(Math.abs(ref[BEFORE + AFTER - 1]! - ref[0]!)).toBeGreaterThan(100 * TOLERANCE * Math.abs(ref[0]!));
      console.log(`${x.name} → ${y.name}: images read per new rank ${fromImages.map((m) => `[${m.needed.join(',')}]`).join(' ')} of ${oldWorld}; losses ${fromImages[0]!.losses.map((l) => l.toFixed(6)).join(', ')}`);
    }, 120_000);
  }

  it('f32 images restore a bf16 model and bf16 images an f32 one, converted as a disk load converts (the same bits)', async () => {
    const bits = (m: nt.nn.GPT) => m.parameters().map((p) => Buffer.from(bytesOf(p, p.dtype)).toString('hex'));
    for (const [from, to] of [['f32', 'bf16'], ['bf16', 'f32']] as const) {
      const dir = join(work, `convert-${from}-${to}`);
      const source = new nt.nn.GPT(config, { seed: 5, dtype: from });
      const image = decodeImage(wire(takeLayoutImage({ model: source }, 0)));
      await nt.ckpt.save(dir, 0, { model: source });
      const [memory, disk] = [new nt.nn.GPT(config, { seed: 9, dtype: to }), new nt.nn.GPT(config, { seed: 9, dtype: to })];
      const fresh = bits(memory);
      expect((await restoreFromImages({ model: memory }, () => image, 1)).ranks).toEqual([0]);
      await nt.ckpt.load(dir, { model: disk });
      expect(bits(memory)).toEqual(bits(disk));
      expect(bits(memory)).not.toEqual(fresh);
      expect(memory.parameters()[0]!.dtype).toBe(to);
      for (const m of [source, memory, disk]) m.dispose();
    }
  });

  it('an element no image holds is a StateError naming the tensor and its range, and nothing changes; images without splits, or of two steps, are refused', async () => {
    const x: Layout = { name: 'DP2 ZeRO-1', pp: 1, dp: 2, zero: 1 };
    const src = await source(x, join(work, 'refusals'));
    const images = src.images.map((b) => decodeImage(b));
    // Old rank 1's image without its exp_avg chunk of one parameter: half of that state is nowhere.
    const lost = images[1]!.parts.find((p) => p.key.startsWith('optim/') && p.count > 1)!;
    const holed: RankImage = { ...images[1]!, parts: images[1]!.parts.filter((p) => p !== lost) };
    const plain = src.images.map(() => null as RankImage | null);
    await onRanks({ name: 'DP1', pp: 1, dp: 1, zero: 0 }, async (rank) => {
      await rank.train(1);
      const before = stateHash(rank.items);
      const err = await restoreFromImages(rank.items, (k) => (k === 1 ? holed : images[k]!), 2).catch((e: unknown) => e as Error);
      expect(err).toBeInstanceOf(nt.StateError);
      expect(err.message).toContain(`of '${lost.key}'`);
      expect(err.message).toMatch(/elements \[\d+, \d+\) of .* are in no old image/);
      // Takes without splits (plain takeImage) cannot be placed in another layout.
      plain[0] = takeImage(rank.items, 1);
      await expect(restoreFromImages(rank.items, () => plain[0]!, 1)).rejects.toThrow(/takeLayoutImage/);
      await expect(restoreFromImages(rank.items, (k) => (k === 0 ? images[0]! : { ...images[1]!, step: 7 }), 2)).rejects.toThrow(/of step 7/);
      expect(stateHash(rank.items)).toBe(before);
      // The intact images restore.
      expect((await restoreFromImages(rank.items, (k) => images[k]!, 2)).ranks).toEqual([0, 1]);
      expect(stateHash(rank.items)).not.toBe(before);
    });
  }, 120_000);
});

/** What each rank of reshard-image-rank.ts writes. */
interface FixtureResult { rank: number; losses: number[]; hash?: string; needed?: number[]; fetched?: number[] }

const fixture = join(root, 'test', 'fixtures', 'ckpt', 'reshard-image-rank.ts');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const pool = new JobPool();

async function launch(name: string, nproc: number, flags: string[]): Promise<{ code: number | null; output: string; ranks: FixtureResult[] }> {
  const out = join(work, name);
  return pool.run(async () => {
    const args = [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(fixture), '--out', out, ...flags];
    const { code, output } = await runProcess(process.execPath, args, { cwd: root, limitMs: 300_000 });
    const ranks = code !== 0 ? [] : Array.from({ length: nproc }, (_, r) => JSON.parse(readFileSync(join(out, `result-${r}.json`), 'utf8')) as FixtureResult);
    return { code, output, ranks };
  });
}

const launched: Array<[string, number, string[], number, string[]]> = [
  // ZeRO needs two replicas or more: one replica of TP2 runs without it.
  ['DP2×TP2 ZeRO-3 → DP1×TP2', 4, ['--dp', '2', '--tp', '2', '--zero', '3'], 2, ['--dp', '1', '--tp', '2', '--zero', '0']],
  ['DP4 ZeRO-3 → DP2 ZeRO-3', 4, ['--dp', '4', '--zero', '3'], 2, ['--dp', '2', '--zero', '3']],
];

describe('restoring under another layout from in-memory images (through the launcher)', () => {
  launched.forEach(([name, oldWorld, from, newWorld, to], i) => {
    it(`${name}: the images restore the disk checkpoint's bytes, and training goes on within the layout tolerance`, async () => {
      const src = await launch(`source${i}`, oldWorld, ['--phase', 'source', ...from]);
      expect(src.code, src.output).toBe(0);
      const target = [...to, '--from', join(work, `source${i}`), '--old-world', String(oldWorld)];
      const [mem, disk] = await Promise.all([launch(`images${i}`, newWorld, ['--phase', 'images', ...target]), launch(`disk${i}`, newWorld, ['--phase', 'disk', ...target])]);
      expect(mem.code, mem.output).toBe(0);
      expect(disk.code, disk.output).toBe(0);
      mem.ranks.forEach((m, r) => {
        expect(m.hash, `rank ${r}: memory and disk restore the same bytes`).toBe(disk.ranks[r]!.hash);
        expect(m.losses).toEqual(disk.ranks[r]!.losses);
        expect(m.losses).toEqual(mem.ranks[0]!.losses);
        // Only the images planned were read, and not all of them: each new rank holds half the state.
        expect(m.fetched).toEqual(m.needed);
        expect(m.needed!.length).toBeLessThan(oldWorld);
      });
      const ref = await single();
      expect(relDiff([...src.ranks[0]!.losses, ...mem.ranks[0]!.losses], ref)).toBeLessThan(TOLERANCE);
      console.log(`${name}: images read per new rank ${mem.ranks.map((m) => `[${m.needed!.join(',')}]`).join(' ')} of ${oldWorld}; losses ${mem.ranks[0]!.losses.map((l) => l.toFixed(6)).join(', ')}`);
    }, QUEUED_TEST_TIMEOUT_MS);
  });
});
