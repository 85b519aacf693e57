// One definition of the elementwise op codes: native/core/op_codes.h, compiled by both backends, and
// lib/kernel-codes.ts, which the ops send; they must agree, and a code past the list is refused.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { BINARY, UNARY } from '../../lib/kernel-codes.js';
import { cpu } from '../../lib/native.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const header = readFileSync(join(root, 'native', 'core', 'op_codes.h'), 'utf8');

/** The enumerators of `enum name : int { kA = 0, ... }` in the header, without the k prefix, lower camel case. */
function enumOf(name: string): Record<string, number> {
  const body = new RegExp(`enum ${name}\\s*:\\s*int\\s*\\{([^}]*)\\}`).exec(header)?.[1];
  if (!body) throw new Error(`enum ${name} not found in op_codes.h`);
  const out: Record<string, number> = {};
  for (const m of body.matchAll(/k(\w+)\s*=\s*(\d+)/g)) out[m[1]![0]!.toLowerCase() + m[1]!.slice(1)] = Number(m[2]);
  return out;
}

describe('elementwise op codes', () => {
  it('lib/kernel-codes.ts matches native/core/op_codes.h, op for op, and the counts close each list', () => {
    const { binaryOpCount, ...binary } = enumOf('BinaryOp');
    const { unaryOpCount, ...unary } = enumOf('UnaryOp');
    expect(binary).toEqual({ ...BINARY });
    expect(unary).toEqual({ ...UNARY });
    expect(binaryOpCount).toBe(Object.keys(BINARY).length);
    expect(unaryOpCount).toBe(Object.keys(UNARY).length);
  });

  it('each backend compiles the shared header (no enum of its own) and refuses a code past the list', () => {
    for (const f of ['native/cpu/kernels/elementwise.cc', 'native/cuda/kernels/elementwise.cu']) {
      const src = readFileSync(join(root, f), 'utf8');
      expect(src, f).toMatch(/#include "[./]*core\/op_codes\.h"/);
      expect(src, f).not.toMatch(/enum\s+(BinaryOp|UnaryOp)\b/);
    }
    const a = nt.ones([4]), o = nt.zeros([4]);
    expect(() => cpu().binary(Object.keys(BINARY).length, a.storage, a.storage, o.storage, 0, new Int32Array([4]), new Int32Array([1]), new Int32Array([1]))).toThrow(new RegExp(`binary: unknown op ${Object.keys(BINARY).length}`));
    expect(() => cpu().unary(Object.keys(UNARY).length, a.storage, o.storage, 4, 0, 0)).toThrow(new RegExp(`unary: unknown op ${Object.keys(UNARY).length}`));
    expect([...nt.add(a, a).toArraySync()]).toEqual([2, 2, 2, 2]);
  });
});
