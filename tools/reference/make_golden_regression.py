#!/usr/bin/env python3
"""Golden files for regression: the model file `testdata/golden/reg_model.toml`
(a residual MLP with LayerNorm, GELU and dropout off) built as the equivalent
`nn.Sequential`, trained with MSE on `data/tables/diabetes.csv` (CPU, fp32).

The features are standardised as Redline does with every row in training
(`--val-split 0`): float32 values, mean and population std computed in
float64 over the float32 values, rounded to float32, then `(x - mean) / std`
in float32. The target (`progression`, 25..346) is used as it is.

Writes `reg_init.safetensors` (state_dict), `reg_first_batch.safetensors`
(predictions, loss and every gradient on batch 0 at init, plus float64
gradients `grad64.*`) and `reg_trace.json` / `reg_final.safetensors`
(8 Adam 1e-2 steps of batch 32 over the first 256 rows in file order).

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_regression.py \
        --out testdata/golden --data data/tables/diabetes.csv
"""

import argparse
import os
import sys
import tomllib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import meta, write_json, write_safetensors  # noqa: E402
from make_golden_layers import build, write_state  # noqa: E402

STEPS = 8
BATCH = 32
LR = 1e-2
SEED = 5


def load_table(path):
    """Features standardised as Redline does, and the last column as target."""
    raw = np.loadtxt(path, delimiter=",", skiprows=1, dtype=np.float64)
    x = raw[:, :-1].astype(np.float32)
    y = raw[:, -1].astype(np.float32)
    x64 = x.astype(np.float64)
    mean64 = x64.mean(axis=0)
    std = np.sqrt(((x64 - mean64) ** 2).mean(axis=0)).astype(np.float32)
    std[std == 0] = 1.0
    x = (x - mean64.astype(np.float32)) / std
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y).reshape(-1, 1)


def grads_f64(spec, state, x, y):
    """Every gradient of the first batch, computed in float64, as float32."""
    mods, _ = build(spec["layers"], [x.shape[1]], 1)
    model = nn.Sequential(*mods).double()
    model.load_state_dict({k: v.double() for k, v in state.items()})
    model.train()
    F.mse_loss(model(x.double()), y.double()).backward()
    return {n: p.grad.float() for n, p in model.named_parameters()}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/tables/diabetes.csv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    with open(os.path.join(args.out, "reg_model.toml"), "rb") as f:
        spec = tomllib.load(f)["model"]
    x, y = load_table(args.data)
    torch.manual_seed(SEED)
    mods, _ = build(spec["layers"], [x.shape[1]], 1)
    model = nn.Sequential(*mods)
    write_state(model, os.path.join(args.out, "reg_init.safetensors"))
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=LR, foreach=False)
    model.train()
    losses = []
    for k in range(STEPS):
        xb, yb = x[k * BATCH:(k + 1) * BATCH], y[k * BATCH:(k + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        pred = model(xb)
        loss = F.mse_loss(pred, yb)
        loss.backward()
        if k == 0:
            first = {"pred": pred, "loss": loss.reshape(1)}
            for name, p in model.named_parameters():
                first[f"grad.{name}"] = p.grad
            for name, g in grads_f64(spec, init_state, xb, yb).items():
                first[f"grad64.{name}"] = g
            write_safetensors(first, os.path.join(args.out, "reg_first_batch.safetensors"))
        losses.append(float(loss.item()))
        opt.step()
    write_state(model, os.path.join(args.out, "reg_final.safetensors"))
    write_json({"model": spec["name"], "data": "data/tables/diabetes.csv", "steps": STEPS,
                "batch_size": BATCH, "optimizer": "adam", "lr": LR, "seed": SEED,
                "loss": "mse", "torch_version": torch.__version__, "losses": losses},
               os.path.join(args.out, "reg_trace.json"))
    print(f"reg: {sum(p.numel() for p in model.parameters())} params, "
          f"losses {losses[0]:.3f} .. {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
