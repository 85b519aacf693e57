# The PyTorch-eager peer of `nodetron bench train`: the same GPT (scripts/golden/gpt_golden.py's model, f32,
# fused SDPA attention), one training step = forward + backward + AdamW, timed after warm-up.
# Prints one JSON object. Usage: torch_train.py --layers L --heads H --width C --ctx T --batch B --vocab V
#   --steps N --warmup W --threads K
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
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    cfg = dict(vocabSize=a.vocab, blockSize=a.ctx, nLayer=a.layers, nHead=a.heads, nEmbd=a.width, dropout=0.0, bias=True)
    gen = torch.Generator().manual_seed(0)
    ps = make_params(cfg, gen)
    params = [p.detach().float().requires_grad_(True) for p in ps.values()]
    ps = dict(zip(ps.keys(), params))
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=False, foreach=True)
    idx = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen)
    targets = torch.randint(0, a.vocab, (a.batch, a.ctx), generator=gen)
    times = []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        _, loss = forward(ps, cfg, idx, targets, fused_attention=True)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt)
    ms = 1000 * sum(times) / len(times)
    print(json.dumps({'impl': 'pytorch-eager', 'torch': torch.__version__, 'threads': a.threads, 'msPerStep': ms,
                      'tokensPerSec': a.batch * a.ctx / (ms / 1000), 'loss': loss.item(),
                      'params': sum(p.numel() for p in params)}))


if __name__ == '__main__':
    main()
