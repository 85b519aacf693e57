// The API reference (`npm run docs`: typedoc over lib/index.ts, config typedoc.json) documents every
// public symbol: typedoc.json turns on validation.notDocumented with treatWarningsAsErrors, so a
// symbol exported without a TSDoc comment (or a broken {@link}) fails this test.
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const typedocBin = join(dirname(createRequire(import.meta.url).resolve('typedoc/package.json')), 'bin', 'typedoc');

describe('API docs (typedoc)', () => {
  it('build with every public symbol documented and no warnings', () => {
    const r = spawnSync(process.execPath, [typedocBin, '--emit', 'none'], {
      cwd: root,
      encoding: 'utf8',
      env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
      timeout: 290_000,
    });
    const output = `${r.stdout ?? ''}${r.stderr ?? ''}`;
    const problems = output.split('\n').filter((l) => /\[(warning|error)\]/.test(l));
    expect(problems).toEqual([]);
    expect(r.status, output).toBe(0);
  }, 300_000);
});
