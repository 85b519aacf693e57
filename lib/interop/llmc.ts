// llm.c model files (gpt2_124M.bin, gpt2_124M_bf16.bin), as llm.c's train_gpt2.py write_model and
// train_gpt2.cu gpt2_write_to_checkpoint write them: a header of 256 little-endian int32 (magic
// 20240326, version 3 for fp32 or 5 for bf16, maxT, V, L, NH, C, Vp, zeros), then every parameter
// back to back in llm.c's order — wte [Vp, C] (the vocabulary padded with zero rows to Vp), wpe
// [maxT, C], then each block tensor stacked over the layers ([L, ...]: ln1w, ln1b, qkvw, qkvb,
// attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb), then lnfw and lnfb. Linear weights are
// [out, in], as in nodetron, so nothing is transposed; every tensor has the file's dtype.
import { closeSync, fstatSync } from 'node:fs';
import { type DType, dtypeSize, parseDType } from '../dtype.js';
import { ArgumentError, StateError } from '../errors.js';
import { openForReading, readAll, writeAll, writeFileAtomically } from '../io/files.js';
import { GPT, type GPTConfig, padVocab } from '../nn/gpt.js';
import { BLOCK_PARAMS, blockParamShape, checkGPT2 } from './gpt2.js';
import { bytesOf, loadBytes } from '../io/tensor-bytes.js';

/** header[0] of an llm.c model file. */
export const LLMC_MAGIC = 20240326;
/** header[1] → the dtype of every tensor of the file. */
export const LLMC_VERSIONS: Readonly<Record<number, 'f32' | 'bf16'>> = { 3: 'f32', 5: 'bf16' };
/** Bytes of the header: 256 int32. */
export const LLMC_HEADER_BYTES = 1024;
/** llm.c pads the vocabulary to a multiple of this (GPT-2's 50257 to 50304). */
export const LLMC_VOCAB_MULTIPLE = 128;

/** Other llm.c files, named when one is given where a model file belongs. */
const OTHER_MAGICS: Record<number, string> = {
  20240327: 'a debug state file (gpt2_124M_debug_state.bin)', 20240328: 'a tokenizer file', 20240520: 'a GPT-2 token shard',
  20240522: 'an evaluation file', 20240527: 'a training state file (optimizer state)', 20240801: 'a Llama 3 token shard',
};

/** What the header of an llm.c model file says. */
export interface LlmcHeader {
  /** File format version: 3 (f32 weights) or 5 (bf16 weights). */
  version: number;
  /** The weights' dtype. */
  dtype: 'f32' | 'bf16';
  /** Longest context (the positions table's rows): GPTConfig.blockSize. */
  maxT: number;
  /** Vocabulary size. */
  vocabSize: number;
  /** The token table's rows in the file (vocabSize padded). */
  paddedVocabSize: number;
  /** Transformer blocks. */
  nLayer: number;
  /** Attention heads. */
  nHead: number;
  /** Embedding width. */
  nEmbd: number;
}

/** Options of {@link writeLlmc}. */
export interface WriteLlmcOptions {
  /** 'f32' (version 3, the default) or 'bf16' (version 5). */
  dtype?: 'f32' | 'bf16';
  /** Rows of the token table in the file, >= vocabSize, the extra ones zeros (default: vocabSize rounded up to a multiple of 128, as llm.c does). */
  paddedVocabSize?: number;
}

/** Options of {@link readLlmc}. */
export interface ReadLlmcOptions {
  /** Device of the model (default cpu). */
  device?: string;
  /** Dtype of the model's parameters (default f32); the file's dtype is cast to it. */
  dtype?: DType | string;
  /** The model's dropout (default 0: llm.c trains without dropout). */
  dropout?: number;
}

/** One tensor of the file: the parameter it fills, its byte offset in the file, and its bytes (for wte, the V real rows). */
interface Slot { name: string; offset: number; bytes: number }

