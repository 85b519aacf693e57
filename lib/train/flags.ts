// Layout flags from the command line and the environment (`--tp 2 --pp 2 --zero 1 --sp --micro-batches 4
// --schedule 1f1b --offload --recompute`, or NODETRON_TP=2 …), so one training script runs as one
// process or under `nodetron launch` with any layout; and a strict parser for a script's own options
// together with the layout flags.
import { ArgumentError } from '../errors.js';
import { parseOptions } from '../cmdline/args.js';
import type { LayoutFlags } from '../parallel/layout.js';

/** The layout flags of a training run: a parallel layout (checked later against the model and the world) and recomputation. */
export interface LayoutArgs extends LayoutFlags {
  /** Recompute each block's activations in backward (`--recompute`). */
  recompute?: boolean;
  /** Compute precision (`--precision bf16`): the forward under bf16 autocast, f32 master weights (default f32). */
  precision?: 'f32' | 'bf16';
  /** In-job recovery (`--recover memory`): see TrainSetupOptions.recover. */
  recover?: 'memory' | 'off';
  /** In-job recovery: copy the state every N steps (`--recover-every N`, default 1): see TrainSetupOptions.recoverEvery. */
  recoverEvery?: number;
}

/** A parsed command line: each option's value by name, and the positional arguments in `_`. */
export type ParsedOptions = {
  [name: string]: string | number | boolean | string[] | undefined;
  /** Positional arguments, in order. */
  _: string[];
};

/** The kind of value an option takes (`--name value`, or a `--flag` for booleans). */
export type OptionKind = 'string' | 'number' | 'boolean';

/** The layout flags (command-line names) and their kinds. */
export const LAYOUT_FLAGS: Readonly<Record<string, OptionKind>> = Object.freeze({
  tp: 'number', pp: 'number', dp: 'number', zero: 'number', sp: 'boolean', offload: 'boolean', recompute: 'boolean',
  'micro-batches': 'number', schedule: 'string', precision: 'string', 'virtual-stages': 'number',
  cp: 'number', 'cp-mode': 'string', ep: 'number', recover: 'string', 'recover-every': 'number',
});

/** Each layout flag's environment variable (the command line wins when both are given). */
export const LAYOUT_ENV: Readonly<Record<string, string>> = Object.freeze({
  tp: 'NODETRON_TP', pp: 'NODETRON_PP', dp: 'NODETRON_DP', zero: 'NODETRON_ZERO', sp: 'NODETRON_SP', offload: 'NODETRON_OFFLOAD',
  recompute: 'NODETRON_RECOMPUTE', 'micro-batches': 'NODETRON_MICRO_BATCHES', schedule: 'NODETRON_SCHEDULE',
  precision: 'NODETRON_PRECISION', 'virtual-stages': 'NODETRON_VIRTUAL_STAGES',
  cp: 'NODETRON_CP', 'cp-mode': 'NODETRON_CP_MODE', ep: 'NODETRON_EP', recover: 'NODETRON_RECOVER', 'recover-every': 'NODETRON_RECOVER_EVERY',
});

