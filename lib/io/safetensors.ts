// The safetensors file format (Hugging Face): an 8-byte little-endian header length, a JSON header
// naming each tensor's dtype, shape and byte range, then the tensors' bytes back to back. Written
// here for checkpoints and model export; read with positional reads, so a reader takes only the
// byte ranges it needs and never a whole file. The header is checked as strictly as the reference
// implementation: ranges in order, contiguous, inside the file, sized by shape × dtype.
import { closeSync, fstatSync, fsyncSync, openSync, readSync } from 'node:fs';
import type { DType } from '../dtype.js';
import { ArgumentError, StateError } from '../errors.js';
import { closeOnThrow, openForReading, writeAll } from './files.js';

/** The dtypes safetensors names (the subset nodetron reads and writes). */
export const SAFETENSORS_DTYPES = { F64: 8, F32: 4, F16: 2, BF16: 2, I64: 8, I32: 4, I16: 2, I8: 1, U64: 8, U32: 4, U16: 2, U8: 1, BOOL: 1 } as const;
export type SafetensorsDType = keyof typeof SAFETENSORS_DTYPES;

/**
 * nodetron dtype → safetensors dtype: the one table of the names (checkpoints and the Hugging Face
 * interop read it, and {@link DTYPE_OF_SAFETENSORS} is its inverse).
 */
export const SAFETENSORS_DTYPE_OF: Readonly<Record<DType, SafetensorsDType>> = { f32: 'F32', f16: 'F16', bf16: 'BF16', i32: 'I32', u8: 'U8' };

/** safetensors dtype → nodetron dtype, for the safetensors dtypes nodetron has (the inverse of {@link SAFETENSORS_DTYPE_OF}). */
export const DTYPE_OF_SAFETENSORS: Readonly<Partial<Record<SafetensorsDType, DType>>> = Object.fromEntries(
  Object.entries(SAFETENSORS_DTYPE_OF).map(([nt, st]) => [st, nt]));

/** Headers larger than this are refused (the reference implementation's limit is 100 MB). */
const MAX_HEADER_BYTES = 100 * 1024 * 1024;

/** One tensor to write: its bytes are taken as they are (row-major, little-endian). */
export interface SafetensorsTensor {
  name: string;
  dtype: SafetensorsDType;
  shape: readonly number[];
  data: ArrayBufferView;
}

/** One tensor of a file's header: where its bytes are, relative to the file's start. */
export interface SafetensorsEntry {
  dtype: SafetensorsDType;
  shape: number[];
  /** Absolute byte offset of the tensor's first byte in the file. */
  offset: number;
  byteLength: number;
}

export interface SafetensorsHeader {
  tensors: Map<string, SafetensorsEntry>;
  metadata: Record<string, string>;
  /** Total file size the header implies (header + data). */
  fileSize: number;
}

const elementsOf = (shape: readonly number[]) => shape.reduce((a, b) => a * b, 1);

/**
 * The header bytes (length prefix + JSON, padded with spaces to a multiple of 8 as the reference
 * writer does) for tensors laid out in the given order, and each tensor's absolute offset.
 */
