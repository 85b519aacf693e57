// Gradients written in place: when a leaf's gradient has a home (registerGradAllocator, as a
// data-parallel bucket's view), the ops that can write a gradient where they are told (matmul,
// linear, linearGelu, embedding, cast: the weight GEMMs, the embedding scatter and autocast's weight
// cast) write the leaf's first gradient straight into that home instead of into a tensor of their own
// that backward() copies in.
// The bits are those of a backward without any home (the same kernels on the same operands; only
// where the product is stored changes), the tensor the op made is never allocated (peak memory), and
// a backward that takes a home but fails, or gives no gradient there, leaves no unwritten home as .grad.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { record, registerGradAllocator, viewOf } from '../../lib/internal.js';
import { leaf, randomArray, rng } from '../helpers/gradcheck.js';

/** A bucket holding each leaf's gradient in a range, ranges back to back after `pad` elements (unaligned views). */
function bucketFor(leaves: nt.Tensor[], pad = 3) {
  const total = leaves.reduce((n, l) => n + l.size, pad);
  const bucket = nt.full([total], 7);
  const views = new Map<nt.Tensor, nt.Tensor>();
  let offset = pad;
  const handles = leaves.map((l) => {
    const at = offset;
    offset += l.size;
    // As GradBuffer does: the view becomes .grad when handed out.
    return registerGradAllocator(l, (p) => { const v = viewOf(bucket, at, p.shape); views.set(p, v); p.grad = v; return v; });
  });
  return { bucket, views, dispose: () => { for (const h of handles) h.remove(); bucket.dispose(); } };
}

const bits = (t: nt.Tensor) => Array.from(new Uint32Array((t.toArraySync() as Float32Array).buffer.slice(0)));