/** The file's tensors in llm.c's order, and the file's total size. */
function layout(h: Omit<LlmcHeader, 'version' | 'nHead'>): { slots: Slot[]; size: number; wtePadBytes: number } {
  const el = dtypeSize(h.dtype), c = h.nEmbd;
  const slots: Slot[] = [];
  let at = LLMC_HEADER_BYTES;
  const put = (name: string, elements: number, stored = elements) => {
    slots.push({ name, offset: at, bytes: elements * el });
    at += stored * el;
  };
  put('wte.weight', h.vocabSize * c, h.paddedVocabSize * c);
  put('wpe.weight', h.maxT * c);
  for (const p of BLOCK_PARAMS) {
    const n = blockParamShape(p, c).reduce((a, b) => a * b, 1);
    for (let i = 0; i < h.nLayer; i++) put(`h.${i}.${p}`, n);
  }
  put('lnF.weight', c);
  put('lnF.bias', c);
  return { slots, size: at, wtePadBytes: (h.paddedVocabSize - h.vocabSize) * c * el };
}

/**
 * Writes `model` as an llm.c model file at `path` (under a temporary name, fsynced, then renamed into
 * place) that llm.c's train_gpt2.c (fp32) or train_gpt2.cu (fp32 or bf16 builds) loads. The model must
 * be a whole GPT-2 (see exportHF).
 */
export function writeLlmc(model: GPT, path: string, opts: WriteLlmcOptions = {}): void {
  const params = checkGPT2(model, 'writeLlmc');
  if (typeof path !== 'string' || path === '') throw new ArgumentError(`writeLlmc: path must be a non-empty string`);
  const dtype = opts.dtype ?? 'f32';
  const version = Number(Object.entries(LLMC_VERSIONS).find(([, d]) => d === dtype)?.[0]);
  if (!Number.isInteger(version)) throw new ArgumentError(`writeLlmc: dtype must be 'f32' or 'bf16', got ${JSON.stringify(opts.dtype)}`);
  const c = model.config;
  const vp = opts.paddedVocabSize ?? padVocab(c.vocabSize, LLMC_VOCAB_MULTIPLE);
  if (!Number.isInteger(vp) || vp < c.vocabSize || vp > 0x7fffffff) throw new ArgumentError(`writeLlmc: paddedVocabSize must be an integer >= vocabSize ${c.vocabSize}, got ${vp}`);
  const h = { dtype, maxT: c.blockSize, vocabSize: c.vocabSize, paddedVocabSize: vp, nLayer: c.nLayer, nEmbd: c.nEmbd };
  const header = new Int32Array(256);
  header.set([LLMC_MAGIC, version, c.blockSize, c.vocabSize, c.nLayer, c.nHead, c.nEmbd, vp]);
  const { slots, wtePadBytes } = layout(h);
  writeFileAtomically(path, (fd) => {
    let at = writeAll(fd, new Uint8Array(header.buffer), 0);
    for (const s of slots) {
      at += writeAll(fd, bytesOf(params.get(s.name)!, dtype), at);
      if (s.name === 'wte.weight') at += writeZeros(fd, wtePadBytes, at);
    }
  });
}

function writeZeros(fd: number, n: number, position: number): number {
  const zeros = new Uint8Array(Math.min(n, 1 << 20));
  for (let done = 0; done < n; done += Math.min(zeros.length, n - done)) writeAll(fd, zeros.subarray(0, Math.min(zeros.length, n - done)), position + done);
  return n;
}