export function encodeHeader(tensors: readonly Omit<SafetensorsTensor, 'data'>[], byteLengths: readonly number[],
  metadata: Record<string, string> = {}): { header: Buffer; offsets: number[] } {
  const json: Record<string, unknown> = {};
  if (Object.keys(metadata).length > 0) {
    for (const [k, v] of Object.entries(metadata)) if (typeof v !== 'string') throw new ArgumentError(`safetensors: metadata '${k}' must be a string`);
    json.__metadata__ = metadata;
  }
  const seen = new Set<string>();
  let at = 0;
  const rel: number[] = [];
  tensors.forEach((t, i) => {
    if (!t.name || t.name === '__metadata__' || seen.has(t.name)) throw new ArgumentError(`safetensors: tensor name ${JSON.stringify(t.name)} is empty, reserved or repeated`);
    seen.add(t.name);
    const size = typeof t.dtype === 'string' && Object.hasOwn(SAFETENSORS_DTYPES, t.dtype) ? SAFETENSORS_DTYPES[t.dtype] : undefined;
    if (size === undefined) throw new ArgumentError(`safetensors: unknown dtype ${JSON.stringify(t.dtype)} for '${t.name}' (${Object.keys(SAFETENSORS_DTYPES).join(', ')})`);
    if (!Array.isArray(t.shape) || !t.shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new ArgumentError(`safetensors: '${t.name}' has a bad shape [${t.shape.join(', ')}]`);
    const expect = elementsOf(t.shape) * size;
    if (byteLengths[i] !== expect) throw new ArgumentError(`safetensors: '${t.name}' has ${byteLengths[i]} bytes, its shape [${t.shape.join(', ')}] of ${t.dtype} needs ${expect}`);
    json[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [at, at + expect] };
    rel.push(at);
    at += expect;
  });
  let text = JSON.stringify(json);
  text += ' '.repeat((8 - ((8 + Buffer.byteLength(text)) % 8)) % 8);
  const body = Buffer.from(text, 'utf8');
  const header = Buffer.alloc(8 + body.length);
  header.writeBigUInt64LE(BigInt(body.length), 0);
  body.copy(header, 8);
  return { header, offsets: rel.map((r) => r + header.length) };
}

const bytesOf = (v: ArrayBufferView) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength);

/**
 * Writes a safetensors file at `path` (created or truncated), then fsyncs it when `sync` (default
 * true). Returns the file's size.
 */
export function writeSafetensors(path: string, tensors: readonly SafetensorsTensor[], metadata: Record<string, string> = {}, { sync = true } = {}): number {
  if (typeof path !== 'string' || path === '') throw new ArgumentError(`safetensors: path must be a non-empty string, got ${typeof path}`);
  if (!Array.isArray(tensors)) throw new ArgumentError(`safetensors: tensors must be an array of { name, dtype, shape, data }`);
  tensors.forEach((t, i) => {
    if (t === null || typeof t !== 'object' || !ArrayBuffer.isView(t.data)) throw new ArgumentError(`safetensors: tensor ${i} must be { name, dtype, shape, data: a typed array }`);
  });
  const { header } = encodeHeader(tensors, tensors.map((t) => t.data.byteLength), metadata);
  const fd = openSync(path, 'w');
  try {
    let size = writeAll(fd, header, 0);
    for (const t of tensors) size += writeAll(fd, bytesOf(t.data), size);
    if (sync) fsyncSync(fd);
    return size;
  } finally {
    closeSync(fd);
  }
}

