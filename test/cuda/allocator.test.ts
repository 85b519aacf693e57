// The cuda caching allocator's bookkeeping, run over simulated device memory (HostAllocatorSim in
// the cpu addon): packing, best fit, splitting, merging, stream separation, cross-stream frees, OOM.
import { describe, expect, it } from 'vitest';
import { OutOfMemoryError, ArgumentError } from '../../lib/index.js';
import { testingAddon } from '../../lib/testing/native.js';

const MiB = 1 << 20;
interface Block { offsetBytes: number; bytes: number; allocated: boolean }
interface Segment { base: number; bytes: number; stream: number; small: boolean; blocks: Block[] }
interface Sim {
  allocate(bytes: number, stream: number): number;
  free(p: number): void;
  recordStream(p: number, stream: number): void;
  setStreamBusy(stream: number, busy: boolean): void;
  destroyStream(stream: number, notify?: boolean): void;
  poolCreated(stream: number): void;
  emptyCache(): void;
  resetPeak(): void;
  stats(): Record<string, number>;
  segments(): Segment[];
}
const newSim = (capacityBytes: number): Sim => new (testingAddon().HostAllocatorSim)(capacityBytes) as Sim;

// Invariants that must hold after every operation.
function checkInvariants(sim: Sim): void {
  const st = sim.stats();
  let reserved = 0, allocated = 0;
  for (const s of sim.segments()) {
    reserved += s.bytes;
    let offset = 0;
    for (let i = 0; i < s.blocks.length; i++) {
      const b = s.blocks[i]!;
      expect(b.offsetBytes).toBe(offset);
      offset += b.bytes;
      if (b.allocated) allocated += b.bytes;
      // merging: two free neighbours never stay apart
      if (i > 0) expect(b.allocated || s.blocks[i - 1]!.allocated).toBe(true);
    }
    expect(offset).toBe(s.bytes);
  }
  expect(st.reserved).toBe(reserved);
  expect(st.deviceBytesUsed).toBe(reserved);
  expect(st.allocated).toBeLessThanOrEqual(allocated);  // pending frees are not counted as allocated
  expect(st.peak).toBeGreaterThanOrEqual(st.allocated);
}

