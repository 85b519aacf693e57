// What the interop tests share: the golden files of scripts/golden/interop.py (a tiny GPT-2 saved by
// transformers, the same weights as llm.c files, and its logits), bitwise comparison of models, and a
// scratch directory.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, expect } from 'vitest';
import * as nt from '../../lib/index.js';
import { bytesOf } from '../../lib/io/tensor-bytes.js';

export const GOLDEN = join(__dirname, '..', 'golden', 'interop');
export const HF_DIR = join(GOLDEN, 'hf-tiny');
export const LLMC_F32 = join(GOLDEN, 'gpt2-tiny.bin');
export const LLMC_BF16 = join(GOLDEN, 'gpt2-tiny_bf16.bin');

export interface GoldenLogits { batch: number; seq: number; idx: number[]; logits: string; config: Record<string, number> }
export const golden = JSON.parse(readFileSync(join(GOLDEN, 'logits.json'), 'utf8')) as GoldenLogits;

export function f32(b64: string): Float32Array {
  const buf = Buffer.from(b64, 'base64');
  return new Float32Array(buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength));
}

/** A scratch directory removed after the file's tests. */
export function scratch(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Max |a - b| relative to the reference's largest magnitude. */
export function relErr(got: ArrayLike<number>, want: ArrayLike<number>): number {
  let err = 0, scale = 1e-12;
  for (let i = 0; i < want.length; i++) { err = Math.max(err, Math.abs(got[i]! - want[i]!)); scale = Math.max(scale, Math.abs(want[i]!)); }
  return err / scale;
}

/** The model's logits (eval mode, no graph) for the golden tokens. */
export function logitsOf(model: nt.nn.GPT): Float32Array {
  model.eval();
  return nt.scope(() => nt.noGrad(() => {
    const idx = nt.tensor(Int32Array.from(golden.idx), [golden.batch, golden.seq]);
    return model.forward(idx).logits.toArraySync() as Float32Array;
  }));
}

/** Every parameter of `a` equals `b`'s bit for bit once both are in `dtype`; same names, same config. */
export function expectSameWeights(a: nt.nn.GPT, b: nt.nn.GPT, dtype: nt.DType = 'f32'): void {
  const { dropout: _da, ...ca } = a.config, { dropout: _db, ...cb } = b.config;
  expect(ca).toEqual(cb);
  const pb = new Map(b.namedParameters());
  expect(a.namedParameters().map(([n]) => n)).toEqual([...pb.keys()]);
  for (const [name, p] of a.namedParameters()) {
    expect(Buffer.from(bytesOf(p, dtype)).equals(Buffer.from(bytesOf(pb.get(name)!, dtype))), name).toBe(true);
  }
}

/** The golden files of scripts/golden/llama.py or moe.py (test/golden/<family>/): each model's logits for one batch of tokens. */
export interface HFGolden { batch: number; seq: number; tokens: number[]; models: Record<string, { logits: string; shape: number[] }> }

/** The golden directory of a Llama family (test/golden/llama or moe), its logits.json, and a model's logits for its tokens. */
export function llamaGolden(family: 'llama' | 'moe'): { dir: string; golden: HFGolden; logitsOf: (model: nt.nn.Llama) => Float32Array } {
  const dir = join(__dirname, '..', 'golden', family);
  const golden = JSON.parse(readFileSync(join(dir, 'logits.json'), 'utf8')) as HFGolden;
  const logitsOf = (model: nt.nn.Llama): Float32Array => {
    model.eval();
    return nt.scope(() => nt.noGrad(() => {
      const idx = nt.tensor(Int32Array.from(golden.tokens), [golden.batch, golden.seq]);
      return model.forward(idx).logits!.toArraySync() as Float32Array;
    }));
  };
  return { dir, golden, logitsOf };
}

/**
 * Two Llamas with equal configs and the same parameters, bit for bit in `dtype`; `anyOrder`: their
 * parameter names compared as sets (else in order).
 */
export function expectSameLlamaWeights(a: nt.nn.Llama, b: nt.nn.Llama, dtype: nt.DType = 'f32', anyOrder = false): void {
  expect(a.config).toEqual(b.config);
  const pb = new Map(b.namedParameters());
  const names = (xs: string[]) => (anyOrder ? [...xs].sort() : xs);
  expect(names(a.namedParameters().map(([k]) => k))).toEqual(names([...pb.keys()]));
  for (const [name, p] of a.namedParameters()) expect(Buffer.from(bytesOf(p, dtype)).equals(Buffer.from(bytesOf(pb.get(name)!, dtype))), name).toBe(true);
}
