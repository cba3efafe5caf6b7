#!/usr/bin/env python3
"""Golden file for Redline's fused CPU convolution, batch norm and max pooling kernels
(issue 52's shape classes): PyTorch's `F.conv2d` (also grouped and depthwise), `F.batch_norm(training=True)` (alone and
followed by `F.relu`), `F.max_pool2d(3, 2, 1)` and `F.avg_pool2d` (strided, padded, with and
without `count_include_pad`), forward and backward, CPU, computed in
float64 from float32 inputs, stored as float32.

Inputs by formula (the Rust test repeats it; `i` is the flat index, float64 then rounded to
float32): `x = sin(0.37 i + 0.1)`, a conv weight `0.3 sin(0.53 i + 0.2)`, a conv bias
`0.1 cos(0.29 i + 0.3)`, a batch norm weight `0.5 + 0.1 sin(0.53 i + 0.2)` and bias
`0.1 cos(0.29 i + 0.3)`, the upstream gradient `go = sin(0.61 i + 0.4)`.

Stored per case NAME: `NAME.y` and the gradients of `(y * go).sum()`: `NAME.dx`, and for
the convolutions and norms `NAME.dw`, `NAME.db`; and for each of those `err32.NAME.KEY`,
how far torch's own float32 run lands from the float64 one (relative L2): a bias gradient
sums outputs' gradients that cancel, so float32 rounding alone moves it by about 1e-5, and
the test bounds Redline's error by three times torch's own (or 1e-5, whichever is larger).

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_conv.py --out testdata/golden
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import write_safetensors  # noqa: E402

# name: (batch, cin, h, w, cout, kernel, stride, padding); the Rust test lists the same.
CONVS = {
    "k3s1p1": (2, 3, 10, 9, 4, 3, 1, 1),  # per-sample GEMMs, dx as a convolution
    "k3s1p1_small": (3, 4, 5, 5, 6, 3, 1, 1),  # whole-batch GEMMs
    "k1s1": (2, 5, 9, 8, 3, 1, 1, 0),  # the input as the im2col matrix
    "k1s2": (2, 4, 9, 9, 6, 1, 2, 0),  # strided 1x1 downsampling
    "k3s2p1": (2, 3, 17, 16, 5, 3, 2, 1),  # strided 3x3
    "k7s2p3": (2, 3, 23, 22, 4, 7, 2, 3),  # ResNet's stem
    "k8s8": (2, 3, 32, 32, 4, 8, 8, 0),  # patches
    "k3s1p1_wino": (2, 64, 7, 6, 64, 3, 1, 1),  # Winograd's F(2x2, 3x3), odd and even sides
}
# Grouped: name: (batch, cin, h, w, cout, kernel, stride, padding, groups).
GROUPED = {
    "g2": (2, 4, 9, 8, 6, 3, 1, 1, 2),  # ResNeXt-like
    "dw": (2, 6, 10, 9, 6, 3, 1, 1, 6),  # depthwise (MobileNet)
    "dw2_s2": (2, 4, 11, 11, 8, 3, 2, 1, 4),  # depthwise, 2 outputs a channel, strided
}
NORM = (3, 4, 5, 6)
POOL = (2, 3, 11, 10)
# Average pools on POOL: name: (kernel, stride, padding, count_include_pad).
AVG = {
    "avg3s2p1": (3, 2, 1, True),
    "avg3s2p1_ex": (3, 2, 1, False),
    "avg3s1p1_ex": (3, 1, 1, False),
    "avg2s2": (2, 2, 0, True),
    "avg5s3p2_ex": (5, 3, 2, False),
}


def formula(shape, a, b, f=torch.sin, scale=1.0, shift=0.0):
    n = 1
    for s in shape:
        n *= s
    i = torch.arange(n, dtype=torch.float64)
    v = (shift + scale * f(a * i + b)).float()
    return v.double().reshape(shape).requires_grad_()


def cases(dtype):
    """Every case's tensors, computed in `dtype` from the same float32 inputs."""
    out = {}

    def leaf(t):
        return t.detach().to(dtype).requires_grad_()

    convs = {n: v + (1,) for n, v in CONVS.items()} | GROUPED
    for name, (b, cin, h, w, cout, k, s, p, groups) in convs.items():
        x = leaf(formula((b, cin, h, w), 0.37, 0.1))
        wt = leaf(formula((cout, cin // groups, k, k), 0.53, 0.2, scale=0.3))
        bias = leaf(formula((cout,), 0.29, 0.3, torch.cos, scale=0.1))
        y = F.conv2d(x, wt, bias, stride=s, padding=p, groups=groups)
        go = formula(tuple(y.shape), 0.61, 0.4).detach().to(dtype)
        (y * go).sum().backward()
        out.update({f"{name}.y": y, f"{name}.dx": x.grad, f"{name}.dw": wt.grad,
                    f"{name}.db": bias.grad})
    for name, relu in [("bn", False), ("bn_relu", True)]:
        x = leaf(formula(NORM, 0.37, 0.1))
        wt = leaf(formula((NORM[1],), 0.53, 0.2, scale=0.1, shift=0.5))
        bias = leaf(formula((NORM[1],), 0.29, 0.3, torch.cos, scale=0.1))
        y = F.batch_norm(x, None, None, wt, bias, training=True, eps=1e-5)
        if relu:
            y = F.relu(y)
        go = formula(tuple(y.shape), 0.61, 0.4).detach().to(dtype)
        (y * go).sum().backward()
        out.update({f"{name}.y": y, f"{name}.dx": x.grad, f"{name}.dw": wt.grad,
                    f"{name}.db": bias.grad})
    x = leaf(formula(POOL, 0.37, 0.1))
    y = F.max_pool2d(x, 3, 2, 1)
    go = formula(tuple(y.shape), 0.61, 0.4).detach().to(dtype)
    (y * go).sum().backward()
    out.update({"pool.y": y, "pool.dx": x.grad})
    for name, (k, s, p, inc) in AVG.items():
        x = leaf(formula(POOL, 0.37, 0.1))
        y = F.avg_pool2d(x, k, s, p, count_include_pad=inc)
        go = formula(tuple(y.shape), 0.61, 0.4).detach().to(dtype)
        (y * go).sum().backward()
        out.update({f"{name}.y": y, f"{name}.dx": x.grad})
    return {k: v.detach() for k, v in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/golden")
    a = ap.parse_args()
    ref, f32 = cases(torch.float64), cases(torch.float32)
    out = {k: v.float() for k, v in ref.items()}
    for k, v in ref.items():
        err = (f32[k].double() - v).norm() / v.norm().clamp_min(1e-30)
        out[f"err32.{k}"] = torch.tensor([err.item()], dtype=torch.float32)
    path = os.path.join(a.out, "conv_classes.safetensors")
    write_safetensors(out, path)
    print(f"wrote {path} ({len(out)} tensors)")


if __name__ == "__main__":
    main()
