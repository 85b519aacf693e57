// Stage 0: what the run ran on: GPU, driver, CUDA runtime, cuBLASLt, NCCL (nodetron uses no cuDNN),
// torch (and the CUDA/cuDNN/NCCL torch was built with), node and the commit; the libraries the cuda
// addon resolves. Without a GPU it still records what it can, then skips.
import { spawnSync } from 'node:child_process';
import { commit, findPython } from '../common.mjs';

export async function run(rec, nt, noGpu) {
  rec.info('commit', commit());
  rec.info('node', process.version);
  const smi = spawnSync('nvidia-smi', ['--query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit', '--format=csv,noheader'], { encoding: 'utf8', timeout: 30_000 });
  if (smi.status === 0) rec.info('nvidiaSmi', smi.stdout.trim());
  const { python, torch } = findPython();
  rec.info('python', python);
  if (torch) {
    const r = spawnSync(python, ['-c', 'import torch,json;c=torch.cuda.is_available();print(json.dumps({"torch":torch.__version__,"cuda":torch.version.cuda,"cudnn":torch.backends.cudnn.version(),"nccl":".".join(map(str,torch.cuda.nccl.version())) if c else None,"gpu":torch.cuda.get_device_name(0) if c else None}))'], { encoding: 'utf8', timeout: 30_000 });
    rec.info('torch', r.status === 0 ? JSON.parse(r.stdout.trim().split('\n').pop()) : { version: torch, error: r.stderr.slice(-300) });
  } else rec.info('torch', null);
  if (nt) {
    try {
      const { cuda } = await import('../../../dist/native.js');
      rec.info('libraries', cuda().libraryInfo());
    } catch (e) { rec.info('libraries', { error: String(e?.message ?? e).split('\n')[0] }); }
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
