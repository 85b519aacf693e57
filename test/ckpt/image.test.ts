// In-memory rank images (lib/ckpt/image.ts) and ParallelTrainer.abandonStep: one process (a GPT with
// dropout under nt.trainStep, and a one-rank ParallelTrainer) trains 2 steps, takes an image, trains 3,
// restores and trains the same 3 again: bit-identical losses and state. The encoding round trip, an
// image of another layout refused with nothing changed. Then real layouts through the launcher
// (test/fixtures/recovery/image-rank.ts): DP2×TP2 ZeRO-3, PP2×DP2 1F1B and DP2 ZeRO-1, each with the
// image round trip and a step that fails midway (a collective throws CommError on every rank), then
// abandonStep + restoreImage + the same steps: bit-identical with the failure-free run; and half the
// ranks restoring into a freshly built trainer (a replacement) while the others go on with theirs.
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { lcgGlobalBatch } from '../helpers/token-batch.js';
import * as nt from '../../lib/index.js';
import { decodeImage, decodeImageHead, encodeImage, restoreImage, takeImage, type RankImage } from '../../lib/ckpt/image.js';
import type { CheckpointItems } from '../../lib/ckpt/items.js';
import { JobPool, QUEUED_TEST_TIMEOUT_MS, runProcess } from '../helpers/jobs.js';
import { nodeArgs, scriptPath } from '../helpers/node-script.js';
import { root } from '../helpers/equivalence.js';

