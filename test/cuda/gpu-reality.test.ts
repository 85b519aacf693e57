// Checks for the first GPU run (skipped without a GPU): cuBLASLt plans cached per key with the
// declared alignments, linear's bias in the GEMM epilogue, recordStream across a destroyed stream,
// the Philox normals against the cpu stream, and NODETRON_CUDA_SYNC=1.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { cuda as cudaAddon, packageRoot } from '../../lib/native.js';

const hasGpu = nt.cuda.isAvailable();
const why = hasGpu ? '' : ` (skipped: no usable GPU: ${nt.cuda.unavailableReason()})`;

function worstRel(got: nt.Tensor, want: nt.Tensor): number {
  const g = got.to({ device: 'cpu', dtype: 'f32' }).toArraySync(), w = want.to('f32').toArraySync();
  let worst = 0;
  for (let i = 0; i < w.length; i++) worst = Math.max(worst, Math.abs(g[i]! - w[i]!) / (1 + Math.abs(w[i]!)));
  return worst;
}

describe.skipIf(!hasGpu)(`GPU reality${why}`, () => {
  it('linear with bias (cuBLASLt BIAS epilogue) matches cpu for odd and even widths', () => {
    for (const dtype of ['f32', 'bf16', 'f16'] as const) {
      for (const [rows, inF, outF] of [[5, 24, 17], [64, 768, 3072], [7, 33, 1], [1, 8, 50257]] as const) {
        const x = nt.randn([rows, inF], { seed: 1, dtype }), w = nt.randn([outF, inF], { seed: 2, dtype }), b = nt.randn([outF], { seed: 3, dtype });
        const ref = nt.linear(x, w, b);
        const out = nt.linear(x.to('cuda'), w.to('cuda'), b.to('cuda'));
        expect(worstRel(out, ref), `${dtype} ${rows}x${inF}->${outF}`).toBeLessThan(dtype === 'f32' ? 1e-4 : 5e-2);
      }
    }
  });

  it('repeated GEMMs reuse a cached plan; odd batch strides (2-byte alignment) are correct', () => {
    const before = cudaAddon().gemmPlanCache(0);
    const a = nt.randn([3, 17, 33], { seed: 4, dtype: 'bf16' }), b = nt.randn([3, 33, 9], { seed: 5, dtype: 'bf16' });
    const ga = a.to('cuda'), gb = b.to('cuda');
    for (let i = 0; i < 5; i++) expect(worstRel(nt.matmul(ga, gb), nt.matmul(a, b))).toBeLessThan(5e-2);
    const after = cudaAddon().gemmPlanCache(0);
    expect(after.hits - before.hits).toBeGreaterThanOrEqual(4);
    expect(after.size).toBeLessThanOrEqual(after.capacity);
  });

  it('a tensor recorded on a stream that is destroyed before it is freed frees cleanly', () => {
    const s = nt.cuda.newStream();
    const t = nt.randn([1 << 20], { device: 'cuda' });
    nt.cuda.recordStream(t, s);
    s.destroy();
    expect(() => t.dispose()).not.toThrow();
    expect(nt.memoryStats('cuda').pendingFrees).toBe(0);
  });

  it('Philox normals match the cpu stream within 1e-5 (no fast-math approximations)', () => {
    const g = nt.randn([1 << 16], { seed: 9, device: 'cuda' }), c = nt.randn([1 << 16], { seed: 9 });
    const d = g.toArraySync(), e = c.toArraySync();
    let worst = 0;
    for (let i = 0; i < d.length; i++) worst = Math.max(worst, Math.abs(d[i]! - e[i]!));
    expect(worst).toBeLessThan(1e-5);
    const u = nt.randn([4097], { seed: 11, device: 'cuda', mean: 0.5, std: 3 }).toArraySync();
    const v = nt.randn([4097], { seed: 11, mean: 0.5, std: 3 }).toArraySync();
    for (let i = 0; i < v.length; i++) expect(Math.abs(u[i]! - v[i]!)).toBeLessThan(3e-5 * (1 + Math.abs(v[i]!)));
  });

  it('NODETRON_CUDA_SYNC=1 runs a training step and reports debugSync', () => {
    const script = `import(${JSON.stringify(join(packageRoot, 'dist', 'index.js'))}).then((nt) => {
      const x = nt.randn([64, 128], { device: 'cuda' }), w = nt.randn([256, 128], { device: 'cuda', requiresGrad: true });
      const y = nt.sum(nt.gelu(nt.linear(x, w))); nt.backward(y);
      console.log(String(w.grad.shape), nt.cuda.deviceCount() > 0);
    })`;
    const r = spawnSync(process.execPath, ['-e', script], { env: { ...process.env, NODETRON_CUDA_SYNC: '1' }, encoding: 'utf8', timeout: 120_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout.trim()).toBe('256,128 true');
  });
});
