// Token datasets: llm.c's shard format (round trip, damage detected), `nodetron data tokenize`
// (GPT-2 tokens with <|endoftext|> separators, val/train shards, bad input named), and TokenLoader
// (a seeded order; data-parallel ranks disjoint and together the single process's batch; exact
// resume mid-epoch; epochs; resharding the position; one reader per tensor-parallel group).
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';

const work = mkdtempSync(join(tmpdir(), 'nt-data-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const bin = join(__dirname, '..', '..', 'bin', 'nodetron.js');

/** Shards of consecutive token ids (mod 60000), so a window's position is readable from its tokens. */
function shards(counts: number[]): string[] {
  let at = 0;
  return counts.map((n, i) => {
    const path = join(work, `seq_${i}_${counts.join('-')}.bin`);
    nt.data.writeTokenShard(path, Uint16Array.from({ length: n }, () => at++ % 60000));
    return path;
  });
}
const rows = async (l: nt.data.TokenLoader) => {
  const { inputs, targets } = await l.next();
  const x = Array.from(inputs.toArraySync()), y = Array.from(targets.toArraySync());
  inputs.dispose(); targets.dispose();
  return { x, y };
};

describe('token shards', () => {
  it('round-trip with llm.c\'s header, and read ranges', () => {
    const path = join(work, 'a.bin');
    nt.data.writeTokenShard(path, Uint16Array.from([5, 6, 7, 65535]));
    const bytes = readFileSync(path);
    expect(bytes.length).toBe(1024 + 8);
    expect([bytes.readInt32LE(0), bytes.readInt32LE(4), bytes.readInt32LE(8)]).toEqual([20240520, 1, 4]);
    using s = nt.data.TokenShard.open(path);
    expect(s.tokens).toBe(4);
    expect(Array.from(s.read(1, 3))).toEqual([6, 7, 65535]);
    expect(() => s.read(2, 3)).toThrow(/outside/);
  });
  it.each([
    ['bad magic', (p: string) => { const b = readFileSync(p); b.writeInt32LE(7, 0); writeFileSync(p, b); }, /not a token shard/],
    ['a truncated file', (p: string) => truncateSync(p, 1024 + 3), /truncated/],
    ['a wrong count', (p: string) => { const b = readFileSync(p); b.writeInt32LE(3, 8); writeFileSync(p, b); }, /trailing bytes/],
    ['a short header', (p: string) => truncateSync(p, 100), /shorter than the 1024-byte header/],
  ])('refuses %s', (_what, hurt, message) => {
    const path = join(work, 'bad.bin');
    nt.data.writeTokenShard(path, Uint16Array.from([1, 2, 3, 4]));
    hurt(path);
    expect(() => nt.data.TokenShard.open(path)).toThrow(message);
  });
});

describe('nodetron data tokenize', () => {
  const input = join(work, 'corpus');
  mkdirSync(join(input, 'sub'), { recursive: true });
  writeFileSync(join(input, 'a.txt'), 'Call me Ishmael. Some years ago');
  writeFileSync(join(input, 'sub', 'b.jsonl'), `${JSON.stringify({ text: 'never mind how long' })}\n\n${JSON.stringify({ text: 'precisely <|endoftext|> having' })}\n`);
  writeFileSync(join(input, 'skip.md'), 'not an input');
  const enc = nt.data.gpt2Tokenizer();
  const expected = ['Call me Ishmael. Some years ago', 'never mind how long', 'precisely <|endoftext|> having'].flatMap((t) => [50256, ...enc.encode(t, [], [])]);

  it('writes GPT-2 tokens with <|endoftext|> before each document into val and train shards', () => {
    const out = join(work, 'tok');
    const r = spawnSync(process.execPath, [bin, 'data', 'tokenize', input, '--out', out, '--name', 'moby', '--val-tokens', '5', '--shard-tokens', '8'], { encoding: 'utf8' });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/3 documents/);
    const summary = JSON.parse(readFileSync(join(out, 'tokenize.json'), 'utf8')) as nt.data.TokenizeSummary;
    expect(summary.tokens).toBe(expected.length);
    expect(summary.shards[0]).toEqual({ file: 'moby_val_000000.bin', split: 'val', tokens: 5 });
    expect(summary.shards.slice(1).every((s) => s.split === 'train' && s.tokens <= 8)).toBe(true);
    expect(summary.shards[1]!.file).toBe('moby_train_000001.bin');
    const all = summary.shards.flatMap((s) => { using f = nt.data.TokenShard.open(join(out, s.file)); return Array.from(f.read(0, f.tokens)); });
    expect(all).toEqual(expected);
  });
  it('names the file and line of a bad JSON line, and refuses missing input', () => {
    const bad = join(work, 'bad.jsonl');
    writeFileSync(bad, `${JSON.stringify({ text: 'ok' })}\n{not json\n`);
    const r = spawnSync(process.execPath, [bin, 'data', 'tokenize', bad, '--out', join(work, 'tok-bad')], { encoding: 'utf8' });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/bad\.jsonl:2: not JSON/);
    const field = spawnSync(process.execPath, [bin, 'data', 'tokenize', bad, '--out', join(work, 'tok-bad'), '--field', 'body'], { encoding: 'utf8' });
    expect(field.stderr).toMatch(/bad\.jsonl:1: no string field 'body'/);
    const missing = spawnSync(process.execPath, [bin, 'data', 'tokenize', join(work, 'nope.txt'), '--out', join(work, 'tok-bad')], { encoding: 'utf8' });
    expect(missing.status).toBe(2);  // a usage error: the argument names no file
    expect(missing.stderr).toMatch(/does not exist/);
    expect(spawnSync(process.execPath, [bin, 'data', 'tokenize'], { encoding: 'utf8' }).status).toBe(2);
  });
});

