#!/usr/bin/env python3
"""PyTorch's side of bench/ddp.py: `--world` processes (torch.multiprocessing, gloo on
loopback; one process without a process group when --world 1), each a DistributedDataParallel
model reading its DistributedSampler(shuffle=False) shard of Fashion-MNIST's training split,
`--batch` per rank, Adam 1e-3, `--steps` steps after 5 warm-up steps; cores / world threads
per process. Prints one JSON line: rank 0's seconds per step and global samples/s.
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "tools", "reference"))
from make_golden import MODELS, load_split  # noqa: E402

WARMUP = 5


def worker(rank, a, port, out):
    threads = max(1, (os.cpu_count() or 1) // a.world)
    torch.set_num_threads(threads)
    if a.world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=a.world)
    n = a.batch * a.world * (a.steps + WARMUP)
    x, y = load_split(a.data, "train", n)
    # DistributedSampler(shuffle=False): positions rank, rank + W, ...
    x, y = x[rank::a.world].contiguous(), y[rank::a.world].contiguous()
    torch.manual_seed(0)
    model = MODELS[a.model]()
    net = DDP(model) if a.world > 1 else model
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    def step(i):
        xb, yb = x[i * a.batch:(i + 1) * a.batch], y[i * a.batch:(i + 1) * a.batch]
        opt.zero_grad()
        F.cross_entropy(net(xb), yb).backward()
        opt.step()

    for i in range(WARMUP):
        step(i)
    if a.world > 1:
        dist.barrier()
    t0 = time.perf_counter()
    for i in range(WARMUP, WARMUP + a.steps):
        step(i)
    if a.world > 1:
        dist.barrier()
    secs = time.perf_counter() - t0
    if rank == 0:
        out.put({"step_s": secs / a.steps,
                 "samples_per_s": a.batch * a.world * a.steps / secs,
                 "threads": threads, "torch": torch.__version__})
    if a.world > 1:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--port", type=int, default=29531)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, a, a.port, out)) for r in range(a.world)]
    for p in procs:
        p.start()
    result = out.get()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"rank exited with {p.exitcode}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
