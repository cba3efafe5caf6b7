#!/usr/bin/env python3
"""Mixed-precision golden files for Redline's `--precision bf16-mixed`: PyTorch's CPU
autocast (`torch.autocast("cpu", dtype=torch.bfloat16)`) around the forward and the loss,
fp32 master weights and Adam 1e-3 state, the backward outside the autocast region, as
Lightning's `precision="bf16-mixed"` runs it. Same initial weights, data (file order,
batch 64) and steps as the fp32 goldens (`mlp_init`, `cnn_init`). Records every step's
loss, the dtype autocast gave the logits, and the final weights (fp32).

Usage (from the repository root):

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_precision.py \
        --out testdata/golden --data data/fashion-mnist

Writes `bf16_mixed_<model>_trace.json` and `bf16_mixed_<model>_final.safetensors`.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import BATCH_SIZE, MODELS, STEPS, load_split  # noqa: E402


def run(name, data, out):
    steps = STEPS[name]
    x, y = load_split(data, "train", BATCH_SIZE * steps)
    model = MODELS[name]()
    model.load_state_dict(load_file(os.path.join(out, f"{name}_init.safetensors")))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, logits_dtype = [], None
    for i in range(steps):
        xb, yb = x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE], y[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
        logits_dtype = str(logits.dtype)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, os.path.join(out, f"bf16_mixed_{name}_final.safetensors"),
              metadata={"torch_version": torch.__version__})
    with open(os.path.join(out, f"bf16_mixed_{name}_trace.json"), "w") as f:
        json.dump({
            "model": name,
            "precision": "bf16-mixed (torch.autocast cpu bfloat16)",
            "steps": steps,
            "batch": BATCH_SIZE,
            "optimizer": "adam",
            "lr": 1e-3,
            "logits_dtype": logits_dtype,
            "loss_dtype": "torch.float32",
            "losses": losses,
            "torch_version": torch.__version__,
        }, f, indent=1)
        f.write("\n")
    os.chmod(os.path.join(out, f"bf16_mixed_{name}_final.safetensors"), 0o644)
    print(f"{name}: {steps} steps, logits {logits_dtype}, last loss {losses[-1]:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--models", default="mlp,cnn")
    a = ap.parse_args()
    torch.set_num_threads(1)
    for name in a.models.split(","):
        run(name, a.data, a.out)


if __name__ == "__main__":
    main()
