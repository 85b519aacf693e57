// One kernel contract for both backends: every kernel with a signature in native/core/signatures.h is
// declared once per backend by the macro that checks the call against that signature (NT_KERNEL on the
// cpu, NT_CUDA_KERNEL / NT_CUDA_KERNEL_VALUE on cuda; the cuda macros give a body no CallbackInfo) and
// the bindings read their arguments by the declared names, not by position. A source scan: it needs no GPU and no cuda build.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { packageRoot } from '../../lib/native.js';

const read = (p: string) => readFileSync(join(packageRoot, p), 'utf8');
const signatures = [...read('native/core/signatures.h').matchAll(/\{"(\w+)",\s*"/g)].map((m) => m[1]!);
const sources = (dir: string, ext: string) =>
  readdirSync(join(packageRoot, dir)).filter((f) => f.endsWith(ext)).map((f) => ({ file: `${dir}/${f}`, text: read(`${dir}/${f}`) }));
const cudaSources = [...sources('native/cuda/kernels', '.cu'), ...sources('native/cuda', '.cc')];
const cpuSources = [...sources('native/cpu/kernels', '.cc'), ...sources('native/cpu', '.cc')];
const declared = (files: { text: string }[], macro: RegExp) => files.flatMap((f) => [...f.text.matchAll(macro)].map((m) => m[1]!));

describe('the kernel contract (signatures.h, NT_KERNEL, NT_CUDA_KERNEL)', () => {
  it('the signature table is read (it lists the kernels)', () => {
    for (const k of ['binary', 'gemm', 'gemm_epilogue', 'flash_attention_backward', 'sgd_step']) expect(signatures).toContain(k);
  });

  it('every cuda kernel is declared once with NT_CUDA_KERNEL, never by a hand-written NT_EXPORT', () => {
    const cudaKernels = declared(cudaSources, /NT_CUDA_KERNEL(?:_VALUE)?\("(\w+)"/g);
    // read and write check their typed array against the signature through typedArrayRange() (signatures.h)
    const viaRange = ['read', 'write'];
    const handWritten = declared(cudaSources, /NT_EXPORT\("(\w+)"/g).filter((n) => signatures.includes(n));
    expect(handWritten.sort()).toEqual(viaRange);
    expect(new Set(cudaKernels).size).toBe(cudaKernels.length);
    expect([...cudaKernels, ...viaRange].sort()).toEqual([...signatures].sort());
  });

  it('every cpu kernel with a signature is declared with NT_KERNEL, but the value-returning optimizer calls', () => {
    const cpuKernels = declared(cpuSources, /NT_KERNEL\("(\w+)"/g);
    const handWritten = declared(cpuSources, /NT_EXPORT\("(\w+)"/g).filter((n) => signatures.includes(n));
    // read/write: typedArrayRange(); the optimizer steps check their signature with kernelArgs() themselves
    expect(handWritten.sort()).toEqual(['adamw_step', 'lamb_step', 'read', 'scale_in_place', 'sum_squares', 'write']);
    expect(new Set(cpuKernels).size).toBe(cpuKernels.length);
    for (const k of cpuKernels) expect(signatures, k).toContain(k);
  });

  it('cpu kernel bodies read arguments by their declared names, not by position', () => {
    const bodies = cpuSources.flatMap(({ file, text }) => [...text.matchAll(/NT_KERNEL\("(\w+)", \w+\) \{([\s\S]*?)\n\}\n/g)].map((m) => ({ file, kernel: m[1]!, body: m[2]! })));
    expect(bodies.length).toBeGreaterThan(30);
    for (const { file, kernel, body } of bodies) {
      expect(body, `${file} ${kernel}`).not.toMatch(/\ba\.(size|int64|number|boolean|dtype|string)\(\d/);
      expect(body, `${file} ${kernel}`).not.toMatch(/\((info|a), \d+, /);
      expect(body, `${file} ${kernel}`).not.toMatch(/\binfo\[\d/);
    }
  });

  it('cuda bindings read arguments by their declared names, not by position', () => {
    for (const { file, text } of sources('native/cuda/kernels', '.cu')) {
      expect(text, file).not.toMatch(/\bk\.args\.(size|int64|number|boolean|dtype|string)\(\d/);
      expect(text, file).not.toMatch(/\bk\.(data|optional)(<[^>]*>)?\(\d/);
      expect(text, file).not.toMatch(/KernelCall k\(info/);
    }
    // every name a cuda binding reads is declared in some signature (a typo would be a run-time Native error)
    const names = new Set([...read('native/core/signatures.h').matchAll(/(\w+):[sonifdbItSA]\b/g)].map((m) => m[1]!));
    for (const { file, text } of sources('native/cuda/kernels', '.cu'))
      for (const m of text.matchAll(/\bk\.(?:args\.(?:size|int64|number|boolean|dtype|given|ints|at)|data|optional)(?:<[^>]*>)?\("(\w+)"/g))
        expect(names.has(m[1]!), `${file}: "${m[1]}"`).toBe(true);
  });
});
