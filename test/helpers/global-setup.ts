// vitest's globalSetup: transpiles test/'s rank fixtures and helpers once before the files run, so
// child processes start as plain node on compiled code (test/helpers/node-script.ts says when).
import { buildTestScripts } from './node-script.js';

export default async function setup(): Promise<void> {
  await buildTestScripts();
}
