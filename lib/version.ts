// The package version, read from package.json once.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from './native.js';

/** nodetron's version, from its package.json. */
export const version: string = (JSON.parse(readFileSync(join(packageRoot, 'package.json'), 'utf8')) as { version: string }).version;