describe('caching allocator (host simulation)', () => {
  it('packs small requests into one 2 MiB segment, rounded to 512 bytes', () => {
    const sim = newSim(64 * MiB);
    const a = sim.allocate(1, 0), b = sim.allocate(513, 0), c = sim.allocate(MiB, 0);
    expect(b - a).toBe(512);
    expect(c - b).toBe(1024);
    const segs = sim.segments();
    expect(segs).toHaveLength(1);
    expect(segs[0]!.bytes).toBe(2 * MiB);
    expect(segs[0]!.small).toBe(true);
    expect(sim.stats().allocated).toBe(512 + 1024 + MiB);
    expect(sim.stats().requested).toBe(1 + 513 + MiB);
    checkInvariants(sim);
  });

  it('sizes large segments: 20 MiB under 10 MiB, else rounded to 2 MiB', () => {
    const sim = newSim(1024 * MiB);
    sim.allocate(11 * MiB, 0);  // its 12 MiB segment keeps the 1 MiB rest: not worth a split
    sim.allocate(MiB + 1, 0);
    const sizes = sim.segments().map((s) => s.bytes).sort((x, y) => x - y);
    expect(sizes).toEqual([12 * MiB, 20 * MiB]);
    checkInvariants(sim);
  });

  it('reuses a freed block for the same stream, merges neighbours, and picks the best fit', () => {
    const sim = newSim(64 * MiB);
    const a = sim.allocate(4096, 0), b = sim.allocate(8192, 0), c = sim.allocate(4096, 0);
    sim.free(b);
    expect(sim.allocate(8192, 0)).toBe(b);  // exact fit comes back
    sim.free(a);
    sim.free(b);
    // a and b merged into one 12 KiB free block before c
    const blocks = sim.segments()[0]!.blocks;
    expect(blocks[0]).toEqual({ offsetBytes: 0, bytes: 12288, allocated: false });
    expect(blocks[1]).toEqual({ offsetBytes: 12288, bytes: 4096, allocated: true });
    // best fit: a 12 KiB request takes the merged hole, not the tail of the segment
    expect(sim.allocate(12288, 0)).toBe(a);
    expect(sim.stats().cacheHits).toBe(4);  // b and c came from a's segment too
    sim.free(a);
    sim.free(c);
    expect(sim.segments()[0]!.blocks).toHaveLength(1);  // whole segment is one free block again
    checkInvariants(sim);
  });

  it('keeps streams apart: a block freed on stream 1 is not handed to stream 2', () => {
    const sim = newSim(64 * MiB);
    const p = sim.allocate(4096, 1);
    sim.free(p);
    const q = sim.allocate(4096, 2);
    expect(q).not.toBe(p);
    expect(sim.segments().map((s) => s.stream).sort()).toEqual([1, 2]);
    expect(sim.allocate(4096, 1)).toBe(p);
    checkInvariants(sim);
  });

  it('holds a block used on another stream until that stream has caught up', () => {
    const sim = newSim(64 * MiB);
    const p = sim.allocate(4096, 0);
    sim.setStreamBusy(7, true);
    sim.recordStream(p, 7);
    sim.free(p);
    expect(sim.stats().pendingFrees).toBe(1);
    expect(sim.allocate(4096, 0)).not.toBe(p);  // still in use by stream 7
    sim.setStreamBusy(7, false);
    expect(sim.allocate(4096, 0)).toBe(p);  // event done: block back in the cache
    expect(sim.stats().pendingFrees).toBe(0);
    expect(sim.stats().eventsDestroyed).toBe(1);
    checkInvariants(sim);
  });

  it('a block recorded on a stream that was then destroyed frees without throwing and goes back to the cache', () => {
    const sim = newSim(64 * MiB);
    const p = sim.allocate(4096, 0);
    sim.setStreamBusy(7, true);
    sim.recordStream(p, 7);
    sim.destroyStream(7);  // synchronized, destroyed, allocator told
    expect(() => sim.free(p)).not.toThrow();
    expect(sim.stats().pendingFrees).toBe(0);
    expect(sim.allocate(4096, 0)).toBe(p);
    sim.recordStream(p, 7);  // a dead stream has no work: nothing to wait for
    sim.free(p);
    expect(sim.stats()).toMatchObject({ pendingFrees: 0, allocated: 0 });
    checkInvariants(sim);
  });

  it('a pending free waiting on a stream completes when that stream is destroyed', () => {
    const sim = newSim(64 * MiB);
    const p = sim.allocate(4096, 0);
    sim.setStreamBusy(3, true);
    sim.recordStream(p, 3);
    sim.free(p);
    expect(sim.stats().pendingFrees).toBe(1);
    sim.destroyStream(3);
    expect(sim.stats().pendingFrees).toBe(0);
    expect(sim.stats().eventsDestroyed).toBe(1);
    expect(sim.allocate(4096, 0)).toBe(p);
    checkInvariants(sim);
  });

  it("a destroyed stream's segments go back to the device once fully free, not leaked in its pool", () => {
    const sim = newSim(64 * MiB);
    const a = sim.allocate(4096, 5), b = sim.allocate(4096, 5);
    const c = sim.allocate(12 * MiB, 5);
    sim.free(c);  // a fully free cached segment of stream 5
    sim.free(b);
    expect(sim.stats().segments).toBe(2);
    sim.destroyStream(5);
    expect(sim.stats().segments).toBe(1);  // the free large segment went back at once
    sim.free(a);  // the last block of the small segment: released too
    expect(sim.stats()).toMatchObject({ segments: 0, reserved: 0, deviceBytesUsed: 0, allocated: 0 });
    checkInvariants(sim);
  });

  it('a free whose event cannot be recorded throws typed and keeps the block live (books intact)', () => {
    const sim = newSim(64 * MiB);
    const p = sim.allocate(4096, 0);
    sim.recordStream(p, 9);
    sim.destroyStream(9, false);  // the device forgets the stream but the allocator is not told
    expect(() => sim.free(p)).toThrow(ArgumentError);
    expect(sim.stats()).toMatchObject({ allocated: 4096, pendingFrees: 0, eventsDestroyed: 0 });
    checkInvariants(sim);
  });

  it('frees cached segments and retries when the device is full, then fails with OutOfMemoryError and stats', () => {
    const sim = newSim(40 * MiB);
    const a = sim.allocate(20 * MiB, 0);
    sim.free(a);  // cached 20 MiB segment on stream 0
    const b = sim.allocate(30 * MiB, 1);  // needs the cached segment released
    expect(sim.stats().cacheFlushes).toBe(1);
    expect(sim.stats().reserved).toBe(30 * MiB);
    let err: unknown;
    try { sim.allocate(16 * MiB, 1); } catch (e) { err = e; }
    expect(err).toBeInstanceOf(OutOfMemoryError);
    expect((err as Error).message).toMatch(/out of memory on sim.*allocated 31457280 bytes.*reserved 31457280/);
    expect(sim.stats().ooms).toBe(1);
    // healthy afterwards
    sim.free(b);
    expect(sim.allocate(16 * MiB, 1)).toBeGreaterThan(0);
    checkInvariants(sim);
  });

  it('rejects frees of unknown pointers with ArgumentError', () => {
    const sim = newSim(8 * MiB);
    const p = sim.allocate(100, 0);
    sim.free(p);
    expect(() => sim.free(p)).toThrow(ArgumentError);
    expect(() => sim.free(12345)).toThrow(ArgumentError);
    expect(sim.allocate(100, 0)).toBe(p);
  });

  it('emptyCache returns only fully free segments; peak tracks the high-water mark', () => {
    const sim = newSim(256 * MiB);
    const a = sim.allocate(3 * MiB, 0), b = sim.allocate(100, 0), c = sim.allocate(12 * MiB, 0);
    sim.free(a);
    sim.free(c);
    sim.emptyCache();
    expect(sim.segments()).toHaveLength(1);  // the small segment holding b stays
    expect(sim.stats().peak).toBe(3 * MiB + 512 + 12 * MiB);
    sim.resetPeak();
    expect(sim.stats().peak).toBe(512);
    sim.free(b);
    sim.emptyCache();
    expect(sim.stats().reserved).toBe(0);
    checkInvariants(sim);
  });

  it('keeps a live CUDA graph pool\'s free segments through emptyCache; releases them once the pool is retired', () => {
    // A captured step frees its temporaries to its pool while the graph's replays still write them.
    const sim = newSim(256 * MiB);
    const POOL = 77;
    sim.poolCreated(POOL);
    const a = sim.allocate(4 * MiB, POOL), b = sim.allocate(4 * MiB, 0);
    sim.free(a);
    sim.free(b);
    sim.emptyCache();
    expect(sim.segments().map((s) => s.stream)).toEqual([POOL]);
    // An allocation that does not fit flushes the cache and retries: the pool's segment stays too.
    expect(() => sim.allocate(253 * MiB, 0)).toThrow();
    expect(sim.segments().map((s) => s.stream)).toEqual([POOL]);
    sim.destroyStream(POOL);
    sim.emptyCache();
    expect(sim.stats().reserved).toBe(0);
    checkInvariants(sim);
  });

  it('keeps its books straight under random traffic on three streams', () => {
    const sim = newSim(8192 * MiB);
    let seed = 12345;
    const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);
    const live: { p: number; bytes: number; stream: number }[] = [];
    for (let step = 0; step < 3000; step++) {
      if (live.length && rnd() < 0.45) {
        const [x] = live.splice(Math.floor(rnd() * live.length), 1);
        sim.free(x!.p);
      } else {
        const bytes = rnd() < 0.7 ? 1 + Math.floor(rnd() * 200_000) : 1 + Math.floor(rnd() * 24 * MiB);
        const stream = Math.floor(rnd() * 3);
        live.push({ p: sim.allocate(bytes, stream), bytes, stream });
      }
      if (step % 500 === 0) { checkInvariants(sim); if (rnd() < 0.5) sim.emptyCache(); }
    }
    // live allocations never overlap
    const sorted = [...live].sort((x, y) => x.p - y.p);
    for (let i = 1; i < sorted.length; i++) expect(sorted[i]!.p).toBeGreaterThanOrEqual(sorted[i - 1]!.p + sorted[i - 1]!.bytes);
    expect(sim.stats().requested).toBe(live.reduce((s, x) => s + x.bytes, 0));
    checkInvariants(sim);
    for (const x of live) sim.free(x.p);
    sim.emptyCache();
    expect(sim.stats()).toMatchObject({ allocated: 0, requested: 0, reserved: 0, segments: 0 });
  });
});
