// Checkpoints in one process: exact resume (stopped at step 3 of 6, resumed in a fresh model and
// optimizer: bit-identical losses and parameters), the parts arithmetic behind resharding, atomic
// commits, keep-K, and each kind of damage detected with the previous checkpoint used instead.
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, truncateSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cover, coverageProblem, partIntervals } from '../../lib/ckpt/intervals.js';
import { localWorld } from '../../lib/testing/index.js';

const work = mkdtempSync(join(tmpdir(), 'nt-ckpt-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0.1, bias: true };
const B = 4, T = 16;

function batch(step: number): { x: nt.Tensor; y: nt.Tensor } {
  let s = (step + 1) * 7919;
  const seq = new Int32Array(B * (T + 1)).map(() => { s = (s * 1103515245 + 12345) % 2147483648; return s % 64; });
  const x = new Int32Array(B * T), y = new Int32Array(B * T);
  for (let b = 0; b < B; b++) { x.set(seq.subarray(b * (T + 1), b * (T + 1) + T), b * T); y.set(seq.subarray(b * (T + 1) + 1, (b + 1) * (T + 1)), b * T); }
  return { x: nt.tensor(x, [B, T]), y: nt.tensor(y, [B, T]) };
}

class Schedule implements nt.ckpt.Stateful {
  calls = 0;
  lr(): number { this.calls++; return 1e-2 * Math.min(1, this.calls / 4); }
  state() { return { calls: this.calls }; }
  loadState(s: { calls: number }) { this.calls = s.calls; }
}

function setup() {
  const model = new nt.nn.GPT(config, { seed: 5 });
  const optimizer = new nt.optim.AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.1 });
  return { model, optimizer, schedule: new Schedule() };
}
type Run = ReturnType<typeof setup>;
function train(run: Run, from: number, to: number): number[] {
  const losses: number[] = [];
  for (let step = from; step < to; step++) {
    const { x, y } = batch(step);
    losses.push(nt.trainStep(run.model, run.optimizer, x, y, { lr: run.schedule.lr(), maxGradNorm: 1 }).loss);
    x.dispose(); y.dispose();
  }
  return losses;
}
const items = (run: Run) => ({ model: run.model, optimizer: run.optimizer, scheduler: run.schedule, rng: { model: run.model.generator } });
const bits = (ps: nt.Tensor[]) => ps.map((p) => Array.from(new Uint32Array(p.toArraySync().buffer)));

