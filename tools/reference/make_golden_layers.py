#!/usr/bin/env python3
"""Golden files for the layer set: a model file (`testdata/golden/seq_model.toml`)
built as the equivalent `nn.Sequential`, on Fashion-MNIST (CPU, fp32).

Writes `seq_init.safetensors` (state_dict: `0.weight`, `3.body.0.weight`,
`4.shortcut.1.running_mean`, ...),
`seq_first_batch.safetensors` (logits, loss and every gradient on batch 0 at
init) and `seq_trace.json` / `seq_final.safetensors` (8 Adam 1e-3 steps over
the first 8*64 training images in file order).

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_layers.py \
        --out testdata/golden --data data/fashion-mnist
"""

import argparse
import os
import sys
import tomllib

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import (load_split, make_readable, meta, write_json,  # noqa: E402
                         write_safetensors)
from safetensors.torch import save_file  # noqa: E402

STEPS = 8
BATCH = 64
SEED = 3


class Residual(nn.Module):
    """shortcut(x) + body(x); the shortcut is the identity when empty."""

    def __init__(self, layers, shortcut):
        super().__init__()
        self.body = nn.Sequential(*layers)
        if shortcut:
            self.shortcut = nn.Sequential(*shortcut)
        else:
            self.shortcut = None

    def forward(self, x):
        s = x if self.shortcut is None else self.shortcut(x)
        return s + self.body(x)


def write_state(model, path):
    """state_dict with its buffers (BatchNorm's num_batches_tracked is int64)."""
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, path, metadata=meta())
    make_readable(path)


def build(specs, shape, outputs):
    """nn modules for the specs, inferring shapes as Redline does."""
    mods = []
    for s in specs:
        t = s["type"]
        if t == "linear":
            out = s.get("out", outputs)
            mods.append(nn.Linear(shape[0], out))
            shape = [out]
        elif t == "conv2d":
            c, h, w = shape
            k, p, st = s["kernel"], s.get("padding", 0), s.get("stride", 1)
            mods.append(nn.Conv2d(c, s["out"], k, stride=st, padding=p, bias=s.get("bias", True)))
            shape = [s["out"], (h + 2 * p - k) // st + 1, (w + 2 * p - k) // st + 1]
        elif t == "batchnorm2d":
            mods.append(nn.BatchNorm2d(shape[0], eps=s.get("eps", 1e-5),
                                       momentum=s.get("momentum", 0.1)))
        elif t in ("maxpool2d", "avgpool2d"):
            k = s["kernel"]
            mods.append(nn.MaxPool2d(k) if t == "maxpool2d" else nn.AvgPool2d(k))
            shape = [shape[0], shape[1] // k, shape[2] // k]
        elif t == "flatten":
            mods.append(nn.Flatten())
            n = 1
            for d in shape:
                n *= d
            shape = [n]
        elif t == "relu":
            mods.append(nn.ReLU())
        elif t == "gelu":
            mods.append(nn.GELU())
        elif t == "dropout":
            mods.append(nn.Dropout(s["p"]))
        elif t == "layernorm":
            mods.append(nn.LayerNorm(shape[-1], eps=s.get("eps", 1e-5)))
        elif t == "residual":
            inner, out = build(s["layers"], shape, outputs)
            short, _ = build(s.get("shortcut", []), shape, outputs)
            mods.append(Residual(inner, short))
            shape = out
        else:
            raise ValueError(t)
    return mods, shape


def grads_f64(spec, state, x, y):
    """Every gradient of the first batch, computed in float64, as float32."""
    mods, _ = build(spec["layers"], [1, 28, 28], 10)
    model = nn.Sequential(*mods).double()
    model.load_state_dict({k: v.double() if v.is_floating_point() else v
                           for k, v in state.items()})
    model.train()
    F.cross_entropy(model(x.double()), y).backward()
    return {n: p.grad.float() for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with open(os.path.join(args.out, "seq_model.toml"), "rb") as f:
        spec = tomllib.load(f)["model"]
    torch.manual_seed(SEED)
    mods, _ = build(spec["layers"], [1, 28, 28], 10)
    model = nn.Sequential(*mods)
    write_state(model, os.path.join(args.out, "seq_init.safetensors"))
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    x, y = load_split(args.data, "train", STEPS * BATCH)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    model.train()
    losses = []
    for k in range(STEPS):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        loss.backward()
        if k == 0:
            first = {"logits": logits, "loss": loss.reshape(1)}
            for name, p in model.named_parameters():
                first[f"grad.{name}"] = p.grad
            # Backprop through batch statistics cancels digits: the float64
            # gradients (rounded to f32) show how far fp32 itself lands.
            for name, g in grads_f64(spec, init_state, xb, yb).items():
                first[f"grad64.{name}"] = g
            write_safetensors(first, os.path.join(args.out, "seq_first_batch.safetensors"))
        losses.append(float(loss.item()))
        opt.step()
    write_state(model, os.path.join(args.out, "seq_final.safetensors"))
    write_json({"model": spec["name"], "steps": STEPS, "batch_size": BATCH, "optimizer": "adam",
                "lr": 1e-3, "seed": SEED, "torch_version": torch.__version__, "losses": losses},
               os.path.join(args.out, "seq_trace.json"))
    print(f"seq: {sum(p.numel() for p in model.parameters())} params, "
          f"losses {losses[0]:.6f} .. {losses[-1]:.6f}")


if __name__ == "__main__":
    main()
