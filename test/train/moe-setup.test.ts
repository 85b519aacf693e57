// MoE routing statistics where users read them: nt.train.setup's step result and progress line (one
// process), and the per-step metrics file of a launched EP2 job (NODETRON_METRICS).
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import * as nt from '../../lib/index.js';
import { runProcess } from '../helpers/jobs.js';
import { nodeArgs } from '../helpers/node-script.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('MoE statistics in nt.train.setup and the metrics file', () => {
  it('the step result carries the routing and the progress line shows it', async () => {
    const lines: string[] = [];
    const config: nt.nn.GPTConfig = { vocabSize: 64, blockSize: 16, nLayer: 2, nHead: 2, nEmbd: 16, dropout: 0, bias: false, moe: { experts: 4, topK: 2, hidden: 16, capacityFactor: 0.5 } };
    const run = await nt.train.setup({
      model: (shard) => new nt.nn.GPT(config, shard), layout: {}, batchSize: 2, steps: 2,
      optimizer: (groups) => new nt.optim.AdamW(groups, { lr: 1e-3 }), progress: { every: 1, log: (l) => lines.push(l) },
      data: (step) => ({ inputs: nt.tensor(Int32Array.from({ length: 32 }, (_, i) => (i * 7 + step) % 64), [2, 16]), targets: nt.tensor(Int32Array.from({ length: 32 }, (_, i) => (i * 5 + step) % 64), [2, 16]) }),
    });
    try {
      const r = await run.step();
      expect(r.moe!.forwards).toBe(2);
      expect(r.moe!.tokensPerExpert.reduce((a, b) => a + b, 0)).toBe(2 * 32 * 2);
      // Capacity 0.5: each expert takes at most ceil(0.5·32·2/4) = 8 of a layer's 64 slots, so at least half are dropped.
      expect(r.moe!.dropped / r.moe!.routed).toBeGreaterThanOrEqual(0.5);
      expect(r.moe!.auxLoss).toBeGreaterThan(0);
      const line = lines.find((l) => /^step +1\//.test(l))!;
      expect(line).toMatch(/\| moe aux \d+\.\d{4} drop \d+\.\d% max\/mean \d+\.\d\d/);
    } finally {
      await run.close();
    }
  });

  it('a launched EP2 job writes each step\'s routing to the metrics file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'nt-moe-metrics-'));
    try {
      const { code, output } = await runProcess(process.execPath, [...nodeArgs(join(root, 'test', 'fixtures', 'launch', 'launcher.ts')), '--nproc-per-node', '2',
        join(root, 'scripts', 'bench', 'moe.ts'), '--steps', '2', '--warmup', '0', '--ep', '2', '--width', '32', '--ctx', '16', '--batch', '4'],
      { cwd: root, limitMs: 240_000, env: { ...process.env, NODETRON_METRICS: dir } });
      expect(code, output).toBe(0);
      const steps = readFileSync(join(dir, 'rank-0.metrics.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l) as nt.distributed.StepMetrics);
      expect(steps).toHaveLength(2);
      for (const s of steps) {
        // 2 layers × the global batch's 4·16 tokens × top-2, summed over the two data-parallel ranks.
        expect(s.moe!.tokensPerExpert).toHaveLength(8);
        expect(s.moe!.tokensPerExpert.reduce((a, b) => a + b, 0)).toBe(2 * 64 * 2);
        expect(s.moe!.droppedShare).toBe(0);
        expect(s.moe!.loadBalanceLoss).toBeGreaterThan(0.5);
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 300_000);
});
