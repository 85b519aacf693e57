# The PyTorch peer of `nodetron bench gemm --bf16`: torch.matmul GFLOP/s of f32 and bf16 operands on the
# CPU (MKL / oneDNN, as PyTorch picks), best of a few timed loops per shape, with --threads threads.
# Usage: gemm_torch.py --threads K M,N,K [M,N,K ...]   Prints one JSON object: {torch, threads, rows: [{m, n, k, f32, bf16}]}.
import argparse
import json
import time

import torch


def gflops(a, b, flops, min_seconds=0.3, rounds=3):
    torch.matmul(a, b)
    best = float('inf')
    for _ in range(rounds):
        n, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b)
            n += 1
            t = time.perf_counter() - t0
            if t >= min_seconds:
                break
        best = min(best, t / n)
    return flops / best / 1e9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--threads', type=int, default=2)
    ap.add_argument('shapes', nargs='+')
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = []
    for s in a.shapes:
        m, n, k = (int(v) for v in s.split(','))
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)
        row = {'m': m, 'n': n, 'k': k, 'f32': gflops(x, y, 2 * m * n * k)}
        row['bf16'] = gflops(x.bfloat16(), y.bfloat16(), 2 * m * n * k)
        rows.append(row)
    print(json.dumps({'torch': torch.__version__, 'threads': torch.get_num_threads(), 'rows': rows}))


if __name__ == '__main__':
    main()
