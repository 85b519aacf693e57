// `nodetron data tokenize <files or directories> --out DIR`: GPT-2 token shards in llm.c's format,
// with a progress line and a summary.
import { UsageError } from '../errors.js';
import { parseOptions } from '../cmdline/args.js';
import { tokenize } from '../data/tokenize.js';

const usage = `usage: nodetron data tokenize <.txt/.jsonl files or directories...> --out DIR [options]
  --name NAME          shard name prefix (default data): NAME_val_000000.bin, NAME_train_000001.bin, ...
  --shard-tokens N     tokens per train shard (default 100000000)
  --val-tokens N       the first N tokens go to a validation shard (default 0: none)
  --field F            the field of each JSON line holding its text (default text)
Each .txt file is one document, each .jsonl line one; every document is preceded by <|endoftext|>.`;

const fmt = (n: number) => (n >= 1e9 ? `${(n / 1e9).toFixed(2)}G` : n >= 1e6 ? `${(n / 1e6).toFixed(2)}M` : n >= 1e3 ? `${(n / 1e3).toFixed(1)}K` : String(n));

/** `nodetron data tokenize ...`; returns the exit code (usage errors are thrown as UsageError). */
export async function main(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === '--help' || sub === '-h') { console.log(usage); return 0; }
  if (sub === undefined) throw new UsageError('missing subcommand (tokenize)');
  if (sub !== 'tokenize') throw new UsageError(`unknown subcommand ${JSON.stringify(sub)} (tokenize)`);
  const o = parseOptions(rest, {
    out: 'string', name: 'string', 'shard-tokens': { kind: 'positive', min: 2, max: 2 ** 31 - 1 }, 'val-tokens': { kind: 'count', max: 2 ** 31 - 1 }, field: 'string', help: 'boolean',
  }, { h: 'help' });
  if (o.help) { console.log(usage); return 0; }
  if (o._.length === 0) throw new UsageError('give the input files or directories');
  if (!o.out) throw new UsageError('give the output directory with --out DIR');
  const tty = process.stderr.isTTY;
  let lastLine = 0;
  const summary = await tokenize(o._, {
    out: o.out as string, name: o.name as string | undefined, shardTokens: o['shard-tokens'] as number | undefined,
    valTokens: o['val-tokens'] as number | undefined, field: o.field as string | undefined,
    progress: ({ bytes, totalBytes, tokens, documents, seconds }) => {
      const frac = totalBytes > 0 ? Math.min(1, bytes / totalBytes) : 1;
      const bar = '#'.repeat(Math.round(frac * 30)).padEnd(30, '.');
      const line = `[${bar}] ${(100 * frac).toFixed(1)}%  ${fmt(tokens)} tokens  ${documents} docs  ${fmt(bytes)}B/${fmt(totalBytes)}B  ${fmt(tokens / Math.max(seconds, 1e-3))} tok/s`;
      if (tty) process.stderr.write(`\r${line}`);
      else if (seconds - lastLine >= 5 || frac === 1) { lastLine = seconds; process.stderr.write(`${line}\n`); }
    },
  });
  if (tty) process.stderr.write('\n');
  console.log(`tokenized ${summary.inputs.length} file(s), ${summary.documents} documents: ${summary.tokens} tokens in ${summary.seconds.toFixed(1)} s → ` +
    `${summary.shards.length} shard(s) in ${o.out as string} (${summary.shards.map((s) => `${s.file}: ${s.tokens}`).join(', ')}); summary in tokenize.json`);
  return 0;
}
