// A whole training step (forward with the fused head's loss, backward, AdamW) captured as one CUDA
// graph and replayed (issue #35): the fused head counts its targets on the device under a capture,
// and AdamW with deviceMeta reads lr and step from device metadata that advanceDeviceMeta writes
// before each replay. Without a GPU: the same step code through nt.cuda.graph's cpu form (replay
// calls the step) equals eager steps; the capture itself, and the GPU case below, need a GPU.
// Untested here: everything in the GPU block (capture of the head's device count, of adamw_step_meta
// with its cached device table, the replays' equality with eager steps).
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { AdamW } from '../../lib/optim/adamw.js';

const hasGpu = nt.cuda.isAvailable();
const config = { vocabSize: 97, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 32, dropout: 0, bias: true };
const B = 2, T = 16;

function setup(device: 'cpu' | 'cuda', deviceMeta: boolean) {
  const model = new nt.nn.GPT(config, { seed: 5, device });
  const ids = Int32Array.from({ length: B * T }, (_, i) => (i * 37 + 11) % config.vocabSize);
  const tg = Int32Array.from({ length: B * T }, (_, i) => (i * 53 + 7) % config.vocabSize);
  const x = nt.tensor(ids, [B, T]).to(device), y = nt.tensor(tg, [B, T]).to(device);
  const opt = new AdamW(model.parameters(), { lr: 1e-2, weightDecay: 0.1 });
  opt.deviceMeta = deviceMeta;
  const step = () => nt.scope(() => {
    model.zeroGrad();
    model.forward(x, y).loss!.backward();
    opt.step();
  });
  return { model, opt, step, dispose: () => { model.dispose(); x.dispose(); y.dispose(); } };
}

const lrAt = (s: number) => 1e-2 * (1 - s / 10);
const snapshot = (m: nt.nn.GPT) => m.parameters().slice(0, 3).map((p) => Array.from(p.to('cpu').to('f32').toArraySync() as Float32Array));

describe('a training step as one graph, cpu form', () => {
  it('nt.cuda.graph on cpu with deviceMeta: each replay (which writes its own metadata) equals an eager host-scalar step', () => {
    const eager = setup('cpu', false), graphed = setup('cpu', true);
    try {
      for (let s = 1; s <= 3; s++) { for (const g of eager.opt.paramGroups) g.options.lr = lrAt(s); eager.step(); }
      // The first step eagerly (it makes AdamW's state and metadata), then replays. On cpu replay()
      // calls the step, which writes its own metadata, so advanceDeviceMeta is not called here.
      for (const g of graphed.opt.paramGroups) g.options.lr = lrAt(1);
      graphed.step();
      const g = nt.cuda.graph(graphed.step, { device: 'cpu' });
      for (let s = 2; s <= 3; s++) { for (const pg of graphed.opt.paramGroups) pg.options.lr = lrAt(s); g.replay(); }
      g.dispose();
      expect(snapshot(graphed.model)).toEqual(snapshot(eager.model));
    } finally {
      eager.dispose(); graphed.dispose();
    }
  });
});

describe.skipIf(!hasGpu)('a training step as one CUDA graph on a GPU', () => {
  it('forward + loss + backward + AdamW (deviceMeta) captures, and its replays equal eager steps', () => {
    const eager = setup('cuda', false), graphed = setup('cuda', true);
    try {
      for (let s = 1; s <= 4; s++) { for (const g of eager.opt.paramGroups) g.options.lr = lrAt(s); eager.step(); }
      // warmup 1: the first step runs eagerly (AdamW's state, metadata and device table), then the
      // capture records step 2 without running it; each replay is one step after advanceDeviceMeta.
      for (const g of graphed.opt.paramGroups) g.options.lr = lrAt(1);
      const g = nt.cuda.graph(graphed.step, { warmup: 1 });
      expect(g.captured).toBe(true);
      for (let s = 2; s <= 4; s++) {
        for (const pg of graphed.opt.paramGroups) pg.options.lr = lrAt(s);
        graphed.opt.advanceDeviceMeta();
        g.replay();
      }
      nt.cuda.synchronize();
      // The same kernels in the same order on the same device: equal up to atomics' order in the
      // GEMMs' split-k (cuBLASLt may choose another algorithm inside a capture), so within f32 rounding
      // of a few steps' updates (lr 1e-2: parameters move by ~1e-2 per step; 1e-5 relative is far below that).
      const a = snapshot(graphed.model), b = snapshot(eager.model);
      a.forEach((p, i) => p.forEach((v, j) => expect(Math.abs(v - b[i]![j]!)).toBeLessThanOrEqual(1e-5 * Math.max(1, Math.abs(b[i]![j]!)))));
      for (const [p, st] of graphed.opt.state) expect(st.step, p.describe()).toBe(4);
      g.dispose();
    } finally {
      eager.dispose(); graphed.dispose();
    }
  });

  it('without an eager step first, the capture is refused with GraphCaptureError (no device table or metadata yet)', () => {
    const graphed = setup('cuda', true);
    try {
      expect(() => nt.cuda.graph(graphed.step, { warmup: 0 })).toThrow(nt.GraphCaptureError);
    } finally {
      graphed.dispose();
    }
  });
});