const work = mkdtempSync(join(tmpdir(), 'nt-image-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0.1, bias: true };
const B = 4, T = 16;

function batch(step: number): { x: nt.Tensor; y: nt.Tensor } {
  const b = lcgGlobalBatch(step, B, T, 64);
  return { x: nt.tensor(b.x, [B, T]), y: nt.tensor(b.y, [B, T]) };
}

/** A data position and a schedule, both restored by the image. */
class Position implements nt.ckpt.Stateful {
  step = 0;
  lr(): number { return 1e-2 * Math.min(1, (this.step + 1) / 4); }
  state() { return { step: this.step }; }
  loadState(s: { step: number }) { this.step = s.step; }
}

const hash = (image: RankImage): string => {
  const h = createHash('sha256');
  for (const piece of encodeImage(image)) h.update(piece);
  return h.digest('hex');
};

describe('rank images in one process', () => {
  it('nt.trainStep: 2 steps, image, 3 steps, restore, the same 3 steps bit for bit (dropout, schedule, optimizer state)', () => {
    const model = new nt.nn.GPT(config, { seed: 5 });
    const optimizer = new nt.optim.AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.1 });
    const pos = new Position();
    const items: CheckpointItems = { model, optimizer, loader: pos, rng: { model: model.generator } };
    const train = (n: number) => Array.from({ length: n }, () => {
      const { x, y } = batch(pos.step);
      const loss = nt.trainStep(model, optimizer, x, y, { lr: pos.lr(), maxGradNorm: 1 }).loss;
      x.dispose(); y.dispose(); pos.step++;
      return loss;
    });
    train(2);
    const image = takeImage(items, 2);
    expect(image.step).toBe(2);
    const first = train(3);
    const after = hash(takeImage(items, 5));
    optimizer.paramGroups[0]!.options.lr = 123;  // changed after the image: restored too
    restoreImage(items, image);
    expect(pos.step).toBe(2);
    expect(optimizer.paramGroups[0]!.options.lr).not.toBe(123);
    const again = train(3);
    expect(again).toEqual(first);
    expect(hash(takeImage(items, 5))).toBe(after);
    // Without the restore the same steps give other numbers (the test can fail).
    expect(train(1)[0]).not.toBe(first[0]);
    model.dispose(); optimizer.dispose();
  });

  it('a one-rank ParallelTrainer: the round trip, abandonStep with nothing failed, reuse of the buffer, encode/decode', async () => {
    const model = new nt.nn.GPT({ ...config, dropout: 0 }, { seed: 7 });
    const stage = new nt.parallel.pp.GPTStage(model, 0, 1);
    const trainer = await nt.parallel.ParallelTrainer.create(stage, [{ params: stage.parameters() }], {
      mesh: null, maxGradNorm: 1, createOptimizer: (g) => new nt.optim.AdamW(g, { lr: 1e-2 }),
    });
    const pos = new Position();
    const items: CheckpointItems = { model: trainer, loader: pos };
    const train = async (n: number) => {
      const out: number[] = [];
      for (let i = 0; i < n; i++) {
        const { x, y } = batch(pos.step);
        out.push((await trainer.step(x, y, { lr: pos.lr() })).loss);
        x.dispose(); y.dispose(); pos.step++;
      }
      return out;
    };
    await train(2);
    const image = takeImage(items, 2);
    const first = await train(3);
    const after = takeImage(items, 5);
    const afterHash = hash(after);
    // The image survives its byte encoding; a decoded image restores like the original.
    const pieces = encodeImage(image);
    const bytes = new Uint8Array(pieces.reduce((s, p) => s + p.byteLength, 0));
    let at = 0;
    for (const p of pieces) { bytes.set(p, at); at += p.byteLength; }
    const decoded = decodeImage(bytes);
    expect(decoded.step).toBe(2);
    expect(decoded.parts).toEqual(image.parts);
    expect(Buffer.from(decoded.data).equals(Buffer.from(image.data))).toBe(true);
    expect(() => decodeImage(bytes.subarray(0, bytes.byteLength - 1))).toThrow(nt.StateError);
    expect(() => decodeImage(new Uint8Array(16))).toThrow(nt.StateError);
    // Its header alone, from the first bytes (what a reshape plans from): too few bytes say how many.
    const headLength = (pieces[0]!.byteLength);
    expect(decodeImageHead(bytes.subarray(0, 4))).toEqual({ need: 8 });
    const short = decodeImageHead(bytes.subarray(0, 20));
    expect('need' in short && short.need > 20 && short.need <= headLength).toBe(true);
    expect(decodeImageHead(bytes.subarray(0, headLength))).toEqual({ head: { step: 2, parts: image.parts, state: JSON.parse(JSON.stringify(image.state)) } });
    expect(() => decodeImageHead(new Uint8Array(16))).toThrow(nt.StateError);
    trainer.abandonStep();  // no step failed: harmless
    restoreImage(items, decoded);
    expect(await train(3)).toEqual(first);
    // The reused buffer: the same bytes, no new allocation.
    const reused = takeImage(items, 5, image);
    expect(reused.data.buffer).toBe(image.data.buffer);
    expect(hash(reused)).toBe(afterHash);
    trainer.dispose(); stage.dispose();
  });

  it('an image of another model or layout is a StateError and changes nothing', () => {
    const small = new nt.nn.GPT(config, { seed: 1 });
    const other = new nt.nn.GPT({ ...config, nLayer: 1 }, { seed: 1 });
    const o1 = new nt.optim.AdamW(small.parameters(), { lr: 1e-2 });
    const o2 = new nt.optim.AdamW(other.parameters(), { lr: 1e-2 });
    const image = takeImage({ model: other, optimizer: o2 }, 0);
    const before = hash(takeImage({ model: small, optimizer: o1 }, 0));
    expect(() => restoreImage({ model: small, optimizer: o1 }, image)).toThrow(/another layout or model/);
    // The same parts with one byte too few, or a generator the image lacks: refused before any write.
    const own = takeImage({ model: small, optimizer: o1 }, 0);
    expect(() => restoreImage({ model: small, optimizer: o1 }, { ...own, data: own.data.subarray(0, own.data.byteLength - 4) })).toThrow(nt.StateError);
    expect(() => restoreImage({ model: small, optimizer: o1, rng: { model: small.generator } }, own)).toThrow(/no random generator/);
    expect(hash(takeImage({ model: small, optimizer: o1 }, 0))).toBe(before);
    for (const d of [small, other, o1, o2]) d.dispose();
  });
});