describe('checkpoint parts arithmetic', () => {
  it('a column slice, a flat chunk of it, and full coverage', () => {
    // [4, 6] split on dim 1 into runs [1, 2) and [4, 6): local [4, 3].
    const split = { fullShape: [4, 6], dim: 1, runs: [[1, 1], [4, 2]] as Array<[number, number]> };
    const all = partIntervals([4, 6], { split, start: 0, count: 12 });
    expect(all[0]).toEqual({ global: 1, local: 0, length: 1 });
    expect(all[1]).toEqual({ global: 4, local: 1, length: 2 });
    expect(all.reduce((s, iv) => s + iv.length, 0)).toBe(12);
    const chunk = partIntervals([4, 6], { split, start: 2, count: 4 }); // local elements 2..5
    expect(chunk).toEqual([{ global: 5, local: 2, length: 1 }, { global: 7, local: 3, length: 1 }, { global: 10, local: 4, length: 2 }]);
    // The complementary runs tile the tensor; one left out is named.
    const other = { fullShape: [4, 6], dim: 1, runs: [[0, 1], [2, 2]] as Array<[number, number]> };
    const tiles = [...all, ...partIntervals([4, 6], { split: other, start: 0, count: 12 })];
    expect(coverageProblem(24, tiles)).toBeNull();
    expect(coverageProblem(24, all)).toMatch(/in no part/);
    expect(coverageProblem(24, [...tiles, { global: 3, local: 0, length: 1 }])).toMatch(/two parts/);
    // A rank's flat chunk of the whole tensor, filled from the two column slices.
    const pieces = cover(partIntervals([4, 6], { split: null, start: 5, count: 8 }), [
      { item: 'a', intervals: all }, { item: 'b', intervals: partIntervals([4, 6], { split: other, start: 0, count: 12 }) },
    ], 'test');
    expect(pieces.reduce((s, p) => s + p.length, 0)).toBe(8);
    expect(pieces[0]).toEqual({ item: 'a', from: 2, to: 5, length: 1 });
    expect(() => cover([{ global: 0, local: 0, length: 24 }], [{ item: 'a', intervals: all }], 'x')).toThrow(/element 0 is in no saved part/);
  });

  it('data-parallel replicas save contiguous, even shares of the state that tile every tensor; a load asks for everything', () => {
    const model = new nt.nn.Linear(5, 7, { seed: 1 }); // weight 35 elements, bias 7
    const opt = new nt.optim.AdamW(model.parameters(), { lr: 1e-3 });
    for (const p of model.parameters()) opt.ensureState(p);
    const keys = nt.ckpt.plainState(model, opt).parts.map((p) => p.key);
    expect(keys.length).toBe(6); // 2 parameters, each with 2 moments
    for (const count of [1, 2, 3, 8, 200]) {
      const shares = Array.from({ length: count }, (_, index) => nt.ckpt.plainState(model, opt, { share: { index, count } }));
      for (const key of keys) {
        const parts = shares.map((s) => s.parts.find((p) => p.key === key)!);
        const size = parts[0]!.fullShape.reduce((a, b) => a * b, 1);
        for (const p of parts) expect(p.offset).toBe(p.start); // each replica's own elements
        expect(coverageProblem(size, parts.filter((p) => p.count > 0).flatMap((p) => partIntervals(p.fullShape, p))), `${key} over ${count}`).toBeNull();
      }
      // Even in bytes (126 f32 elements in all: within one element), in at most keys + count pieces.
      const elements = shares.map((s) => s.parts.reduce((n, p) => n + p.count, 0));
      expect(elements.reduce((a, b) => a + b, 0)).toBe(126);
      expect(Math.max(...elements) - Math.min(...elements), `over ${count}`).toBeLessThanOrEqual(1);
      expect(shares.flatMap((s) => s.parts).filter((p) => p.count > 0).length).toBeLessThanOrEqual(keys.length + count);
    }
    const load = nt.ckpt.plainState(model, opt, { share: { index: 1, count: 3 }, forLoad: true });
    for (const p of load.parts) expect([p.start, p.count]).toEqual([0, p.tensor.size]);
    expect(() => nt.ckpt.plainState(model, opt, { share: { index: 3, count: 3 } })).toThrow(/share 3 of 3/);
    expect(() => nt.ckpt.plainState(model, opt, { saveReplicas: false } as never)).toThrow(/saveReplicas option is gone/);
    model.dispose();
  });
});

