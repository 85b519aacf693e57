// recompute() (activation checkpointing; nt.checkpoint was its old name): same gradients as the plain graph, lower peak memory, nothing left alive, and the
// same dropout mask in the re-run.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose } from '../helpers/gradcheck.js';

const width = 96, depth = 4, blocks = 4;

function makeWeights(): nt.Tensor[] {
  return Array.from({ length: depth * blocks }, (_, i) => {
    const w = nt.scale(nt.randn([width, width], { seed: 100 + i }), 1 / Math.sqrt(width));
    w.requiresGrad = true;
    return w;
  });
}

function block(x: nt.Tensor, ws: nt.Tensor[]): nt.Tensor {
  let h = x;
  for (const w of ws) h = nt.tanh(nt.matmul(h, w));
  return h;
}

/** Loss and peak bytes above the starting allocation, for one forward+backward. */
function run(ws: nt.Tensor[], useCheckpoint: boolean): number {
  const base = nt.memoryStats().allocated;
  nt.resetPeakMemory();
  nt.scope(() => {
    let h = nt.randn([128, width], { seed: 7 });
    for (let b = 0; b < blocks; b++) {
      const part = ws.slice(b * depth, (b + 1) * depth);
      h = useCheckpoint ? nt.recompute((x) => block(x, part), h) : block(h, part);
    }
    nt.mean(nt.mul(h, h)).backward();
  });
  return nt.memoryStats().peak - base;
}

describe('checkpoint', () => {
  it('gives the same gradients with a lower peak and leaves no live tensors', () => {
    const ws = makeWeights();
    const plainPeak = run(ws, false);
    const plain = ws.map((w) => Float64Array.from(w.grad!.toArraySync()));
    nt.zeroGrad(ws);
    const live = nt.memoryStats().liveTensors;
    const ckptPeak = run(ws, true);
    expect(nt.memoryStats().liveTensors).toBe(live + ws.length);  // only the new .grad tensors
    ws.forEach((w, i) => expectClose(w.grad!.toArraySync(), plain[i]!, 1e-6, 1e-4, `grad ${i}`));
    expect(ckptPeak).toBeLessThan(plainPeak * 0.75);
    ws.forEach((w) => w.dispose());
  });

  it('passes gradients to checkpointed inputs and replays dropout masks', () => {
    nt.manualSeed(3);
    const x = nt.randn([4, 6], { seed: 1 });
    x.requiresGrad = true;
    const f = (t: nt.Tensor) => nt.mul(nt.dropout(t, 0.5), t);
    nt.manualSeed(11);
    nt.sum(f(x)).backward();
    const plain = Float64Array.from(x.grad!.toArraySync());
    nt.zeroGrad([x]);
    nt.manualSeed(11);
    nt.sum(nt.recompute(f, x)).backward();
    expectClose(x.grad!.toArraySync(), plain, 0, 0, 'checkpoint grad');
    x.dispose();
  });

  it('is a plain call under noGrad', () => {
    const x = nt.ones([2]);
    const y = nt.noGrad(() => nt.recompute((t) => nt.mul(t, 2), x));
    expect(y.gradFn).toBeNull();
    expect(Array.from(y.toArraySync())).toEqual([2, 2]);
  });

  it('is nt.recompute; its deprecated old name nt.checkpoint has left the public API', () => {
    expect('checkpoint' in nt).toBe(false);
    const x = nt.tensor(new Float32Array([1, -2, 3]), [3]);
    x.requiresGrad = true;
    nt.sum(nt.recompute((t) => nt.mul(t, t), x)).backward();
    expect(Array.from(x.grad!.toArraySync())).toEqual([2, -4, 6]);
    x.dispose();
  });
});
