#!/usr/bin/env python3
"""Causal attention on the CPU (issue 50's measure): Redline's fused kernel
(crates/redline-kernels/examples/attention.rs) beside PyTorch's
`F.scaled_dot_product_attention(is_causal=True)` on the same threads, forward and backward,
median ms of 7 runs after 2 warm-ups, at shakespeare-char's shape (4, 6, 256, 64) and GPT-2's
(1, 12, 1024, 64). The markdown table goes to stdout.

    cargo build --release -p redline-kernels --example attention
    ~/.venvs/redline-ref/bin/python bench/attention.py [--threads N]
"""

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def torch_times(shape, threads):
    torch.set_num_threads(threads)
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.float32)
    q, k, v = ((torch.sin(i * 0.37 + s)).reshape(shape).requires_grad_() for s in (0.1, 0.2, 0.3))
    fwd, bwd = [], []
    for run in range(9):
        t0 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.perf_counter()
        o.sum().backward()
        t2 = time.perf_counter()
        if run >= 2:
            fwd.append((t1 - t0) * 1e3)
            bwd.append((t2 - t1) * 1e3)
        q.grad = k.grad = v.grad = None
    return statistics.median(fwd), statistics.median(bwd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    out = subprocess.run([str(ROOT / "target/release/examples/attention"), str(args.threads)],
                         check=True, capture_output=True, text=True).stdout
    print(f"threads: {args.threads}, torch {torch.__version__}\n")
    print("| shape (B, H, T, D) | Redline fwd ms | PyTorch fwd ms | Redline bwd ms | PyTorch bwd ms "
          "| fwd+bwd ratio (PyTorch / Redline) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for line in out.strip().splitlines():
        r = json.loads(line)
        tf, tb = torch_times(tuple(r["shape"]), args.threads)
        ratio = (tf + tb) / (r["forward_ms"] + r["backward_ms"])
        print(f"| {tuple(r['shape'])} | {r['forward_ms']:.2f} | {tf:.2f} | {r['backward_ms']:.2f} | "
              f"{tb:.2f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