describe('gradients written into their homes', () => {
  const r = rng(11);
  const B = 5, T = 7, C = 24, H = 40, V = 31;
  const xv = randomArray(B * T * C, r), w1v = randomArray(H * C, r), b1v = randomArray(H, r), w2v = randomArray(C * H, r), b2v = randomArray(C, r);
  const ev = randomArray(V * C, r), ids = Int32Array.from({ length: B * T }, () => Math.floor(r() * V));
  const mv = randomArray(C * C, r);
  // embedding → linearGelu → linear → matmul with a weight: each weight's only gradient comes from one op.
  function run(withHomes: boolean) {
    const e = leaf(ev, [V, C]), w1 = leaf(w1v, [H, C]), b1 = leaf(b1v, [H]), w2 = leaf(w2v, [C, H]), b2 = leaf(b2v, [C]), m = leaf(mv, [C, C]);
    const x = leaf(xv, [B, T, C]);
    const params = [e, w1, b1, w2, b2, m];
    const homes = withHomes ? bucketFor(params) : null;
    const idx = nt.tensor(ids, [B, T], { dtype: 'i32' });
    const h = nt.add(nt.embedding(idx, e), x);
    const y = nt.matmul(nt.linear(nt.linearGelu(h, w1, b1), w2, b2), m);
    nt.sum(nt.mul(y, y)).backward();
    const out = { grads: params.map((p) => bits(p.grad!)), xGrad: bits(x.grad!), inHome: params.map((p) => homes !== null && p.grad === homes.views.get(p)) };
    homes?.dispose();
    for (const t of [...params, x, idx, h, y]) t.dispose();
    return out;
  }

  it('are bit for bit the gradients of a backward without homes, and are the homes', () => {
    const plain = run(false), homed = run(true);
    expect(homed.grads).toEqual(plain.grads);
    expect(homed.xGrad).toEqual(plain.xGrad);
    expect(homed.inHome).toEqual([true, true, true, true, true, true]);
  });

  it('leave out the op\'s own gradient tensor: the peak of backward is a weight\'s bytes lower', () => {
    // One large weight (1 MiB of f32) and a thin input: with a home, backward allocates only g, dx and
    // small temporaries; copying in would hold the op's own dW (1 MiB) beside the home.
    const n = 512, rows = 4;
    const peakOf = (withHome: boolean) => {
      const w = leaf(randomArray(n * n, rng(5)), [n, n]), x = leaf(randomArray(rows * n, rng(6)), [rows, n]);
      const home = withHome ? bucketFor([w]) : null;
      const loss = nt.sum(nt.linear(x, w));
      const before = nt.memoryStats().allocated;
      nt.resetPeakMemory();
      loss.backward();
      const extra = nt.memoryStats().peak - before;
      const inHome = home !== null && w.grad === home.views.get(w);
      home?.dispose();
      for (const t of [w, x, loss]) t.dispose();
      return { extra, inHome };
    };
    const weightBytes = n * n * 4;
    const plain = peakOf(false), homed = peakOf(true);
    // Without a home the gradient is a new tensor: the peak holds it (the measure sees a weight's bytes).
    expect(plain.extra).toBeGreaterThanOrEqual(weightBytes);
    expect(homed.inHome).toBe(true);
    expect(homed.extra).toBeLessThan(weightBytes / 4);
  });

  it('take autocast\'s gradient of an f32 weight cast straight in: the same bits, no f32 copy beside the home', () => {
    // An f32 weight used in bf16 (nt.cast, as autocast's weight cache does): its bf16 gradient is cast
    // into the home. Copying in would hold the f32 conversion (a weight's bytes) beside the home and
    // the bf16 gradient: the token table's gradient under bf16 ZeRO 2 was 24.6 MiB more than modelled.
    const n = 512, rows = 4;
    const runOf = (withHome: boolean) => {
      const w = leaf(randomArray(n * n, rng(7)), [n, n]), x = leaf(randomArray(rows * n, rng(8)), [rows, n], false);
      const home = withHome ? bucketFor([w]) : null;
      const xb = x.to('bf16');
      const loss = nt.sum(nt.cast(nt.linear(xb, nt.cast(w, 'bf16')), 'f32'));
      const before = nt.memoryStats().allocated;
      nt.resetPeakMemory();
      loss.backward();
      const extra = nt.memoryStats().peak - before;
      const out = { extra, inHome: home !== null && w.grad === home.views.get(w), bits: bits(w.grad!) };
      home?.dispose();
      for (const t of [w, x, xb, loss]) t.dispose();
      return out;
    };
    const weightBytes = n * n * 4;
    const plain = runOf(false), homed = runOf(true);
    expect(homed.inHome).toBe(true);
    expect(homed.bits).toEqual(plain.bits);
    // Both hold the bf16 gradient (half a weight's bytes); only the plain one makes an f32 tensor of its own.
    expect(plain.extra).toBeGreaterThanOrEqual(weightBytes);
    expect(homed.extra).toBeLessThan(weightBytes * 0.75);
  });

  it('an op that gives a gradient of another dtype for a homed leaf has it cast into the home', () => {
    const w = leaf([1, 2, 3], [3]), x = leaf([4, 5, 6], [3], false);
    const home = bucketFor([w]);
    // No target taken: the engine converts the op's bf16 gradient into the home.
    nt.sum(record('bf16-grad', nt.add(x, w), [x, w], (g) => [null, nt.scale(g, 3).to('bf16')])).backward();
    expect(w.grad).toBe(home.views.get(w));
    expect(Array.from(w.grad!.toArraySync())).toEqual([3, 3, 3]);
    home.dispose();
    nt.zeroGrad([w]);
    for (const t of [w, x]) t.dispose();
  });

  it('are taken by the weight pass of deferWeightGrads too, with the same bits and without the op\'s own dW', () => {
    const n = 512, rows = 4;
    const wv = randomArray(n * n, rng(8)), xv2 = randomArray(rows * n, rng(9));
    const gradOf = (withHome: boolean) => {
      const w = leaf(wv, [n, n]), x = leaf(xv2, [rows, n]);
      const home = withHome ? bucketFor([w]) : null;
      const y = nt.linear(x, w);
      const { weightGrads } = nt.deferWeightGrads(() => nt.sum(nt.mul(y, y)).backward(), { now: [x] });
      expect(w.grad === null || w.grad === home?.views.get(w)).toBe(true);
      const before = nt.memoryStats().allocated;
      nt.resetPeakMemory();
      weightGrads.run();
      const out = { g: bits(w.grad!), inHome: w.grad === home?.views.get(w), extra: nt.memoryStats().peak - before };
      home?.dispose();
      for (const t of [w, x, y]) t.dispose();
      return out;
    };
    const plain = gradOf(false), homed = gradOf(true);
    expect(homed.g).toEqual(plain.g);
    expect(homed.inHome).toBe(true);
    // The W pass of a weight with a home allocates nothing of a weight's size (without one it makes dW).
    expect(plain.extra).toBeGreaterThanOrEqual(n * n * 4);
    expect(homed.extra).toBeLessThan((n * n * 4) / 4);
  });

  it('an op that takes a home and throws, or gives no gradient there, leaves no unwritten home as .grad; one that makes its own tensor is copied in', () => {
    const w = leaf([1, 2, 3], [3]), x = leaf([4, 5, 6], [3]);
    const home = bucketFor([w]);
    const op = (behaviour: 'throw' | 'none' | 'own') => record('test-op', nt.add(x, w), [x, w], (g, target) => {
      target(1);
      if (behaviour === 'throw') throw new nt.StateError('the op failed');
      return [g.clone(), behaviour === 'none' ? null : nt.scale(g, 2)];
    });
    expect(() => nt.sum(op('throw')).backward()).toThrow(nt.StateError);
    expect(w.grad).toBeNull();
    nt.sum(op('none')).backward();
    expect(w.grad).toBeNull();
    nt.zeroGrad([x]);
    nt.sum(op('own')).backward();
    expect(w.grad).toBe(home.views.get(w));
    expect(Array.from(w.grad!.toArraySync())).toEqual([2, 2, 2]);
    // A leaf at two positions of one op gets no home from it: its two gradients add up as usual.
    nt.zeroGrad([w]);
    let handed: (nt.Tensor | null)[] = [];
    const twice = record('twice', nt.mul(w, w), [w, w], (g, target) => { handed = [target(0), target(1)]; return [g.clone(), g.clone()]; });
    nt.sum(twice).backward();
    expect(handed).toEqual([null, null]);
    expect(Array.from(w.grad!.toArraySync())).toEqual([2, 2, 2]);
    home.dispose();
    nt.zeroGrad([w, x]);
    for (const t of [w, x]) t.dispose();
  });
});
