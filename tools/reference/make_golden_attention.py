#!/usr/bin/env python3
"""Golden file for Redline's fused causal attention (`redline_kernels::causal_attention`):
PyTorch's `F.scaled_dot_product_attention(q, k, v, is_causal=True)` forward and backward,
CPU, computed in float64 from float32 inputs, stored as float32.

For each shape (B, H, T, D) named `b{B}h{H}t{T}d{D}`, the inputs are set by a formula the
Rust test repeats (so they are not committed): with `i` the flat index, in float64 then
rounded to float32, `q = sin(0.37 i + 0.1)`, `k = sin(0.53 i + 0.2)`, `v = cos(0.29 i + 0.3)`
and the upstream gradient `go = sin(0.61 i + 0.4)`. Stored: `o` the output, `dq`, `dk`, `dv`
the gradients of `(o * go).sum()`. Also `bf16.o`: SDPA on the bf16-rounded inputs of the
last shape with bf16 math (PyTorch's CPU kernel), for the 16-bit path's check, with
`bf16.err` its distance from the float64 output of the same rounded inputs (relative L2).

`layer.*`: nanoGPT's `CausalSelfAttention` (n_embd 12, 3 heads, no dropout) on x (2, 7, 12),
float64, with every value set by formula (flat index `i`): `x = sin(0.23 i + 0.5)`,
`c_attn.weight = 0.3 sin(0.11 i + 0.7)`, `c_attn.bias = 0.1 cos(0.17 i)`,
`c_proj.weight = 0.3 cos(0.13 i + 0.2)`, `c_proj.bias = 0.1 sin(0.19 i + 0.3)`, upstream
gradient `go = sin(0.41 i + 0.6)`: `layer.y` and the gradients `layer.dx`,
`layer.c_attn.weight` ... of `(y * go).sum()`.

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_attention.py --out testdata/golden
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import write_safetensors  # noqa: E402

SHAPES = [(1, 1, 1, 4), (2, 3, 17, 8), (1, 2, 64, 16), (1, 1, 130, 24)]


def formula(shape, a, b, f=torch.sin):
    n = shape[0] * shape[1] * shape[2] * shape[3]
    i = torch.arange(n, dtype=torch.float64)
    return f(a * i + b).float().reshape(shape)


def layer():
    def f(shape, a, b, fn=torch.sin, scale=1.0):
        n = 1
        for s in shape:
            n *= s
        i = torch.arange(n, dtype=torch.float64)
        return (scale * fn(a * i + b)).reshape(shape)

    C, H = 12, 3
    x = f((2, 7, C), 0.23, 0.5).requires_grad_()
    w = {
        "c_attn.weight": f((3 * C, C), 0.11, 0.7, scale=0.3),
        "c_attn.bias": f((3 * C,), 0.17, 0.0, torch.cos, 0.1),
        "c_proj.weight": f((C, C), 0.13, 0.2, torch.cos, 0.3),
        "c_proj.bias": f((C,), 0.19, 0.3, scale=0.1),
    }
    for t in w.values():
        t.requires_grad_()
    B, T, _ = x.shape
    q, k, v = (x @ w["c_attn.weight"].T + w["c_attn.bias"]).split(C, dim=2)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, C) @ w["c_proj.weight"].T + w["c_proj.bias"]
    (y * f((2, 7, C), 0.41, 0.6)).sum().backward()
    out = {"layer.y": y.detach().float(), "layer.dx": x.grad.float()}
    out.update({f"layer.{k}": t.grad.float() for k, t in w.items()})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/golden")
    args = ap.parse_args()
    out = {}
    for shape in SHAPES:
        name = "b{}h{}t{}d{}".format(*shape)
        q, k, v = formula(shape, 0.37, 0.1), formula(shape, 0.53, 0.2), formula(shape, 0.29, 0.3, torch.cos)
        go = formula(shape, 0.61, 0.4)
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        o = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
        (o * go.double()).sum().backward()
        for key, t in [("o", o.detach()), ("dq", q64.grad), ("dk", k64.grad), ("dv", v64.grad)]:
            out[f"{name}.{key}"] = t.float()
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    ob = F.scaled_dot_product_attention(qb, kb, vb, is_causal=True)
    o64 = F.scaled_dot_product_attention(qb.double(), kb.double(), vb.double(), is_causal=True)
    out["bf16.o"] = ob.float()
    out["bf16.err"] = ((ob.double() - o64).norm() / o64.norm()).reshape(1).float()
    out.update(layer())
    write_safetensors(out, os.path.join(args.out, "attention.safetensors"))
    print("bf16 err", out["bf16.err"].item(), "torch", torch.__version__)


if __name__ == "__main__":
    main()
