#!/usr/bin/env python3
"""ResNet training steps on the CPU, Redline against PyTorch on the same cores, in one run
(issue 52's ResNet rows). Random images of one size, 10 classes, Adam 1e-3 in both.

    ~/.venvs/redline-ref/bin/python bench/resnet_cpu.py --bin target/release/redline \\
        --threads 2 --rows resnet18:8:64,resnet18:32:224

Each row MODEL:BATCH:SIZE: Redline's `train --model MODEL` on an .npz of BATCH x (STEPS + 2)
images, one epoch of 2 + STEPS steps logged every step (the median of the last STEPS steps'
wall times, from metrics.csv; before 2026-11-28 the difference of a 2 + STEPS and a 2-step run's
means, which swung 2x run to run on the small rows), then torchvision's model in a plain PyTorch loop over the same number of images,
each step's batch gathered in a shuffled order inside the timed step as Redline's loader does
(the median of STEPS steps after two warm-up steps; before 2026-11-28 PyTorch reused one
batch, which stays in a 32 MB L3 cache at 64 x 224 px and made the patch row 1.2x faster). Prints a table of ms/step, images/s and the ratio; with `--rounds N`, the
medians of N rounds, Redline and PyTorch alternating, each round's pair listed.
"""

import argparse
import csv
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


def redline_step_times(binary, model, path, batch, steps, threads, run_dir, precision="32-true"):
    """Each step's wall time (s) of a `--max-steps STEPS` run: the differences of the
    `elapsed_s` of metrics.csv's step rows (`--log-every 1`; on the CPU the read-back is
    free)."""
    cmd = [binary, "train", "--model", model_arg(model), "--data", path, "--batch-size", str(batch),
           "--max-steps", str(steps), "--threads", str(threads), "--val-split", "0",
           "--no-validate", "--monitor-interval", "0", "--task", "classification",
           "--device", "cpu", "--no-checkpoint", "--log-every", "1", "--run-dir", run_dir,
           "--precision", precision]
    p = subprocess.run(cmd, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{out[-3000:]}")
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        rows = [r for r in csv.DictReader(f) if r["kind"] == "step"]
    elapsed = [float(r["elapsed_s"]) for r in rows]
    if len(elapsed) != steps:
        sys.exit(f"{run_dir}/metrics.csv: {len(elapsed)} step rows, expected {steps}")
    return [b - a for a, b in zip([0.0] + elapsed, elapsed)]


def redline_ms(binary, model, batch, size, steps, threads, tmp, precision="32-true"):
    """Steady-state ms/step: the median of STEPS steps after 2 warm-up steps, as PyTorch's."""
    n = batch * (steps + 2)
    rng = np.random.default_rng(0)
    path = os.path.join(tmp, f"x{batch}_{size}.npz")
    x = rng.standard_normal((n, 3, size, size), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    np.savez(path, x=x, y=y)
    times = redline_step_times(binary, model, path, batch, steps + 2, threads,
                               os.path.join(tmp, f"run_{model}_{batch}_{size}"), precision)
    return 1000 * statistics.median(times[2:])


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


def torch_ms(model, batch, size, steps, threads, reuse_batch=False, precision="32-true"):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if model in FILE_MODELS:
        net = FILE_MODELS[model]()
    else:
        net = getattr(torchvision.models, model)(num_classes=10)
    if precision == "bf16-true":
        # Lightning's bf16-true: the module converted (parameters, buffers).
        net = net.to(torch.bfloat16)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    # The same job as Redline's run: a dataset of BATCH x (STEPS + 2) images,
    # each step's batch gathered from a shuffled order (what a DataLoader's
    # collate copies), inside the timed step as Redline's loader is.
    xs = torch.randn(batch * (steps + 2), 3, size, size)
    if precision == "bf16-true":
        xs = xs.to(torch.bfloat16)
    ys = torch.randint(0, 10, (batch * (steps + 2),))
    order = torch.randperm(len(xs))
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        idx = order[(0 if reuse_batch else i) * batch:][:batch]
        if reuse_batch:
            # --torch-reuse-batch: compute alone, on one batch gathered once.
            if i == 0:
                x, y = xs.index_select(0, idx), ys.index_select(0, idx)
        else:
            x, y = xs.index_select(0, idx), ys.index_select(0, idx)
        opt.zero_grad(set_to_none=True)
        # bf16-mixed: Lightning's autocast to bfloat16 around the forward,
        # the loss in fp32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed"):
            out = net(x)
        F.cross_entropy(out.float(), y).backward()
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
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each row ROUNDS times, Redline and PyTorch alternating, and "
                         "print the medians (this VM's neighbours swing either side 10-20%% "
                         "from one minute to the next)")
    ap.add_argument("--torch-reuse-batch", action="store_true",
                    help="PyTorch trains on one batch gathered once (its compute alone; the "
                         "protocol before 2026-11-28)")
    ap.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed", "bf16-true"],
                    help="Redline's --precision; PyTorch: autocast to bfloat16 (bf16-mixed) or the "
                         "model and batch converted (bf16-true)")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{a.threads} threads, {os.cpu_count()} logical cores, precision {a.precision}")
    print("| model | batch | size | Redline ms/step | PyTorch ms/step | Redline img/s | PyTorch img/s | Redline / PyTorch time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in a.rows.split(","):
        model, batch, size = row.split(":")
        batch, size = int(batch), int(size)
        ours_all, theirs_all = [], []
        for _ in range(max(1, a.rounds)):
            with tempfile.TemporaryDirectory() as tmp:
                ours_all.append(redline_ms(a.bin, model, batch, size, a.steps, a.threads, tmp,
                                           a.precision))
            theirs_all.append(torch_ms(model, batch, size, a.steps, a.threads,
                                       a.torch_reuse_batch, a.precision))
        ours, theirs = statistics.median(ours_all), statistics.median(theirs_all)
        rounds = ""
        if len(ours_all) > 1:
            rounds = " (rounds: " + ", ".join(
                f"{o:.0f}/{t:.0f}" for o, t in zip(ours_all, theirs_all)) + ")"
        print(f"| {model} | {batch} | {size} | {ours:.1f} | {theirs:.1f} | "
              f"{1000 * batch / ours:.1f} | {1000 * batch / theirs:.1f} | {ours / theirs:.2f}x{rounds} |",
              flush=True)

if __name__ == "__main__":
    main()
