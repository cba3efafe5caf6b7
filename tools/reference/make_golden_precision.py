#!/usr/bin/env python3
"""Mixed-precision golden files for Redline's `--precision bf16-mixed`: PyTorch's CPU
autocast (`torch.autocast(DEVICE, dtype=torch.bfloat16)`) around the forward and the loss,
fp32 master weights and Adam 1e-3 state, the backward outside the autocast region, as
Lightning's `precision="bf16-mixed"` runs it. Same initial weights and data (file order,
batch 64) as the fp32 goldens (`mlp_init`, `cnn_init`), 20 steps for both models (the fp32
goldens' CNN has 8; `fp32_<model>_*` is the same run in fp32, for comparison). Records every
step's loss, the dtype autocast gave the logits, and the final weights (fp32). The CNN's
weight files leave out `fc1.weight` (1.6 MB, 95% of the file): the other tensors check the
run, and the repository travels to the GPU machine under a size limit.

Usage (from the repository root):

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_precision.py \
        --out testdata/golden --data data/fashion-mnist

Writes `bf16_mixed_<model>_trace.json` and `bf16_mixed_<model>_final.safetensors`.

With `--device cuda --init testdata/golden --out DIR` the same jobs run on cuda:0 under
`torch.autocast("cuda", ...)` and `torch.amp.GradScaler("cuda")` (deterministic algorithms,
TF32 off for the fp32 ops): the reference `bench/gpu.sh precision` checks Redline's GPU runs
against, beside the CPU goldens (a GPU's sums round in another order, and the CNN's pooling
ties move with them, as `cnn_ties.py` shows in fp32). Not committed: made on each GPU.

`bf16-true` (Lightning's `precision="bf16-true"`, its `HalfPrecision` plugin): the model
converted with `.to(torch.bfloat16)` after the fp32 init is loaded, the batch's inputs cast
to bf16, the forward, the loss (`F.cross_entropy` on bf16 logits, a bf16 loss) and the
backward in bf16, and `torch.optim.Adam` over the bf16 parameters (its state bf16, its ops
rounding to bf16). Writes `bf16_true_<model>_*`; the final weights in bf16, as trained.
And the same with the loss computed in fp32 from the bf16 logits
(`F.cross_entropy(logits.float(), y)`, Redline's choice: its losses always run in fp32),
`bf16_true_fp32_loss_<model>_*`: it checks the rest of the bf16 step (kernels, gradients,
the bf16 Adam) without the bf16 loss's own rounding.

`16-mixed` (Lightning's `precision="16-mixed"`): `torch.autocast(DEVICE, dtype=torch.float16)`
with `torch.amp.GradScaler("cpu")` (`scaler.scale(loss).backward()`, `scaler.step(opt)`,
`scaler.update()`), twice per model: with GradScaler's defaults (`fp16_mixed_<model>_*`),
and made to overflow (`fp16_overflow_<model>_*`: `init_scale=2**24`, `growth_interval=3`, so
the first steps overflow, are skipped and back off, and the scale grows and overflows again),
and (MLP) made to overflow with 2 micro-batches a step and `clip_grad_norm_(0.5)` after
`unscale_` (`fp16_accum_clip_mlp_*`).
Each step records the loss, whether the step was skipped (the scale went down) and the scale
after `update()`.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import BATCH_SIZE, MODELS, load_split  # noqa: E402

# Steps of every precision run (the 20, for both models).
STEPS = {"mlp": 20, "cnn": 20}

# Where the runs go: "cpu" (the committed goldens) or "cuda" (--device cuda: the same jobs
# under CUDA autocast, the reference for Redline's runs on a GPU), and the folder holding
# `<model>_init.safetensors` (--init; default: --out).
DEVICE = "cpu"
INIT = None


def start(name, data):
    """The job's batches and its model from the fp32 init, on DEVICE."""
    x, y = load_split(data, "train", BATCH_SIZE * STEPS[name])
    model = MODELS[name]()
    model.load_state_dict(load_file(os.path.join(INIT, f"{name}_init.safetensors")))
    return x.to(DEVICE), y.to(DEVICE), model.to(DEVICE)


