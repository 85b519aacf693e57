# The peer of `nodetron bench checkpoint --compare-torch`: torch.distributed.checkpoint on as many Gloo
# ranks as the layout (1 or 2) saving the same bytes per rank as nodetron's checkpoint (f32 tensors of 1M elements each,
# distinct keys per rank), to the same disk: a synchronous dcp.save, then dcp.async_save (the time
# until it returns is its training stall). Prints one JSON line: saveS, asyncStallS, asyncTotalS.
import argparse
import json
import os
import shutil
import socket
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, world, port, args, per_rank, out_path):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    n = per_rank[rank] // 4
    chunk = 1 << 20
    state = {f"r{rank}.t{i}": torch.randn(min(chunk, n - i * chunk)) for i in range((n + chunk - 1) // chunk)} if n > 0 else {}
    times = {}
    for mode in ("sync", "async"):
        path = os.path.join(args.dir, mode)
        dist.barrier()
        t0 = time.perf_counter()
        if mode == "sync":
            dcp.save(state, checkpoint_id=path)
        else:
            fut = dcp.async_save(state, checkpoint_id=path)
            times["asyncStallS"] = time.perf_counter() - t0
            fut.result()
        dist.barrier()
        times["saveS" if mode == "sync" else "asyncTotalS"] = time.perf_counter() - t0
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(times, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--bytes", required=True, help="bytes per rank, comma-separated")
    args = p.parse_args()
    per_rank = [int(b) for b in args.bytes.split(",")]
    os.makedirs(args.dir, exist_ok=True)
    out_path = os.path.join(args.dir, "result.json")
    mp.spawn(worker, args=(len(per_rank), free_port(), args, per_rank, out_path), nprocs=len(per_rank), join=True)
    with open(out_path) as f:
        print(json.dumps({**json.load(f), "torch": torch.__version__}))
    shutil.rmtree(args.dir, ignore_errors=True)
