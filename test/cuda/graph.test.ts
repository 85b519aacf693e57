// nt.cuda.graph (lib/cuda/graph.ts, native/cuda/graph.cc). Without a GPU: the cpu graph (replay calls
// fn), the typed errors of bad arguments and of a missing GPU. With one: a captured chain of ops
// replays to the eager result, each replay seeing the inputs' current values; a host read or write
// inside the capture fails it with GraphCaptureError naming the op, and transfers and captures after
// that work; disposing the graph returns the capture's memory and its stream's cuBLASLt workspace.
// (The staging logic behind the refusal runs without a GPU in test/cuda/staging.test.ts.)
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cuda as cudaAddon } from '../../lib/native.js';

const hasGpu = nt.cuda.isAvailable();

describe('nt.cuda.graph without a GPU', () => {
  it("on 'cpu' nothing is captured and nothing runs until replay: each replay calls fn", () => {
    let calls = 0;
    const g = nt.cuda.graph(() => { calls++; }, { device: 'cpu', warmup: 2 });
    expect(g.captured).toBe(false);
    expect(g.device).toBe('cpu');
      expect(calls).toBe(0);  // no warm-up on cpu: nothing is captured, so nothing needs warming
    g.replay(); g.replay();
    expect(calls).toBe(2);
    g.dispose();
    expect(g.disposed).toBe(true);
    expect(() => g.replay()).toThrow(nt.StateError);
    expect(nt.cuda.isCapturing('cpu')).toBe(false);
  });

  it('rejects bad arguments with typed errors', () => {
    expect(() => nt.cuda.graph(42 as unknown as () => void, { device: 'cpu' })).toThrow(nt.ArgumentError);
    expect(() => nt.cuda.graph(() => {}, { device: 'cpu', warmup: -1 })).toThrow(/warmup must be an integer >= 0/);
    expect(() => nt.cuda.graph(() => {}, { device: 'tpu' })).toThrow(nt.DeviceError);
  });

  it.skipIf(hasGpu)('on cuda without a usable GPU: BackendUnavailableError saying why', () => {
    expect(() => nt.cuda.graph(() => {})).toThrow(nt.BackendUnavailableError);
    expect(nt.cuda.isCapturing()).toBe(false);
  });
});

describe.skipIf(!hasGpu)('nt.cuda.graph on a GPU', () => {
  it('replays a chain of ops (GEMM with epilogues, GELU, sums) to the eager result, reading the inputs as they are at replay', () => {
    nt.scope(() => {
      const x = nt.randn([64, 96], { device: 'cuda', seed: 1 }), w = nt.randn([128, 96], { device: 'cuda', seed: 2 }), b = nt.randn([128], { device: 'cuda', seed: 3 });
      let y: nt.Tensor | null = null;
      const g = nt.cuda.graph(() => { y = nt.sum(nt.linearGelu(x, w, b), 0); }, { warmup: 1 });
      expect(g.captured).toBe(true);
      g.replay();
      const eager = () => Array.from(nt.sum(nt.linearGelu(x, w, b), 0).to('cpu').toArraySync());
      expect(Array.from(y!.to('cpu').toArraySync())).toEqual(eager());
      // New values written into x's storage (same address): the next replay reads them.
      const fresh = nt.randn([64, 96], { seed: 9 }).toArraySync() as Float32Array;
      x.backend.write(x.storage, 0, fresh);
      g.replay();
      expect(Array.from(y!.to('cpu').toArraySync())).toEqual(eager());
      g.dispose();
    });
  });

  it('a host read inside fn fails the capture with GraphCaptureError naming it; the next capture works', () => {
    nt.scope(() => {
      const x = nt.randn([8, 8], { device: 'cuda', seed: 4 });
      let err: unknown;
      try { nt.cuda.graph(() => { nt.add(x, 1).toArraySync(); }, { warmup: 0 }); } catch (e) { err = e; }
      expect(err).toBeInstanceOf(nt.GraphCaptureError);
      expect((err as nt.GraphCaptureError).op).not.toBe('unknown');
      expect(nt.cuda.isCapturing()).toBe(false);
      let y: nt.Tensor | null = null;
      const g = nt.cuda.graph(() => { y = nt.mul(x, 2); }, { warmup: 0 });
      g.replay();
      nt.cuda.synchronize();
      expect(Array.from(y!.to('cpu').toArraySync())).toEqual(Array.from(nt.mul(x, 2).to('cpu').toArraySync()));
      g.dispose();
    });
  });

  it('a host read or write inside fn is refused (GraphCaptureError naming it) before staging; later transfers work', () => {
    nt.scope(() => {
      const x = nt.randn([8, 8], { device: 'cuda', seed: 5 });
      const values = new Float32Array(64).map((_, i) => i);
      const attempts: [string, () => void][] = [
        ['write', () => { x.backend.write(x.storage, 0, values); }],
        ['read', () => { x.backend.read(x.storage, 0, new Float32Array(64)); }],
      ];
      for (const [op, transfer] of attempts) {
        let err: unknown;
        try { nt.cuda.graph(() => { nt.mul(x, 2); transfer(); }, { warmup: 0 }); } catch (e) { err = e; }
        expect(err).toBeInstanceOf(nt.GraphCaptureError);
        expect((err as nt.GraphCaptureError).op).toBe(op);
        expect((err as Error).message).toMatch(/outside the captured function/);
        expect(nt.cuda.isCapturing()).toBe(false);
        // every later transfer works: the staging events were not left in the discarded capture
        x.backend.write(x.storage, 0, values);
        expect(Array.from(x.to('cpu').toArraySync())).toEqual(Array.from(values));
      }
    });
  });

  it('disposing a graph frees the cuBLASLt workspace its stream allocated', () => {
    nt.scope(() => {
      const x = nt.randn([64, 96], { device: 'cuda', seed: 6 }), w = nt.randn([128, 96], { device: 'cuda', seed: 7 });
      nt.linear(x, w);  // the default stream's workspace exists before
      nt.cuda.synchronize();
      const before = cudaAddon().gemmPlanCache(0) as { workspaces: number; workspaceBytes: number };
      for (let i = 0; i < 3; i++) {
        const g = nt.cuda.graph(() => { nt.linear(x, w); }, { warmup: i % 2 });  // warm-up 0: the workspace comes from the capture's pool
        expect((cudaAddon().gemmPlanCache(0) as { workspaces: number }).workspaces).toBe(before.workspaces + 1);
        g.dispose();
        expect(cudaAddon().gemmPlanCache(0)).toMatchObject({ workspaces: before.workspaces, workspaceBytes: before.workspaceBytes });
      }
    });
  });
});
