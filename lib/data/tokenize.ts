// `nodetron data tokenize`: text (.txt: one document per file) and JSON lines (.jsonl: one document
// per line, in a field) → GPT-2 BPE tokens (js-tiktoken, no network) in llm.c's shard format, each
// document preceded by <|endoftext|> as llm.c's data scripts do. The first --val-tokens go to a
// validation shard (<name>_val_000000.bin), the rest to train shards of --shard-tokens each.
// Inputs are read in sorted order (directories recursively), JSON lines streamed.
import { createReadStream, mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { extname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { Tiktoken } from 'js-tiktoken/lite';
import gpt2Ranks from 'js-tiktoken/ranks/gpt2';
import { ArgumentError, StateError } from '../errors.js';
import { writeTokenShard } from './shards.js';

/** GPT-2's <|endoftext|>. */
export const GPT2_EOT = 50256;
const EXTENSIONS = new Set(['.txt', '.jsonl']);

let encoder: Tiktoken | undefined;
/** The GPT-2 BPE (bundled ranks). */
export function gpt2Tokenizer(): Tiktoken {
  encoder ??= new Tiktoken(gpt2Ranks);
  return encoder;
}

/** Options of {@link tokenize}. */
export interface TokenizeOptions {
  /** Output directory (created if missing). */
  out: string;
  /** Shard name prefix (default 'data'). */
  name?: string;
  /** Tokens per train shard (default 100M, llm.c's size). */
  shardTokens?: number;
  /** Tokens in the validation shard (default 0: none). */
  valTokens?: number;
  /** The JSON field holding a line's text (default 'text'). */
  field?: string;
  /** Progress lines (default: none). */
  progress?: (p: { bytes: number; totalBytes: number; tokens: number; documents: number; seconds: number }) => void;
}

/** What {@link tokenize} returns (and writes to tokenize.json in the output directory). */
export interface TokenizeSummary {
  /** The input files, in the order read. */
  inputs: string[];
  /** Documents tokenized. */
  documents: number;
  /** Tokens written, <|endoftext|> separators included. */
  tokens: number;
  /** Input text bytes (UTF-8) read. */
  bytes: number;
  /** Wall time taken, in seconds. */
  seconds: number;
  /** The shards written. */
  shards: Array<{
    /** Path of the shard file. */
    file: string;
    /** Whether it is the validation shard or a train shard. */
    split: 'val' | 'train';
    /** Tokens in the shard. */
    tokens: number;
  }>;
}

/** The input files: files as given, directories walked (sorted), keeping .txt and .jsonl. */
export function listInputs(paths: string[]): string[] {
  if (!Array.isArray(paths) || paths.some((p) => typeof p !== 'string')) throw new ArgumentError(`tokenize: the inputs must be an array of file or directory paths`);
  const out: string[] = [];
  const walk = (p: string, explicit: boolean) => {
    let st;
    try { st = statSync(p); } catch { throw new ArgumentError(`tokenize: ${p} does not exist`); }
    if (st.isDirectory()) {
      for (const name of readdirSync(p).sort()) walk(join(p, name), false);
    } else if (EXTENSIONS.has(extname(p))) out.push(resolve(p));
    else if (explicit) throw new ArgumentError(`tokenize: ${p} is neither .txt nor .jsonl`);
  };
  for (const p of paths) walk(p, true);
  if (out.length === 0) throw new ArgumentError(`tokenize: no .txt or .jsonl files in ${paths.join(', ')}`);
  return out;
}

/** Tokenizes the inputs into shards under opts.out; returns (and writes as tokenize.json) a summary. */
export async function tokenize(paths: string[], opts: TokenizeOptions): Promise<TokenizeSummary> {
  if (opts === null || typeof opts !== 'object' || typeof opts.out !== 'string' || opts.out === '') {
    throw new ArgumentError(`tokenize: options must give out, the output directory (a non-empty string)`);
  }
  const name = opts.name ?? 'data', field = opts.field ?? 'text';
  const shardTokens = opts.shardTokens ?? 100_000_000, valTokens = opts.valTokens ?? 0;
  if (!(Number.isInteger(shardTokens) && shardTokens >= 2 && shardTokens < 2 ** 31)) throw new ArgumentError(`tokenize: --shard-tokens must be an integer in [2, 2^31), got ${shardTokens}`);
  if (!(Number.isInteger(valTokens) && valTokens >= 0 && valTokens < 2 ** 31)) throw new ArgumentError(`tokenize: --val-tokens must be an integer >= 0, got ${valTokens}`);
  if (!/^[\w.-]+$/.test(name)) throw new ArgumentError(`tokenize: --name must be letters, digits, '.', '_' or '-', got ${JSON.stringify(name)}`);
  const inputs = listInputs(paths);
  const totalBytes = inputs.reduce((s, f) => s + statSync(f).size, 0);
  mkdirSync(opts.out, { recursive: true });
  const enc = gpt2Tokenizer();
  const t0 = performance.now();
  const summary: TokenizeSummary = { inputs, documents: 0, tokens: 0, bytes: 0, seconds: 0, shards: [] };

  let split: 'val' | 'train' = valTokens > 0 ? 'val' : 'train';
  let capacity = split === 'val' ? valTokens : shardTokens;
  let buf = new Uint16Array(capacity);
  let fill = 0;
  const flush = () => {
    if (fill === 0) return;
    const file = `${name}_${split}_${String(summary.shards.length).padStart(6, '0')}.bin`;
    writeTokenShard(join(opts.out, file), buf.subarray(0, fill));
    summary.shards.push({ file, split, tokens: fill });
    split = 'train';
    capacity = shardTokens;
    buf = new Uint16Array(capacity);
    fill = 0;
  };
  const push = (tokens: number[]) => {
    let i = 0;
    while (i < tokens.length) {
      const n = Math.min(tokens.length - i, capacity - fill);
      for (let k = 0; k < n; k++) buf[fill + k] = tokens[i + k]!;
      fill += n;
      i += n;
      if (fill === capacity) flush();
    }
    summary.tokens += tokens.length;
  };
  const doc = (text: string) => {
    push([GPT2_EOT, ...enc.encode(text, [], [])]);
    summary.documents++;
  };
  let lastReport = 0;
  const report = (force = false) => {
    const now = performance.now();
    if (!opts.progress || (!force && now - lastReport < 250)) return;
    lastReport = now;
    opts.progress({ bytes: summary.bytes, totalBytes, tokens: summary.tokens, documents: summary.documents, seconds: (now - t0) / 1000 });
  };

  for (const file of inputs) {
    if (extname(file) === '.txt') {
      const text = readFileSync(file, 'utf8');
      doc(text);
      summary.bytes += Buffer.byteLength(text);
      report();
      continue;
    }
    const lines = createInterface({ input: createReadStream(file, { encoding: 'utf8' }), crlfDelay: Infinity });
    let lineNo = 0;
    for await (const line of lines) {
      lineNo++;
      summary.bytes += Buffer.byteLength(line) + 1;
      if (line.trim() === '') continue;
      let value: unknown;
      try { value = JSON.parse(line); } catch (e) { throw new StateError(`tokenize: ${file}:${lineNo}: not JSON (${(e as Error).message})`); }
      const text = (value as Record<string, unknown> | null)?.[field];
      if (typeof text !== 'string') throw new StateError(`tokenize: ${file}:${lineNo}: no string field '${field}'`);
      doc(text);
      report();
    }
  }
  flush();
  summary.seconds = (performance.now() - t0) / 1000;
  report(true);
  writeFileSync(join(opts.out, 'tokenize.json'), JSON.stringify(summary, null, 2));
  return summary;
}
