#!/usr/bin/env python3
"""ResNet training steps on the CPU, Redline against PyTorch on the same cores, in one run
(issue 52's ResNet rows). Random images of one size, 10 classes, Adam 1e-3 in both.

    ~/.venvs/redline-ref/bin/python bench/resnet_cpu.py --bin target/release/redline \\
        --threads 2 --rows resnet18:8:64,resnet18:32:224

Each row MODEL:BATCH:SIZE: Redline's `train --model MODEL` on an .npz of BATCH x (STEPS + 2)
images, run for 2 + STEPS and for 2 steps (the fit's training times from their summaries; the
difference over STEPS is the steady-state step, as PyTorch's median leaves out 2 warm-up
steps), then torchvision's model in a plain PyTorch loop (the median of
STEPS steps after two warm-up steps). Prints a table of ms/step, images/s and the ratio.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F
import torchvision


def redline_train_s(binary, model, path, batch, steps, threads, run_dir):
    """The fit's training time (its summary's ms/step times its steps) of a
    `--max-steps STEPS` run."""
    cmd = [binary, "train", "--model", model_arg(model), "--data", path, "--batch-size", str(batch),
           "--max-steps", str(steps), "--threads", str(threads), "--val-split", "0",
           "--no-validate", "--monitor-interval", "0", "--task", "classification",
           "--device", "cpu", "--no-checkpoint", "--run-dir", run_dir]
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    m = re.search(r"([0-9.]+) ms/step", out)
    if p.returncode != 0 or not m:
        sys.exit(f"failed: {' '.join(cmd)}\n{out[-3000:]}")
    return float(m.group(1)) * steps / 1000


def redline_ms(binary, model, batch, size, steps, threads, tmp):
    """Steady-state ms/step: a run of 2 + STEPS steps less a run of 2 (the
    warm-up steps PyTorch's median leaves out), over STEPS."""
    n = batch * (steps + 2)
    rng = np.random.default_rng(0)
    path = os.path.join(tmp, f"x{batch}_{size}.npz")
    x = rng.standard_normal((n, 3, size, size), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    np.savez(path, x=x, y=y)
    run = lambda k: redline_train_s(binary, model, path, batch, k, threads,
                                    os.path.join(tmp, f"run_{model}_{batch}_{size}_{k}"))
    return 1000 * (run(steps + 2) - run(2)) / steps


# Models of bench/models/NAME.toml and their PyTorch twins (other names are torchvision's).
FILE_MODELS = {
    "patch8": lambda: torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 8, stride=8), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 10)),
    "mbv2_block": lambda: MbBlock(),
}


class MbBlock(torch.nn.Module):
    """bench/models/mbv2_block.toml in PyTorch."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.body = nn.Sequential(
            nn.Conv2d(32, 192, 1, bias=False), nn.BatchNorm2d(192), nn.ReLU(),
            nn.Conv2d(192, 192, 3, 1, 1, groups=192, bias=False), nn.BatchNorm2d(192),
            nn.ReLU(), nn.Conv2d(192, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.body(h))


def model_arg(model):
    """Redline's --model for a row's MODEL: a file of bench/models, or a zoo name."""
    if model in FILE_MODELS:
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), "models", model + ".toml")
    return model


def torch_ms(model, batch, size, steps, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if model in FILE_MODELS:
        net = FILE_MODELS[model]()
    else:
        net = getattr(torchvision.models, model)(num_classes=10)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(batch, 3, size, size)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(x), y).backward()
        opt.step()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/redline")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", default="resnet18:8:64")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{a.threads} threads, {os.cpu_count()} logical cores")
    print("| model | batch | size | Redline ms/step | PyTorch ms/step | Redline img/s | PyTorch img/s | Redline / PyTorch time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        for row in a.rows.split(","):
            model, batch, size = row.split(":")
            batch, size = int(batch), int(size)
            ours = redline_ms(a.bin, model, batch, size, a.steps, a.threads, tmp)
            theirs = torch_ms(model, batch, size, a.steps, a.threads)
            print(f"| {model} | {batch} | {size} | {ours:.1f} | {theirs:.1f} | "
                  f"{1000 * batch / ours:.1f} | {1000 * batch / theirs:.1f} | {ours / theirs:.2f}x |",
                  flush=True)


if __name__ == "__main__":
    main()
