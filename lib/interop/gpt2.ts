// What the Hugging Face and llm.c converters share: the check that a nodetron GPT is a plain GPT-2
// (the one model both formats describe), the names and shapes of its parameters for a config, host-side
// transposes of raw bytes. Moves of
// bytes between parameters and files (dtype casts on the parameter's device) are lib/io/tensor-bytes.ts.
import { ArgumentError } from '../errors.js';
import { GPT, type GPTConfig } from '../nn/gpt.js';
import type { Parameter } from '../nn/module.js';
import { fmtShape, sameShape } from '../shape.js';

/** The LayerNorm epsilon of nodetron's GPT (and of GPT-2). */
export const GPT2_LAYER_NORM_EPS = 1e-5;

/** The parameters of one block, in nodetron's names (relative to `h.<i>.`) and order. */
export const BLOCK_PARAMS = [
  'ln1.weight', 'ln1.bias', 'attn.qkv.weight', 'attn.qkv.bias', 'attn.proj.weight', 'attn.proj.bias',
  'ln2.weight', 'ln2.bias', 'mlp.fc.weight', 'mlp.fc.bias', 'mlp.proj.weight', 'mlp.proj.bias',
] as const;
export type BlockParam = (typeof BLOCK_PARAMS)[number];

/** The shape of a block parameter for embedding width c (Linear weights [out, in]). */
export function blockParamShape(p: BlockParam, c: number): number[] {
  switch (p) {
    case 'attn.qkv.weight': return [3 * c, c];
    case 'attn.qkv.bias': return [3 * c];
    case 'attn.proj.weight': return [c, c];
    case 'mlp.fc.weight': return [4 * c, c];
    case 'mlp.fc.bias': return [4 * c];
    case 'mlp.proj.weight': return [c, 4 * c];
    default: return [c];
  }
}

/** Every parameter of a GPT-2 of this config, in nodetron's names and namedParameters() order. */
export function gpt2Params(c: Pick<GPTConfig, 'vocabSize' | 'blockSize' | 'nLayer' | 'nEmbd'>): Array<{ name: string; shape: number[] }> {
  const out = [{ name: 'wte.weight', shape: [c.vocabSize, c.nEmbd] }, { name: 'wpe.weight', shape: [c.blockSize, c.nEmbd] }];
  for (let i = 0; i < c.nLayer; i++) for (const p of BLOCK_PARAMS) out.push({ name: `h.${i}.${p}`, shape: blockParamShape(p, c.nEmbd) });
  out.push({ name: 'lnF.weight', shape: [c.nEmbd] }, { name: 'lnF.bias', shape: [c.nEmbd] });
  return out;
}

/**
 * Checks that `model` is a GPT-2 the formats can hold (biases, a LayerNorm before attention and one
 * before the MLP, full causal attention, every parameter whole) and returns its parameters by name.
 */
export function checkGPT2(model: unknown, call: string): Map<string, Parameter> {
  if (!(model instanceof GPT)) throw new ArgumentError(`${call}: model must be an nn.GPT`);
  const c = model.config;
  if (!c.bias) throw new ArgumentError(`${call}: GPT-2 has biases in every Linear and LayerNorm; the model was built with bias: false`);
  if (c.parallelBlock) throw new ArgumentError(`${call}: GPT-2 has two LayerNorms per block; the model uses the parallel block (parallelBlock: true)`);
  if (c.window !== undefined && c.window < c.blockSize) throw new ArgumentError(`${call}: GPT-2 attends to every earlier position; the model uses a sliding window of ${c.window} < blockSize ${c.blockSize}`);
  const own = new Map(model.namedParameters());
  const problems: string[] = [];
  for (const { name, shape } of gpt2Params(c)) {
    const p = own.get(name);
    if (!p) problems.push(`${name} is missing`);
    else if (!sameShape(p.shape, shape)) problems.push(`${name} is ${fmtShape(p.shape)}, expected ${fmtShape(shape)}`);
    own.delete(name);
  }
  for (const name of own.keys()) problems.push(`${name} is not a GPT-2 parameter`);
  if (problems.length > 0) {
    throw new ArgumentError(`${call}: the model is not a whole GPT-2 (${problems.join('; ')}); a tensor- or vocabulary-parallel model holds slices: build one with the default layouts and load the full state dict into it`);
  }
  return new Map(model.namedParameters());
}

/** The row-major [cols, rows] transpose of a [rows, cols] matrix of elemSize-byte elements. */
export function transposeBytes(bytes: Uint8Array, rows: number, cols: number, elemSize: number): Uint8Array {
  const n = rows * cols;
  if (bytes.byteLength !== n * elemSize) throw new ArgumentError(`transposeBytes: ${bytes.byteLength} bytes do not hold [${rows}, ${cols}] of ${elemSize}-byte elements`);
  // Typed views need aligned offsets; a subarray of a pooled Buffer may not be.
  const src = bytes.byteOffset % elemSize === 0 ? bytes : bytes.slice();
  const out = new Uint8Array(bytes.byteLength);
  const view = (b: Uint8Array) => (elemSize === 4 ? new Uint32Array(b.buffer, b.byteOffset, n)
    : elemSize === 2 ? new Uint16Array(b.buffer, b.byteOffset, n) : null);
  const s = view(src), d = view(out);
  if (!s || !d) throw new ArgumentError(`transposeBytes: elements of ${elemSize} bytes are not supported`);
  // Blocks of 32 × 32 keep both the reads and the writes within a few cache lines.
  const B = 32;
  for (let r0 = 0; r0 < rows; r0 += B) {
    const r1 = Math.min(r0 + B, rows);
    for (let c0 = 0; c0 < cols; c0 += B) {
      const c1 = Math.min(c0 + B, cols);
      for (let r = r0; r < r1; r++) for (let c = c0; c < c1; c++) d[c * rows + r] = s[r * cols + c]!;
    }
  }
  return out;
}