def final_weights(model, name, dtype=torch.float32):
    """The model's weights for a golden file, in `dtype`; the CNN's without fc1.weight."""
    return {k: v.detach().to(dtype).cpu().clone().contiguous() for k, v in model.state_dict().items()
            if not (name == "cnn" and k == "fc1.weight")}


def run_fp32(name, data, out):
    """The same job in fp32, for the precision tests' "nearer the 16-bit run than fp32"."""
    steps = STEPS[name]
    x, y, model = start(name, data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for i in range(steps):
        xb, yb = x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE], y[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]
        opt.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        opt.step()
    path = os.path.join(out, f"fp32_{name}_final.safetensors")
    save_file(final_weights(model, name), path, metadata={"torch_version": torch.__version__,
                                                          "steps": str(steps)})
    os.chmod(path, 0o644)
    print(f"fp32 {name}: {steps} steps")


def run_bf16_true(name, data, out, fp32_loss=False):
    steps = STEPS[name]
    x, y, model = start(name, data)
    model = model.to(torch.bfloat16)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, logits_dtype, loss_dtype = [], None, None
    for i in range(steps):
        xb, yb = x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE], y[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]
        opt.zero_grad()
        logits = model(xb.to(torch.bfloat16))
        loss = F.cross_entropy(logits.float() if fp32_loss else logits, yb)
        logits_dtype, loss_dtype = str(logits.dtype), str(loss.dtype)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    prefix = "bf16_true_fp32_loss" if fp32_loss else "bf16_true"
    path = os.path.join(out, f"{prefix}_{name}_final.safetensors")
    save_file(final_weights(model, name, torch.bfloat16), path,
              metadata={"torch_version": torch.__version__})
    os.chmod(path, 0o644)
    with open(os.path.join(out, f"{prefix}_{name}_trace.json"), "w") as f:
        json.dump({
            "model": name,
            "precision": "bf16-true (model.to(bfloat16), bf16 inputs and Adam state), loss in "
                         + ("fp32 (logits.float())" if fp32_loss else "bf16"),
            "steps": steps,
            "batch": BATCH_SIZE,
            "optimizer": "adam",
            "lr": 1e-3,
            "logits_dtype": logits_dtype,
            "loss_dtype": loss_dtype,
            "losses": losses,
            "torch_version": torch.__version__,
        }, f, indent=1)
        f.write("\n")
    print(f"{prefix} {name}: {steps} steps, logits {logits_dtype}, loss {loss_dtype}, "
          f"last loss {losses[-1]:.4f}")


