// The safetensors reader and writer: a round trip, the reference layout (8-byte aligned header,
// contiguous ranges), partial reads, and every malformed file refused with the reason.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError, StateError } from '../../lib/index.js';
import { SafetensorsFile, writeSafetensors } from '../../lib/io/safetensors.js';

const dir = mkdtempSync(join(tmpdir(), 'nt-st-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

function sample(path: string): void {
  writeSafetensors(path, [
    { name: 'a', dtype: 'F32', shape: [2, 3], data: Float32Array.from([1, 2, 3, 4, 5, 6]) },
    { name: 'b.c', dtype: 'U16', shape: [3], data: Uint16Array.from([7, 8, 65535]) },
    { name: 'empty', dtype: 'BF16', shape: [0, 4], data: new Uint16Array(0) },
  ], { format: 'pt', step: '3' });
}

describe('safetensors', () => {
  it('round-trips tensors and metadata, with the header padded to 8 bytes', () => {
    const path = join(dir, 'ok.safetensors');
    sample(path);
    const bytes = readFileSync(path);
    const n = Number(bytes.readBigUInt64LE(0));
    expect((8 + n) % 8).toBe(0);
    const header = JSON.parse(bytes.subarray(8, 8 + n).toString());
    expect(header.a).toEqual({ dtype: 'F32', shape: [2, 3], data_offsets: [0, 24] });
    expect(header['b.c'].data_offsets).toEqual([24, 30]);
    expect(header.__metadata__).toEqual({ format: 'pt', step: '3' });
    using f = SafetensorsFile.open(path);
    expect(f.names.sort()).toEqual(['a', 'b.c', 'empty']);
    const a = f.readBytes('a');
    expect(Array.from(new Float32Array(a.buffer, a.byteOffset, 6))).toEqual([1, 2, 3, 4, 5, 6]);
    const part = f.readBytes('a', 8, 8);
    expect(Array.from(new Float32Array(part.buffer, part.byteOffset, 2))).toEqual([3, 4]);
    const b = f.readBytes('b.c');
    expect(Array.from(new Uint16Array(b.buffer, b.byteOffset, 3))).toEqual([7, 8, 65535]);
    expect(f.readBytes('empty').length).toBe(0);
    expect(f.header.metadata.step).toBe('3');
    expect(() => f.readBytes('a', 20, 8)).toThrow(ArgumentError);
    expect(() => f.readBytes('nope')).toThrow(/no tensor named 'nope'/);
  });

  it('refuses data that does not match the shape, and repeated names', () => {
    expect(() => writeSafetensors(join(dir, 'bad.safetensors'), [{ name: 'x', dtype: 'F32', shape: [3], data: new Float32Array(2) }])).toThrow(/needs 12/);
    expect(() => writeSafetensors(join(dir, 'bad.safetensors'), [
      { name: 'x', dtype: 'F32', shape: [1], data: new Float32Array(1) }, { name: 'x', dtype: 'F32', shape: [1], data: new Float32Array(1) },
    ])).toThrow(/repeated/);
  });

  const corrupt: Array<[string, (b: Buffer) => Buffer, RegExp]> = [
    ['truncated data', (b) => b.subarray(0, b.length - 1), /truncated/],
    ['trailing bytes', (b) => Buffer.concat([b, Buffer.from([0])]), /trailing bytes/],
    ['a header length past the end', (b) => { const c = Buffer.from(b); c.writeBigUInt64LE(BigInt(c.length), 0); return c; }, /header claims/],
    ['a header that is not JSON', (b) => { const c = Buffer.from(b); c[8] = 0x7a; return c; }, /not JSON/],
    ['a file shorter than the length prefix', (b) => b.subarray(0, 5), /too short/],
    ['overlapping ranges', (b) => rewrite(b, (h) => { h['b.c'].data_offsets = [20, 26]; }), /contiguous|spans/],
    ['a range that does not fit the shape', (b) => rewrite(b, (h) => { h.a.shape = [2, 2]; }), /needs 16/],
    ['an unknown dtype', (b) => rewrite(b, (h) => { h.a.dtype = 'F8'; }), /unknown dtype/],
  ];
  it.each(corrupt)('refuses %s', (_what, damage, message) => {
    const path = join(dir, 'c.safetensors');
    sample(path);
    writeFileSync(path, damage(readFileSync(path)));
    expect(() => SafetensorsFile.open(path)).toThrow(StateError);
    expect(() => SafetensorsFile.open(path)).toThrow(message);
  });
});

/** The same data with an edited header (length prefix updated). */
function rewrite(b: Buffer, edit: (h: Record<string, { dtype: string; shape: number[]; data_offsets: number[] }>) => void): Buffer {
  const n = Number(b.readBigUInt64LE(0));
  const h = JSON.parse(b.subarray(8, 8 + n).toString());
  edit(h);
  const body = Buffer.from(JSON.stringify(h));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(body.length), 0);
  return Buffer.concat([len, body, b.subarray(8 + n)]);
}
