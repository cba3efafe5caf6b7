#!/usr/bin/env python3
"""Generate PyTorch golden files for Redline's Rust (candle) tests.

Everything runs on the CPU in float32. The Fashion-MNIST IDX files are read
directly with gzip + numpy (torchvision is deliberately NOT used), so the
reference pipeline is independent of any dataset helper library.

Usage (from the repository root):

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden.py \
        --out testdata/golden --data data/fashion-mnist

    # prove that a safetensors file written by the Rust side loads into PyTorch
    ~/.venvs/redline-ref/bin/python tools/reference/make_golden.py \
        --data data/fashion-mnist --check-rust-output weights.safetensors --model mlp

See tools/reference/README.md for a description of every output file.
"""

import argparse
import gzip
import json
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

BATCH_SIZE = 64
IMAGE_MAGIC = 0x00000803
LABEL_MAGIC = 0x00000801


# --------------------------------------------------------------------------
# Data (IDX, read by hand)
# --------------------------------------------------------------------------

def read_idx_images(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n, rows, cols = np.frombuffer(data, dtype=">u4", count=4, offset=0)
    if magic != IMAGE_MAGIC:
        raise ValueError(f"{path}: bad image magic 0x{int(magic):08x}")
    if (rows, cols) != (28, 28):
        raise ValueError(f"{path}: unexpected image dims {rows}x{cols}")
    pixels = np.frombuffer(data, dtype=np.uint8, count=int(n) * 28 * 28, offset=16)
    return pixels.reshape(int(n), 28, 28)


def read_idx_labels(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = np.frombuffer(data, dtype=">u4", count=2, offset=0)
    if magic != LABEL_MAGIC:
        raise ValueError(f"{path}: bad label magic 0x{int(magic):08x}")
    return np.frombuffer(data, dtype=np.uint8, count=int(n), offset=8)


def normalise(pixels_u8):
    """uint8 (N,28,28) -> float32 tensor (N,1,28,28), x = (p/255 - 0.5)/0.5."""
    x = pixels_u8.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(0.5)) / np.float32(0.5)
    return torch.from_numpy(np.ascontiguousarray(x.reshape(-1, 1, 28, 28)))


def load_split(data_dir, split, count):
    prefix = "train" if split == "train" else "t10k"
    imgs = read_idx_images(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    lbls = read_idx_labels(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    if len(imgs) != len(lbls):
        raise ValueError(f"{split}: {len(imgs)} images but {len(lbls)} labels")
    if count > len(imgs):
        raise ValueError(f"{split}: need {count} images, file has {len(imgs)}")
    x = normalise(imgs[:count])
    y = torch.from_numpy(lbls[:count].astype(np.int64))
    return x, y


# --------------------------------------------------------------------------
# Models (names must match the Rust VarMap paths)
# --------------------------------------------------------------------------

class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(3136, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


MODELS = {"mlp": Mlp, "cnn": Cnn}
SEEDS = {"mlp": 0, "cnn": 1}
STEPS = {"mlp": 20, "cnn": 8}
TORCH_SAVED_SEED = 7
TORCH_SAVED_TEST_IMAGES = 8


# --------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------

def f32_dict(tensors):
    out = {}
    for k, v in tensors.items():
        v = v.detach().clone().contiguous()
        if v.dtype != torch.float32:
            raise TypeError(f"{k}: expected float32, got {v.dtype}")
        out[k] = v
    return out


def meta():
    # Exactly ONE metadata key: safetensors serialises __metadata__ from a Rust
    # HashMap, so with two or more keys their order (and the file bytes) would
    # change from run to run.
    return {"torch_version": torch.__version__}


def make_readable(path):
    # safetensors creates files 0600; golden files are meant to be shared.
    os.chmod(path, 0o644)


def write_safetensors(tensors, path):
    save_file(f32_dict(tensors), path, metadata=meta())
    make_readable(path)


def write_json(obj, path):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def make_optimizer(name, params):
    # foreach=False pins the single-tensor ("for-loop") implementation so the
    # arithmetic order is the documented one (see README).
    if name == "adam":
        hp = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
        opt = torch.optim.Adam(params, lr=hp["lr"], betas=tuple(hp["betas"]), eps=hp["eps"],
                               weight_decay=hp["weight_decay"], foreach=False)
    elif name == "adamw":
        hp = {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01}
        opt = torch.optim.AdamW(params, lr=hp["lr"], betas=tuple(hp["betas"]), eps=hp["eps"],
                                weight_decay=hp["weight_decay"], foreach=False)
    elif name == "sgd":
        hp = {"lr": 0.05, "momentum": 0.9, "dampening": 0.0, "nesterov": True,
              "weight_decay": 1e-4}
        opt = torch.optim.SGD(params, lr=hp["lr"], momentum=hp["momentum"],
                              dampening=hp["dampening"], nesterov=hp["nesterov"],
                              weight_decay=hp["weight_decay"], foreach=False)
    else:
        raise ValueError(name)
    return opt, hp


def train(model, opt, x, y, steps, capture_first=False):
    """Plain loop: batch k = x[k*64:(k+1)*64], no shuffle. Returns (losses, first)."""
    model.train()
    losses = []
    first = None
    for k in range(steps):
        xb = x[k * BATCH_SIZE:(k + 1) * BATCH_SIZE]
        yb = y[k * BATCH_SIZE:(k + 1) * BATCH_SIZE]
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)  # mean reduction
        loss.backward()
        if capture_first and k == 0:
            first = {"logits": logits.detach().clone(), "loss": loss.detach().reshape(1).clone()}
            for name, p in model.named_parameters():
                first[f"grad.{name}"] = p.grad.detach().clone()
        losses.append(float(loss.item()))
        opt.step()
    return losses, first


def trace(model_name, steps, optimizer, seed, hp, losses, labels, x0):
    obj = {
        "model": model_name,
        "steps": steps,
        "batch_size": BATCH_SIZE,
        "lr": hp["lr"],
        "optimizer": optimizer,
        "seed": seed,
        "torch_version": torch.__version__,
        "losses": losses,
        "first_batch_labels": [int(v) for v in labels],
    }
    # Optimizer hyperparameters, flattened into the top level ("lr" is above).
    for k, v in hp.items():
        if k != "lr":
            obj[k] = v
    # Cheap data-pipeline sanity checks for the Rust side (float64 sums of the
    # normalised float32 batch-0 input).
    obj["first_batch_input_sum"] = float(x0.double().sum().item())
    obj["first_batch_input_abs_sum"] = float(x0.double().abs().sum().item())
    return obj


# --------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------

def gen_model(name, x, y, out):
    steps, seed = STEPS[name], SEEDS[name]
    n = steps * BATCH_SIZE
    xs, ys = x[:n], y[:n]

    torch.manual_seed(seed)
    model = MODELS[name]()
    init = f32_dict(model.state_dict())
    write_safetensors(init, os.path.join(out, f"{name}_init.safetensors"))

    opt, hp = make_optimizer("adam", model.parameters())
    losses, first = train(model, opt, xs, ys, steps, capture_first=True)
    write_safetensors(first, os.path.join(out, f"{name}_first_batch.safetensors"))
    write_safetensors(model.state_dict(), os.path.join(out, f"{name}_final.safetensors"))
    write_json(trace(name, steps, "adam", seed, hp, losses, ys[:BATCH_SIZE].tolist(), xs[:BATCH_SIZE]),
               os.path.join(out, f"{name}_trace.json"))
    print(f"{name}/adam: losses {losses[0]:.6f} {losses[1]:.6f} {losses[2]:.6f} ... {losses[-1]:.6f}")
    return init


def gen_mlp_optimizer(opt_name, init, x, y, out):
    steps, seed = STEPS["mlp"], SEEDS["mlp"]
    n = steps * BATCH_SIZE
    xs, ys = x[:n], y[:n]
    model = Mlp()
    model.load_state_dict(init, strict=True)
    opt, hp = make_optimizer(opt_name, model.parameters())
    losses, _ = train(model, opt, xs, ys, steps)
    write_safetensors(model.state_dict(), os.path.join(out, f"mlp_{opt_name}_final.safetensors"))
    write_json(trace("mlp", steps, opt_name, seed, hp, losses, ys[:BATCH_SIZE].tolist(), xs[:BATCH_SIZE]),
               os.path.join(out, f"mlp_{opt_name}_trace.json"))
    print(f"mlp/{opt_name}: losses {losses[0]:.6f} {losses[1]:.6f} {losses[2]:.6f} ... {losses[-1]:.6f}")


def gen_torch_saved(data_dir, out):
    torch.manual_seed(TORCH_SAVED_SEED)
    model = Mlp()
    path = os.path.join(out, "torch_saved_mlp.safetensors")
    # Exactly the call a PyTorch user would make (no metadata, no conversion).
    save_file(model.state_dict(), path)
    make_readable(path)
    xt, yt = load_split(data_dir, "test", TORCH_SAVED_TEST_IMAGES)
    model.eval()
    with torch.no_grad():
        logits = model(xt)
    write_safetensors({"logits": logits, "input": xt},
                      os.path.join(out, "torch_saved_mlp_logits.safetensors"))
    print(f"torch_saved_mlp: test labels {yt.tolist()}")


def check_rust_output(path, model_name, data_dir):
    model = MODELS[model_name]()
    state = load_file(path)
    model.load_state_dict(state, strict=True)
    for k, v in state.items():
        print(f"  {k}: {tuple(v.shape)} {v.dtype}")
    xt, yt = load_split(data_dir, "test", TORCH_SAVED_TEST_IMAGES)
    model.eval()
    with torch.no_grad():
        logits = model(xt)
    if not torch.isfinite(logits).all():
        print("logits contain non-finite values", file=sys.stderr)
        return 1
    torch.set_printoptions(precision=6, sci_mode=False, linewidth=140)
    print(f"logits on the first {TORCH_SAVED_TEST_IMAGES} t10k images (labels {yt.tolist()}):")
    print(logits)
    print(f"argmax: {logits.argmax(1).tolist()}")
    print("OK")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="testdata/golden", help="output directory")
    ap.add_argument("--data", default="data/fashion-mnist", help="directory with the Fashion-MNIST IDX .gz files")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    ap.add_argument("--check-rust-output", metavar="FILE.safetensors",
                    help="load a Rust-written safetensors file into the PyTorch module (strict) and run a forward")
    ap.add_argument("--model", choices=sorted(MODELS), default="mlp", help="model for --check-rust-output")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)

    if args.check_rust_output:
        sys.exit(check_rust_output(args.check_rust_output, args.model, args.data))

    os.makedirs(args.out, exist_ok=True)
    print(f"torch {torch.__version__}, numpy {np.__version__}, threads {torch.get_num_threads()}")
    n_train = max(STEPS.values()) * BATCH_SIZE
    x, y = load_split(args.data, "train", n_train)

    mlp_init = gen_model("mlp", x, y, args.out)
    gen_mlp_optimizer("sgd", mlp_init, x, y, args.out)
    gen_mlp_optimizer("adamw", mlp_init, x, y, args.out)
    gen_model("cnn", x, y, args.out)
    gen_torch_saved(args.data, args.out)


if __name__ == "__main__":
    main()
