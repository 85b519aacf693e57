# The peer of `nodetron bench comm --compare-torch`: torch.distributed's Gloo allreduce (f32 sum, in
# place) over the same sizes and with the same timing method; prints one JSON line of rows.
import argparse
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sizes(lo, hi, factor):
    b = lo
    while b <= hi:
        yield b
        b = max(b + 1, round(b * factor))


def worker(rank, world, port, args, out_path):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    rows = []
    for nbytes in sizes(args.b, args.e, args.f):
        count = nbytes // 4
        if count == 0:
            continue
        t = torch.ones(count, dtype=torch.float32)
        for _ in range(args.w):
            dist.all_reduce(t)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.n):
            dist.all_reduce(t)
        sec = torch.tensor([(time.perf_counter() - t0) / args.n])
        dist.all_reduce(sec, op=dist.ReduceOp.MAX)
        s = sec.item()
        algbw = count * 4 / s / 1e9
        rows.append({"bytes": count * 4, "timeUs": s * 1e6, "algbw": algbw, "busbw": algbw * 2 * (world - 1) / world})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--np", type=int, default=2)
    p.add_argument("-b", type=int, default=8)
    p.add_argument("-e", type=int, default=128 << 20)
    p.add_argument("-f", type=float, default=2)
    p.add_argument("-n", type=int, default=20)
    p.add_argument("-w", type=int, default=5)
    args = p.parse_args()
    out_path = f"/tmp/nodetron-torch-gloo-{os.getpid()}.json"
    mp.spawn(worker, args=(args.np, free_port(), args, out_path), nprocs=args.np, join=True)
    with open(out_path) as f:
        rows = json.load(f)
    os.unlink(out_path)
    sys.stdout.write(json.dumps(rows) + "\n")


if __name__ == "__main__":
    main()
