#!/usr/bin/env python3
"""What checkpointing costs the training loop: `redline train` with checkpoints at the
default interval (each epoch end), every 100 steps, and off (`--no-checkpoint`), side by
side in one run, alternating the variants round by round so that drift on a noisy machine
falls on all of them. MLP (batch 64) and CNN on the shipped Fashion-MNIST, CPU.

    python3 bench/checkpoint_cost.py [--rounds 3] [--mlp-epochs 3] [--cnn-epochs 1]
        [--bin target/release/redline] [--out bench/results/<date>-<host>-checkpoint-cost.md]

Reported per model and variant: the median over rounds of (a) the median training seconds
per epoch (`epoch_s`: what the loop spends training, the host snapshot of a mid-epoch
checkpoint included) and (b) the fit's wall seconds per epoch from `summary.json` (training,
validation and every epoch-end checkpoint's snapshot). The cost is each against `off`.
The writes themselves run on a background thread; on a 2-core machine that thread competes
with the compute threads, which (b) includes.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

VARIANTS = [
    ("epoch end (default)", []),
    ("every 100 steps", ["--checkpoint-every", "100"]),
    ("off", ["--no-checkpoint"]),
]


def run(binary: str, model: str, epochs: int, extra: list[str], work: Path) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    cmd = [
        binary, "train", "--model", model, "--epochs", str(epochs), "--device", "cpu",
        "--monitor-interval", "0", "--run-dir", str(run_dir),
    ] + extra
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}")
    epochs_s = [
        json.loads(line)["epoch_s"]
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"kind":"epoch"' in line
    ]
    summary = json.loads((run_dir / "summary.json").read_text())
    ckpt = summary.get("checkpoints") or {}
    return {
        "epoch_s": statistics.median(epochs_s),
        "wall_per_epoch": summary["wall_s"] / max(1, summary["epochs"]),
        "written": ckpt.get("written", 0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target/release/redline"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mlp-epochs", type=int, default=3)
    ap.add_argument("--cnn-epochs", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    out = [
        "# Checkpoint cost",
        "",
        f"`python3 bench/checkpoint_cost.py --rounds {args.rounds} --mlp-epochs {args.mlp_epochs} "
        f"--cnn-epochs {args.cnn_epochs}` on {platform.node()} ({os.cpu_count()} cores), "
        f"load average {load:.2f} at start, commit "
        + subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                         stdout=subprocess.PIPE).stdout.strip()
        + ".",
        "",
        "| model | checkpoints | written | median epoch s | cost | wall s / epoch | cost |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for model, epochs in (("mlp", args.mlp_epochs), ("cnn", args.cnn_epochs)):
            got: dict[str, list[dict]] = {name: [] for name, _ in VARIANTS}
            for r in range(args.rounds):
                # Alternate the order each round so no variant always runs first.
                order = VARIANTS if r % 2 == 0 else list(reversed(VARIANTS))
                for name, extra in order:
                    res = run(args.bin, model, epochs, extra, work)
                    got[name].append(res)
                    print(f"{model} round {r + 1} {name}: {res}", file=sys.stderr)
            off_e = statistics.median(x["epoch_s"] for x in got["off"])
            off_w = statistics.median(x["wall_per_epoch"] for x in got["off"])
            for name, _ in VARIANTS:
                e = statistics.median(x["epoch_s"] for x in got[name])
                w = statistics.median(x["wall_per_epoch"] for x in got[name])
                written = got[name][0]["written"]
                cost = lambda a, b: "-" if name == "off" else f"{100 * (a / b - 1):+.1f}%"
                out.append(
                    f"| {model} ({epochs} epochs) | {name} | {written} | {e:.3f} | {cost(e, off_e)} "
                    f"| {w:.3f} | {cost(w, off_w)} |"
                )
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
