// Post-accumulate-grad hooks: each runs once per backward() right after its leaf's gradient is
// complete (checked against float64 derivatives), in backward order, through checkpoint() re-runs,
// across accumulation, and bad registrations are typed errors.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose, leaf, randomArray, rng } from '../helpers/gradcheck.js';
import { registerGradAllocator, viewOf } from '../../lib/internal.js';

describe('registerPostAccumulateGradHook', () => {
  it('runs once, after the last of several accumulations, with the complete gradient', () => {
    // f(w) = Σ w·a + Σ tanh(w) + Σ w·w·b reaches w through four edges; df/dw = a + 1 - tanh²w + 2wb.
    const r = rng(1), n = 13;
    const [wv, av, bv] = [randomArray(n, r), randomArray(n, r), randomArray(n, r)];
    const w = leaf(wv, [n]), a = leaf(av, [n], false), b = leaf(bv, [n], false);
    const seen: Float32Array[] = [];
    const handle = w.registerPostAccumulateGradHook((p) => { seen.push(p.grad!.toArraySync() as Float32Array); });
    const f = nt.add(nt.add(nt.sum(nt.mul(w, a)), nt.sum(nt.tanh(w))), nt.sum(nt.mul(nt.mul(w, w), b)));
    f.backward();
    expect(seen).toHaveLength(1);
    const wf = Float32Array.from(wv);
    const ref = Float64Array.from(wf, (x, i) => Math.fround(av[i]!) + 1 - Math.tanh(x) ** 2 + 2 * x * Math.fround(bv[i]!));
    expectClose(seen[0]!, ref, 1e-5, 1e-5, 'gradient at hook time');
    expectClose(w.grad!.toArraySync(), ref, 1e-5, 1e-5, 'gradient after backward');
    handle.remove();
    handle.remove();
    nt.zeroGrad([w]);
    nt.sum(nt.mul(w, a)).backward();
    expect(seen).toHaveLength(1);
    for (const t of [w, a, b, f]) t.dispose();
  });

  it('fires in backward order, while earlier layers have no gradient yet', () => {
    const r = rng(2);
    const x = leaf(randomArray(5 * 7, r), [5, 7], false);
    const ws = [[7, 6], [6, 9], [9, 3]].map(([i, o]) => leaf(randomArray(i! * o!, r), [i!, o!]));
    const events: string[] = [];
    ws.forEach((w, i) => w.registerPostAccumulateGradHook(() => {
      events.push(`w${i}:${ws.map((u) => (u.grad ? 'g' : '-')).join('')}`);
    }));
    let h = x;
    for (const w of ws) h = nt.tanh(nt.matmul(h, w));
    nt.sum(h).backward();
    expect(events).toEqual(['w2:--g', 'w1:-gg', 'w0:ggg']);
    for (const t of [x, ...ws]) t.dispose();
  });

  it('runs once per backward() call; accumulated gradients are complete at each call', () => {
    const w = leaf([0.5, -1, 2], [3]);
    const sums: number[] = [];
    w.registerPostAccumulateGradHook((p) => { sums.push(Array.from(p.grad!.toArraySync()).reduce((s, v) => s + v, 0)); });
    const y = nt.sum(nt.scale(w, 3));
    y.backward(undefined, { retainGraph: true });
    y.backward();
    nt.sum(w).backward();
    expect(sums).toEqual([9, 18, 21]);
    // A leaf that is the output itself, and a hooked leaf the graph never reaches.
    const lone = leaf([4], [1]), unused = leaf([1], [1]);
    let loneCalls = 0, unusedCalls = 0;
    lone.registerPostAccumulateGradHook(() => { loneCalls++; });
    unused.registerPostAccumulateGradHook(() => { unusedCalls++; });
    lone.backward();
    nt.sum(w).backward();
    expect([loneCalls, unusedCalls]).toEqual([1, 0]);
    for (const t of [w, y, lone, unused]) t.dispose();
  });

  it('a hook may take and dispose the gradient, even one handed to two edges', () => {
    const w = leaf([1, 2, 3, 4], [4]);
    const taken: number[][] = [];
    w.registerPostAccumulateGradHook((p) => {
      taken.push(Array.from(p.grad!.toArraySync()));
      p.grad!.dispose();
      p.grad = null;
    });
    // add's backward hands one gradient tensor to both of its inputs (both are w).
    nt.sum(nt.add(w, w)).backward();
    nt.sum(nt.mul(nt.add(w, w), w)).backward();
    expect(taken).toEqual([[2, 2, 2, 2], [4, 8, 12, 16]]);
    expect(w.grad).toBeNull();
    w.dispose();
  });

  it('checkpoint(): parameters inside re-run blocks (and shared with the outside) fire once with the full gradient', () => {
    const r = rng(3), width = 6, blocks = 3;
    const x = leaf(randomArray(4 * width, r), [4, width], false);
    const ws = Array.from({ length: blocks }, () => leaf(randomArray(width * width, r, -0.5, 0.5), [width, width]));
    const shared = leaf(randomArray(width, r), [width]);
    const block = (i: number) => (h: nt.Tensor) => nt.mul(nt.tanh(nt.matmul(h, ws[i]!)), shared);
    const forward = (useCheckpoint: boolean) => {
      let h = x;
      for (let i = 0; i < blocks; i++) h = useCheckpoint ? nt.recompute(block(i), h) : block(i)(h);
      return nt.sum(nt.mul(h, shared));
    };
    const params = [...ws, shared];
    forward(false).backward();
    const plain = params.map((p) => Float64Array.from(p.grad!.toArraySync()));
    nt.zeroGrad(params);
    const atHook = new Map<nt.Tensor, Float32Array[]>();
    const order: string[] = [];
    params.forEach((p, i) => p.registerPostAccumulateGradHook(() => {
      const list = atHook.get(p) ?? [];
      list.push(p.grad!.toArraySync() as Float32Array);
      atHook.set(p, list);
      order.push(i === blocks ? 'shared' : `w${i}:${ws[0]!.grad ? 'g' : '-'}`);
    }));
    forward(true).backward();
    params.forEach((p, i) => {
      expect(atHook.get(p), `param ${i}`).toHaveLength(1);
      expectClose(atHook.get(p)![0]!, plain[i]!, 1e-6, 1e-5, `param ${i} at hook time`);
    });
    // The last block's weight is final before the first block's re-run; the shared one only at the end.
    expect(order).toEqual(['w2:-', 'w1:-', 'w0:g', 'shared']);
    for (const t of [x, ...params]) t.dispose();
  });

  it('rejects non-leaves, leaves without grad and non-functions with typed errors', () => {
    const w = leaf([1, 2], [2]);
    const y = nt.scale(w, 2);
    expect(() => y.registerPostAccumulateGradHook(() => {})).toThrow(nt.AutogradError);
    expect(() => leaf([1], [1], false).registerPostAccumulateGradHook(() => {})).toThrow(nt.AutogradError);
    expect(() => nt.registerPostAccumulateGradHook(w, 'nope' as never)).toThrow(nt.ArgumentError);
    const d = leaf([1], [1]);
    d.dispose();
    expect(() => d.registerPostAccumulateGradHook(() => {})).toThrow(nt.DisposedError);
    // The library keeps working, and a throwing hook surfaces from backward without breaking the next one.
    const h = w.registerPostAccumulateGradHook(() => { throw new Error('hook failed'); });
    expect(() => nt.sum(nt.scale(w, 3)).backward()).toThrow('hook failed');
    h.remove();
    nt.zeroGrad([w]);
    nt.sum(nt.scale(w, 3)).backward();
    expect(Array.from(w.grad!.toArraySync())).toEqual([3, 3]);
    for (const t of [w, y]) t.dispose();
  });
});