describe('TokenLoader', () => {
  const files = shards([1000, 333, 700]);
  const T = 8;
  it('draws windows in a seeded order: the same seed repeats, another differs, targets are the inputs shifted', async () => {
    const a = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 1 });
    const b = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 1 });
    const c = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 2 });
    const [ra, rb, rc] = [await rows(a), await rows(b), await rows(c)];
    expect(ra).toEqual(rb);
    expect(ra.x).not.toEqual(rc.x);
    for (let r = 0; r < 4; r++) {
      const x = ra.x.slice(r * T, (r + 1) * T), y = ra.y.slice(r * T, (r + 1) * T);
      const shardStart = x[0]! < 1000 ? 0 : x[0]! < 1333 ? 1000 : 1333;
      expect((x[0]! - shardStart) % T).toBe(0); // windows start at multiples of seqLen within their shard
      expect(y).toEqual(x.map((v) => v + 1));
    }
    expect(a.windows).toBe(Math.floor(999 / T) + Math.floor(332 / T) + Math.floor(699 / T));
  });

  it('data-parallel ranks read disjoint windows that together make the single process\'s batch', async () => {
    const single = new nt.data.TokenLoader({ files, batchSize: 6, seqLen: T, seed: 3 });
    const ranks = [0, 1, 2].map((d) => new nt.data.TokenLoader({ files, batchSize: 2, seqLen: T, seed: 3, dpRank: d, dpSize: 3 }));
    const seen = new Set<number>();
    for (let step = 0; step < 5; step++) {
      const whole = await rows(single);
      const parts = await Promise.all(ranks.map(rows));
      expect(parts.flatMap((p) => p.x)).toEqual(whole.x);
      for (let r = 0; r < 6; r++) {
        const first = whole.x[r * T]!;
        expect(seen.has(first)).toBe(false);
        seen.add(first);
      }
    }
  });

  it('resumes mid-epoch exactly from state(), across epochs, and under another data-parallel split', async () => {
    const straight = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 9 });
    expect(straight.batchesPerEpoch).toBe(Math.floor(straight.windows / 4));
    const batches = [];
    for (let i = 0; i < straight.batchesPerEpoch + 4; i++) batches.push(await rows(straight));
    expect(straight.epoch).toBe(1);
    // Epoch 1 is a different order of the same windows.
    const firstOf = (bs: typeof batches) => bs.flatMap((b) => [0, 1, 2, 3].map((r) => b.x[r * T]!));
    const epoch0 = firstOf(batches.slice(0, straight.batchesPerEpoch));
    expect(new Set(epoch0).size).toBe(epoch0.length);
    expect(firstOf(batches.slice(straight.batchesPerEpoch))).not.toEqual(epoch0.slice(0, 16));

    const stopAt = straight.batchesPerEpoch - 2;
    const first = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 9 });
    for (let i = 0; i < stopAt; i++) await rows(first);
    const state = JSON.parse(JSON.stringify(first.state())) as nt.data.LoaderState;
    const resumed = new nt.data.TokenLoader({ files, batchSize: 4, seqLen: T, seed: 9 });
    resumed.loadState(state);
    for (let i = stopAt; i < stopAt + 5; i++) expect(await rows(resumed)).toEqual(batches[i]);
    // The same position split over 2 data-parallel ranks of 2 rows.
    const halves = [0, 1].map((d) => new nt.data.TokenLoader({ files, batchSize: 2, seqLen: T, seed: 9, dpRank: d, dpSize: 2 }));
    for (const h of halves) h.loadState(state);
    for (let i = stopAt; i < stopAt + 3; i++) {
      const [a, b] = await Promise.all(halves.map(rows));
      expect([...a!.x, ...b!.x]).toEqual(batches[i]!.x);
    }
    expect(() => new nt.data.TokenLoader({ files, batchSize: 3, seqLen: T, seed: 9 }).loadState(state)).toThrow(/global batch of 4 rows/);
    expect(() => new nt.data.TokenLoader({ files, batchSize: 4, seqLen: 4, seed: 9 }).loadState(state)).toThrow(/seqLen 8/);
    expect(() => new nt.data.TokenLoader({ files: files.slice(0, 2), batchSize: 4, seqLen: T, seed: 9 }).loadState(state)).toThrow(/shards/);
  });

  it('one reader per tensor-parallel group: rank 0 reads and broadcasts, both get the batch', async () => {
    const reference = await rows(new nt.data.TokenLoader({ files, batchSize: 2, seqLen: T, seed: 4 }));
    const got = await runLocalRanks(2, async (world) => {
      const l = new nt.data.TokenLoader({ files, batchSize: 2, seqLen: T, seed: 4, tpGroup: world });
      const r = await rows(l);
      l.close();
      return { r, reads: l.isReader };
    });
    // Rank 1 holds no open shard: its batch can only have come from rank 0's broadcast.
    expect(got.map((g) => g.reads)).toEqual([true, false]);
    expect(got[0]!.r).toEqual(reference);
    expect(got[1]!.r).toEqual(reference);
  });

  it('releases the batch when the tensor-parallel broadcast fails (a lost peer), on the reader and on a receiver', async () => {
    // Groups whose broadcast fails: rejecting at the first or the second broadcast, or throwing at the call.
    const failing = (rank: number, how: 'first' | 'second' | 'throws') => {
      let calls = 0;
      return {
        rank, size: 2, ranks: [0, 1],
        broadcast: () => {
          calls++;
          if (how === 'throws') throw new nt.CommError('allReduce: the group is not connected yet', 'notConnected');
          if (how === 'first' || calls === 2) return Promise.reject(new nt.CommError('broadcast: peer lost', 'broadcast'));
          return Promise.resolve();
        },
      } as unknown as nt.distributed.CollectiveGroup;
    };
    for (const rank of [0, 1]) {
      for (const how of ['first', 'second', 'throws'] as const) {
        const l = new nt.data.TokenLoader({ files, batchSize: 2, seqLen: T, seed: 4, tpGroup: failing(rank, how) });
        expect(l.isReader).toBe(rank === 0);
        const before = nt.memoryStats('cpu').liveTensors;
        await expect(l.next()).rejects.toThrow(nt.CommError);
        expect({ rank, how, leaked: nt.memoryStats('cpu').liveTensors - before }).toEqual({ rank, how, leaked: 0 });
        l.close();
      }
    }
  });

  it('refuses bad options with the reason', () => {
    expect(() => new nt.data.TokenLoader({ files: [], batchSize: 1, seqLen: 4 })).toThrow(/at least one/);
    expect(() => new nt.data.TokenLoader({ files, batchSize: 1, seqLen: 4, dpRank: 2, dpSize: 2 })).toThrow(/not a rank/);
    expect(() => new nt.data.TokenLoader({ files: shards([10]), batchSize: 4, seqLen: 4 })).toThrow(/fewer than one global batch/);
    expect(() => new nt.data.TokenLoader({ files: [join(work, 'missing.bin')], batchSize: 1, seqLen: 4 })).toThrow(/missing\.bin/);
  });
});
