// The stage-specific parts of the ZeRO optimizers are refused by the type checker, not at run time:
// compiles test/fixtures/parallel/zero-types.ts with the repository's compiler settings and checks
// that exactly the lines marked `// error: <text>` fail, each with a message containing <text>.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runLocalRanks } from '../../lib/testing/index.js';
import { ZeroOptimizer, ZeroStage12Optimizer, ZeroStage3Optimizer } from '../../lib/parallel/zero/optimizer.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixture = join(root, 'test', 'fixtures', 'parallel', 'zero-types.ts');

describe('ZeRO optimizer types', () => {
  it('each stage has its own methods; the other stage\'s are compile errors', () => {
    const config = ts.readConfigFile(join(root, 'tsconfig.json'), ts.sys.readFile);
    const { options } = ts.parseJsonConfigFileContent(config.config, ts.sys, root);
    const program = ts.createProgram([fixture], { ...options, noEmit: true, rootDir: root, skipLibCheck: true });
    const source = program.getSourceFile(fixture)!;
    const found = new Map<number, string[]>();
    for (const d of ts.getPreEmitDiagnostics(program, source)) {
      expect(d.file?.fileName, ts.flattenDiagnosticMessageText(d.messageText, '\n')).toBe(source.fileName);
      const line = source.getLineAndCharacterOfPosition(d.start!).line + 1;
      found.set(line, [...(found.get(line) ?? []), ts.flattenDiagnosticMessageText(d.messageText, '\n')]);
    }
    const expected = new Map<number, string>();
    readFileSync(fixture, 'utf8').split('\n').forEach((text, i) => {
      const m = /^(?!\s*\/\/).*\/\/ error: (.*)$/.exec(text);
      if (m) expected.set(i + 1, m[1]!);
    });
    expect(expected.size).toBeGreaterThanOrEqual(9);
    expect([...found.keys()].sort((a, b) => a - b)).toEqual([...expected.keys()].sort((a, b) => a - b));
    for (const [line, text] of expected) expect(found.get(line)!.join('\n'), `line ${line}`).toContain(text);
  }, 120_000);

  it('ZeroOptimizer builds the class of its stage, and instanceof ZeroOptimizer holds for both', async () => {
    await runLocalRanks(2, async (g) => {
      const adamw = (groups: { params: Iterable<nt.Tensor> }[]) => new nt.optim.AdamW(groups);
      const two = new ZeroOptimizer([nt.zeros([4], { requiresGrad: true })], adamw, { group: g, stage: 2 });
      const three = new ZeroOptimizer([nt.zeros([4], { requiresGrad: true })], adamw, { group: g, stage: 3 });
      expect(two).toBeInstanceOf(ZeroStage12Optimizer);
      expect(two).not.toBeInstanceOf(ZeroStage3Optimizer);
      expect(three).toBeInstanceOf(ZeroStage3Optimizer);
      expect(three).not.toBeInstanceOf(ZeroStage12Optimizer);
      expect(two instanceof ZeroOptimizer && three instanceof ZeroOptimizer).toBe(true);
      expect({} instanceof ZeroOptimizer).toBe(false);
      expect([two.stage, three.stage]).toEqual([2, 3]);
      // JavaScript callers find no other stage's method to call (TypeScript callers do not compile).
      expect(['attach' in two, 'gatherStats' in two, 'noSync' in three, 'reduceStats' in three]).toEqual([false, false, false, false]);
      expect(() => new ZeroStage12Optimizer([nt.zeros([4])], adamw, { group: g, stage: 3 as never })).toThrow(/stage must be 1 or 2, got 3/);
      expect(() => new ZeroStage3Optimizer([nt.zeros([4])], adamw, { group: g, stage: 1 as never })).toThrow(/stage must be 3, got 1/);
      two.dispose();
      three.dispose();
    });
  });
});
