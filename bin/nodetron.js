#!/usr/bin/env node
// The `nodetron` command: dispatches to the compiled CLI in dist/.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cli = join(root, 'dist', 'cli.js');
if (!existsSync(cli)) {
  console.error(`nodetron: ${cli} is missing; build the package with \`npm run build\` (or \`node scripts/setup.mjs\`).`);
  process.exit(1);
}
const { main } = await import(pathToFileURL(cli).href);
process.exitCode = await main(process.argv.slice(2));
