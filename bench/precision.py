#!/usr/bin/env python3
"""Precision on the CPU: `redline train --precision 32-true | bf16-mixed` beside PyTorch's
tensor workload with and without `torch.autocast("cpu", dtype=torch.bfloat16)`
(bench/torch_mnist.py --precision), in one run, alternating the variants round by round.
MLP at batch 64 and 512 (5 epochs) and the CNN (1 epoch) on the shipped Fashion-MNIST.

    python3 bench/precision.py [--rounds 3] [--threads 2] [--cnn-epochs 1]
        [--bin target/release/redline] [--python ~/.venvs/redline-ref/bin/python]
        [--out bench/results/<date>-<host>-precision.md]

Reported per job and precision, medians over rounds: training seconds per epoch (Redline's
`epoch_s`, PyTorch's timed loop), test accuracy after the last epoch, and the process's peak
resident memory (`/usr/bin/time -v`, the whole process: data, model, optimizer and
activations together; the split by kind is not measured yet). Both sides train on all 60,000
training images (Redline `--val-split 0`).
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
PRECISIONS = ["32-true", "bf16-mixed"]


def timed(cmd: list[str]) -> tuple[str, float]:
    """Runs `cmd` under /usr/bin/time -v: (stdout, peak RSS in MiB)."""
    p = subprocess.run(["/usr/bin/time", "-v"] + cmd, cwd=REPO, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    return p.stdout, (int(rss.group(1)) / 1024 if rss else float("nan"))


def redline(a, model, batch, precision, epochs, work: Path) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    _, rss = timed([a.bin, "train", "--model", model, "--batch-size", str(batch), "--epochs",
                    str(epochs), "--precision", precision, "--device", "cpu", "--threads",
                    str(a.threads), "--val-split", "0", "--no-checkpoint",
                    "--monitor-interval", "0", "--run-dir", str(run_dir)])
    rows = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    epochs_s = [r["epoch_s"] for r in rows if r.get("kind") == "epoch"]
    test = next(r for r in rows if r.get("kind") == "test")
    return {"epoch_s": statistics.median(epochs_s), "acc": test["test_accuracy"], "rss": rss}


def torch(a, model, batch, precision, epochs) -> dict:
    out, rss = timed([a.python, str(REPO / "bench/torch_mnist.py"), "--workload", "tensor",
                      "--model", model, "--batch-size", str(batch), "--epochs", str(epochs),
                      "--threads", str(a.threads), "--precision", precision])
    r = json.loads(out.strip().splitlines()[-1])
    return {"epoch_s": statistics.median(r["epoch_s"]), "acc": r["test_accuracy"], "rss": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target/release/redline"))
    ap.add_argument("--python", default=str(Path.home() / ".venvs/redline-ref/bin/python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--mlp-epochs", type=int, default=5)
    ap.add_argument("--cnn-epochs", type=int, default=1)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    load = os.getloadavg()[0]
    res: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            for model, batch in JOBS:
                epochs = a.mlp_epochs if model == "mlp" else a.cnn_epochs
                for precision in PRECISIONS:
                    for side in ("redline", "pytorch"):
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
        f"{a.mlp_epochs} --cnn-epochs {a.cnn_epochs}` on {platform.node()} ({os.cpu_count()} "
        f"cores), load average {load:.2f} at start, commit {commit}. Medians over rounds; peak "
        "RSS is the whole process's.",
        "",
        "| job | precision | Redline s/epoch | vs its fp32 | test acc | peak RSS MiB | "
        "PyTorch s/epoch | vs its fp32 | test acc | peak RSS MiB |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for model, batch in JOBS:
        for precision in PRECISIONS:
            cells = []
            for side in ("redline", "pytorch"):
                xs = res[(model, batch, precision, side)]
                base = med(res[(model, batch, "32-true", side)], "epoch_s")
                t = med(xs, "epoch_s")
                cells.append(f"{t:.3f} | {t / base:.2f}x | {100 * med(xs, 'acc'):.2f}% | "
                             f"{med(xs, 'rss'):.0f}")
            out.append(f"| {model} b{batch} | {precision} | " + " | ".join(cells) + " |")
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
