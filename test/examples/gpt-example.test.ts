// The example a user runs first (examples/gpt/train.ts, what `npm run demo` trains): it trains from
// token shards through nt.data.TokenLoader, saves checkpoints in the background, resumes one under
// another layout with the launcher (`--resume auto`), and exports a Hugging Face directory; under a
// time budget it stops by itself and ends with the unigram level, the loss curve (terminal, SVG, JSON)
// and a sample with its known-word share.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runProcess } from '../helpers/jobs.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const example = join(root, 'examples', 'gpt', 'train.ts');
const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts');
const work = mkdtempSync(join(tmpdir(), 'nt-example-'));
afterAll(() => rmSync(work, { recursive: true, force: true }));
const small = ['--layers', '1', '--heads', '2', '--width', '32', '--ctx', '16', '--batch', '4', '--eval-batches', '1', '--generate', '0'];

describe('examples/gpt/train.ts', () => {
  it('saves, resumes under DP2 ZeRO-1 from the newest checkpoint, and exports to Hugging Face', async () => {
    const ckpt = join(work, 'ckpt'), hf = join(work, 'hf');
    const first = await runProcess(process.execPath, ['--import', 'tsx', example, ...small, '--steps', '4', '--save', ckpt, '--save-every', '2', '--eval-interval', '2'],
      { cwd: root, limitMs: 240_000 });
    expect(first.code, first.output).toBe(0);
    expect(first.output).toMatch(/checkpoint step 4: training held/);
    expect(nt.ckpt.listCheckpoints(ckpt).map((c) => c.step)).toEqual([4, 2]);
    expect(nt.ckpt.readManifest(join(ckpt, 'step-00000004')).state.loader).toMatchObject({ epoch: 0, batch: 4, globalBatch: 4 });

    const resumed = await runProcess(process.execPath, ['--import', 'tsx', launcher, '--nproc-per-node', '2', example, ...small, '--dp', '2', '--zero', '1',
      '--steps', '6', '--save', ckpt, '--resume', 'auto', '--eval-interval', '3', '--export-hf', hf], { cwd: root, limitMs: 240_000 });
    expect(resumed.code, resumed.output).toBe(0);
    expect(resumed.output).toMatch(/resumed from .*step-00000004 \(step 4\)/);
    expect(resumed.output).toMatch(/step +6\/6/);
    expect(resumed.output).not.toMatch(/step +[1-4]\/6/);
    expect(existsSync(join(hf, 'model.safetensors')) && existsSync(join(hf, 'config.json'))).toBe(true);
    // The exported weights are the final checkpoint's.
    const exported = nt.interop.importHF(hf);
    const saved = nt.ckpt.readTensor(join(ckpt, 'step-00000006'), 'model/lnF.weight').data;
    expect(Array.from(exported.lnF.weight.toArraySync())).toEqual(Array.from(saved));
    exported.dispose();
  }, 600_000);

  it('trains within a time budget and ends with the unigram level, the loss curve and a sample', async () => {
    const out = join(work, 'run');
    const r = await runProcess(process.execPath, ['--import', 'tsx', example, ...small.filter((a) => a !== '--generate' && a !== '0'),
      '--time-budget', '6', '--eval-interval', '5', '--progress-every', '5', '--generate', '16', '--out', out], { cwd: root, limitMs: 240_000 });
    expect(r.code, r.output).toBe(0);
    const unigram = Number(/unigram level \(.*\): ([\d.]+) nats on val/.exec(r.output)?.[1]);
    expect(unigram).toBeGreaterThan(0);
    const trained = /trained (\d+) steps in ([\d.]+) s \(budget 6 s\)/.exec(r.output);
    expect(trained, r.output).not.toBeNull();
    const steps = Number(trained![1]);
    expect(steps).toBeGreaterThan(0);
    // The run stops on its own clock (no fixed --steps): generous bound, the machine may be loaded.
    expect(Number(trained![2])).toBeLessThan(6 + 120);
    expect(r.output).toMatch(/⠤ train loss {3}● val loss {3}╌ unigram level/);
    expect(r.output).toMatch(/final val loss [\d.]+: [\d.]+ nats (below|above) the unigram level/);
    expect(r.output).toMatch(/\d+% of the sample's \d+ generated words occur in the training text/);
    expect(readFileSync(join(out, 'loss.svg'), 'utf8')).toMatch(/^<\?xml[^]*<polyline[^]*<\/svg>\n$/);
    const losses = JSON.parse(readFileSync(join(out, 'losses.json'), 'utf8')) as { train: [number, number][]; val: [number, number][]; unigram: { valCrossEntropy: number } };
    expect(losses.train.map(([s]) => s)).toEqual(Array.from({ length: steps }, (_, i) => i + 1));
    expect(losses.val[0]![0]).toBe(0);
    expect(losses.val.at(-1)![0]).toBe(steps);
    expect(losses.unigram.valCrossEntropy).toBeCloseTo(unigram, 4);
  }, 300_000);
});
