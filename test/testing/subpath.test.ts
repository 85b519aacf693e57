// The test groups live under `nodetron/testing`, not in the main API: the main entry does not export
// them, the subpath does, and package.json's "./testing" export names the files tsc emits for it.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import * as testing from '../../lib/testing/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('nodetron/testing', () => {
  it('holds the in-process and file-backed groups; the main API does not', async () => {
    for (const name of ['localWorld', 'runLocalRanks', 'fileWorld', 'LOCAL_TIMEOUT_MS']) {
      expect(name in testing, name).toBe(true);
      expect(name in nt, name).toBe(false);
      expect(name in nt.parallel, name).toBe(false);
    }
    const sums = await testing.runLocalRanks(3, async (g) => {
      const t = nt.tensor([g.rank + 1]);
      await g.allReduce(t);
      return t.toArraySync()[0];
    });
    expect(sums).toEqual([6, 6, 6]);
  });

  it("package.json exports './testing' from the compiled lib/testing/index.ts", () => {
    const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { exports: Record<string, { types: string; import: string }> };
    const tsconfig = JSON.parse(readFileSync(join(root, 'tsconfig.json'), 'utf8')) as { compilerOptions: { outDir: string; rootDir: string } };
    const { outDir, rootDir } = tsconfig.compilerOptions;
    expect(pkg.exports['./testing']).toEqual({ types: `./${outDir}/testing/index.d.ts`, import: `./${outDir}/testing/index.js` });
    expect(readFileSync(join(root, rootDir, 'testing', 'index.ts'), 'utf8')).toContain("from './local-group.js'");
  });
});
