// The nodetron CLI: `nodetron info`, `nodetron launch`, `nodetron bench <name>`. Each command lives
// in its own module and is imported only when used, so `nodetron info` stays fast.
import { NodetronError } from './errors.js';

const usage = `usage: nodetron <command> [options]

commands:
  info [--json]                  version, backends, libraries, devices (and why not)
  launch [options] script.ts     start one process per GPU (or N on CPU), torchrun-style
  plan --model M --gpus N [...]  ranked parallel layouts: memory per rank, fit, step time, command
  data tokenize <files> --out D  GPT-2 token shards (llm.c's format) from .txt/.jsonl files
  trace merge|stragglers DIR     one timeline from the per-rank traces of NODETRON_TRACE=DIR; straggler scores
  dashboard [DIR] [--port P]     web page: loss, throughput, rank × step heat-map, stragglers, memory
  bench gemm|comm|train|ops|checkpoint|trace [...]
                                 benchmarks; each prints a table, --json F writes JSON

run \`nodetron <command> --help\` for a command's options.`;

const BENCHES = ['gemm', 'comm', 'train', 'ops', 'checkpoint', 'trace'];

interface Command { main(argv: string[]): Promise<number> }

/** Imports a command module by path (commands are loaded only when used). */
async function importCommand(path: string): Promise<Command> {
  return (await import(path)) as Command;
}

export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'info':
        return (await import('./cli/info.js')).main(rest);
      case 'data':
        return (await import('./cli/data.js')).main(rest);
      case 'plan':
        return (await import('./cli/plan.js')).main(rest);
      case 'trace':
        return (await import('./cli/trace.js')).main(rest);
      case 'dashboard':
        return (await import('./cli/dashboard.js')).main(rest);
      case 'launch':
        return (await importCommand('./launch/cli.js')).main(rest);
      case 'bench': {
        const [name, ...args] = rest;
        if (!name || !BENCHES.includes(name)) {
          console.error(`nodetron bench: unknown benchmark ${JSON.stringify(name ?? '')} (${BENCHES.join(', ')})`);
          return 2;
        }
        return (await importCommand(`./bench/${name}.js`)).main(args);
      }
      case undefined:
      case '-h':
      case '--help':
      case 'help':
        console.log(usage);
        return command === undefined ? 2 : 0;
      case '--version':
      case 'version':
        console.log((await import('./version.js')).version);
        return 0;
      default:
        console.error(`nodetron: unknown command ${JSON.stringify(command)}\n\n${usage}`);
        return 2;
    }
  } catch (e) {
    if (e instanceof NodetronError) {
      console.error(`nodetron ${command}: ${e.name}: ${e.message}`);
      return 1;
    }
    throw e;
  }
}
