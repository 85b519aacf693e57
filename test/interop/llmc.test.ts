// llm.c model files against the golden ones scripts/golden/interop.py wrote with llm.c's writer logic
// (test/golden/interop/gpt2-tiny.bin fp32, gpt2-tiny_bf16.bin bf16, vocabulary 64 padded to 128):
// readLlmc equals importHF of the same weights (f32 bit-exact, bf16 to bf16 rounding); writeLlmc of
// the imported model is the golden file byte for byte; round trips are bit-exact with any padding; a
// file with a bad magic, version, header or size is refused with the reason.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectSameWeights, f32, golden, HF_DIR, LLMC_BF16, LLMC_F32, logitsOf, relErr, scratch } from './helpers.js';

const { readLlmc, readLlmcHeader, writeLlmc, importHF } = nt.interop;
const work = scratch('nt-llmc-');
let n = 0;
const fresh = () => join(work, `m${n++}.bin`);

describe('readLlmc', () => {
  it('reads the fp32 file as importHF reads the HF checkpoint, bit for bit', () => {
    expect(readLlmcHeader(LLMC_F32)).toEqual({ version: 3, dtype: 'f32', maxT: 16, vocabSize: 64, paddedVocabSize: 128, nLayer: 2, nHead: 2, nEmbd: 32 });
    using hf = importHF(HF_DIR);
    using m = readLlmc(LLMC_F32);
    expect(m.config).toEqual({ vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true });
    expectSameWeights(m, hf);
    expect(relErr(logitsOf(m), f32(golden.logits))).toBeLessThan(1e-4);
  });

  it('reads the bf16 file as the HF weights rounded to bf16', () => {
    expect(readLlmcHeader(LLMC_BF16)).toMatchObject({ version: 5, dtype: 'bf16', paddedVocabSize: 128 });
    using hf = importHF(HF_DIR);
    using m = readLlmc(LLMC_BF16);
    expect(m.wte.weight.dtype).toBe('f32');
    expectSameWeights(m, hf, 'bf16');
    using half = readLlmc(LLMC_BF16, { dtype: 'bf16', dropout: 0.1 });
    expect(half.wte.weight.dtype).toBe('bf16');
    expect(half.config.dropout).toBe(0.1);
    expectSameWeights(half, m, 'bf16');
    // bf16 weights stay close to the f32 model's logits.
    expect(relErr(logitsOf(m), f32(golden.logits))).toBeLessThan(2e-2);
  });
});

