#!/usr/bin/env python3
"""PyTorch DistributedDataParallel golden files for Redline's `--strategy ddp`.

Two processes (torch.multiprocessing), the gloo backend on loopback, each
wrapping the model in `DistributedDataParallel` and reading its part of the
training split through `DistributedSampler(shuffle=False)`, `batch` samples
per rank per step, Adam 1e-3 (the tutorial's), from the same initial weights
as the single-process goldens (`mlp_init.safetensors`, `cnn_init.safetensors`).
For each step it records the global mean loss (the ranks' losses averaged,
as the one-process loss of the same global batch) and, at the end, rank 0's
weights. Everything on the CPU in float32.

Because DistributedSampler deals file positions r, r + W, r + 2W, ... to rank
r, the 2 ranks' step-k batches together are exactly the samples of the
one-process step-k batch of 2 x `batch` in file order: the same global batch.

Usage (from the repository root):

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_ddp.py \
        --out testdata/golden --data data/fashion-mnist

Writes `ddp_<model>_trace.json` and `ddp_<model>_final.safetensors`.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import MODELS, load_split  # noqa: E402

WORLD = 2
# Per-rank batch and steps: 2 x 32 = the one-process goldens' batch of 64.
RUNS = {"mlp": (32, 20), "cnn": (32, 8)}


def rank_main(rank, model_name, data_dir, out, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    batch, steps = RUNS[model_name]
    x, y = load_split(data_dir, "train", batch * WORLD * steps)
    model = MODELS[model_name]()
    init = load_file(os.path.join(out, f"{model_name}_init.safetensors"))
    model.load_state_dict(init)
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    sampler = DistributedSampler(TensorDataset(x, y), num_replicas=WORLD, rank=rank,
                                 shuffle=False)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch, sampler=sampler)
    losses = []
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(ddp(xb), yb)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / WORLD)
    if rank == 0:
        weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        save_file(weights, os.path.join(out, f"ddp_{model_name}_final.safetensors"),
                  metadata={"torch_version": torch.__version__})
        with open(os.path.join(out, f"ddp_{model_name}_trace.json"), "w") as f:
            json.dump({
                "model": model_name,
                "world_size": WORLD,
                "batch_per_rank": batch,
                "steps": len(losses),
                "backend": "gloo",
                "sampler": "DistributedSampler(shuffle=False)",
                "optimizer": "adam",
                "lr": 1e-3,
                "losses": losses,
                "torch_version": torch.__version__,
            }, f, indent=1)
            f.write("\n")
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    for i, name in enumerate(a.models.split(",")):
        mp.spawn(rank_main, args=(name, a.data, a.out, a.port + i), nprocs=WORLD, join=True)
        print(f"wrote ddp_{name}_trace.json and ddp_{name}_final.safetensors")


if __name__ == "__main__":
    main()
