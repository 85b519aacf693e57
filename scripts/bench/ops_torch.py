# PyTorch peer of `nodetron bench ops`: the same ops, shapes and timing rule (median of rounds,
# forward + backward), printed as JSON {case: seconds} with the configuration it ran with (torch
# version, threads, the allocator environment it was started with, compile mode). Used only for
# side-by-side benchmarks.
# Usage: ops_torch.py [THREADS] [--compile [MODE]]   (MODE: default, max-autotune-no-cudagraphs, ...;
#   the forward of each case goes through torch.compile, AOTAutograd compiles its backward)
import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

ALLOC_ENV = ('LD_PRELOAD', 'MALLOC_MMAP_MAX_', 'MALLOC_TRIM_THRESHOLD_', 'MALLOC_TOP_PAD_', 'MALLOC_ARENA_MAX', 'MALLOC_CONF',
             'TCMALLOC_RELEASE_RATE')

ap = argparse.ArgumentParser()
ap.add_argument('threads', nargs='?', type=int, default=None)
ap.add_argument('--compile', nargs='?', const='default', default=None)
a = ap.parse_args()
torch.manual_seed(0)
threads = a.threads if a.threads else torch.get_num_threads()
torch.set_num_threads(threads)


def time_it(fn, min_seconds=0.3, rounds=5):
    fn()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = time.perf_counter() - t0
        if dt * rounds >= min_seconds:
            break
        calls *= max(2, min(10, int(min_seconds / rounds / max(dt, 1e-9)) + 1))
    per = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls)
    per.sort()
    return per[len(per) // 2]


def compiled(fn):
    return torch.compile(fn, mode=None if a.compile == 'default' else a.compile) if a.compile else fn


N, V, C, B, H, T, D = 1024, 50257, 128, 8, 4, 128, 32
out = {}
first_call = {}


def case(name, leaves, forward, rounds=5):
    """Times zero-grad + forward + backward (all-ones gradient, or a scalar's 1); the first call (compilation) is timed apart."""
    fwd = compiled(forward)

    def run():
        for t in leaves:
            t.grad = None
        y = fwd()
        if y.numel() == 1:
            y.backward()
        else:
            y.backward(torch.ones_like(y))
    t0 = time.perf_counter()
    run()
    first_call[name] = time.perf_counter() - t0
    out[name] = time_it(run, rounds=rounds)


logits = torch.randn(N, V, requires_grad=True)
targets = torch.randint(0, V, (N,))
case('crossEntropy fwd+bwd [1024, 50257]', [logits], lambda: F.cross_entropy(logits, targets))

x = torch.randn(N, C, requires_grad=True)
w = torch.randn(V, C, requires_grad=True)
case('linear fwd+bwd [1024,128]x[50257,128]', [x, w], lambda: F.linear(x, w), rounds=3)
case('linear+crossEntropy fwd+bwd (LM head)', [x, w], lambda: F.cross_entropy(F.linear(x, w), targets), rounds=3)

q, k, v = (torch.randn(B, H, T, D, requires_grad=True) for _ in range(3))
case('attention fwd+bwd [8,4,128,32] causal', [q, k, v], lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

xl = torch.randn(N, C, requires_grad=True)
wl = torch.ones(C, requires_grad=True)
bl = torch.zeros(C, requires_grad=True)
case('layerNorm fwd+bwd [1024,128]', [xl, wl, bl], lambda: F.layer_norm(xl, (C,), wl, bl))

xg = torch.randn(N, 4 * C, requires_grad=True)
case('gelu fwd+bwd [1024,512]', [xg], lambda: F.gelu(xg, approximate='tanh'))

print(json.dumps({'torch': torch.__version__, 'threads': threads, 'compileMode': a.compile,
                  'allocatorEnv': {k: os.environ[k] for k in ALLOC_ENV if k in os.environ},
                  'seconds': out, 'firstCallSeconds': first_call}))