/** What each rank of image-rank.ts writes (result-<rank>.json). */
interface ImageRankResult {
  rank: number;
  reference: { losses: number[]; hash: string };
  restored: { losses: number[]; hash: string };
  failed: { error: string; losses: number[]; hash: string; leakBytes: number };
  replaced: { fresh: boolean; losses: number[]; hash: string };
  imageBytes: number;
  takeImageMs: number;
}

const fixture = join(root, 'test', 'fixtures', 'recovery', 'image-rank.ts');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const pool = new JobPool();

async function launch(name: string, nproc: number, flags: string[]): Promise<{ code: number | null; output: string; ranks: ImageRankResult[] }> {
  const out = join(work, name);
  return pool.run(async () => {
    const args = [...nodeArgs(launcher), '--nproc-per-node', String(nproc), scriptPath(fixture), '--out', out, ...flags];
    const { code, output } = await runProcess(process.execPath, args, { cwd: root, limitMs: 300_000 });
    const ranks = code !== 0 ? [] : Array.from({ length: nproc }, (_, r) => JSON.parse(readFileSync(join(out, `result-${r}.json`), 'utf8')) as ImageRankResult);
    return { code, output, ranks };
  });
}

describe('rank images under real layouts (4 and 2 ranks through the launcher)', () => {
  const layouts: Array<[string, number, string[]]> = [
    ['dp2-tp2-zero3', 4, ['--dp', '2', '--tp', '2', '--zero', '3', '--fail', 'reduceScatter']],
    ['pp2-dp2-1f1b', 4, ['--dp', '2', '--pp', '2', '--micro-batches', '2', '--schedule', '1f1b', '--fail', 'allReduce']],
    ['dp2-zero1', 2, ['--dp', '2', '--zero', '1', '--fail', 'reduceScatter']],
  ];
  // Started together at the first of these tests (queued on the pool), not when the file is collected.
  let runs: Map<string, ReturnType<typeof launch>> | null = null;
  const started = () => (runs ??= new Map(layouts.map(([name, n, flags]) => [name, launch(name, n, flags)])));
  for (const [name, n] of layouts) {
    it(`${name}: the image round trip and a step failed midway (abandonStep, restoreImage) give the failure-free run bit for bit`, async () => {
      const r = await started().get(name)!;
      expect(r.code, r.output).toBe(0);
      expect(r.ranks).toHaveLength(n);
      for (const rank of r.ranks) {
        expect(rank.reference.losses).toHaveLength(3);
        expect(rank.restored.losses).toEqual(rank.reference.losses);
        expect(rank.restored.hash).toBe(rank.reference.hash);
        expect(rank.failed.error).toMatch(/^CommError/);
        expect(rank.failed.losses).toEqual(rank.reference.losses);
        expect(rank.failed.hash).toBe(rank.reference.hash);
        expect(rank.failed.leakBytes).toBe(0);
        expect(rank.replaced.losses).toEqual(rank.reference.losses);
        expect(rank.replaced.hash).toBe(rank.reference.hash);
        expect(rank.imageBytes).toBeGreaterThan(0);
      }
      expect(r.ranks.filter((x) => x.replaced.fresh).length).toBe(n / 2);
      // The losses are the job's: the same on every rank.
      for (const rank of r.ranks) expect(rank.reference.losses).toEqual(r.ranks[0]!.reference.losses);
      console.log(`${name}: image bytes per rank ${r.ranks.map((x) => x.imageBytes).join(', ')}; takeImage ms ${r.ranks.map((x) => x.takeImageMs.toFixed(2)).join(', ')}`);
    }, QUEUED_TEST_TIMEOUT_MS);
  }
});
