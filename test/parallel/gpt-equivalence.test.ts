// Parallel GPT training through the real launcher and Gloo: a tiny GPT trained 3 steps as DP2,
// ZeRO-1 DP2, ZeRO-2 DP2 (+ offload), DP4 and ZeRO-3 DP2/DP4 (± offload) matches the single-process run step by step (losses,
// gradient norms) and in its final parameters; bad layouts fail on every rank before training.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { ArgumentError, parallel } from '../../lib/index.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const script = join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-gpt-eq-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));

interface Trained { code: number | null; output: string; ranks: { losses: number[]; gradNorms: number[]; paramChange: number; params: Float32Array }[] }

function train(name: string, nproc: number, flags: string[]): Promise<Trained> {
  const out = join(work, name);
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ['--import', 'tsx', launcher, '--nproc-per-node', String(nproc), script, '--out', out, ...flags], {
      cwd: root, stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => { output += d.toString(); });
    child.stderr.on('data', (d: Buffer) => { output += d.toString(); });
    child.on('close', (code) => {
      const ranks = code !== 0 ? [] : Array.from({ length: nproc }, (_, r) => {
        const res = JSON.parse(readFileSync(join(out, `result-${r}.json`), 'utf8')) as { losses: number[]; gradNorms: number[]; paramChange: number };
        const bytes = readFileSync(join(out, `params-${r}.f32`));
        return { ...res, params: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4) };
      });
      resolve({ code, output, ranks });
    });
  }).then((r) => r as Trained);
}

/** Largest |a - b| over the largest |b|: f32 agreement of whole vectors (scale-free, robust to tiny entries). */
function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  expect(a.length).toBe(b.length);
  let diff = 0, scale = 0;
  for (let i = 0; i < a.length; i++) { diff = Math.max(diff, Math.abs(a[i]! - b[i]!)); scale = Math.max(scale, Math.abs(b[i]!)); }
  return diff / scale;
}

// All launches start at once (they are mostly process start-up), each into its own output folder.
function launchRun(name: string, nproc: number, flags: string[]): Promise<Trained> {
  mkdirSync(join(work, name));
  return train(name, nproc, flags);
}
const single = launchRun('single', 1, []);
const layouts = {
  'DP2': launchRun('dp2', 2, ['--dp', '2']),
  'ZeRO-1 DP2': launchRun('zero1', 2, ['--dp', '2', '--zero', '1']),
  'ZeRO-2 DP2 offload recompute': launchRun('zero2', 2, ['--zero', '2', '--offload', '--recompute']),
  'DP4 ZeRO-1': launchRun('dp4', 4, ['--zero', '1']),
  'ZeRO-3 DP2': launchRun('zero3', 2, ['--zero', '3']),
  'ZeRO-3 DP2 offload': launchRun('zero3-offload', 2, ['--zero', '3', '--offload']),
  'ZeRO-3 DP4': launchRun('zero3-dp4', 4, ['--zero', '3']),
  'ZeRO-3 DP4 offload recompute': launchRun('zero3-dp4-offload', 4, ['--zero', '3', '--offload', '--recompute']),
};
const TOLERANCE = 1e-5;

describe('parallel GPT equivalence (launcher + Gloo)', () => {
  it('single-process reference trains', async () => {
    const ref = await single;
    expect(ref.code, ref.output).toBe(0);
    const { losses, gradNorms } = ref.ranks[0]!;
    expect(losses).toHaveLength(3);
    // An untrained model predicts roughly uniformly over the 64 tokens, and training lowers the loss.
    expect(Math.abs(losses[0]! - Math.log(64))).toBeLessThan(1);
    expect(losses[2]!).toBeLessThan(losses[0]!);
    expect(gradNorms.every((n) => n > 0 && Number.isFinite(n))).toBe(true);
  }, 150_000);

  it.each(Object.keys(layouts))('%s matches the single process step by step', async (name) => {
    const [ref, run] = await Promise.all([single, layouts[name as keyof typeof layouts]]);
    expect(run.code, run.output).toBe(0);
    const expected = ref.ranks[0]!;
    for (const r of run.ranks) {
      expect(relDiff(r.losses, expected.losses)).toBeLessThan(TOLERANCE);
      expect(relDiff(r.gradNorms, expected.gradNorms)).toBeLessThan(TOLERANCE);
      expect(relDiff(r.params, expected.params)).toBeLessThan(TOLERANCE);
      // Replicas stay identical bit for bit: every rank applies the same averaged update.
      expect(relDiff(r.params, run.ranks[0]!.params)).toBe(0);
    }
    // The parameters moved far more than the tolerance, so agreement is not two copies of the initialization.
    expect(expected.paramChange).toBeGreaterThan(100 * TOLERANCE);
  }, 150_000);

  it('rejects a bad layout on every rank before training', async () => {
    const bad = await launchRun('bad', 2, ['--dp', '2', '--tp', '2']);
    expect(bad.code).not.toBe(0);
    expect(bad.output).toMatch(/tp·pp·dp = 2·1·2 = 4 but the job has 2 processes/);
  }, 150_000);
});

describe('training layout validation', () => {
  const shape = { nLayer: 2, nHead: 2, nEmbd: 32 };
  it('fills dp from the world and accepts valid layouts', () => {
    expect(parallel.resolveTrainingLayout({}, shape, 4, 4)).toEqual({ tp: 1, pp: 1, dp: 4, zero: 0, offload: false });
    expect(parallel.resolveTrainingLayout({ tp: 2, zero: 1, offload: true }, shape, 4, 4)).toEqual({ tp: 2, pp: 1, dp: 2, zero: 1, offload: true });
    expect(parallel.resolveTrainingLayout({ zero: 3, offload: true }, shape, 2, 4)).toEqual({ tp: 1, pp: 1, dp: 2, zero: 3, offload: true });
  });
  it.each([
    [{ dp: 3 }, 2, 6, /job has 2 processes/],
    [{ tp: 4 }, 4, 4, /does not divide the 2 attention heads/],
    [{ pp: 3, dp: 1 }, 3, 4, /--pp 3 is more pipeline stages than the model's 2 layers/],
    [{ dp: 3 }, 3, 4, /does not divide the global batch of 4/],
    [{ zero: 4 }, 1, 4, /--zero must be 0, 1, 2 or 3/],
    [{ offload: true }, 1, 4, /--offload .* needs --zero 1, 2 or 3/],
  ] as const)('rejects %o on %d ranks (batch %d)', (flags, world, batch, message) => {
    expect(() => parallel.resolveTrainingLayout(flags, shape, world, batch)).toThrow(ArgumentError);
    expect(() => parallel.resolveTrainingLayout(flags, shape, world, batch)).toThrow(message);
    expect(parallel.resolveTrainingLayout({}, shape, 2, 4).dp).toBe(2);
  });
  it('batchSlice gives each data-parallel rank its rows', () => {
    expect([0, 1, 2].map((r) => parallel.batchSlice(6, r, 3))).toEqual([{ start: 0, count: 2 }, { start: 2, count: 2 }, { start: 4, count: 2 }]);
    expect(() => parallel.batchSlice(5, 0, 2)).toThrow(ArgumentError);
  });
});
