#!/usr/bin/env python3
"""Profiler overhead: the same `redline train` with --profiler off, simple and
detailed, interleaved (off, simple, detailed, off, ...) so that machine noise
hits all three alike. Prints a markdown table of median training seconds per
epoch and the ratio to `off`, plus the breakdown each mode measured.

    python3 bench/profiler_overhead.py [--model mlp] [--epochs 2] [--repeats 5]
                                       [--binary target/release/redline] [-- extra train flags]

Build first (`cargo build --release`); check `uptime` and do not run it while
anything else builds. Uses only the standard library.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

MODES = ["off", "simple", "detailed"]


def run_once(binary, mode, args, extra, root):
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = os.path.join(tmp, "run")
        cmd = [binary, "train", "--model", args.model, "--epochs", str(args.epochs),
               "--no-validate", "--profiler", mode, "--run-dir", run_dir, *extra]
        subprocess.run(cmd, cwd=root, check=True, stdout=subprocess.DEVNULL)
        with open(os.path.join(run_dir, "summary.json")) as f:
            summary = json.load(f)
        with open(os.path.join(run_dir, "breakdown.json")) as f:
            breakdown = json.load(f)
        return summary, breakdown


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--binary", default="target/release/redline")
    ap.add_argument("extra", nargs="*", help="extra `redline train` flags (after --)")
    args = ap.parse_args()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binary = os.path.join(root, args.binary) if not os.path.isabs(args.binary) else args.binary
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: run `cargo build --release` first")

    per_epoch = {m: [] for m in MODES}
    last_breakdown = {}
    for r in range(args.repeats):
        for mode in MODES:
            summary, breakdown = run_once(binary, mode, args, args.extra, root)
            per_epoch[mode].append(summary["train_s"] / summary["epochs"])
            last_breakdown[mode] = breakdown
            print(f"repeat {r + 1}/{args.repeats} {mode:>8}: {per_epoch[mode][-1]:.4f} s/epoch",
                  file=sys.stderr)

    base = statistics.median(per_epoch["off"])
    print(f"\n{args.model}, {args.epochs} epochs, no validation, {args.repeats} interleaved repeats; "
          f"median training seconds per epoch\n")
    print("| profiler | s/epoch (median) | min | max | vs off |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for mode in MODES:
        v = per_epoch[mode]
        print(f"| {mode} | {statistics.median(v):.4f} | {min(v):.4f} | {max(v):.4f} | "
              f"{statistics.median(v) / base:.3f}x |")
    print("\nBreakdown measured by each mode (last repeat, % of the fit's wall time):\n")
    cats = [c["name"] for c in last_breakdown["off"]["categories"]]
    print("| profiler | " + " | ".join(cats) + " |")
    print("| --- |" + " ---: |" * len(cats))
    for mode in MODES:
        shares = {c["name"]: c["percent"] for c in last_breakdown[mode]["categories"]}
        print(f"| {mode} | " + " | ".join(f"{shares[c]:.1f}" for c in cats) + " |")


if __name__ == "__main__":
    main()
