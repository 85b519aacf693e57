// Stage 2: parallel training on one GPU. The tiny GPT of test/fixtures/parallel/gpt-train.ts (the CPU
// equivalence test's fixture) with --device cuda: the single-process reference on cuda must equal
// the one on cpu, and two ranks sharing the GPU (cuda tensors, collectives through Gloo in host
// memory: NCCL refuses two ranks on one GPU) under TP2, ZeRO-2 with offload and PP2 must equal the
// single-GPU reference step by step (losses, gradient norms). Runs through the real launcher.
// NODETRON_GPU_RUN_DRY=1: the same launches with --device cpu (the code path, not the GPU, is checked).
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { relErr, root } from '../common.mjs';

const LAYOUTS = [
  { name: 'TP2', flags: ['--tp', '2'] },
  { name: 'DP2 ZeRO-2 offload', flags: ['--dp', '2', '--zero', '2', '--offload'] },
  { name: 'PP2 1F1B', flags: ['--pp', '2', '--micro-batches', '2', '--schedule', '1f1b'] },
];

const DRY = ['1', 'full'].includes(process.env.NODETRON_GPU_RUN_DRY ?? '');
const DEV = DRY ? 'cpu' : 'cuda';

export async function run(rec, nt, noGpu) {
  if (noGpu && !DRY) return rec.skip(noGpu);
  const work = mkdtempSync(join(tmpdir(), 'nt-gpu-parallel-'));
  const launcher = join(root, 'test', 'fixtures', 'launch', 'launcher.ts'), script = join(root, 'test', 'fixtures', 'parallel', 'gpt-train.ts');
  const train = (name, nproc, flags) => {
    // The fixture writes <out>/params-<rank>.f32 and result-<rank>.json into a folder it does not make.
    const out = join(work, name.replace(/\W+/g, '-'));
    mkdirSync(out, { recursive: true });
    const t0 = Date.now();
    const r = spawnSync(process.execPath, ['--import', 'tsx', launcher, '--nproc-per-node', String(nproc), script, '--out', out, '--steps', '3', ...flags],
      { cwd: root, encoding: 'utf8', timeout: 60_000 });
    const wallS = (Date.now() - t0) / 1000;
    if (r.status !== 0) return { error: `exit ${r.status}${r.error ? ` (${r.error.message})` : ''}: ${(r.stdout + r.stderr).slice(-1500)}`, wallS };
    return { ranks: Array.from({ length: nproc }, (_, k) => JSON.parse(readFileSync(join(out, `result-${k}.json`), 'utf8'))), wallS };
  };
  const cpuRef = train('reference-cpu', 1, ['--reference']);
  const gpuRef = train(`reference-${DEV}`, 1, ['--reference', '--device', DEV]);
  for (const [name, r] of [['reference cpu', cpuRef], [`reference ${DEV}`, gpuRef]]) if (r.error) rec.check({ name: `${name} ran`, ok: false, error: r.error });
  if (cpuRef.error || gpuRef.error) return;
  const vec = (r) => [...r.ranks[0].losses, ...r.ranks[0].gradNorms];
  const c0 = relErr(vec(gpuRef), vec(cpuRef), 1e-4);
  rec.check({ name: 'single-GPU reference = cpu reference (losses, grad norms)', ok: c0.bad === 0, maxRelErr: c0.maxRelErr, tol: 1e-4 });
  for (const l of LAYOUTS) {
    const r = train(l.name, 2, [...l.flags, '--device', DEV]);
    if (r.error) { rec.check({ name: `${l.name}: 2 ranks on one GPU`, ok: false, error: r.error, wallS: r.wallS }); continue; }
    // The last pipeline stage holds the loss; every rank reports the same values otherwise.
    const last = r.ranks.reduce((a, b) => (b.coords.pp >= a.coords.pp ? b : a));
    const c = relErr([...last.losses, ...last.gradNorms], vec(gpuRef), 1e-4);
    rec.check({ name: `${l.name}: 2 ranks on one GPU = single-GPU run`, ok: c.bad === 0, maxRelErr: c.maxRelErr, tol: 1e-4, wallS: r.wallS });
  }
}