describe('registerGradAllocator', () => {
  it('backward writes a leaf\'s first gradient into the tensor its allocator gives (a view), then accumulates there; null or removal falls back', () => {
    // f(w) = Σ w·a + Σ w·w: df/dw = a + 2w, reaching w through two edges.
    const r = rng(3), n = 6;
    const [wv, av] = [randomArray(n, r), randomArray(n, r)];
    const w = leaf(wv, [n]), a = leaf(av, [n], false);
    const bucket = nt.full([n + 4], 7);
    let calls = 0;
    const handle = registerGradAllocator(w, () => { calls++; return viewOf(bucket, 2, [n]); });
    const f = () => nt.add(nt.sum(nt.mul(w, a)), nt.sum(nt.mul(w, w)));
    f().backward();
    f().backward();
    expect(calls).toBe(1);
    const ref = Float64Array.from(wv, (x, i) => 2 * (Math.fround(av[i]!) + 2 * Math.fround(x)));
    // The gradient lives in the bucket's range; the elements around it are untouched.
    const b = Array.from(bucket.toArraySync());
    expectClose(Float32Array.from(b.slice(2, 2 + n)), ref, 1e-5);
    expect([...b.slice(0, 2), ...b.slice(2 + n)]).toEqual([7, 7, 7, 7]);
    expectClose(w.grad!.toArraySync() as Float32Array, ref, 1e-5);
    nt.zeroGrad([w]);
    // An allocator returning null, and a removed one, leave backward's own gradient.
    handle.remove();
    const none = registerGradAllocator(w, () => null);
    f().backward();
    expectClose(w.grad!.toArraySync() as Float32Array, Float64Array.from(ref, (x) => x / 2), 1e-5);
    expect(Array.from(bucket.toArraySync()).slice(2, 2 + n)).toEqual(b.slice(2, 2 + n));
    none.remove();
    nt.zeroGrad([w]);
    // A tensor of the wrong shape is an AutogradError naming the leaf.
    const bad = registerGradAllocator(w, () => viewOf(bucket, 0, [n - 1]));
    expect(() => f().backward()).toThrow(nt.AutogradError);
    bad.remove();
    expect(() => registerGradAllocator(nt.mul(w, a), () => null)).toThrow(nt.AutogradError);
    nt.zeroGrad([w]);
    bucket.dispose();
  });
});
