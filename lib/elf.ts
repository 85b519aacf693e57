// The shared libraries an ELF file asks the loader for (its DT_NEEDED entries), read from the file
// itself: the cuda addon names the cuBLASLt and NCCL sonames it was linked against (libcublasLt.so.12 or
// .13), so the loader can look for exactly those instead of a name fixed at the time lib/ was written.
import { closeSync, openSync, readSync } from 'node:fs';

const PT_LOAD = 1, PT_DYNAMIC = 2, DT_NULL = 0n, DT_NEEDED = 1n, DT_STRTAB = 5n;

function readAt(fd: number, position: number, length: number): Buffer {
  const b = Buffer.alloc(length);
  const n = readSync(fd, b, 0, length, position);
  if (n !== length) throw new Error(`short read: ${n} of ${length} bytes at ${position}`);
  return b;
}

/**
 * The DT_NEEDED sonames of a 64-bit little-endian ELF file (a Linux x86_64/aarch64 shared object), in
 * the file's order. Throws an Error saying what is wrong for anything else.
 */
export function elfNeeded(path: string): string[] {
  const fd = openSync(path, 'r');
  try {
    const h = readAt(fd, 0, 64);
    if (h.readUInt32BE(0) !== 0x7f454c46) throw new Error(`${path} is not an ELF file`);
    if (h[4] !== 2 || h[5] !== 1) throw new Error(`${path} is not a 64-bit little-endian ELF file`);
    const phoff = Number(h.readBigUInt64LE(32)), phentsize = h.readUInt16LE(54), phnum = h.readUInt16LE(56);
    const ph = readAt(fd, phoff, phentsize * phnum);
    const loads: Array<{ vaddr: bigint; offset: bigint; filesz: bigint }> = [];
    let dyn: { offset: number; size: number } | undefined;
    for (let i = 0; i < phnum; i++) {
      const o = i * phentsize, type = ph.readUInt32LE(o);
      const offset = ph.readBigUInt64LE(o + 8), vaddr = ph.readBigUInt64LE(o + 16), filesz = ph.readBigUInt64LE(o + 32);
      if (type === PT_LOAD) loads.push({ vaddr, offset, filesz });
      else if (type === PT_DYNAMIC) dyn = { offset: Number(offset), size: Number(filesz) };
    }
    if (!dyn) return [];   // statically linked: needs nothing
    const d = readAt(fd, dyn.offset, dyn.size);
    const needed: bigint[] = [];
    let strtab: bigint | undefined;
    for (let o = 0; o + 16 <= d.length; o += 16) {
      const tag = d.readBigInt64LE(o), val = d.readBigUInt64LE(o + 8);
      if (tag === DT_NULL) break;
      if (tag === DT_NEEDED) needed.push(val);
      else if (tag === DT_STRTAB) strtab = val;
    }
    if (strtab === undefined) throw new Error(`${path}: the dynamic section has no string table`);
    // DT_STRTAB is an address: the load segment that holds it says where that is in the file.
    const seg = loads.find((l) => strtab! >= l.vaddr && strtab! < l.vaddr + l.filesz);
    if (!seg) throw new Error(`${path}: the string table is in no loaded segment`);
    const base = Number(strtab - seg.vaddr + seg.offset);
    return needed.map((off) => {
      const bytes = Buffer.alloc(256);
      const n = readSync(fd, bytes, 0, 256, base + Number(off));
      const end = bytes.subarray(0, n).indexOf(0);
      if (end < 0) throw new Error(`${path}: a needed library's name is not terminated within 256 bytes`);
      return bytes.subarray(0, end).toString('utf8');
    });
  } finally {
    closeSync(fd);
  }
}