def run(name, data, out):
    steps = STEPS[name]
    x, y, model = start(name, data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses, logits_dtype = [], None
    for i in range(steps):
        xb, yb = x[i * BATCH_SIZE:(i + 1) * BATCH_SIZE], y[i * BATCH_SIZE:(i + 1) * BATCH_SIZE]
        opt.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            logits = model(xb)
            loss = F.cross_entropy(logits, yb)
        logits_dtype = str(logits.dtype)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    save_file(final_weights(model, name), os.path.join(out, f"bf16_mixed_{name}_final.safetensors"),
              metadata={"torch_version": torch.__version__})
    with open(os.path.join(out, f"bf16_mixed_{name}_trace.json"), "w") as f:
        json.dump({
            "model": name,
            "precision": f"bf16-mixed (torch.autocast {DEVICE} bfloat16)",
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


# (file prefix, GradScaler settings, micro-batches per step, clip_grad_norm_ max) of
# the 16-mixed runs: defaults; made to overflow; made to overflow with Lightning's
# `accumulate_grad_batches=2` and `gradient_clip_val=0.5` (each micro-batch's loss
# divided by 2, then unscale_, clip, step, update: Lightning's order).
FP16_RUNS = [
    ("fp16_mixed", {"init_scale": 65536.0, "growth_interval": 2000}, 1, None),
    ("fp16_overflow", {"init_scale": 2.0 ** 24, "growth_interval": 3}, 1, None),
    ("fp16_accum_clip", {"init_scale": 2.0 ** 24, "growth_interval": 3}, 2, 0.5),
]


def run_fp16(name, data, out, prefix, settings, accumulate, clip):
    if accumulate > 1 and name != "mlp":
        return
    steps = STEPS[name]
    x, y, model = start(name, data)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler(DEVICE, **settings)
    losses, scales, skipped, logits_dtype = [], [], [], None
    for i in range(steps // accumulate):
        opt.zero_grad()
        step_loss = 0.0
        before = scaler.get_scale()
        for j in range(accumulate):
            k = i * accumulate + j
            xb, yb = x[k * BATCH_SIZE:(k + 1) * BATCH_SIZE], y[k * BATCH_SIZE:(k + 1) * BATCH_SIZE]
            with torch.autocast(DEVICE, dtype=torch.float16):
                logits = model(xb)
                loss = F.cross_entropy(logits, yb)
            logits_dtype = str(logits.dtype)
            scaler.scale(loss / accumulate).backward()
            step_loss += float(loss.detach()) / accumulate
        if clip is not None:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        losses.append(step_loss)
        scales.append(scaler.get_scale())
        # The scale goes down only after an overflow, and a step that
        # overflowed was skipped.
        skipped.append(scaler.get_scale() < before)
    path = os.path.join(out, f"{prefix}_{name}_final.safetensors")
    save_file(final_weights(model, name), path, metadata={"torch_version": torch.__version__})
    os.chmod(path, 0o644)
    with open(os.path.join(out, f"{prefix}_{name}_trace.json"), "w") as f:
        json.dump({
            "model": name,
            "precision": f"16-mixed (torch.autocast {DEVICE} float16, torch.amp.GradScaler {DEVICE})",
            "scaler": {"init": settings["init_scale"], "growth": 2.0, "backoff": 0.5,
                       "interval": settings["growth_interval"]},
            "steps": steps // accumulate,
            "batch": BATCH_SIZE,
            "accumulate": accumulate,
            "clip_grad_norm": clip,
            "optimizer": "adam",
            "lr": 1e-3,
            "logits_dtype": logits_dtype,
            "losses": losses,
            "scales": scales,
            "skipped": skipped,
            "skipped_steps": sum(skipped),
            "torch_version": torch.__version__,
        }, f, indent=1)
        f.write("\n")
    print(f"{prefix} {name}: {steps // accumulate} steps, {sum(skipped)} skipped, scale {scales[-1]:g}, "
          f"last loss {losses[-1]:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="testdata/golden")
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--precisions", default="32-true,bf16-mixed,16-mixed,bf16-true")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: the same jobs under CUDA autocast on cuda:0, deterministic, the "
                         "fp32 ops without TF32 (bench/gpu.sh precision's reference)")
    ap.add_argument("--init", help="folder of <model>_init.safetensors (default: --out)")
    ap.add_argument("--steps", type=int,
                    help="steps of every run instead of 20 (precision_steps.py's shorter "
                         "references; not for the goldens)")
    a = ap.parse_args()
    if a.steps:
        STEPS.update({k: a.steps for k in STEPS})
    global DEVICE, INIT
    DEVICE, INIT = a.device, a.init or a.out
    os.makedirs(a.out, exist_ok=True)
    if DEVICE == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        if not torch.cuda.is_available():
            sys.exit("--device cuda: torch sees no CUDA device")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    precisions = a.precisions.split(",")
    for name in a.models.split(","):
        if "32-true" in precisions:
            run_fp32(name, a.data, a.out)
        if "bf16-true" in precisions:
            run_bf16_true(name, a.data, a.out)
            run_bf16_true(name, a.data, a.out, fp32_loss=True)
        if "bf16-mixed" in precisions:
            run(name, a.data, a.out)
        if "16-mixed" in precisions:
            for prefix, settings, accumulate, clip in FP16_RUNS:
                run_fp16(name, a.data, a.out, prefix, settings, accumulate, clip)


if __name__ == "__main__":
    main()
