# The PyTorch peer of `nodetron bench train`: the same GPT (scripts/golden/gpt_golden.py's model, f32,
# fused SDPA attention), one training step = zero_grad + forward + backward + AdamW, timed after warm-up;
# eager, or with the forward under torch.compile (--compile MODE; AOTAutograd compiles the backward too).
# Prints one JSON object: median and mean ms per timed step, the configuration it ran with (torch
# version, threads, the allocator environment it was started with, oneDNN, compile mode), and the step's
# peak memory as PyTorch's own CPU allocator counts it (one extra, untimed step under the profiler's
# memory events: bytes of tensors allocated above what is resident when the step starts, i.e. above
# parameters + AdamW state; the same quantity nodetron's memoryStats peak gives).
# Usage: torch_train.py --layers L --heads H --width C --ctx T --batch B --vocab V --steps N --warmup W
#   --threads K [--device cuda] [--dtype bf16 (autocast)] [--compile [default|max-autotune-no-cudagraphs]]
#   [--no-mkldnn] [--no-memory] [--init PREFIX] [--losses N]
# --init PREFIX starts from another run's weights and tokens: PREFIX.json lists the parameters ({name, shape,
# offset} in f32 elements, named as nodetron names them), PREFIX.bin holds them (f32, little-endian) and
# PREFIX-tokens.bin the inputs then the targets (int32, [batch, ctx] each). --losses N records the losses
# of the first N steps (all untimed: N counts as warm-up when it is larger).
import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'golden'))
from gpt_golden import forward, make_params  # noqa: E402

ALLOC_ENV = ('LD_PRELOAD', 'MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_ARENA_MAX', 'MALLOC_CONF',
             'TCMALLOC_RELEASE_RATE')


def step_peak_bytes(step):
    """Peak bytes of live tensors above the starting point during step(), from the profiler's [memory] events."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == '[memory]')
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def main():
    ap = argparse.ArgumentParser()
    for k, d in [('layers', 4), ('heads', 4), ('width', 128), ('ctx', 128), ('batch', 8), ('vocab', 50257), ('steps', 5),
                 ('warmup', 2), ('threads', 2)]:
        ap.add_argument('--' + k, type=int, default=d)
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--dtype', default='f32', choices=['f32', 'bf16', 'f16'])
    ap.add_argument('--compile', nargs='?', const='default', default=None,
                    help='torch.compile the forward with this mode (default, max-autotune-no-cudagraphs, ...)')
    ap.add_argument('--no-mkldnn', action='store_true', help='torch.backends.mkldnn.enabled = False')
    ap.add_argument('--no-memory', action='store_true', help='skip the profiled peak-memory step')
    ap.add_argument('--init', default=None, help='start from PREFIX.json/.bin weights and PREFIX-tokens.bin')
    ap.add_argument('--losses', type=int, default=0, help='record the losses of the first N steps')
    ap.add_argument('--cpu-time', action='store_true', help='time each step by the process CPU time (cpu; use with --threads 1)')
    a = ap.parse_args()
    clock = time.process_time if a.cpu_time else time.perf_counter
    a.warmup = max(a.warmup, a.losses)
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    if a.no_mkldnn:
        torch.backends.mkldnn.enabled = False
    cfg = dict(vocabSize=a.vocab, blockSize=a.ctx, nLayer=a.layers, nHead=a.heads, nEmbd=a.width, dropout=0.0, bias=True)
    gen = torch.Generator().manual_seed(0)
    if a.init:
        import numpy as np
        with open(a.init + '.json') as f:
            manifest = json.load(f)
        flat = np.fromfile(a.init + '.bin', dtype='<f4')
        ps = {m['name']: torch.from_numpy(flat[m['offset']:m['offset'] + math.prod(m['shape'])].copy()).reshape(m['shape']) for m in manifest}
        expected = set(make_params(dict(cfg, vocabSize=2, blockSize=2, nEmbd=2), gen).keys())
        if set(ps) != expected:
            raise SystemExit(f'--init: parameter names differ from the model: {sorted(set(ps) ^ expected)[:8]}')
    else:
        ps = make_params(cfg, gen)
    params = [p.detach().float().to(dev).requires_grad_(True) for p in ps.values()]
    ps = dict(zip(ps.keys(), params))
    # nodetron's AdamW: lr 1e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on every parameter; foreach
    # is PyTorch's fastest CPU path (fused=True is CUDA/MPS-only for f32 on some versions).
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=False, foreach=True)
    if a.init:
        import numpy as np
        tok = torch.from_numpy(np.fromfile(a.init + '-tokens.bin', dtype='<i4').astype('int64')).reshape(2, a.batch, a.ctx)
        idx, targets = tok[0].to(dev), tok[1].to(dev)
    else:
        idx = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen).to(dev)
        targets = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen).to(dev)
    fwd = lambda i, t: forward(ps, cfg, i, t, fused_attention=True)  # noqa: E731
    if a.compile:
        fwd = torch.compile(fwd, mode=None if a.compile == 'default' else a.compile)
    amp = dict(device_type=dev.type, dtype={'bf16': torch.bfloat16, 'f16': torch.float16}.get(a.dtype, torch.float32), enabled=a.dtype != 'f32')
    cuda = dev.type == 'cuda'
    out = {}

    def step():
        with torch.autocast(**amp):
            _, loss = fwd(idx, targets)
        loss.backward()
        opt.step()
        out['loss'] = loss
        opt.zero_grad(set_to_none=True)

    times = []
    losses = []
    compile_s = None
    for i in range(a.warmup + a.steps):
        if cuda and i == a.warmup:
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            torch.cuda.synchronize()
        t0 = clock()
        step()
        if cuda:
            torch.cuda.synchronize()
        dt = clock() - t0
        if i < a.losses:
            losses.append(out['loss'].item())
        if i == 0 and a.compile:
            compile_s = dt
        if i >= a.warmup:
            times.append(dt)
    peak = None
    if cuda:
        peak = torch.cuda.max_memory_allocated()
    elif not a.no_memory:
        peak = step_peak_bytes(step)
    ms = 1000 * statistics.median(times)
    print(json.dumps({
        'impl': 'pytorch-compile' if a.compile else 'pytorch-eager', 'device': a.device, 'dtype': a.dtype,
        'torch': torch.__version__, 'threads': torch.get_num_threads(), 'compileMode': a.compile, 'mkldnn': torch.backends.mkldnn.enabled,
        'allocatorEnv': {k: os.environ[k] for k in ALLOC_ENV if k in os.environ},
        'msPerStep': ms, 'meanMsPerStep': 1000 * statistics.fmean(times), 'stepsMs': [1000 * t for t in times],
        'firstStepSeconds': compile_s, 'tokensPerSec': a.batch * a.ctx / (ms / 1000), 'loss': out['loss'].item(),
        'peakStepBytes': peak, 'peakKind': 'cuda max_memory_allocated' if cuda else ('profiler: tensor bytes above parameters + AdamW state' if peak is not None else None),
        'maxRssBytes': _max_rss(), 'params': sum(p.numel() for p in params), 'losses': losses}))


def _max_rss():
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except Exception:  # noqa: BLE001 (not on every platform)
        return None


if __name__ == '__main__':
    main()
