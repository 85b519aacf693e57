// Stage 0: what the run ran on: GPU, driver, CUDA runtime, cuBLASLt, NCCL (nodetron uses no cuDNN),
// torch (and the CUDA/cuDNN/NCCL torch was built with), node and the commit; the libraries the cuda
// addon resolves. Without a GPU it still records what it can, then skips. On a GPU machine where the cuda
// addon does not load, it records why (the load error, `ldd` of the addon, the library search path node
// had) as a failed check, so the later steps' PyTorch baselines still run (run.mjs).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { commit, findPython, pythonEnv, root } from '../common.mjs';

export async function run(rec, nt, noGpu) {
  rec.info('commit', commit());
  for (const k of ['NODETRON_FLASH_SIMT', 'NODETRON_CUDA_EPILOGUES', 'NODETRON_CUDA_SYNC']) if (process.env[k] !== undefined) rec.info(k, process.env[k]);
  rec.info('node', process.version);
  const smi = spawnSync('nvidia-smi', ['--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit', '--format=csv,noheader'], { encoding: 'utf8', timeout: 30_000 });
  if (smi.status === 0) rec.info('nvidiaSmi', smi.stdout.trim());
  const { python, torch } = findPython();
  rec.info('python', python);
  if (torch) {
    const r = spawnSync(python, ['-c', 'import torch,json,os;c=torch.cuda.is_available();print(json.dumps({"torch":torch.__version__,"cuda":torch.version.cuda,"cudnn":torch.backends.cudnn.version(),"nccl":".".join(map(str,torch.cuda.nccl.version())) if c else None,"gpu":torch.cuda.get_device_name(0) if c else None,"ldLibraryPath":os.environ.get("LD_LIBRARY_PATH")}))'], { encoding: 'utf8', timeout: 30_000, env: pythonEnv() });
    rec.info('torch', r.status === 0 ? JSON.parse(r.stdout.trim().split('\n').pop()) : { version: torch, error: r.stderr.slice(-300) });
  } else rec.info('torch', null);
  if (nt) {
    try {
      const { cuda } = await import('../../../dist/native.js');
      rec.info('libraries', cuda().libraryInfo());
    } catch (e) { rec.info('libraries', { error: String(e?.message ?? e).split('\n')[0] }); }
  }
  if (noGpu?.startsWith('cuda unusable: ')) {
    // A GPU is there and nodetron cannot use it: what the loader saw, for the fix (the other steps'
    // PyTorch parts still run).
    const addon = ['build/Release/nodetron_cuda.node', `prebuilds/${process.platform}-${process.arch}/cuda/nodetron_cuda.node`].map((p) => join(root, p)).find(existsSync);
    const lddOf = (path) => { const r = spawnSync('ldd', [path], { encoding: 'utf8', timeout: 15_000 }); return `${r.stdout ?? ''}${r.stderr ?? ''}`.trim(); };
    // Where nodetron itself did not load, the cpu addon's libraries (OpenBLAS, Gloo) are the suspects too.
    const cpuAddon = nt ? null : join(root, 'build', 'Release', 'nodetron.node');
    const lddText = [addon ? lddOf(addon) : 'no cuda addon in build/Release or prebuilds/', ...(cpuAddon && existsSync(cpuAddon) ? [`${cpuAddon}:\n${lddOf(cpuAddon)}`] : [])].join('\n');
    // The folders lib/native.ts tries for cuBLASLt and NCCL by absolute path when the loader does not find them.
    let searched = null;
    try { searched = (await import('../../../dist/native.js')).cudaLibraryDirs(); } catch (e) { searched = String(e?.message ?? e).split('\n')[0]; }
    rec.info('cudaLoad', { reason: noGpu, addon: addon ?? null, ldd: lddText.slice(0, 6000), LD_LIBRARY_PATH: process.env.LD_LIBRARY_PATH ?? null, NODETRON_LD_LIBRARY_PATH: process.env.NODETRON_LD_LIBRARY_PATH ?? null, cudaLibraryDirs: searched });
    rec.data.reason = noGpu;
    const missing = lddText.split('\n').filter((l) => /not found/.test(l)).map((l) => l.trim()).join('; ');
    rec.check({ name: 'the cuda addon loads on this GPU machine', ok: false, error: `${noGpu}${missing ? ` | ldd: ${missing}` : ''} | LD_LIBRARY_PATH=${process.env.LD_LIBRARY_PATH ?? ''}` });
    console.log(`cuda addon did not load: ${noGpu}\nldd ${addon}:\n${lddText}\nLD_LIBRARY_PATH=${process.env.LD_LIBRARY_PATH ?? ''}`);
    return;
  }
  if (noGpu) return rec.skip(noGpu);
  const { cuda } = await import('../../../dist/native.js');
  const devices = cuda().deviceInfo();
  rec.info('devices', devices);
  rec.info('gpu', devices[0]?.name ?? null);
  rec.info('driver', smi.status === 0 ? smi.stdout.split(',')[1]?.trim() : rec.data.info.libraries?.cudaDriver);
  rec.check({ name: 'a GPU is usable', ok: devices.length > 0 });
  rec.check({ name: 'cuBLASLt and NCCL versions known', ok: Boolean(rec.data.info.libraries?.cublasLt && rec.data.info.libraries?.nccl), error: JSON.stringify(rec.data.info.libraries) });
  rec.check({ name: 'torch sees the GPU', ok: Boolean(rec.data.info.torch?.gpu), error: rec.data.info.torch ? undefined : 'no python with torch' });
}