describe('checkpoints in one process', () => {
  it('resumes bit-exactly: 3 steps, save, 3 steps in fresh objects = 6 steps uninterrupted', async () => {
    const straight = setup();
    const expected = train(straight, 0, 6);
    const root = join(work, 'resume');
    const first = setup();
    const before = train(first, 0, 3);
    expect(before).toEqual(expected.slice(0, 3));
    const saved = await nt.ckpt.save(root, 3, items(first));
    expect(saved.dir).toBe(join(root, 'step-00000003'));
    first.model.dispose(); first.optimizer.dispose();
    const second = setup();
    const r = await nt.ckpt.load(root, items(second));
    expect(r.step).toBe(3);
    expect(r.optimizerLoaded).toBe(true);
    expect(second.schedule.calls).toBe(3);
    const after = train(second, 3, 6);
    expect(after).toEqual(expected.slice(3));
    expect(bits(second.model.parameters())).toEqual(bits(straight.model.parameters()));
    // The manifest: one file, every parameter and both AdamW states, whole.
    const m = nt.ckpt.readManifest(saved.dir);
    expect(m.files).toHaveLength(1);
    expect(Object.keys(m.tensors).filter((k) => k.startsWith('model/'))).toHaveLength(second.model.parameters().length);
    expect(m.tensors['optim/expAvg/wte.weight']!.shape).toEqual([64, 32]);
    expect(nt.ckpt.readTensor(saved.dir, 'model/wte.weight').data.length).toBe(64 * 32);
  });

  it('keeps the last K, writes atomically, and names a model that does not fit', async () => {
    const root = join(work, 'keep');
    const run = setup();
    const c = new nt.ckpt.Checkpointer(root, { keep: 2 });
    for (const step of [1, 2, 3]) {
      train(run, step - 1, step);
      const r = await c.save(step, items(run));
      expect(r.stallMs).toBeGreaterThanOrEqual(0);
    }
    await c.close();
    expect(c.list().map((x) => x.step)).toEqual([3, 2]);
    // The pruned step 1 is deleted off the save's path, and close() waits for it.
    expect(readdirSync(root).filter((n) => n.startsWith('.'))).toEqual([]);
    expect(readdirSync(root)).toEqual(['step-00000002', 'step-00000003']);
    // A crash mid-save: a directory without a manifest is not a checkpoint.
    mkdirSync(join(root, '.tmp-step-00000004'));
    mkdirSync(join(root, 'step-00000005'));
    expect(nt.ckpt.latest(root)!.step).toBe(3);
    const wider = new nt.nn.GPT({ ...config, vocabSize: 96 }, { seed: 5 });
    await expect(nt.ckpt.load(join(root, 'step-00000003'), { model: wider })).rejects.toThrow(/'model\/wte.weight' was saved with shape \[64, 32\], this model's is \[96, 32\]/);
  });

  const damage: Array<[string, (dir: string) => void, RegExp]> = [
    ['a truncated shard', (dir) => truncateSync(join(dir, 'rank-00000.safetensors'), 100), /truncated/],
    ['a checksum mismatch', (dir) => { const p = join(dir, 'rank-00000.safetensors'); const b = readFileSync(p); b[b.length - 3] ^= 0xff; writeFileSync(p, b); }, /checksum/],
    ['a missing manifest', (dir) => unlinkSync(join(dir, 'manifest.json')), /./],
  ];
  it.each(damage)('detects %s and resumes from the previous checkpoint', async (_what, hurt, message) => {
    const root = join(work, `damage-${_what.replace(/ /g, '-')}`);
    const run = setup();
    train(run, 0, 1);
    await nt.ckpt.save(root, 1, items(run));
    const atOne = bits(run.model.parameters());
    train(run, 1, 2);
    await nt.ckpt.save(root, 2, items(run));
    hurt(join(root, 'step-00000002'));
    const fresh = setup();
    const warnings: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = ((s: string) => { warnings.push(String(s)); return true; }) as typeof process.stderr.write;
    let r: nt.ckpt.LoadResult | null;
    try { r = await new nt.ckpt.Checkpointer(root).loadLatest(items(fresh)); } finally { process.stderr.write = write; }
    expect(r!.step).toBe(1);
    expect(bits(fresh.model.parameters())).toEqual(atOne);
    if (existsSync(join(root, 'step-00000002', 'manifest.json'))) expect(warnings.join('')).toMatch(message);
  });

  it('queues saves made without awaiting each other, replaces a step saved again, and prunes only older steps', async () => {
    const root = join(work, 'queue');
    const run = setup();
    const c = new nt.ckpt.Checkpointer(root, { keep: 2 });
    train(run, 0, 1);
    const first = c.save(1, items(run));
    const second = c.save(2, items(run)); // not awaited in between: waits for the first
    const [a, b] = await Promise.all([first, second]);
    await Promise.all([a.done, b.done]);
    expect(c.list().map((x) => x.step)).toEqual([2, 1]);
    // A run resumed from step 1 saves step 2 again: the new copy replaces the old one whole.
    const before = nt.ckpt.readManifest(b.dir).saveId;
    train(run, 1, 2);
    const again = await c.save(2, items(run));
    await again.done;
    expect(nt.ckpt.readManifest(again.dir).saveId).not.toBe(before);
    const saved = nt.ckpt.readTensor(again.dir, 'model/wte.weight').data;
    expect(Array.from(new Uint32Array(saved.buffer, saved.byteOffset, saved.length))).toEqual(bits([run.model.wte.weight])[0]);
    // Steps newer than the one just committed (left by the run before a resume) are not pruned.
    await (await c.save(7, items(run))).done;
    await (await c.save(3, items(run))).done;
    await c.close();
    expect(c.list().map((x) => x.step)).toEqual([7, 3, 2]);
    expect(readdirSync(root).filter((n) => n.startsWith('.'))).toEqual([]);
  });

  it('a synchronous save throws its own failure, and the checkpointer stays usable', async () => {
    const root = join(work, 'sync-failure');
    const run = setup();
    writeFileSync(root, 'a file where the root directory should be');
    const c = new nt.ckpt.Checkpointer(root, { async: false });
    await expect(c.save(1, items(run))).rejects.toThrow();
    unlinkSync(root);
    const r = await c.save(2, items(run));
    expect(existsSync(join(r.dir, 'manifest.json'))).toBe(true);
    await c.close();
  });

  it('loadLatest stops on a checkpoint this model cannot take instead of falling back to an older one', async () => {
    const root = join(work, 'incompatible');
    const run = setup();
    const c = new nt.ckpt.Checkpointer(root);
    await c.save(1, items(run));
    await c.save(2, items(run));
    await c.close();
    const wider = new nt.nn.GPT({ ...config, vocabSize: 96 }, { seed: 5 });
    await expect(new nt.ckpt.Checkpointer(root).loadLatest({ model: wider })).rejects.toThrow(/'model\/wte.weight' was saved with shape/);
  });

  it('loadLatest on two ranks: the rank that cannot take the checkpoint throws its error, the other a StateError naming it', async () => {
    const root = join(work, 'two-ranks-incompatible');
    const run = setup();
    const c = new nt.ckpt.Checkpointer(root);
    await c.save(1, items(run));
    await c.close();
    // Two in-process ranks, each a trainer-like holder of a whole model; rank 1's model is wider.
    const worlds = await localWorld(2);
    const models = [new nt.nn.GPT(config, { seed: 5 }), new nt.nn.GPT({ ...config, vocabSize: 96 }, { seed: 5 })];
    const results = await Promise.all(worlds.map((world, r) => new nt.ckpt.Checkpointer(root).loadLatest({
      model: {
        world,
        checkpointHoldings: () => ({ model: models[r]!, optimizer: null, zero: null, savedElsewhere: new Set<nt.Tensor>(), replica: null }),
      },
    }).catch((e: unknown) => e as Error)));
    expect(results[1]).toBeInstanceOf(nt.ShapeError);
    expect((results[1] as Error).message).toMatch(/'model\/wte.weight' was saved with shape/);
    expect(results[0]).toBeInstanceOf(nt.StateError);
    expect((results[0] as Error).message).toBe(`checkpoint ${join(root, 'step-00000001')}: rank 1 could not load it (see the error there); every rank stops`);
    for (const m of models) m.dispose();
  });

  it('a step whose old copy was moved aside by a save that then crashed is found again', async () => {
    const root = join(work, 'aside');
    const run = setup();
    await nt.ckpt.save(root, 1, items(run));
    // The crash window of saving step 1 again: the old copy renamed aside, the new one not yet in place.
    renameSync(join(root, 'step-00000001'), join(root, '.old-step-00000001-1-abc'));
    const fresh = setup();
    // A pruned step whose background deletion a crash interrupted is removed when a run resumes.
    mkdirSync(join(root, '.deleted-step-00000001-1-x'));
    writeFileSync(join(root, '.deleted-step-00000001-1-x', 'rank-00000.safetensors'), 'left over');
    const r = await new nt.ckpt.Checkpointer(root).loadLatest(items(fresh));
    expect(existsSync(join(root, '.deleted-step-00000001-1-x'))).toBe(false);
    expect(r?.step).toBe(1);
    expect(bits(fresh.model.parameters())).toEqual(bits(run.model.parameters()));
  });

  it('a model without optimizer state loads the weights and reports it', async () => {
    const root = join(work, 'weights-only');
    const run = setup();
    await nt.ckpt.save(root, 0, { model: run.model });
    const fresh = setup();
    const r = await nt.ckpt.load(root, { model: fresh.model, optimizer: fresh.optimizer });
    expect(r.optimizerLoaded).toBe(false);
    expect(bits(fresh.model.parameters())).toEqual(bits(run.model.parameters()));
  });
});

describe('a save in flight, abandoned (in-job recovery)', () => {
  it("rank 0's commit stops waiting for a rank that will never write, and says why", async () => {
    const { commit } = await import('../../lib/ckpt/commit.js');
    const root = mkdtempSync(join(tmpdir(), 'nt-ckpt-abandon-'));
    const tmp = join(root, '.tmp-step-00000007');
    mkdirSync(tmp, { recursive: true });
    let reason: string | null = null;
    setTimeout(() => { reason = 'in-job recovery rolled the run back'; }, 100);
    const t0 = Date.now();
    // Two ranks, neither of which wrote its record: without the abandonment this waits the full 60 s.
    await expect(commit(root, tmp, join(root, 'step-00000007'), {
      step: 7, saveId: '7-x', worldSize: 2, common: { optimizer: { groups: null, steps: {} }, state: {}, layout: null }, timeoutMs: 60_000, abandoned: () => reason,
    })).rejects.toThrow(/abandoned \(in-job recovery rolled the run back\)/);
    expect(Date.now() - t0).toBeLessThan(30_000);
    expect(existsSync(join(root, 'step-00000007'))).toBe(false);
    rmSync(root, { recursive: true, force: true });
  });

  // Two in-process ranks, each a data-parallel replica saving half of one GPT; rank 1 writes under
  // `rank1Root` (a different directory: to rank 0's commit, a rank that never writes its part).
  async function twoRankSave(root: string, rank1Root: string, step: number) {
    const worlds = await localWorld(2);
    const models = [0, 1].map(() => new nt.nn.GPT(config, { seed: 5 }));
    const rankItems = (r: number) => ({
      model: {
        world: worlds[r]!,
        checkpointHoldings: () => ({ model: models[r]!, optimizer: null, zero: null, savedElsewhere: new Set<nt.Tensor>(), replica: { index: r, count: 2 } }),
      },
    });
    const cps = [new nt.ckpt.Checkpointer(root), new nt.ckpt.Checkpointer(rank1Root)];
    const saved = await Promise.all(cps.map((c, r) => c.save(step, rankItems(r))));
    await saved[1]!.done;
    return { cps, saved, models, rankItems };
  }
  const tmpOf = (root: string, step: number) => join(root, `.tmp-step-${String(step).padStart(8, '0')}`);
  const settled = (p: Promise<unknown>, ms: number) => Promise.race([p.then(() => 'settled', () => 'settled'), new Promise((r) => setTimeout(() => r('pending'), ms))]);

  it('keeps a save of a step <= the rollback step: it commits once every file is in', async () => {
    const root = mkdtempSync(join(tmpdir(), 'nt-ckpt-keep-'));
    const other = mkdtempSync(join(tmpdir(), 'nt-ckpt-keep-other-'));
    try {
      // Step 4 is the rollback step; rank 1 (a survivor, not lost) has not finished writing its part yet.
      const { cps, saved, models } = await twoRankSave(root, other, 4);
      expect(await settled(saved[0]!.done, 200)).toBe('pending');
      cps[0]!.abandonInFlight('in-job recovery rolled the run back', { through: 4, lost: [] });
      expect(await settled(saved[0]!.done, 200)).toBe('pending');
      // Its part arrives: the save commits as if nothing had happened.
      for (const f of readdirSync(tmpOf(other, 4))) writeFileSync(join(tmpOf(root, 4), f), readFileSync(join(tmpOf(other, 4), f)));
      await saved[0]!.done;
      await cps[0]!.wait();
      expect(existsSync(join(root, 'step-00000004', 'manifest.json'))).toBe(true);
      expect(cps[0]!.list().map((c) => c.step)).toEqual([4]);
      for (const c of cps) await c.close();
      for (const m of models) m.dispose();
    } finally {
      rmSync(root, { recursive: true, force: true });
      rmSync(other, { recursive: true, force: true });
    }
  });

  it('gives up a kept save whose lost rank never wrote its part, and any save after the rollback step, quietly', async () => {
    const root = mkdtempSync(join(tmpdir(), 'nt-ckpt-keep-'));
    const other = mkdtempSync(join(tmpdir(), 'nt-ckpt-keep-other-'));
    try {
      // Kept (step 4 <= 4), but rank 1 was lost and its record is not there: given up, not failed.
      const a = await twoRankSave(root, other, 4);
      a.cps[0]!.abandonInFlight('in-job recovery rolled the run back', { through: 4, lost: [1] });
      await expect(a.saved[0]!.done).rejects.toThrow(/abandoned \(in-job recovery rolled the run back; lost rank 1 never wrote its part of step 4\)/);
      await a.cps[0]!.wait();
      expect(existsSync(join(root, 'step-00000004'))).toBe(false);
      // A save of a step after the rollback step (6 > 5) is given up even though no rank was lost.
      const b = await twoRankSave(root, other, 6);
      b.cps[0]!.abandonInFlight('in-job recovery rolled the run back', { through: 5, lost: [] });
      await expect(b.saved[0]!.done).rejects.toThrow(/abandoned \(in-job recovery rolled the run back\)/);
      await b.cps[0]!.wait();
      // Without keep, as before: every save in flight is given up.
      const c = await twoRankSave(root, other, 3);
      c.cps[0]!.abandonInFlight('rolled back');
      await expect(c.saved[0]!.done).rejects.toThrow(/abandoned \(rolled back\)/);
      await c.cps[0]!.wait();
      expect(readdirSync(root).filter((d) => d.startsWith('step-'))).toEqual([]);
      expect(() => c.cps[0]!.abandonInFlight('')).toThrow(nt.ArgumentError);
      expect(() => c.cps[0]!.abandonInFlight('x', { through: 1.5, lost: [] })).toThrow(/keep.through/);
      expect(() => c.cps[0]!.abandonInFlight('x', { through: 1, lost: [-1] })).toThrow(/keep.lost/);
      for (const r of [a, b, c]) {
        for (const cp of r.cps) await cp.close();
        for (const m of r.models) m.dispose();
      }
    } finally {
      rmSync(root, { recursive: true, force: true });
      rmSync(other, { recursive: true, force: true });
    }
  });
});