/** Reads and checks the header of an open file. */
export function readHeaderFd(fd: number, what: string): SafetensorsHeader {
  const size = fstatSync(fd).size;
  if (size < 8) throw new StateError(`${what}: ${size} bytes is too short for a safetensors file`);
  const prefix = Buffer.alloc(8);
  readExactly(fd, prefix, 0, what);
  const n = prefix.readBigUInt64LE(0);
  if (n > BigInt(Math.min(MAX_HEADER_BYTES, size - 8))) throw new StateError(`${what}: the header claims ${n} bytes, the file has ${size - 8} after the length`);
  const body = Buffer.alloc(Number(n));
  readExactly(fd, body, 8, what);
  let json: unknown;
  try { json = JSON.parse(body.toString('utf8')); } catch (e) { throw new StateError(`${what}: the header is not JSON (${(e as Error).message})`); }
  if (json === null || typeof json !== 'object' || Array.isArray(json)) throw new StateError(`${what}: the header is not a JSON object`);
  const dataStart = 8 + Number(n);
  const tensors = new Map<string, SafetensorsEntry>();
  let metadata: Record<string, string> = {};
  const ranges: Array<[number, number, string]> = [];
  for (const [name, v] of Object.entries(json as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (v === null || typeof v !== 'object' || Object.values(v).some((x) => typeof x !== 'string')) throw new StateError(`${what}: __metadata__ must map strings to strings`);
      metadata = v as Record<string, string>;
      continue;
    }
    const e = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const dtype = e?.dtype as SafetensorsDType;
    if (typeof dtype !== 'string' || !Object.hasOwn(SAFETENSORS_DTYPES, dtype)) throw new StateError(`${what}: tensor '${name}' has an unknown dtype ${JSON.stringify(e?.dtype)}`);
    const shape = e.shape;
    if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && d >= 0)) throw new StateError(`${what}: tensor '${name}' has a bad shape`);
    const offs = e.data_offsets;
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => Number.isSafeInteger(o) && o >= 0) || offs[1] < offs[0]) {
      throw new StateError(`${what}: tensor '${name}' has bad data_offsets`);
    }
    const byteLength = offs[1] - offs[0];
    if (byteLength !== elementsOf(shape) * SAFETENSORS_DTYPES[dtype]) {
      throw new StateError(`${what}: tensor '${name}' spans ${byteLength} bytes, its shape [${shape.join(', ')}] of ${dtype} needs ${elementsOf(shape) * SAFETENSORS_DTYPES[dtype]}`);
    }
    tensors.set(name, { dtype, shape: shape as number[], offset: dataStart + offs[0], byteLength });
    ranges.push([offs[0], offs[1], name]);
  }
  ranges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let end = 0;
  for (const [b, e, name] of ranges) {
    if (b !== end) throw new StateError(`${what}: tensor '${name}' starts at byte ${b} of the data, expected ${end} (ranges must be contiguous, without gaps or overlaps)`);
    end = e;
  }
  if (dataStart + end !== size) {
    throw new StateError(`${what}: the header describes ${dataStart + end} bytes but the file has ${size} (${dataStart + end > size ? 'truncated' : 'trailing bytes'})`);
  }
  return { tensors, metadata, fileSize: size };
}

function readExactly(fd: number, into: Uint8Array, position: number, what: string): void {
  let done = 0;
  while (done < into.length) {
    const n = readSync(fd, into, done, Math.min(into.length - done, 1 << 30), position + done);
    if (n === 0) throw new StateError(`${what}: unexpected end of file at byte ${position + done}`);
    done += n;
  }
}

/** An open safetensors file: its checked header, and reads of whole tensors or byte ranges of them. */
export class SafetensorsFile {
  readonly header: SafetensorsHeader;
  #fd: number | null;
  private constructor(readonly path: string, fd: number) {
    this.#fd = fd;
    this.header = closeOnThrow(fd, () => readHeaderFd(fd, path));
  }

  static open(path: string): SafetensorsFile {
    if (typeof path !== 'string' || path === '') throw new ArgumentError(`safetensors: path must be a non-empty string, got ${typeof path}`);
    return new SafetensorsFile(path, openForReading(path, (reason) => `safetensors: cannot open ${path}: ${reason}`));
  }

  get names(): string[] { return [...this.header.tensors.keys()]; }

  entry(name: string): SafetensorsEntry {
    const e = this.header.tensors.get(name);
    if (!e) throw new StateError(`${this.path}: no tensor named '${name}'`);
    return e;
  }

  /** `length` bytes of tensor `name` from byte `start` of it, into `into` (allocated when omitted). */
  readBytes(name: string, start = 0, length?: number, into?: Uint8Array): Uint8Array {
    const e = this.entry(name);
    const len = length ?? e.byteLength - start;
    if (start < 0 || len < 0 || start + len > e.byteLength) throw new ArgumentError(`${this.path}: bytes [${start}, ${start + len}) are outside '${name}' (${e.byteLength} bytes)`);
    const out = into ?? new Uint8Array(len);
    if (this.#fd === null) throw new StateError(`${this.path}: the file is closed`);
    readExactly(this.#fd, out.subarray(0, len), e.offset + start, this.path);
    return out;
  }

  close(): void {
    if (this.#fd !== null) closeSync(this.#fd);
    this.#fd = null;
  }

  [Symbol.dispose](): void { this.close(); }
}