describe('writeLlmc', () => {
  it('writes the golden files byte for byte from the imported HF model (fp32 and bf16)', () => {
    using hf = importHF(HF_DIR);
    const a = fresh(), b = fresh();
    writeLlmc(hf, a);
    expect(readFileSync(a).equals(readFileSync(LLMC_F32))).toBe(true);
    writeLlmc(hf, b, { dtype: 'bf16' });
    expect(readFileSync(b).equals(readFileSync(LLMC_BF16))).toBe(true);
  });

  it('round-trips bit for bit with any padding, any size, any model dtype', () => {
    const config = { vocabSize: 50, blockSize: 24, nLayer: 3, nHead: 4, nEmbd: 48, dropout: 0, bias: true };
    using model = new nt.nn.GPT(config, { seed: 3 });
    nt.noGrad(() => {
      for (const [i, [, p]] of model.namedParameters().entries()) {
        using noise = nt.randn(p.shape, { seed: 200 + i, std: 0.05 });
        using sum = nt.add(p, noise);
        p.backend.copy(p.storage, 0, sum.storage, 0, p.nbytes);
      }
    });
    for (const paddedVocabSize of [undefined, 50, 57]) {
      const path = fresh();
      writeLlmc(model, path, { paddedVocabSize });
      const vp = paddedVocabSize ?? 128;
      expect(readLlmcHeader(path)).toMatchObject({ vocabSize: 50, paddedVocabSize: vp, maxT: 24 });
      const bytes = readFileSync(path);
      const h = new Int32Array(bytes.buffer, bytes.byteOffset, 256);
      expect([...h.subarray(0, 8)]).toEqual([20240326, 3, 24, 50, 3, 4, 48, vp]);
      expect([...h.subarray(8)].every((x) => x === 0)).toBe(true);
      // The padding rows after the 50 real ones are zeros; wpe follows them.
      expect(bytes.subarray(1024 + 50 * 48 * 4, 1024 + vp * 48 * 4).every((x) => x === 0)).toBe(true);
      const wpe = new Float32Array(bytes.buffer.slice(bytes.byteOffset + 1024 + vp * 48 * 4, bytes.byteOffset + 1024 + vp * 48 * 4 + 16));
      expect([...wpe]).toEqual([...model.wpe.weight.toArraySync().subarray(0, 4)]);
      using back = readLlmc(path);
      expectSameWeights(back, model);
    }
    // A bf16 model written as bf16 comes back bit for bit.
    using half = readLlmc((() => { const p = fresh(); writeLlmc(model, p, { dtype: 'bf16' }); return p; })(), { dtype: 'bf16' });
    const path = fresh();
    writeLlmc(half, path, { dtype: 'bf16' });
    using again = readLlmc(path, { dtype: 'bf16' });
    expectSameWeights(again, half, 'bf16');
    expectSameWeights(again, model, 'bf16');
  });

  it('refuses bad options', () => {
    using m = readLlmc(LLMC_F32);
    expect(() => writeLlmc(m, fresh(), { dtype: 'f16' as never })).toThrow(nt.ArgumentError);
    expect(() => writeLlmc(m, fresh(), { paddedVocabSize: 63 })).toThrow(/paddedVocabSize must be an integer >= vocabSize 64/);
    expect(() => readLlmc(LLMC_F32, { dropout: -1 })).toThrow(nt.ArgumentError);
  });
});

describe('malformed llm.c files', () => {
  const good = readFileSync(LLMC_F32);
  const edited = (edit: (b: Buffer) => Buffer): string => {
    const path = fresh();
    writeFileSync(path, edit(Buffer.from(good)));
    return path;
  };
  const header = (i: number, v: number) => (b: Buffer) => { b.writeInt32LE(v, 4 * i); return b; };
  const cases: Array<[string, (b: Buffer) => Buffer, RegExp]> = [
    ['a bad magic', header(0, 12345), /magic 12345, not an llm\.c model file's 20240326/],
    ['a debug state file', header(0, 20240327), /it is a debug state file/],
    ['an old version', header(1, 2), /version 2; versions 3 \(fp32\) and 5 \(bf16\) are read/],
    ['the bf16 version over fp32 data', header(1, 5), /has 121344 bytes, its header .* bf16\) describes 61184 \(trailing bytes\)/],
    ['truncated data', (b) => b.subarray(0, b.length - 2), /describes 121344 \(truncated\)/],
    ['trailing bytes', (b) => Buffer.concat([b, Buffer.alloc(4)]), /trailing bytes/],
    ['a cut header', (b) => b.subarray(0, 1000), /1000 bytes, too short for an llm\.c model header/],
    ['heads that do not divide C', header(5, 3), /C 32 is not divisible by NH 3/],
    ['a zero layer count', header(4, 0), /header L is 0/],
    ['Vp below V', header(7, 60), /Vp 60 is smaller than V 64/],
  ];
  for (const [what, edit, re] of cases) {
    it(`refuses ${what}`, () => {
      const path = edited(edit);
      expect(() => readLlmc(path)).toThrow(nt.StateError);
      expect(() => readLlmc(path)).toThrow(re);
    });
  }
  it('refuses a missing file', () => {
    expect(() => readLlmc(join(work, 'nope.bin'))).toThrow(/cannot open .*nope\.bin/);
  });
});