/** Reads and checks the header of an open llm.c model file (of `size` bytes). */
function headerOf(fd: number, size: number, path: string): LlmcHeader {
  if (size < LLMC_HEADER_BYTES) throw new StateError(`readLlmc: ${path} has ${size} bytes, too short for an llm.c model header (${LLMC_HEADER_BYTES})`);
  const raw = readAll(fd, new Uint8Array(LLMC_HEADER_BYTES), 0, path);
  const h = new Int32Array(raw.buffer, 0, 256);
  if (h[0] !== LLMC_MAGIC) {
    const other = OTHER_MAGICS[h[0]!];
    throw new StateError(`readLlmc: ${path} has magic ${h[0]}, not an llm.c model file's ${LLMC_MAGIC}${other ? ` (it is ${other})` : ''}`);
  }
  const version = h[1]!;
  const dtype = LLMC_VERSIONS[version];
  if (!dtype) {
    throw new StateError(`readLlmc: ${path} is version ${version}; versions 3 (fp32) and 5 (bf16) are read (older ones predate the padded vocabulary: write the file again with llm.c's train_gpt2.py)`);
  }
  const [maxT, vocabSize, nLayer, nHead, nEmbd, paddedVocabSize] = [h[2]!, h[3]!, h[4]!, h[5]!, h[6]!, h[7]!];
  const dims = { maxT, V: vocabSize, L: nLayer, NH: nHead, C: nEmbd, Vp: paddedVocabSize };
  for (const [k, v] of Object.entries(dims)) if (!(v > 0)) throw new StateError(`readLlmc: ${path}: header ${k} is ${v}, expected a positive integer`);
  if (nEmbd % nHead !== 0) throw new StateError(`readLlmc: ${path}: C ${nEmbd} is not divisible by NH ${nHead}`);
  if (paddedVocabSize < vocabSize) throw new StateError(`readLlmc: ${path}: the padded vocabulary Vp ${paddedVocabSize} is smaller than V ${vocabSize}`);
  return { version, dtype, maxT, vocabSize, paddedVocabSize, nLayer, nHead, nEmbd };
}

/** The header of the llm.c model file at `path` (checked: magic, version, sizes), without reading its tensors. */
export function readLlmcHeader(path: string): LlmcHeader {
  const fd = openForReading(path, (reason) => `readLlmc: cannot open ${path}: ${reason}`);
  try {
    return headerOf(fd, fstatSync(fd).size, path);
  } finally {
    closeSync(fd);
  }
}

/**
 * Reads the llm.c model file at `path` into a new nodetron GPT (vocabSize V: the padding rows are
 * skipped; blockSize maxT; bias true). The file's size must be exactly what its header describes.
 */
export function readLlmc(path: string, opts: ReadLlmcOptions = {}): GPT {
  if (typeof path !== 'string' || path === '') throw new ArgumentError(`readLlmc: path must be a non-empty string`);
  const dropout = opts.dropout ?? 0;
  if (typeof dropout !== 'number' || !(dropout >= 0 && dropout < 1)) throw new ArgumentError(`readLlmc: dropout must be in [0, 1), got ${dropout}`);
  const dtype = parseDType(opts.dtype ?? 'f32', 'readLlmc');
  const fd = openForReading(path, (reason) => `readLlmc: cannot open ${path}: ${reason}`);
  try {
    const size = fstatSync(fd).size;
    const h = headerOf(fd, size, path);
    const { slots, size: want } = layout(h);
    if (size !== want) {
      throw new StateError(`readLlmc: ${path} has ${size} bytes, its header (V ${h.vocabSize}, Vp ${h.paddedVocabSize}, maxT ${h.maxT}, L ${h.nLayer}, C ${h.nEmbd}, ${h.dtype}) describes ${want} (${size < want ? 'truncated' : 'trailing bytes'})`);
    }
    const config: GPTConfig = { vocabSize: h.vocabSize, blockSize: h.maxT, nLayer: h.nLayer, nHead: h.nHead, nEmbd: h.nEmbd, dropout, bias: true };
    const model = new GPT(config, { device: opts.device, dtype });
    try {
      const params = new Map(model.namedParameters());
      for (const s of slots) loadBytes(params.get(s.name)!, readAll(fd, new Uint8Array(s.bytes), s.offset, path), h.dtype);
    } catch (e) {
      model.dispose();
      throw e;
    }
    return model;
  } finally {
    closeSync(fd);
  }
}
