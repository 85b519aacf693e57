// Cross-cutting checks over every op: a disposed input throws DisposedError, an i32 input where a
// float is needed throws DTypeError, the process stays healthy; bf16 forward spot checks vs f32.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { expectClose } from '../helpers/gradcheck.js';

type Op = [string, (x: nt.Tensor) => unknown];
const w4 = () => nt.ones([4]);
const ops: Op[] = [
  ['add', (x) => nt.add(x, x)], ['sub', (x) => nt.sub(x, 1)], ['mul', (x) => nt.mul(2, x)], ['div', (x) => nt.div(x, x)],
  ['neg', nt.neg], ['exp', nt.exp], ['log', nt.log], ['sqrt', nt.sqrt], ['tanh', nt.tanh], ['pow', (x) => nt.pow(x, 2)],
  ['scale', (x) => nt.scale(x, 2)], ['sum', (x) => nt.sum(x)], ['mean', (x) => nt.mean(x, 0)], ['max', (x) => nt.max(x, 1)],
  ['matmul', (x) => nt.matmul(x, nt.ones([4, 2]))], ['linear', (x) => nt.linear(x, nt.ones([3, 4]))],
  ['gelu', nt.gelu], ['softmax', (x) => nt.softmax(x)], ['logSoftmax', (x) => nt.logSoftmax(x)],
  ['dropout', (x) => nt.dropout(x, 0.5, { seed: 1 })], ['layerNorm', (x) => nt.layerNorm(x, w4())], ['rmsNorm', (x) => nt.rmsNorm(x, w4())],
  ['attention', (x) => { const q = x.reshape([1, 1, 2, 4]); return nt.attention(q, q, q); }],
  ['embedding', (x) => nt.embedding(nt.tensor(Int32Array.from([0]), [1]), x)],
  ['crossEntropy', (x) => nt.crossEntropy(x, nt.tensor(Int32Array.from([0, 1]), [2]))],
  ['permute', (x) => nt.permute(x, [1, 0])], ['transpose', (x) => nt.transpose(x, 0, 1)], ['slice', (x) => nt.slice(x, 1, 1, 3)],
  ['split', (x) => nt.split(x, 1)], ['chunk', (x) => nt.chunk(x, 2, 1)], ['cat', (x) => nt.cat([x, x], 1)],
  ['reshape', (x) => nt.reshape(x, [8])], ['squeeze', (x) => nt.squeeze(x)], ['unsqueeze', (x) => nt.unsqueeze(x, 0)],
];

describe('every op rejects bad tensors with typed errors', () => {
  for (const [name, op] of ops) {
    it(name, () => {
      nt.scope(() => {
        const dead = nt.ones([2, 4]);
        dead.dispose();
        expect(() => op(dead)).toThrow(nt.DisposedError);
        // a following op works
        const live = nt.full([2, 4], 0.5);
        expect(() => op(live)).not.toThrow();
      });
    });
  }
  it('missing tensors throw ArgumentError (optional bias may be null)', () => {
    const x = nt.ones([2, 4]), w = nt.ones([3, 4]);
    expect(() => nt.matmul(x, null as never)).toThrow(nt.ArgumentError);
    expect(() => nt.linear(undefined as never, w)).toThrow(nt.ArgumentError);
    expect(() => nt.layerNorm(x, null as never)).toThrow(nt.ArgumentError);
    expect(() => nt.attention(x, x, undefined as never)).toThrow(nt.ArgumentError);
    expect(() => nt.crossEntropy(x, null as never)).toThrow(nt.ArgumentError);
    expect(() => nt.cat([x, null as never])).toThrow(nt.ArgumentError);
    expect(nt.linear(x, w, null).shape).toEqual([2, 3]);
    expect(nt.layerNorm(x, nt.ones([4]), undefined).shape).toEqual([2, 4]);
  });
  it('integer inputs to float ops throw DTypeError', () => {
    const i = nt.zeros([2, 4], { dtype: 'i32' });
    for (const [name, op] of ops) {
      if (['reshape', 'squeeze', 'unsqueeze', 'permute', 'transpose', 'slice', 'split', 'chunk', 'cat'].includes(name)) continue;
      expect(() => op(i), name).toThrow(nt.DTypeError);
    }
    i.dispose();
  });
});

describe('bf16 forward matches f32 to bf16 precision', () => {
  const spot: [string, (x: nt.Tensor) => nt.Tensor][] = [
    ['gelu', nt.gelu], ['softmax', (x) => nt.softmax(x)], ['tanh', nt.tanh],
    ['attention', (x) => { const q = x.reshape([1, 2, 3, 4]); return nt.attention(q, q, q); }],
    ['linear', (x) => nt.linear(x, nt.full([5, 4], 0.25, { dtype: x.dtype }))],
    ['permute', (x) => nt.permute(x, [1, 0])],
  ];
  for (const [name, op] of spot) {
    it(name, () => {
      nt.scope(() => {
        const x = nt.randn([6, 4], { seed: 3 }).to('bf16');
        const want = op(x.to('f32')).toArraySync();
        const got = op(x);
        expect(got.dtype).toBe('bf16');
        expectClose(got.toArraySync(), want, 1e-2, 1 / 64, name);
      });
    });
  }
  it('crossEntropy on bf16 logits', () => {
    nt.scope(() => {
      const x = nt.randn([5, 9], { seed: 4 }).to('bf16');
      const t = nt.tensor(Int32Array.from([0, 3, 8, 2, 2]), [5]);
      expect(nt.crossEntropy(x, t).item()).toBeCloseTo(nt.crossEntropy(x.to('f32'), t).item(), 2);
    });
  });
  it('backward in bf16 gives bf16 gradients close to the f32 ones', () => {
    const grads = (dtype: 'f32' | 'bf16') => nt.scope(() => {
      const x = nt.randn([6, 4], { seed: 5 }).to(dtype);
      const w = nt.randn([3, 4], { seed: 6 }).to(dtype);
      x.requiresGrad = true;
      w.requiresGrad = true;
      nt.sum(nt.gelu(nt.linear(x, w))).backward();
      expect(x.grad!.dtype).toBe(dtype);
      return [Array.from(x.grad!.toArraySync()), Array.from(w.grad!.toArraySync())];
    });
    const [gx, gw] = grads('f32'), [hx, hw] = grads('bf16');
    expectClose(hx!, gx!, 2e-2, 2e-2, 'bf16 dx');
    expectClose(hw!, gw!, 2e-2, 2e-2, 'bf16 dw');
  });
});
