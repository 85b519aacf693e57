// The FinalizationRegistry backstop: a tensor dropped without dispose() is counted and warned about.
import { expect, it } from 'vitest';
import { spawnSync } from 'node:child_process';

it('warns once about tensors collected without dispose()', () => {
  const script = `
    import * as nt from './lib/index.ts';
    for (let i = 0; i < 200; i++) nt.zeros([64]);
    await new Promise((r) => setTimeout(r, 10));
    globalThis.gc();
    await new Promise((r) => setTimeout(r, 50));
    globalThis.gc();
    await new Promise((r) => setTimeout(r, 50));
    console.log(JSON.stringify(nt.memoryStats()));
  `;
  const r = spawnSync(process.execPath, ['--expose-gc', '--import', 'tsx', '--input-type=module', '-e', script], { encoding: 'utf8', env: { ...process.env, NODETRON_WARN_LEAKS: '1' } });
  expect(r.status, r.stderr).toBe(0);
  const stats = JSON.parse(r.stdout.trim().split('\n').pop()!);
  expect(stats.leakedTensors).toBeGreaterThan(0);
  expect(stats.liveTensors).toBe(200 - stats.leakedTensors);
  expect(r.stderr.match(/NodetronLeakWarning/g)?.length).toBe(1);
});
