// nodetron's bf16 memory model (--memory-model nodetron) on the bf16 GEMM path this machine runs:
// the AVX512_BF16 kernel ('native') or the fallback that widens each GEMM's 16-bit operands to f32
// ('widen': no AVX512_BF16, NODETRON_CPU_ISA below avx512, or NODETRON_BF16_GEMM=fallback). The CI's
// lower-level pass (scripts/test.mjs, NODETRON_TEST_LOWER_LEVEL) runs this file on the widening path.
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { plan } from '../../lib/internal.js';
import { launchingInternal } from '../helpers/node-script.js';

// calibrateLayout from dist/ when it is fresh: its launched ranks then start without tsx.
const launching = await launchingInternal();

const MiB = (b: number) => (b / 2 ** 20).toFixed(2);

// bf16 autocast (the trainer's precision 'bf16') against the peak measured on the CPU backend.
// Native path measured 2026-11-26 within 6% on 17 layouts but ZeRO 1 (-12.7%: its step's peak is not
// modelled); widening path measured 2026-11-27 (docs/planning.md), where the head's f32 copies of its
// logits block and table add 65-130 MiB (a Zen 3 without AVX-512 had failed the native model by 1.3-1.8x).
describe(`calibration under bf16 autocast (bf16 GEMMs here: ${plan.cpuBf16Path()})`, () => {
  const path = plan.cpuBf16Path();
  for (const spec of ['dp1', 'tp2,sp', 'pp2,mb4,zb-h1', 'dp2,zero2']) {
    it(`${spec}: every rank within 8%`, async () => {
      const row = await launching.plan.calibrateLayout(spec, plan.CALIBRATION_SHAPE, { dtype: 'bf16' });
      for (const r of row.ranks) {
        // The launched ranks ran the path this process runs (the environment reaches them), and that is the one predicted.
        expect(r.bf16Path, `rank ${r.rank}`).toBe(path);
        expect(Math.abs(r.error), `rank ${r.rank} (stage ${r.ppRank}, ${r.bf16Path}): predicted ${MiB(r.predicted)} MiB, measured ${MiB(r.peak)} MiB`).toBeLessThan(0.08);
      }
    }, 180_000);
  }
});

describe('the bf16 GEMM path in the memory model', () => {
  const model = plan.calibrationModel();
  const shape = plan.CALIBRATION_SHAPE;
  const opts = (spec: string) => {
    const layout = plan.parseLayoutSpec(spec);
    return { layout, o: { seq: shape.ctx, microBatchSize: shape.batch / layout.dp / layout.microBatches, dtype: 'bf16' as const, model: 'nodetron' as const, backend: 'cpu' as const } };
  };

  it("'widen' adds the head's f32 copies of its x rows, table and logits block where the head runs; f32 and the published model do not change", () => {
    const { layout, o } = opts('dp1');
    const native = plan.estimateMemory(model, layout, { ...o, bf16Path: 'native' });
    const widen = plan.estimateMemory(model, layout, { ...o, bf16Path: 'widen' });
    // 512 rows (8 sequences of 64) fit one 64 MiB chunk of bf16 logits: the GEMMs copy [512, 128], [50304, 128] and [512, 50304].
    const sc = plan.sizeClass, rows = shape.batch * shape.ctx;
    expect(widen.total - native.total).toBe(sc(4 * rows * shape.width) + sc(4 * shape.vocab * shape.width) + sc(4 * rows * shape.vocab));
    expect(widen.buffers - native.buffers).toBe(widen.total - native.total);
    for (const other of [{ dtype: 'f32' as const }, { dtype: 'bf16' as const }]) {
      const base = { seq: o.seq, microBatchSize: o.microBatchSize, ...other };
      expect(plan.estimateMemory(model, layout, { ...base, bf16Path: 'widen', backend: 'cpu' })).toEqual(plan.estimateMemory(model, layout, { ...base, bf16Path: 'native', backend: 'cpu' }));
    }
  });

  it("a middle stage (its peak in a forward) counts its largest block GEMM's copies (the MLP's, [rows, h] by [4h, h] at this shape)", () => {
    const { layout, o } = opts('pp3,mb4,1f1b');
    const six = plan.calibrationModel({ ...shape, layers: 6 });
    const native = plan.estimateStageMemory(six, layout, { ...o, bf16Path: 'native' }, 1);
    const widen = plan.estimateStageMemory(six, layout, { ...o, bf16Path: 'widen' }, 1);
    const sc = plan.sizeClass, rows = o.microBatchSize * shape.ctx, h = shape.width;
    expect(widen.total - native.total).toBe(sc(4 * rows * h) + sc(4 * h * 4 * h) + sc(4 * rows * 4 * h));
  });

  it('defaults to the path this process runs on cpu and to native on cuda; a bad path or widening on cuda is an ArgumentError', () => {
    const { layout, o } = opts('dp1');
    expect(plan.estimateMemory(model, layout, o)).toEqual(plan.estimateMemory(model, layout, { ...o, bf16Path: plan.cpuBf16Path() }));
    expect(plan.cpuBf16Path()).toBe(nt.info().cpu.bf16Gemm.kernel === 'sgemm' ? 'widen' : 'native');
    const cuda = { ...o, backend: 'cuda' as const };
    expect(plan.estimateMemory(model, layout, cuda)).toEqual(plan.estimateMemory(model, layout, { ...cuda, bf16Path: 'native' }));
    expect(() => plan.estimateMemory(model, layout, { ...cuda, bf16Path: 'widen' })).toThrow(nt.ArgumentError);
    expect(() => plan.estimateMemory(model, layout, { ...cuda, bf16Path: 'widen' })).toThrow(/bf16Path 'widen' is the cpu backend's fallback/);
    expect(() => plan.estimateMemory(model, layout, { ...o, bf16Path: 'fast' as never })).toThrow(/bf16Path must be 'native' or 'widen', got "fast"/);
  });
});
