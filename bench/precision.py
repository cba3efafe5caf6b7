#!/usr/bin/env python3
"""Precision on the CPU: `redline train --precision 32-true | bf16-mixed | 16-mixed | bf16-true`
beside PyTorch's tensor workload in fp32, under `torch.autocast("cpu", dtype=torch.bfloat16)`,
under `torch.autocast("cpu", dtype=torch.float16)` with `torch.amp.GradScaler`, and converted
with `model.to(torch.bfloat16)` (bench/torch_mnist.py --precision), in one run, alternating the
variants round by round.
MLP at batch 64 and 512 (5 epochs) and the CNN (1 epoch) on the shipped Fashion-MNIST.
bench/run.sh runs it after the main comparison and appends its table to the report.

    python3 bench/precision.py [--rounds 3] [--threads 2] [--cnn-epochs 1]
        [--precisions 32-true,bf16-mixed,16-mixed,bf16-true] [--gemm-off]
        [--bin target/release/redline] [--python ~/.venvs/redline-ref/bin/python]
        [--out bench/results/<date>-<host>-precision.md]

Reported per job and precision, medians over rounds: training seconds per epoch (Redline's
`epoch_s`, PyTorch's timed loop), test accuracy after the last epoch, one batch's activations
(what the forward keeps for the backward, the batch and the weights left out: Redline's
`summary.json` `memory.activations`, PyTorch's saved tensors through `saved_tensors_hooks`)
the weights, gradients and optimizer state (Redline's `memory`, PyTorch's tensors after
training), and the process's peak resident memory (`/usr/bin/time -v`, the whole process:
data, model, optimizer and activations together). Both sides train on all 60,000 training
images (Redline `--val-split 0`).

`--gemm-off` adds a Redline-only row for each bf16 precision with `--cpu-bf16-gemm off` (the fp32
GEMM of the bf16-rounded operands instead of the AVX-512 BF16 kernel), so the kernel's gain is
measured in the same run.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
JOBS = [("mlp", 64), ("mlp", 512), ("cnn", 64)]
PRECISIONS = ["32-true", "bf16-mixed", "16-mixed", "bf16-true"]


def timed(cmd: list[str]) -> tuple[str, float]:
    """Runs `cmd` under /usr/bin/time -v: (stdout, peak RSS in MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return p.stdout, (int(rss.group(1)) / 1024 if rss else float("nan"))


GEMM_OFF = " (--cpu-bf16-gemm off)"


def redline(a, model, batch, precision, epochs, work: Path) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    extra = ["--cpu-bf16-gemm", "off"] if precision.endswith(GEMM_OFF) else []
    _, rss = timed([a.bin, "train", "--model", model, "--batch-size", str(batch), "--epochs",
                    str(epochs), "--precision", precision.removesuffix(GEMM_OFF), "--device",
                    "cpu", "--threads", str(a.threads), "--val-split", "0", "--no-checkpoint",
                    "--monitor-interval", "0", "--run-dir", str(run_dir)] + extra)
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs_s = [r["epoch_s"] for r in rows if r.get("kind") == "epoch"]
    test = next(r for r in rows if r.get("kind") == "test")
    summary = json.loads((run_dir / "summary.json").read_text())
    mem = summary["memory"]
    return {"epoch_s": statistics.median(epochs_s), "acc": test["test_accuracy"], "rss": rss,
            "act": mem["activations"] / 2**20,
            "state": (mem["parameters"] + mem["gradients"] + mem["optimizer"]) / 2**20}


TRAIN_SAMPLES = 60000


def torch(a, model, batch, precision, epochs) -> dict:
    # PyTorch's CPU fp16 convolution has no fast kernel here (over 10 minutes for one CNN
    # epoch, where bf16 takes 16 s): it trains on a head of the data, and its epoch time is
    # scaled to the whole split; its accuracy is not comparable and is not reported.
    limit = a.torch_fp16_cnn_limit if (model, precision) == ("cnn", "16-mixed") else 0
    out, rss = timed([a.python, str(REPO / "bench/torch_mnist.py"), "--workload", "tensor",
                      "--model", model, "--batch-size", str(batch), "--epochs", str(epochs),
                      "--threads", str(a.threads), "--precision", precision,
                      "--limit", str(limit)])
    r = json.loads(out.strip().splitlines()[-1])
    scale = TRAIN_SAMPLES / limit if limit else 1.0
    return {"epoch_s": statistics.median(r["epoch_s"]) * scale,
            "acc": float("nan") if limit else r["test_accuracy"], "rss": rss,
            "act": r["activation_bytes"] / 2**20, "state": r["state_bytes"] / 2**20,
            "scaled": bool(limit)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target/release/redline"))
    ap.add_argument("--python", default=str(Path.home() / ".venvs/redline-ref/bin/python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mlp-epochs", type=int, default=5)
    ap.add_argument("--cnn-epochs", type=int, default=1)
    ap.add_argument("--torch-fp16-cnn-limit", type=int, default=3200,
                    help="samples PyTorch's fp16 CNN trains on (its CPU fp16 convolution is "
                    "slow); its s/epoch is scaled to the whole split")
    ap.add_argument("--precisions", default=",".join(PRECISIONS),
                    help="comma-separated; 32-true is always run (the baseline)")
    ap.add_argument("--gemm-off", action="store_true",
                    help="also run Redline's bf16 precisions with --cpu-bf16-gemm off")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    chosen = [p for p in a.precisions.split(",") if p and p != "32-true"]
    precisions = ["32-true"] + chosen
    if a.gemm_off:
        precisions += [p + GEMM_OFF for p in precisions if p.startswith("bf16")]
    load = os.getloadavg()[0]
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            for model, batch in JOBS:
                epochs = a.mlp_epochs if model == "mlp" else a.cnn_epochs
                for precision in precisions:
                    for side in ("redline", "pytorch"):
                        if side == "pytorch" and precision.endswith(GEMM_OFF):
                            continue
                        r = (redline(a, model, batch, precision, epochs, Path(tmp))
                             if side == "redline" else torch(a, model, batch, precision, epochs))
                        res.setdefault((model, batch, precision, side), []).append(r)
                        print(f"round {rnd + 1} {model} b{batch} {precision} {side}: "
                              f"{r['epoch_s']:.3f} s/epoch, acc {r['acc']:.4f}", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE).stdout.strip()
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    out = [
        "# Precision (CPU)",
        "",
        f"`python3 bench/precision.py --rounds {a.rounds} --threads {a.threads} --mlp-epochs "
        f"{a.mlp_epochs} --cnn-epochs {a.cnn_epochs} --precisions {','.join(chosen)}"
        f"{' --gemm-off' if a.gemm_off else ''}` on {platform.node()} ({os.cpu_count()} "
        f"cores), load average {load:.2f} at start, commit {commit}. Medians over rounds; peak "
        "RSS is the whole process's.",
        "",
        "| job | precision | Redline s/epoch | vs its fp32 | test acc | activations MiB (vs "
        "fp32) | weights+grads+optimizer MiB | peak RSS MiB | PyTorch s/epoch | vs its fp32 | "
        "test acc | activations MiB (vs fp32) | weights+grads+optimizer MiB | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, batch in JOBS:
        for precision in precisions:
            cells = []
            for side in ("redline", "pytorch"):
                if (model, batch, precision, side) not in res:
                    cells.append(" | ".join(["-"] * 6))
                    continue
                xs = res[(model, batch, precision, side)]
                base = med(res[(model, batch, "32-true", side)], "epoch_s")
                act0 = med(res[(model, batch, "32-true", side)], "act")
                t, act = med(xs, "epoch_s"), med(xs, "act")
                scaled = "*" if xs[0].get("scaled") else ""
                acc = med(xs, "acc")
                acc_s = "-" if acc != acc else f"{100 * acc:.2f}%"
                cells.append(f"{t:.3f}{scaled} | {t / base:.2f}x | {acc_s} | "
                             f"{act:.2f} ({100 * act / act0:.0f}%) | {med(xs, 'state'):.2f} | "
                             f"{med(xs, 'rss'):.0f}")
            out.append(f"| {model} b{batch} | {precision} | " + " | ".join(cells) + " |")
    out += ["", f"\\* PyTorch's fp16 CNN: trained on the first {a.torch_fp16_cnn_limit} samples "
            "(its CPU fp16 convolution has no fast kernel: one whole epoch ran over 10 minutes), "
            "s/epoch scaled to 60,000; no accuracy. Activations: one batch's forward keep for "
            "the backward (Redline `memory.activations`, PyTorch `saved_tensors_hooks`), the "
            "batch and the weights left out."]
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
