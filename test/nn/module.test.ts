// Module bookkeeping: dotted parameter names, tied weights, state dicts and their errors, train/eval, init statistics.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { Dropout, Embedding, GPT, LayerNorm, Linear, Module, Parameter } from '../../lib/nn/index.js';

class Tiny extends Module {
  readonly a = new Linear(3, 4, { generator: new nt.Generator(1) });
  readonly layers = [new LayerNorm(4), new Linear(4, 2, { bias: false, generator: new nt.Generator(2) })];
  readonly tied: Parameter;
  readonly note = 'not a parameter';
  constructor() { super(); this.tied = this.a.weight; }
}

const cfg = { vocabSize: 11, blockSize: 8, nLayer: 2, nHead: 2, nEmbd: 8, dropout: 0.1, bias: true };

describe('Module', () => {
  it('names parameters with dotted paths (own fields before submodules, as PyTorch) and lists tied weights once', () => {
    const m = new Tiny();
    expect(m.namedParameters().map(([n]) => n)).toEqual(['tied', 'a.bias', 'layers.0.weight', 'layers.0.bias', 'layers.1.weight']);
    expect(m.numParameters()).toBe(12 + 4 + 4 + 4 + 8);
    expect(m.parameters().every((p) => p.requiresGrad)).toBe(true);
  });

  it('GPT has the expected parameter names and count (tied head, parallel block drops ln2)', () => {
    const g = new GPT(cfg);
    const names = g.namedParameters().map(([n]) => n);
    expect(names.slice(0, 4)).toEqual(['wte.weight', 'wpe.weight', 'h.0.ln1.weight', 'h.0.ln1.bias']);
    expect(names).toContain('h.1.attn.qkv.weight');
    expect(names).toContain('h.1.mlp.proj.bias');
    expect(names.at(-1)).toBe('lnF.bias');
    const c = 8, perBlock = 2 * 2 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c);
    expect(g.numParameters()).toBe(11 * c + 8 * c + 2 * perBlock + 2 * c);
    const p = new GPT({ ...cfg, parallelBlock: true });
    expect(p.namedParameters().some(([n]) => n.includes('ln2'))).toBe(false);
    g.dispose(); p.dispose();
  });

  it('initializes GPT as GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2 nLayer), reproducibly by seed', () => {
    const big = { vocabSize: 64, blockSize: 32, nLayer: 4, nHead: 2, nEmbd: 64, dropout: 0, bias: true };
    const g = new GPT(big, { seed: 5 });
    const std = (t: nt.Tensor) => { const a = t.toArraySync(); const m = a.reduce((s, x) => s + x, 0) / a.length; return Math.sqrt(a.reduce((s, x) => s + (x - m) ** 2, 0) / a.length); };
    const sd = g.stateDict();
    expect(std(sd['wte.weight']!)).toBeCloseTo(0.02, 2);
    expect(std(sd['h.0.mlp.fc.weight']!)).toBeCloseTo(0.02, 2);
    expect(std(sd['h.3.mlp.proj.weight']!) / (0.02 / Math.sqrt(8))).toBeCloseTo(1, 1);
    expect(Array.from(sd['h.0.attn.qkv.bias']!.toArraySync()).every((x) => x === 0)).toBe(true);
    expect(Array.from(sd['lnF.weight']!.toArraySync()).every((x) => x === 1)).toBe(true);
    const again = new GPT(big, { seed: 5 }), other = new GPT(big, { seed: 6 });
    expect(again.stateDict()['h.2.attn.qkv.weight']!.toArraySync()).toEqual(sd['h.2.attn.qkv.weight']!.toArraySync());
    expect(other.stateDict()['h.2.attn.qkv.weight']!.toArraySync()).not.toEqual(sd['h.2.attn.qkv.weight']!.toArraySync());
    g.dispose(); again.dispose(); other.dispose();
  });

  it('Linear uses PyTorch layout and bound 1/sqrt(in); Embedding N(0,1)', () => {
    const l = new Linear(50, 7, { generator: new nt.Generator(3) });
    expect(l.weight.shape).toEqual([7, 50]);
    expect(l.bias!.shape).toEqual([7]);
    const w = l.weight.toArraySync();
    expect(Math.max(...w.map(Math.abs))).toBeLessThanOrEqual(1 / Math.sqrt(50));
    expect(Math.max(...w.map(Math.abs))).toBeGreaterThan(0.9 / Math.sqrt(50));
    const e = new Embedding(100, 40, { generator: new nt.Generator(4) });
    const v = e.weight.toArraySync();
    expect(Math.sqrt(v.reduce((s, x) => s + x * x, 0) / v.length)).toBeCloseTo(1, 1);
  });

  it('loads a state dict by name and copies values (not references)', () => {
    const a = new Tiny(), b = new Tiny();
    for (const p of b.parameters()) nt.nn.init.constant(p, 0.5);
    const res = a.loadStateDict(b.stateDict());
    expect(res).toEqual({ missing: [], unexpected: [] });
    expect(Array.from(a.a.weight.toArraySync()).every((x) => x === 0.5)).toBe(true);
    nt.nn.init.constant(b.a.weight, 2);
    expect(a.a.weight.toArraySync()[0]).toBe(0.5);
  });

  it('reports missing, unexpected and misshaped entries all at once, with typed errors, then still works', () => {
    const m = new Tiny();
    const sd: Record<string, nt.Tensor> = { ...m.stateDict() };
    delete sd['a.bias'];
    sd['extra.weight'] = nt.zeros([2]);
    const err = (() => { try { m.loadStateDict(sd); } catch (e) { return e as Error; } return null; })();
    expect(err).toBeInstanceOf(nt.StateError);
    expect(err!.message).toContain('missing keys: a.bias');
    expect(err!.message).toContain('unexpected keys: extra.weight');
    expect(m.loadStateDict(sd, { strict: false })).toEqual({ missing: ['a.bias'], unexpected: ['extra.weight'] });
    const bad = { ...m.stateDict(), 'layers.1.weight': nt.zeros([2, 5]), 'a.weight': nt.zeros([3, 4]) };
    expect(() => m.loadStateDict(bad)).toThrow(nt.ShapeError);
    expect(() => m.loadStateDict(bad)).toThrow(/layers\.1\.weight \(expected \[2, 4\], got \[2, 5\]\).*|a\.weight/);
    expect(m.loadStateDict(m.stateDict())).toEqual({ missing: [], unexpected: [] });
  });

  it('converts dtype on load', () => {
    const m = new Tiny();
    const sd = Object.fromEntries(Object.entries(m.stateDict()).map(([k, v]) => [k, v.to('bf16')]));
    m.loadStateDict(sd);
    expect(m.a.weight.dtype).toBe('f32');
  });

  it('train()/eval() reach every submodule; zeroGrad drops gradients; bad configs throw', () => {
    const g = new GPT(cfg);
    g.eval();
    expect([...g.namedModules()].every(([, m]) => !m.training)).toBe(true);
    g.train();
    expect(g.h[1]!.mlp.dropout.training).toBe(true);
    g.wte.weight.grad = nt.ones(g.wte.weight.shape as number[]);
    g.zeroGrad();
    expect(g.wte.weight.grad).toBeNull();
    expect(() => new GPT({ ...cfg, nHead: 3 })).toThrow(nt.ArgumentError);
    expect(() => new GPT({ ...cfg, vocabSize: 0 })).toThrow(nt.ArgumentError);
    expect(() => new Dropout(1)).toThrow(nt.ArgumentError);
    expect(() => new Linear(0, 3)).toThrow(nt.ArgumentError);
    g.dispose();
    expect(g.wte.weight.disposed).toBe(true);
  });
});
