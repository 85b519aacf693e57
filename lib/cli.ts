// The nodetron CLI: `nodetron info`, `nodetron launch`, `nodetron bench <name>`. Each command lives
// in its own module and is imported only when used, so `nodetron info` stays fast.
import { ArgumentError, NodetronError, UsageError } from './errors.js';

const usage = `usage: nodetron <command> [options]

commands:
  info [--json]                  version, backends, libraries, devices (and why not)
  launch [options] script.ts     start one process per GPU (or N on CPU), torchrun-style
  plan --model M --gpus N [...]  ranked parallel layouts: memory per rank, fit, step time, command
  data tokenize <files> --out D  GPT-2 token shards (llm.c's format) from .txt/.jsonl files
  trace merge|stragglers DIR     one timeline from the per-rank traces of NODETRON_TRACE=DIR; straggler scores
  dashboard [DIR] [--port P]     web page: loss, throughput, rank × step heat-map, stragglers, memory
  bench gemm|comm|train|ops|checkpoint|start|head|trace|pipeline [...]
                                 benchmarks; each prints a table, --json F writes JSON

run \`nodetron <command> --help\` for a command's options.`;

/** The commands dispatch knows (usage errors are printed under their name). */
const COMMANDS = ['info', 'launch', 'plan', 'data', 'trace', 'dashboard', 'bench'] as const;

interface Command { main(argv: string[]): Promise<number> }

/** The benchmarks, each imported only when run (literal paths, so every import of lib/ is visible to its readers and tools). */
const BENCH_MODULES: Record<string, () => Promise<Command>> = {
  gemm: () => import('./bench/gemm.js'),
  comm: () => import('./bench/comm.js'),
  train: () => import('./bench/train.js'),
  ops: () => import('./bench/ops.js'),
  checkpoint: () => import('./bench/checkpoint.js'),
  start: () => import('./bench/start.js'),
  head: () => import('./bench/head.js'),
  trace: () => import('./bench/trace.js'),
  pipeline: () => import('./bench/pipeline.js'),
  chaos: () => import('./bench/chaos.js'),
};

const BENCHES = Object.keys(BENCH_MODULES);


/** The command's name as the user typed it ('bench comm', 'data tokenize'), for messages. */
function commandName(argv: readonly string[]): string {
  const [command, sub] = argv;
  if ((command === 'bench' && sub !== undefined && BENCHES.includes(sub)) || ((command === 'data' || command === 'trace') && sub !== undefined && !sub.startsWith('-'))) {
    return `${command} ${sub}`;
  }
  return command ?? '';
}

async function dispatch(command: string | undefined, rest: string[]): Promise<number> {
  switch (command) {
    case 'info':
      return await (await import('./cli/info.js')).main(rest);
    case 'data':
      return await (await import('./cli/data.js')).main(rest);
    case 'plan':
      return await (await import('./cli/plan.js')).main(rest);
    case 'trace':
      return await (await import('./cli/trace.js')).main(rest);
    case 'dashboard':
      return await (await import('./cli/dashboard.js')).main(rest);
    case 'launch':
      return await ((await import('./launch/cli.js')) as Command).main(rest);
    case 'bench': {
      const [name, ...args] = rest;
      if (name === '--help' || name === '-h') { console.log(usage); return 0; }
      if (!name || !BENCHES.includes(name)) throw new UsageError(`unknown benchmark ${JSON.stringify(name ?? '')} (${BENCHES.join(', ')})`);
      return await (await BENCH_MODULES[name]!()).main(args);
    }
    case undefined:
      console.error(usage);
      return 2;
    case '-h':
    case '--help':
    case 'help':
      if (rest.length > 0) throw new UsageError(`${command} takes no arguments; run \`nodetron <command> --help\` for a command's options`);
      console.log(usage);
      return 0;
    case '--version':
    case '-v':
    case 'version':
      if (rest.length > 0) throw new UsageError(`${command} takes no arguments`);
      console.log((await import('./version.js')).version);
      return 0;
    default:
      throw new UsageError(`unknown command ${JSON.stringify(command)} (${COMMANDS.join(', ')}, help, version)`);
  }
}

/**
 * Runs one `nodetron` command and returns its exit code: 0 success; 1 a runtime failure (a
 * NodetronError, printed on one line); 2 a usage error (an ArgumentError: an unknown command or
 * option, a missing or malformed value, a count or size out of range), printed on one line with a hint
 * to `--help`. Only an unexpected internal error propagates (with its stack).
 */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  const name = commandName(argv);
  try {
    // Awaited inside the try: a command's rejected promise is handled here like a synchronous throw.
    return await dispatch(command, rest);
  } catch (e) {
    if (e instanceof ArgumentError) {
      const known = (COMMANDS as readonly string[]).includes(command ?? '');
      const where = known ? `nodetron ${name}` : 'nodetron';
      console.error(`${where}: ${withoutPrefix(oneLine(e.message), name)}`);
      console.error(`run \`${where === 'nodetron' ? 'nodetron --help' : `${where} --help`}\` for usage`);
      return 2;
    }
    if (e instanceof NodetronError) {
      console.error(`nodetron ${name}: ${e.name}: ${oneLine(e.message)}`);
      return 1;
    }
    throw e;
  }
}

/** The message without a leading 'plan: ' or 'tokenize: ' that repeats the command's name. */
function withoutPrefix(message: string, name: string): string {
  for (const w of [name, ...name.split(' ')]) if (w && message.startsWith(`${w}: `)) return message.slice(w.length + 2);
  return message;
}

/** A message on one line (multi-line messages joined), as the CLI prints errors. */
function oneLine(message: string): string {
  return message.split('\n').map((l) => l.trim()).filter(Boolean).join(' ');
}
