// What the multi-process checkpoint tests share: training runs of test/fixtures/ckpt/train.ts through the
// real launcher (queued on one JobPool, each writing its rank 0 result into its own folder of a scratch
// directory removed after the file's tests), and the bitwise comparison of two saved states.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, expect } from 'vitest';
import * as nt from '../../lib/index.js';
import { JobPool, runProcess } from './jobs.js';
import { nodeArgs, scriptPath } from './node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const script = join(root, 'test', 'fixtures', 'ckpt', 'train.ts');

/** A run's exit code and output, and rank 0's losses by step and the step it started from (-1 when it failed). */
export interface CheckpointRun { code: number | null; output: string; losses: Record<number, number>; start: number }

/**
 * Runs of the checkpoint fixture in a scratch directory named `prefix`…: `launch(name, nproc, flags,
 * launchFlags)` starts one (the fixture gets `flags` after `common`), `ckpt(name)` is the checkpoint
 * root a run saves into, `at(name, step)` one step's folder in it.
 */
export function checkpointRuns(prefix: string, o: { common?: string[]; limitMs: number }) {
  const work = mkdtempSync(join(tmpdir(), prefix));
  afterAll(() => rmSync(work, { recursive: true, force: true }));
  const pool = new JobPool();
  const launch = (name: string, nproc: number, flags: string[], launchFlags: string[] = []): Promise<CheckpointRun> => {
    const out = join(work, `out-${name}`);
    return pool.run(async () => {
      const { code, output } = await runProcess(process.execPath,
        [...nodeArgs(launcher), '--nproc-per-node', String(nproc), ...launchFlags, scriptPath(script), '--out', out, ...(o.common ?? []), ...flags],
        { cwd: root, limitMs: o.limitMs });
      if (code !== 0) return { code, output, losses: {}, start: -1 };
      const r = JSON.parse(readFileSync(join(out, 'result-0.json'), 'utf8')) as { losses: Record<number, number>; start: number };
      return { code, output, ...r };
    });
  };
  const ckpt = (name: string) => join(work, `ckpt-${name}`);
  const at = (name: string, step: number) => join(ckpt(name), nt.ckpt.stepDirName(step));
  return { work, pool, launch, ckpt, at };
}

/** Every tensor of checkpoint a equals b's, bit for bit, and the optimizer's step counts agree. */
export function expectSameCheckpointState(a: string, b: string): void {
  const ma = nt.ckpt.readManifest(a), mb = nt.ckpt.readManifest(b);
  expect(Object.keys(ma.tensors).sort()).toEqual(Object.keys(mb.tensors).sort());
  for (const key of Object.keys(ma.tensors)) {
    const ta = nt.ckpt.readTensor(a, key), tb = nt.ckpt.readTensor(b, key);
    expect(ta.shape, key).toEqual(tb.shape);
    const ua = new Uint32Array(ta.data.buffer), ub = new Uint32Array(tb.data.buffer);
    let diff = -1;
    for (let i = 0; i < ua.length && diff < 0; i++) if (ua[i] !== ub[i]) diff = i;
    expect(diff, `${key} differs at element ${diff}: ${ta.data[diff]} vs ${tb.data[diff]}`).toBe(-1);
  }
  expect(ma.optimizer.steps).toEqual(mb.optimizer.steps);
}
