#!/usr/bin/env python3
"""Two Redline binaries on the same ResNet row, alternating round by round (A/B of a change on
a VM whose neighbours move either side 10-20% from one minute to the next): the steady ms/step
of each round (bench/resnet_cpu.py's redline_ms: 2 warm-up steps, the median of 5) and the
median of the rounds.

    ~/.venvs/redline-ref/bin/python bench/resnet_ab.py OLD_BIN NEW_BIN \\
        [--rounds 3] [--row resnet18:32:224] [--threads 2] [--precision 32-true]
"""

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import resnet_cpu  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bins", nargs=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--row", default="resnet18:32:224")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="32-true")
    a = ap.parse_args()
    model, batch, size = a.row.split(":")
    batch, size = int(batch), int(size)
    res = {b: [] for b in a.bins}
    for _ in range(max(1, a.rounds)):
        for b in a.bins:
            with tempfile.TemporaryDirectory() as tmp:
                res[b].append(resnet_cpu.redline_ms(b, model, batch, size, 5, a.threads, tmp,
                                                          a.precision))
            print(f"{b}: {res[b][-1]:.1f} ms/step", flush=True)
    for b in a.bins:
        rounds = ", ".join(f"{v:.0f}" for v in res[b])
        print(f"{b}: median {statistics.median(res[b]):.1f} ms/step ({rounds})")


if __name__ == "__main__":
    main()
