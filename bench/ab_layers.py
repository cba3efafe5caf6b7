#!/usr/bin/env python3
"""Two (or more) `redline` binaries side by side on one job, alternating run by run: the
median ms per step and per layer span (`--profiler detailed`'s per-layer table) over the
rounds. For a change to one kernel, measured against its parent on the same machine in the
same minutes (the 2-core VM's speed drifts by 10-20% over an hour; an A/A run of one binary
against its copy differed by 3%).

    python3 bench/ab_layers.py BIN_A,BIN_B ROUNDS [redline train arguments...]
    python3 bench/ab_layers.py /tmp/rl_old,/tmp/rl_new 7 --model cnn --precision bf16-mixed --max-steps 200

Each run: `BIN train --threads 2 --val-split 0 --no-validate --monitor-interval 0 --profiler
detailed ARGS`, in a scratch folder (its run folders are left there). ms/step is the
summary's line (the fit's training time over its steps); the layer rows are the spans' mean
ms per call.
"""

import os
import re
import statistics
import subprocess
import sys
import tempfile


def run(binary: str, args: list[str], cwd: str) -> dict[str, float]:
    cmd = [binary, "train", "--threads", "2", "--val-split", "0", "--no-validate",
           "--monitor-interval", "0", "--profiler", "detailed"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd)
    out = p.stdout + p.stderr
    step = re.search(r"([0-9.]+) ms/step", out)
    if p.returncode != 0 or not step:
        sys.exit(f"failed: {' '.join(cmd)}\n{out[-3000:]}")
    times = {"step": float(step.group(1))}
    for line in out.splitlines():
        m = re.match(r"^(\S+\.(?:forward|backward))(?: \([^)]*\))?\s+\d+\s+([0-9.]+)", line)
        if m:
            times[m.group(1)] = float(m.group(2))
    return times


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    bins, rounds, args = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3:]
    seen: dict[str, dict[str, list[float]]] = {b: {} for b in bins}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(rounds):
            for b in bins:
                for k, v in run(b, args, cwd).items():
                    seen[b].setdefault(k, []).append(v)
    print(f"{rounds} rounds, alternating; redline train {' '.join(args)}; load average "
          f"{os.getloadavg()[0]:.2f} at the end")
    keys = ["step"] + sorted(k for k in seen[bins[0]] if k != "step")
    print("| median ms | " + " | ".join(os.path.basename(b) for b in bins) + " |")
    print("| --- |" + " ---: |" * len(bins))
    for k in keys:
        cells = [f"{statistics.median(seen[b][k]):.3f}" if k in seen[b] else "-" for b in bins]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
