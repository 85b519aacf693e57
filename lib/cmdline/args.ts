// The one command-line option parser of every `nodetron` command and benchmark (and of training
// scripts' flags, lib/train/flags.ts): `--name value`, `--name=value`, `--flag`, short aliases, values
// checked by kind (numbers, counts, sizes, choices) before a command runs. Every problem is a
// UsageError, which the CLI prints as one line with a hint to --help and exit code 2.
import { existsSync, statSync } from 'node:fs';
import { totalmem } from 'node:os';
import { dirname, resolve } from 'node:path';
import { UsageError } from '../errors.js';

/**
 * The kind of value an option takes:
 * - 'string', 'boolean' (`--flag`, or `--flag=true|false`), 'number' (any finite decimal number);
 * - 'count': an integer >= 0; 'positive': an integer >= 1;
 * - 'bytes': a size such as 8, 64K, 128M, 1G (powers of 1024), at least 1 byte and at most this machine's memory;
 * - 'infile': an existing file to read; 'outfile': a file to write (`-` for standard output) in an existing
 *   directory, checked before a command runs rather than after its work.
 * An object adds bounds or choices to a kind.
 */
export type ArgKind = 'string' | 'number' | 'boolean' | 'count' | 'positive' | 'bytes' | 'infile' | 'outfile';

/** An option with bounds (`min`, `max`, for numbers, counts and sizes) or a fixed set of `choices` (strings). */
export interface ArgSpec {
  /** The kind of value. */
  kind: ArgKind;
  /** Smallest value allowed (numbers, counts, sizes). */
  min?: number;
  /** Largest value allowed (numbers, counts, sizes). */
  max?: number;
  /** The values a string option may take. */
  choices?: readonly string[];
}

/** Parsed options: each option's value by name (numbers for number kinds and sizes), positional arguments in `_`. */
export type Options = { [key: string]: string | number | boolean | string[] | undefined; _: string[] };

const NUMBER = /^[+-]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$/i;

/** Parses a size such as 8, 64K, 128M, 1G, 2GiB (powers of 1024) into bytes; UsageError when it is not one. */
export function parseBytes(text: string, what = 'size'): number {
  const m = /^(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?$/i.exec(String(text).trim());
  if (!m) throw new UsageError(`cannot read ${JSON.stringify(text)} as a ${what} (e.g. 8, 64K, 128M, 1G)`);
  return Math.round(Number(m[1]) * 1024 ** ' KMGT'.indexOf((m[2] || ' ').toUpperCase()));
}

const fmtBytes = (b: number) => (b >= 2 ** 30 ? `${(b / 2 ** 30).toFixed(1)} GiB` : b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MiB` : `${b} bytes`);

/** Checks one option's text against its kind and bounds and returns its value. */
function value(flag: string, text: string, spec: ArgSpec): string | number | boolean {
  const { kind } = spec;
  if (kind === 'infile') {
    if (!existsSync(text) || !statSync(text).isFile()) throw new UsageError(`${flag}: ${text} is not a file`);
    return text;
  }
  if (kind === 'outfile') {
    if (text === '-') return text;
    const parent = dirname(resolve(text));
    if (text === '' || (existsSync(text) && statSync(text).isDirectory())) throw new UsageError(`${flag}: ${JSON.stringify(text)} is a directory, not a file to write`);
    if (!existsSync(parent) || !statSync(parent).isDirectory()) throw new UsageError(`${flag}: cannot write ${text}: the directory ${parent} does not exist`);
    return text;
  }
  if (kind === 'string') {
    if (spec.choices && !spec.choices.includes(text)) throw new UsageError(`${flag} must be one of ${spec.choices.join(', ')}; got ${JSON.stringify(text)}`);
    return text;
  }
  if (kind === 'boolean') {
    if (/^(true|1|yes|on)$/i.test(text)) return true;
    if (/^(false|0|no|off)$/i.test(text)) return false;
    throw new UsageError(`${flag} is a flag: give it alone, or as ${flag}=true|false; got ${JSON.stringify(text)}`);
  }
  let n: number;
  let shown: (v: number) => string = String;
  if (kind === 'bytes') {
    n = parseBytes(text, `${flag} size`);
    shown = fmtBytes;
  } else {
    if (!NUMBER.test(text.trim())) throw new UsageError(`${flag} needs a number, got ${JSON.stringify(text)}`);
    n = Number(text);
    if (!Number.isFinite(n)) throw new UsageError(`${flag} needs a finite number, got ${JSON.stringify(text)}`);
    if ((kind === 'count' || kind === 'positive') && !Number.isSafeInteger(n)) throw new UsageError(`${flag} needs a whole number, got ${JSON.stringify(text)}`);
  }
  const min = spec.min ?? (kind === 'positive' || kind === 'bytes' ? 1 : kind === 'count' ? 0 : -Infinity);
  const max = spec.max ?? (kind === 'bytes' ? totalmem() : Infinity);
  if (n < min) throw new UsageError(`${flag} must be at least ${shown(min)}, got ${text}`);
  if (n > max) throw new UsageError(`${flag} must be at most ${shown(max)}${kind === 'bytes' && spec.max === undefined ? ' (this machine\'s memory)' : ''}, got ${text}`);
  return n;
}

/**
 * Parses `--name value`, `--name=value` and `--flag` options; `spec` maps long names to kinds,
 * `aliases` short names (`-b`) or alternative names to long ones. Arguments that do not start with
 * `-` (and a lone `-`) are positional, as is everything after `--`. Throws UsageError for an unknown
 * option, a missing value or a value of the wrong kind.
 */
export function parseOptions(argv: readonly string[], spec: Readonly<Record<string, ArgKind | ArgSpec>>, aliases: Readonly<Record<string, string>> = {}): Options {
  const out: Options = { _: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') { out._.push(...argv.slice(i + 1)); break; }
    if (!a.startsWith('-') || a === '-' || /^-\d/.test(a)) { out._.push(a); continue; }
    const eq = a.indexOf('=');
    const name = (eq >= 0 ? a.slice(0, eq) : a).replace(/^--?/, '');
    const inline = eq >= 0 ? a.slice(eq + 1) : undefined;
    const key = Object.hasOwn(aliases, name) ? aliases[name]! : name;
    const raw = Object.hasOwn(spec, key) ? spec[key]! : undefined;
    if (raw === undefined) {
      throw new UsageError(`unknown option ${a.split('=', 1)[0]} (options: ${Object.keys(spec).map((k) => `--${k}`).join(' ')})`);
    }
    const s: ArgSpec = typeof raw === 'string' ? { kind: raw } : raw;
    // Messages name the option as typed (-e), with its long name when that differs (-e (--maxbytes)).
    const typed = a.slice(0, eq >= 0 ? eq : undefined);
    const flag = typed === `--${key}` ? typed : `${typed} (--${key})`;
    if (s.kind === 'boolean' && inline === undefined) { out[key] = true; continue; }
    let text = inline;
    if (text === undefined) {
      const next = argv[i + 1];
      if (next === undefined || (next.startsWith('--') && next.length > 2)) throw new UsageError(`option ${flag} needs a value`);
      text = next;
      i++;
    }
    out[key] = value(flag, text, s);
  }
  return out;
}

/** Throws UsageError unless there are between `min` and `max` positional arguments; `what` names them. */
export function expectPositionals(o: Options, what: string, min: number, max = min): string[] {
  if (o._.length < min) throw new UsageError(`missing ${what}`);
  if (o._.length > max) throw new UsageError(`unexpected argument ${JSON.stringify(o._[max])}${max === 0 ? ' (this command takes options only)' : ''}`);
  return o._;
}
