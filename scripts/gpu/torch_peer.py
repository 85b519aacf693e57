# The PyTorch side of scripts/gpu's performance stage, on the same GPU in the same run. Prints one JSON line.
#   torch_peer.py gemm  --shapes '[[M,N,K,"NN"],...]' --dtypes bf16,f16,tf32,f32 [--device cuda]
#   torch_peer.py membw --rows R --cols C [--device cuda]
# (--device cpu: the dry run's rehearsal of this code, timed by the host clock)
# (the GPT-2 training step is scripts/bench/torch_train.py --device cuda --dtype bf16 [--compile])
import argparse
import json
import time

import torch

DEVICE = 'cuda'

DT = {'bf16': torch.bfloat16, 'f16': torch.float16, 'tf32': torch.float32, 'f32': torch.float32}


def timed(fn, iters):
    fn()
    if DEVICE == 'cpu':
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t0) * 1e3 / iters
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / iters


def gemm(a):
    out = []
    for name in a.dtypes.split(','):
        torch.backends.cuda.matmul.allow_tf32 = name == 'tf32'
        for m, n, k, layout in json.loads(a.shapes):
            x = torch.randn((k, m) if layout[0] == 'T' else (m, k), device=DEVICE, dtype=DT[name])
            y = torch.randn((n, k) if layout[1] == 'T' else (k, n), device=DEVICE, dtype=DT[name])
            xa = x.t() if layout[0] == 'T' else x
            yb = y.t() if layout[1] == 'T' else y
            iters = max(3, min(50, int(2e13 / (2 * m * n * k))))
            ms = timed(lambda: torch.matmul(xa, yb), iters)
            out.append({'dtype': name, 'm': m, 'n': n, 'k': k, 'layout': layout, 'ms': ms, 'tflops': 2 * m * n * k / ms / 1e9})
    return out


def membw(a):
    r, c = a.rows, a.cols
    x = torch.randn(r, c, device=DEVICE, dtype=torch.bfloat16)
    w, b = torch.randn(c, device=DEVICE, dtype=torch.bfloat16), torch.randn(c, device=DEVICE, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    nbytes = 2 * x.numel() * 2
    res = {}
    for name, fn in [('copy', lambda: y.copy_(x)), ('gelu', lambda: torch.nn.functional.gelu(x, approximate='tanh')),
                     ('layernorm', lambda: torch.nn.functional.layer_norm(x, (c,), w, b)), ('add', lambda: torch.add(x, x)),
                     ('softmax', lambda: torch.softmax(x, -1))]:
        ms = timed(fn, 50)
        res[name] = {'ms': ms, 'gbps': (nbytes * (1.5 if name == 'add' else 1)) / ms / 1e6}
    return res


if __name__ == '__main__':
    ap = argparse.ArgumentParser()
    ap.add_argument('what')
    ap.add_argument('--shapes', default='[[4096,4096,4096,"NN"]]')
    ap.add_argument('--dtypes', default='bf16')
    ap.add_argument('--rows', type=int, default=16384)
    ap.add_argument('--cols', type=int, default=4096)
    ap.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    a = ap.parse_args()
    DEVICE = a.device
    print(json.dumps({'torch': torch.__version__, 'result': gemm(a) if a.what == 'gemm' else membw(a)}))
