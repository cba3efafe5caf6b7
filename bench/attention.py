#!/usr/bin/env python3
"""Causal attention on the CPU (issue 50's measure): Redline's fused kernel
(crates/redline-kernels/examples/attention.rs) beside PyTorch's
`F.scaled_dot_product_attention(is_causal=True)` on the same threads, forward and backward,
median ms of 7 runs after 2 warm-ups, at shakespeare-char's shape (4, 6, 256, 64), GPT-2's
(1, 12, 1024, 64) and the small GPT of bench/gpt_cpu.py (16, 4, 256, 32). The markdown table goes to stdout.

    cargo build --release -p redline-kernels --example attention
    ~/.venvs/redline-ref/bin/python bench/attention.py [--threads N]

On a GPU (issue 46's attention row): `--kernels BIN` runs the CUDA test binary's ignored
`cuda_attention_timing` (the `kernels` binary of scripts/gpu-bundle.sh's bundle): Redline's
kernels and candle's ops on cuda:0, forward and forward + backward, at GPT-2's shape (8, 12,
1024, 64) and shakespeare-char's (16, 6, 256, 64), bf16 and fp32, median of 10 after 2
warm-ups, beside PyTorch's `F.scaled_dot_product_attention(is_causal=True)` on the same GPU
(flash attention for bf16; for fp32 whichever backend PyTorch picks), timed the same way.

    python3 bench/attention.py --kernels "$bin/kernels"
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


def torch_cuda_times(shape, dtype):
    """Median ms of the forward and of forward + backward on cuda:0."""
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.float32, device="cuda")
    q, k, v = ((torch.sin(i * 0.37 + s)).reshape(shape).to(dtype).requires_grad_()
               for s in (0.1, 0.2, 0.3))

    def run(backward):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if backward:
            o.float().sum().backward()

    def time_it(backward):
        times = []
        for r in range(12):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            run(backward)
            torch.cuda.synchronize()
            if r >= 2:
                times.append((time.perf_counter() - t0) * 1e3)
            q.grad = k.grad = v.grad = None
        return statistics.median(times)

    return time_it(False), time_it(True)


def gpu_table(kernels):
    def timing(simt):
        env = dict(os.environ, REDLINE_ATTENTION_SIMT="1" if simt else "0")
        out = subprocess.run([kernels, "cuda_attention_timing", "--ignored", "--nocapture",
                              "--test-threads", "1"], check=True, capture_output=True, text=True,
                             env=env).stdout
        return [json.loads(l) for l in out.splitlines() if l.startswith("{")]

    rows = timing(False)
    # The same kernels with the 16-bit forward kept off the tensor cores.
    for r in timing(True):
        if r["path"] == "redline" and r["dtype"] != "F32":
            rows.append(dict(r, path="redline, SIMT forward"))
    rows.sort(key=lambda r: (r["shape"], r["dtype"]))
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}\n")
    print("| shape (B, H, T, D) | dtype | path | fwd ms | fwd+bwd ms | PyTorch SDPA fwd ms "
          "| PyTorch fwd+bwd ms | fwd+bwd ratio (PyTorch / this) |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    dtypes = {"BF16": torch.bfloat16, "F32": torch.float32}
    torch_rows = {}
    for r in rows:
        key = (tuple(r["shape"]), r["dtype"])
        if key not in torch_rows:
            torch_rows[key] = torch_cuda_times(key[0], dtypes[r["dtype"]])
        tf, tb = torch_rows[key]
        print(f"| {key[0]} | {r['dtype']} | {r['path']} | {r['forward_ms']:.3f} | "
              f"{r['fwd_bwd_ms']:.3f} | {tf:.3f} | {tb:.3f} | {tb / r['fwd_bwd_ms']:.2f}x |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--kernels", help="the CUDA test binary (GPU rows instead of the CPU's)")
    args = ap.parse_args()
    if args.kernels:
        gpu_table(args.kernels)
        return
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
