#!/usr/bin/env python3
"""Golden files for gradient clipping and accumulation (PyTorch, CPU, fp32).

From the MLP golden init (`mlp_init.safetensors`, written by make_golden.py),
in file order over the first 20*64 Fashion-MNIST training images:

* mlp_clip_norm:  Adam 1e-3, batch 64, `clip_grad_norm_(max_norm=0.5)` before
  each step; records each step's loss and the norm clip_grad_norm_ returns
  (the norm before clipping).
* mlp_clip_value: SGD 0.05 momentum 0.9, batch 64, `clip_grad_value_(0.01)`.
* mlp_accumulate: Adam 1e-3, 4 micro-batches of 16 per step, each loss divided
  by 4 before backward (Lightning's accumulate_grad_batches=4); records each
  step's mean loss over its 4 micro-batches.

Each writes `<name>_final.safetensors` and `<name>_trace.json`.

Usage (from the repository root, after make_golden.py):

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_grads.py \
        --out testdata/golden --data data/fashion-mnist
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import Mlp, load_split, write_json, write_safetensors  # noqa: E402

STEPS = 20
BATCH = 64
CLIP_NORM = 0.5
CLIP_VALUE = 0.01
MICRO = 4


def fresh(init):
    model = Mlp()
    model.load_state_dict(init, strict=True)
    model.train()
    return model


def adam(model):
    return torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.0, foreach=False)


def clip_norm(init, x, y):
    model = fresh(init)
    opt = adam(model)
    losses, norms = [], []
    for k in range(STEPS):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=CLIP_NORM, foreach=False)
        losses.append(float(loss.item()))
        norms.append(float(norm.item()))
        opt.step()
    return model, {"losses": losses, "grad_norms": norms, "max_norm": CLIP_NORM,
                   "optimizer": "adam", "lr": 1e-3}


def clip_value(init, x, y):
    model = fresh(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, foreach=False)
    losses = []
    for k in range(STEPS):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        torch.nn.utils.clip_grad_value_(model.parameters(), clip_value=CLIP_VALUE, foreach=False)
        losses.append(float(loss.item()))
        opt.step()
    return model, {"losses": losses, "clip_value": CLIP_VALUE, "optimizer": "sgd",
                   "lr": 0.05, "momentum": 0.9}


def accumulate(init, x, y):
    model = fresh(init)
    opt = adam(model)
    micro = BATCH // MICRO
    losses = []
    for k in range(STEPS):
        opt.zero_grad(set_to_none=True)
        step_losses = []
        for m in range(MICRO):
            lo = k * BATCH + m * micro
            loss = F.cross_entropy(model(x[lo:lo + micro]), y[lo:lo + micro])
            (loss / MICRO).backward()
            step_losses.append(float(loss.item()))
        losses.append(sum(step_losses) / MICRO)
        opt.step()
    return model, {"losses": losses, "micro_batch": micro, "accumulate": MICRO,
                   "optimizer": "adam", "lr": 1e-3}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/fashion-mnist")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    init = load_file(os.path.join(args.out, "mlp_init.safetensors"))
    x, y = load_split(args.data, "train", STEPS * BATCH)
    for name, gen in [("mlp_clip_norm", clip_norm), ("mlp_clip_value", clip_value),
                      ("mlp_accumulate", accumulate)]:
        model, trace = gen(init, x, y)
        trace.update({"model": "mlp", "steps": STEPS, "torch_version": torch.__version__})
        write_safetensors(model.state_dict(), os.path.join(args.out, f"{name}_final.safetensors"))
        write_json(trace, os.path.join(args.out, f"{name}_trace.json"))
        extra = f", norms {trace['grad_norms'][0]:.4f} .. {trace['grad_norms'][-1]:.4f}" \
            if "grad_norms" in trace else ""
        print(f"{name}: losses {trace['losses'][0]:.6f} .. {trace['losses'][-1]:.6f}{extra}")


if __name__ == "__main__":
    main()
