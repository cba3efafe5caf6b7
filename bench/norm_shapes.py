#!/usr/bin/env python3
"""Training batch norms (alone and followed by a ReLU), forward and backward, in PyTorch on
the CPU, as `crates/redline-kernels/examples/norm_pool_shapes.rs` times Redline's: the same
shapes (ResNet-18's, or with --resnet50 ResNet-50's stage widths and their 4x bottleneck
outputs) and dtypes, medians of --reps after one warm-up.

    ~/.venvs/redline-ref/bin/python bench/norm_shapes.py --threads 2 --batch 16 --size 64 \\
        --dtype bf16 --resnet50

--dtype f32 | bf16 (the module and input converted: bf16-true) | bf16-mixed (a bf16 input
under fp32 parameters, as autocast hands a bf16 convolution's output to BatchNorm2d).
"""

import argparse
import statistics
import time

import torch


def shapes(size, resnet50):
    stem = [(64, size // 2)]
    if resnet50:
        return stem + [s for i in range(4)
                       for s in [(64 << i, size // (4 << i)), (256 << i, size // (4 << i))]]
    return stem + [(64 << i, size // (4 << i)) for i in range(4)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "bf16-mixed"])
    ap.add_argument("--resnet50", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    x_dtype = torch.float32 if a.dtype == "f32" else torch.bfloat16
    p_dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    print(f"torch {torch.__version__}, {a.threads} threads, batch {a.batch}, input {a.size} px, "
          f"median of {a.reps}; input {x_dtype}, parameters {p_dtype}")
    print("| op | c | side | fwd ms | bwd ms |\n| --- | ---: | ---: | ---: | ---: |")
    for c, side in shapes(a.size, a.resnet50):
        for relu in (True, False):
            bn = torch.nn.BatchNorm2d(c).to(p_dtype)
            x = torch.randn(a.batch, c, side, side).to(x_dtype).requires_grad_()
            fwd, bwd = [], []
            for _ in range(a.reps + 1):
                t = time.perf_counter()
                y = bn(x)
                if relu:
                    y = torch.relu(y)
                t1 = time.perf_counter()
                y.backward(torch.ones_like(y))
                bwd.append(time.perf_counter() - t1)
                fwd.append(t1 - t)
            f, b = statistics.median(fwd[1:]), statistics.median(bwd[1:])
            name = "bn+relu" if relu else "bn"
            print(f"| {name} | {c} | {side} | {f * 1e3:.2f} | {b * 1e3:.2f} |")


if __name__ == "__main__":
    main()