/** Usage text of the layout flags, for a script's `--help`. */
export const LAYOUT_HELP = `Parallel layouts (run under \`nodetron launch --nproc-per-node N\`; tp·pp·dp must equal N; each flag
also reads from its environment variable, NODETRON_TP, NODETRON_PP, NODETRON_DP, NODETRON_ZERO, NODETRON_SP,
NODETRON_OFFLOAD, NODETRON_RECOMPUTE, NODETRON_MICRO_BATCHES, NODETRON_SCHEDULE, NODETRON_PRECISION,
NODETRON_VIRTUAL_STAGES, NODETRON_CP, NODETRON_CP_MODE, NODETRON_EP, NODETRON_RECOVER):
  --dp N               data-parallel ranks (default: N / (tp·pp)); each trains batch/dp sequences
  --pp N               pipeline stages: each holds about layers/N layers (embeddings on the first, head on the last)
  --micro-batches M    split each rank's sequences into M micro-batches (default 1); the pipeline
                       overlaps them, and one process accumulates their gradients
  --schedule S         gpipe | 1f1b | interleaved | zb-h1 | zb-v (default 1f1b; all give the same numbers):
                       1f1b holds fewer activations than gpipe; interleaved (needs --virtual-stages >= 2
                       and micro-batches a multiple of pp), zb-h1 (weight gradients deferred into the
                       bubble) and zb-v (2 chunks per rank in a V: rank r holds chunks r and 2·pp − 1 − r,
                       B and W split as in zb-h1) have smaller bubbles; every --zero stage works with both
  --virtual-stages V   model chunks per pipeline rank for --schedule interleaved (default 1; selects
                       interleaved when > 1): rank r holds chunks r, r + pp, ... of pp·V
  --zero 0|1|2|3       ZeRO stage: shard optimizer state (1), gradients too (2), parameters too (3) over the dp ranks
  --offload            keep ZeRO shards in host memory (needs --zero 1|2|3; no-op for cpu parameters)
  --tp N               tensor-parallel ranks: attention heads, MLP and vocabulary split N ways
                       (N must divide the heads, the width and the vocabulary)
  --sp                 sequence parallelism (needs --tp > 1 dividing the context): LayerNorms, residuals and
                       embeddings hold ctx/tp positions per tensor-parallel rank, which cuts their activations
  --cp N               context parallelism: each sequence split over N ranks (NODETRON_CP); attention over
                       all of it by ring attention or Ulysses; gradients average over dp×cp
  --cp-mode M          ring | ulysses (default ring; NODETRON_CP_MODE): ring needs the context divisible
                       by 2·N, Ulysses by N and the heads (per tensor-parallel rank) by N
  --ep N               expert parallelism (models with MoE layers): the experts split over groups of N
                       data-parallel ranks (N must divide dp and the experts)
  --recompute          recompute each block's activations in backward
  --precision P        f32 | bf16 (default f32): bf16 runs the forward under bf16 autocast (GEMMs and
                       attention in bf16 with f32 accumulation; parameters, gradients, optimizer in f32)
  --recover memory|off in-job recovery (needs \`nodetron launch --spares N\`): each rank's state is copied to
                       another process's memory after every step; a lost rank is replaced from that copy
                       and the job goes on from the last complete step, without a restart (docs/recovery.md)
  --recover-every N    copy the state every N steps instead (default 1): less copying, up to N steps redone`;

function toLayout(values: Record<string, string | number | boolean | undefined>): LayoutArgs {
  const out: LayoutArgs = {};
  for (const k of ['tp', 'pp', 'dp', 'micro-batches', 'virtual-stages', 'cp', 'ep', 'recover-every']) {
    const v = values[k];
    if (v !== undefined && !(Number.isSafeInteger(v) && (v as number) >= 1)) throw new ArgumentError(`--${k} must be an integer >= 1, got ${String(v)}`);
  }
  if (values.zero !== undefined && ![0, 1, 2, 3].includes(values.zero as number)) throw new ArgumentError(`--zero must be 0, 1, 2 or 3, got ${String(values.zero)}`);
  const num = (k: string) => values[k] as number | undefined;
  const bool = (k: string) => values[k] as boolean | undefined;
  if (num('tp') !== undefined) out.tp = num('tp');
  if (num('pp') !== undefined) out.pp = num('pp');
  if (num('dp') !== undefined) out.dp = num('dp');
  if (num('zero') !== undefined) out.zero = num('zero');
  if (num('micro-batches') !== undefined) out.microBatches = num('micro-batches');
  if (num('virtual-stages') !== undefined) out.virtualStages = num('virtual-stages');
  if (num('cp') !== undefined) out.cp = num('cp');
  if (values['cp-mode'] !== undefined) {
    const m = String(values['cp-mode']);
    if (m !== 'ring' && m !== 'ulysses') throw new ArgumentError(`--cp-mode must be ring or ulysses, got ${JSON.stringify(m)}`);
    out.cpMode = m;
  }
  if (num('ep') !== undefined) out.ep = num('ep');
  if (values.schedule !== undefined) out.schedule = String(values.schedule);
  if (bool('sp') !== undefined) out.sequenceParallel = bool('sp');
  if (bool('offload') !== undefined) out.offload = bool('offload');
  if (bool('recompute') !== undefined) out.recompute = bool('recompute');
  if (num('recover-every') !== undefined) out.recoverEvery = num('recover-every');
  if (values.recover !== undefined) {
    const r = String(values.recover);
    if (r !== 'memory' && r !== 'off') throw new ArgumentError(`--recover must be memory or off, got ${JSON.stringify(r)}`);
    out.recover = r;
  }
  if (values.precision !== undefined) {
    const p = String(values.precision);
    if (p !== 'f32' && p !== 'bf16') throw new ArgumentError(`--precision must be f32 or bf16, got ${JSON.stringify(p)}${p === 'f16' ? ' (f16 needs loss scaling: use nt.autocast with nt.GradScaler in your own loop)' : ''}`);
    out.precision = p;
  }
  return out;
}

