// The cuda backend from TypeScript: without a GPU every entry point fails with a typed error naming
// what is missing (and the process stays healthy); with one, ops match the cpu backend.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { BackendUnavailableError } from '../../lib/index.js';
import { cuda as cudaAddon, explainCudaLoadFailure } from '../../lib/native.js';

const hasGpu = nt.cuda.isAvailable();
const why = hasGpu ? '' : `no usable GPU: ${nt.cuda.unavailableReason()}`;

describe('cuda without a GPU', () => {
  it.skipIf(hasGpu)('tensor creation on cuda throws BackendUnavailableError naming the cause, then cpu still works', () => {
    let err: unknown;
    try { nt.zeros([2], { device: 'cuda' }); } catch (e) { err = e; }
    expect(err).toBeInstanceOf(BackendUnavailableError);
    expect((err as Error).message).toMatch(/driver|GPU|not built|cannot load/i);
    const t = nt.tensor([1, 2, 3]);
    expect(Array.from(t.toArraySync())).toEqual([1, 2, 3]);
    t.dispose();
  });

  it.skipIf(hasGpu)('deviceCount is 0, isAvailable false, memoryStats and streams fail typed', () => {
    expect(nt.cuda.deviceCount()).toBe(0);
    expect(nt.cuda.isAvailable()).toBe(false);
    expect(nt.cuda.unavailableReason()).not.toBe('ok');
    expect(() => nt.memoryStats('cuda')).toThrow(BackendUnavailableError);
    expect(() => nt.cuda.newStream()).toThrow(BackendUnavailableError);
    expect(() => nt.cuda.synchronize()).toThrow(BackendUnavailableError);
    expect(nt.memoryStats('cpu').allocated).toBeGreaterThanOrEqual(0);
  });

  it('the addon, when built, loads without a driver and reports library versions', () => {
    let addon;
    try { addon = cudaAddon(); } catch (e) {
      expect(e).toBeInstanceOf(BackendUnavailableError);  // not built here: the reason says so
      return;
    }
    const libs = addon.libraryInfo();
    expect(libs.cudaRuntime).toMatch(/^\d+\.\d+$/);
    expect(libs.cublasLt).toMatch(/^\d+\.\d+\.\d+$/);
    expect(libs.nccl).toMatch(/^\d+\.\d+\.\d+$/);
    expect(typeof addon.driverStatus()).toBe('string');
    const info = nt.info();
    expect(info.backends.cuda.available).toBe(hasGpu);
    if (!hasGpu) expect(info.backends.cuda.reason).toBe(addon.driverStatus());
  });

  it('recordStream checks its tensor and stream before reaching the addon', () => {
    const t = nt.zeros([2]);
    expect(() => nt.cuda.recordStream(t, new nt.cuda.Stream(0, 1))).toThrow(nt.DeviceError);
    t.dispose();
  });

  it('setFloat32MatmulPrecision validates its argument', () => {
    expect(() => nt.cuda.setFloat32MatmulPrecision('medium' as 'high')).toThrow(nt.ArgumentError);
    expect(nt.cuda.getFloat32MatmulPrecision()).toBe('highest');
  });
});

describe('explainCudaLoadFailure', () => {
  const dl = (lib: string) => `Error: ${lib}: cannot open shared object file: No such file or directory`;
  it.each([
    ['libcublasLt.so.13', /cuBLAS.*pip install nvidia-cublas/],
    ['libnccl.so.2', /NCCL.*pip install nvidia-nccl-cu13/],
    ['libcudart.so.13', /CUDA runtime/],
    ['libcuda.so.1', /NVIDIA driver/],
    ['libfoo.so.3', /^libfoo\.so\.3 was not found$/],
  ])('%s', (lib, expected) => {
    expect(explainCudaLoadFailure(dl(lib))).toMatch(expected);
    expect(explainCudaLoadFailure(dl(lib))).toContain(lib);
  });
  it('passes other messages through', () => {
    expect(explainCudaLoadFailure('invalid ELF header')).toBe('invalid ELF header');
  });
});

// On a GPU machine: every op family here against the cpu backend (scripts/gpu/run.mjs, its correctness steps, do the rest).
describe.skipIf(!hasGpu)(`cuda vs cpu ${why}`, () => {
  it('write/read round trip, fill, arange, cast are bit-identical to cpu', () => {
    const x = nt.randn([1000], { seed: 3 });
    for (const dtype of ['f32', 'bf16', 'f16', 'i32', 'u8'] as const) {
      const c = x.to({ dtype, device: 'cuda' });
      const ref = x.to(dtype);
      expect(Array.from(c.toArraySync())).toEqual(Array.from(ref.toArraySync()));
      c.dispose(); ref.dispose();
    }
    const a = nt.arange(0, 10, 0.5, { device: 'cuda' }), b = nt.arange(0, 10, 0.5);
    expect(Array.from(a.toArraySync())).toEqual(Array.from(b.toArraySync()));
    x.dispose(); a.dispose(); b.dispose();
  });

  it('Philox draws match the cpu backend', () => {
    const g = nt.rand([4097], { seed: 11, device: 'cuda' }), c = nt.rand([4097], { seed: 11 });
    expect(Array.from(g.toArraySync())).toEqual(Array.from(c.toArraySync()));
    const gn = nt.randn([513], { seed: 5, device: 'cuda' }), cn = nt.randn([513], { seed: 5 });
    const d = gn.toArraySync(), e = cn.toArraySync();
    for (let i = 0; i < d.length; i++) expect(Math.abs(d[i]! - e[i]!)).toBeLessThan(1e-5);
  });

  it('matmul matches cpu (f32 and bf16, transposes, batches)', () => {
    for (const dtype of ['f32', 'bf16'] as const) {
      const a = nt.randn([3, 17, 33], { seed: 1, dtype }), b = nt.randn([3, 33, 9], { seed: 2, dtype });
      const ref = nt.matmul(a, b).to('f32').toArraySync();
      const ga = a.to('cuda'), gb = b.to('cuda');
      const out = nt.matmul(ga, gb).to('f32').toArraySync();
      const tol = dtype === 'f32' ? 1e-4 : 5e-2;
      for (let i = 0; i < ref.length; i++) expect(Math.abs(out[i]! - ref[i]!)).toBeLessThan(tol * (1 + Math.abs(ref[i]!)));
    }
  });

  it('streams and events order work and time it', () => {
    const s = nt.cuda.newStream();
    const start = new nt.cuda.Event(s.device, { timing: true }), end = new nt.cuda.Event(s.device, { timing: true });
    nt.cuda.withStream(s, () => {
      start.record();
      const t = nt.randn([1 << 20], { device: 'cuda' });
      end.record();
      end.synchronize();
      expect(start.elapsedMs(end)).toBeGreaterThanOrEqual(0);
      t.dispose();
    });
    expect(nt.cuda.currentStream().id).toBe(0);
    s.synchronize();
    s.destroy();
    start.destroy(); end.destroy();
  });

  it('out-of-memory is a typed error and the device stays usable', () => {
    expect(() => nt.empty([2 ** 50 / 4], { device: 'cuda' })).toThrow(nt.OutOfMemoryError);
    const t = nt.ones([4], { device: 'cuda' });
    expect(Array.from(t.toArraySync())).toEqual([1, 1, 1, 1]);
    t.dispose();
  });
});
