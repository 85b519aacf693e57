# The PyTorch-eager peer of `nodetron bench train`: the same GPT (scripts/golden/gpt_golden.py's model, f32,
# fused SDPA attention), one training step = forward + backward + AdamW, timed after warm-up.
# Prints one JSON object. Usage: torch_train.py --layers L --heads H --width C --ctx T --batch B --vocab V
#   --steps N --warmup W --threads K [--device cuda] [--dtype bf16 (autocast)] [--compile]
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'golden'))
from gpt_golden import forward, make_params  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    for k, d in [('layers', 4), ('heads', 4), ('width', 128), ('ctx', 128), ('batch', 8), ('vocab', 50257), ('steps', 5),
                 ('warmup', 2), ('threads', 2)]:
        ap.add_argument('--' + k, type=int, default=d)
    ap.add_argument('--device', default='cpu')
    ap.add_argument('--dtype', default='f32', choices=['f32', 'bf16', 'f16'])
    ap.add_argument('--compile', action='store_true')
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.set_num_threads(a.threads)
    cfg = dict(vocabSize=a.vocab, blockSize=a.ctx, nLayer=a.layers, nHead=a.heads, nEmbd=a.width, dropout=0.0, bias=True)
    gen = torch.Generator().manual_seed(0)
    ps = make_params(cfg, gen)
    params = [p.detach().float().to(dev).requires_grad_(True) for p in ps.values()]
    ps = dict(zip(ps.keys(), params))
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=False, foreach=True)
    idx = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen).to(dev)
    targets = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen).to(dev)
    fwd = lambda i, t: forward(ps, cfg, i, t, fused_attention=True)  # noqa: E731
    if a.compile:
        fwd = torch.compile(fwd)
    amp = dict(device_type=dev.type, dtype={'bf16': torch.bfloat16, 'f16': torch.float16}.get(a.dtype, torch.float32), enabled=a.dtype != 'f32')
    cuda = dev.type == 'cuda'
    times = []
    for i in range(a.warmup + a.steps):
        if cuda and i == a.warmup:
            torch.cuda.reset_peak_memory_stats()
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(**amp):
            _, loss = fwd(idx, targets)
        loss.backward()
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
    ms = 1000 * sum(times) / len(times)
    print(json.dumps({'impl': 'pytorch-compile' if a.compile else 'pytorch-eager', 'device': a.device, 'dtype': a.dtype,
                      'peakBytes': torch.cuda.max_memory_allocated() if cuda else None, 'torch': torch.__version__, 'threads': a.threads, 'msPerStep': ms,
                      'tokensPerSec': a.batch * a.ctx / (ms / 1000), 'loss': loss.item(),
                      'params': sum(p.numel() for p in params)}))


if __name__ == '__main__':
    main()
