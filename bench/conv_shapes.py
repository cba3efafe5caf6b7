#!/usr/bin/env python3
"""ResNet-18's convolutions, forward and backward (dW, db and dx; --no-dx: dW and db), in
PyTorch (oneDNN) on the CPU, as `crates/redline-kernels/examples/conv_shapes.rs` times
Redline's: the same table, medians of --reps after one warm-up.

    ~/.venvs/redline-ref/bin/python bench/conv_shapes.py --threads 2 --batch 32 --size 224
"""

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def shapes(s):
    s1, s2, s3, s4 = s // 4, s // 8, s // 16, s // 32
    return [
        ("conv1 7x7/2", 3, 64, 7, 2, 3, s),
        ("layer1 3x3", 64, 64, 3, 1, 1, s1),
        ("layer2.0.conv1 3x3/2", 64, 128, 3, 2, 1, s1),
        ("layer2 3x3", 128, 128, 3, 1, 1, s2),
        ("layer2 down 1x1/2", 64, 128, 1, 2, 0, s1),
        ("layer3.0.conv1 3x3/2", 128, 256, 3, 2, 1, s2),
        ("layer3 3x3", 256, 256, 3, 1, 1, s3),
        ("layer3 down 1x1/2", 128, 256, 1, 2, 0, s2),
        ("layer4.0.conv1 3x3/2", 256, 512, 3, 2, 1, s3),
        ("layer4 3x3", 512, 512, 3, 1, 1, s4),
        ("layer4 down 1x1/2", 256, 512, 1, 2, 0, s3),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--no-dx", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"torch {torch.__version__}, threads {a.threads}, batch {a.batch}, input {a.size} px, "
          f"median of {a.reps}")
    print("| conv | cin | cout | k/s | in | fwd ms | bwd ms | fwd GFLOP/s | bwd GFLOP/s |\n"
          "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for name, cin, cout, k, stride, pad, side in shapes(a.size):
        x = torch.randn(a.batch, cin, side, side, requires_grad=not a.no_dx)
        w = torch.randn(cout, cin, k, k, requires_grad=True) * 0.05
        w = w.detach().requires_grad_()
        b = torch.zeros(cout, requires_grad=True)
        fwd, bwd = [], []
        for _ in range(a.reps + 1):
            t = time.perf_counter()
            y = F.conv2d(x, w, b, stride=stride, padding=pad)
            f = time.perf_counter() - t
            g = torch.ones_like(y)
            t = time.perf_counter()
            y.backward(g)
            bwd.append(time.perf_counter() - t)
            fwd.append(f)
            w.grad = b.grad = x.grad = None
        fwd, bwd = statistics.median(fwd[1:]), statistics.median(bwd[1:])
        o = (side + 2 * pad - k) // stride + 1
        flops = 2.0 * a.batch * cout * o * o * cin * k * k
        mult = 1 if a.no_dx else 2
        print(f"| {name} | {cin} | {cout} | {k}/{stride} | {side} | {fwd * 1e3:.1f} | "
              f"{bwd * 1e3:.1f} | {flops / fwd / 1e9:.0f} | {mult * flops / bwd / 1e9:.0f} |",
              flush=True)


if __name__ == "__main__":
    sys.exit(main())