/** A layout flag's value from its environment variable (undefined when unset or empty). */
function fromEnv(flag: string, kind: OptionKind, env: NodeJS.ProcessEnv): string | number | boolean | undefined {
  const name = LAYOUT_ENV[flag]!;
  const raw = env[name]?.trim();
  if (raw === undefined || raw === '') return undefined;
  if (kind === 'number') {
    const n = Number(raw);
    if (!Number.isFinite(n)) throw new ArgumentError(`environment variable ${name}=${JSON.stringify(raw)} must be a number`);
    return n;
  }
  if (kind === 'boolean') {
    if (/^(1|true|yes|on)$/i.test(raw)) return true;
    if (/^(0|false|no|off)$/i.test(raw)) return false;
    throw new ArgumentError(`environment variable ${name}=${JSON.stringify(raw)} must be 1/true/yes/on or 0/false/no/off`);
  }
  return raw;
}

/**
 * The layout flags in `argv` (other options are skipped over, not checked: see {@link parseArgs} for
 * a strict parse) over those in the environment. Throws an ArgumentError for a flag without a value
 * or with a value of the wrong kind.
 */
export function layoutFromArgs(argv: readonly string[] = process.argv.slice(2), env: NodeJS.ProcessEnv = process.env): LayoutArgs {
  const values: Record<string, string | number | boolean | undefined> = {};
  for (const [flag, kind] of Object.entries(LAYOUT_FLAGS)) values[flag] = fromEnv(flag, kind, env);
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') break;
    if (!a.startsWith('--')) continue;
    const [key, inline] = a.slice(2).split('=', 2) as [string, string | undefined];
    const kind = Object.hasOwn(LAYOUT_FLAGS, key) ? LAYOUT_FLAGS[key] : undefined;
    if (!kind) continue;
    const sub = parseOptions(kind === 'boolean' || inline !== undefined ? [a] : [a, ...(argv[i + 1] === undefined ? [] : [argv[i + 1]!])], { [key]: kind });
    if (kind !== 'boolean' && inline === undefined) i++;
    values[key] = sub[key] as string | number | boolean;
  }
  return toLayout(values);
}

/**
 * A script's command line: its own options (`spec`: each name and the kind of value it takes) and the
 * layout flags together. Unknown options are an ArgumentError naming the known ones. The layout
 * flags' environment variables fill in what the command line leaves out.
 */
export function parseArgs(argv: readonly string[], spec: Record<string, OptionKind>, env: NodeJS.ProcessEnv = process.env): {
  /** The script's own options (layout flags removed). */
  options: ParsedOptions;
  /** The layout flags, command line over environment. */
  layout: LayoutArgs;
} {
  for (const k of Object.keys(spec)) {
    if (Object.hasOwn(LAYOUT_FLAGS, k)) throw new ArgumentError(`parseArgs: --${k} is a layout flag (parsed for you); leave it out of the script's options`);
  }
  let options: ParsedOptions;
  try {
    options = parseOptions([...argv], { ...spec, ...LAYOUT_FLAGS });
  } catch (e) {
    const unknown = e instanceof ArgumentError ? /^unknown option (\S+)/.exec(e.message) : null;
    if (!unknown) throw e;
    const known = [...Object.keys(spec), ...Object.keys(LAYOUT_FLAGS)].map((k) => `--${k}`).join(' ');
    throw new ArgumentError(`unknown option ${unknown[1]} (known options: ${known})`);
  }
  const values: Record<string, string | number | boolean | undefined> = {};
  for (const [flag, kind] of Object.entries(LAYOUT_FLAGS)) {
    values[flag] = options[flag] !== undefined ? options[flag] as string | number | boolean : fromEnv(flag, kind, env);
    delete options[flag];
  }
  return { options, layout: toLayout(values) };
}
