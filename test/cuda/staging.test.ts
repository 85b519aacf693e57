// Host<->device transfers of the cuda backend (native/cuda/staging.h, the code runtime.cc's write and
// read run) on the test-only addon's simulated runtime, so no GPU is needed: chunking through the
// pinned staging buffers, the refusal of transfers while a CUDA graph is captured (before any staging
// buffer is touched), and new staging events after a discarded capture. The simulation models CUDA's
// events as the code relies on them (pending until the device finishes, unusable once recorded into a
// discarded capture); the GPU run checks the real ones (test/cuda/graph.test.ts).
import { describe, expect, it } from 'vitest';
import { testingAddon } from '../../lib/testing/native.js';

type Step = (string | number)[];
interface Result { ok: boolean; message?: string; buffers: number; eventsMade: number; eventsLive: number; data?: number[] }
const sim = (steps: Step[], opts: Record<string, unknown> = {}): Result[] => testingAddon().stagingSim(opts, steps) as Result[];
const bytes = (n: number, seed: number) => Array.from({ length: n }, (_, i) => (seed + i) & 255);

describe('staged transfers (simulated runtime)', () => {
  it('round-trips bytes in chunks through a bounded set of buffers', () => {
    // chunk 64: 200 bytes go as 4 copies; each waits for a buffer or takes a new one, at most 3
    const r = sim([['write', 8, 200, 7], ['read', 8, 200], ['write', 300, 1000, 99], ['read', 300, 1000], ['read', 8, 200]], { chunk: 64, maxBuffers: 3 });
    expect(r.every((x) => x.ok)).toBe(true);
    expect(r[1]!.data).toEqual(bytes(200, 7));
    expect(r[3]!.data).toEqual(bytes(1000, 99));
    expect(r[4]!.data).toEqual(bytes(200, 7));
    expect(Math.max(...r.map((x) => x.buffers))).toBe(3);
  });

  it('reuses a buffer whose copy finished instead of making another', () => {
    const r = sim([['write', 0, 10, 1], ['complete'], ['write', 0, 10, 2], ['complete'], ['write', 0, 10, 3]], { chunk: 64 });
    expect(r.map((x) => x.buffers)).toEqual([1, 1, 1, 1, 1]);
    // while the first copy is pending, a second write needs a second buffer
    const busy = sim([['write', 0, 10, 1], ['write', 0, 10, 2]], { chunk: 64 });
    expect(busy.map((x) => x.buffers)).toEqual([1, 2]);
  });
});

describe('transfers during a CUDA graph capture', () => {
  it('a write is refused, naming it and what to do instead, without touching a staging buffer', () => {
    const r = sim([['begin'], ['write', 0, 100, 1]], { chunk: 64 });
    expect(r[1]!.ok).toBe(false);
    expect(r[1]!.message).toMatch(/^write: a host-to-device write cannot be captured into a CUDA graph \(cuda:0 is capturing/);
    expect(r[1]!.message).toMatch(/stale data/);
    expect(r[1]!.message).toMatch(/device-resident tensor made before the capture/);
    expect(r[1]!).toMatchObject({ buffers: 0, eventsMade: 0 });
  });

  it('a read is refused the same way; after the capture is discarded, transfers work', () => {
    const r = sim([['write', 0, 50, 3], ['complete'], ['begin'], ['read', 0, 50], ['abort'], ['read', 0, 50], ['write', 0, 50, 4], ['read', 0, 50]]);
    expect(r[3]!.ok).toBe(false);
    expect(r[3]!.message).toMatch(/^read: a device-to-host read cannot be captured into a CUDA graph/);
    expect(r[3]!.message).toMatch(/read it after replay\(\)/);
    expect(r[3]!.eventsMade).toBe(r[2]!.eventsMade);  // nothing staged
    expect(r.slice(4).every((x) => x.ok)).toBe(true);
    expect(r[5]!.data).toEqual(bytes(50, 3));
    expect(r[7]!.data).toEqual(bytes(50, 4));
  });

  it('a staging event recorded into a discarded capture is replaced on abort (without that, every later transfer fails)', () => {
    // 'recordInCapture' is what the unguarded read did: its staging event recorded into the capture
    const steps: Step[] = [['write', 0, 20, 5], ['complete'], ['begin'], ['recordInCapture'], ['abort'], ['write', 0, 20, 6], ['read', 0, 20]];
    const broken = sim(steps, { resetOnAbort: false });
    expect(broken[5]!.ok).toBe(false);
    expect(broken[5]!.message).toMatch(/^cudaEventQuery: /);
    const fixed = sim(steps);
    expect(fixed.slice(4).every((x) => x.ok)).toBe(true);
    expect(fixed[6]!.data).toEqual(bytes(20, 6));
    // one event per buffer stays alive: the replaced ones are destroyed
    expect(fixed[4]!.eventsLive).toBe(fixed[4]!.buffers);
    expect(fixed[4]!.eventsMade).toBe(fixed[3]!.eventsMade + fixed[4]!.buffers);
  });

  it('an eager copy still pending when the capture is discarded is waited for, not lost', () => {
    // the write's copy is pending (no 'complete'); abort replaces its event after waiting for it,
    // and the next transfer then reuses the buffer instead of taking a new one
    const r = sim([['write', 0, 30, 9], ['begin'], ['abort'], ['write', 0, 30, 10], ['read', 0, 30]]);
    expect(r.every((x) => x.ok)).toBe(true);
    expect(r[3]!.buffers).toBe(1);
    expect(r[4]!.data).toEqual(bytes(30, 10));
  });
});
