#!/usr/bin/env python3
"""Which tensor of a 16-bit GPU run leaves PyTorch's first: Redline's weights after a few
steps of a CNN precision golden job (`bash bench/gpu.sh steps` saves them as
`steps-<set>-<job>-<n>.safetensors`) against PyTorch's after as many steps of the same job
(`make_golden_precision.py --steps n`, on this machine's CPU, or the GPU's when run there).

    ~/.venvs/redline-ref/bin/python tools/reference/precision_steps.py DIR [--device cpu]
        [--cache REFS] [--spread]

Prints, per file, each tensor's update (final - init) relative L2 distance from PyTorch's,
worst first. PyTorch's runs are kept in REFS/<device>-<steps>/ (`--cache`; a temporary
folder without it) and read from there when present: `bench/gpu.sh steps` keeps its CUDA runs
in $OUT/torch-steps, so another machine can compare them. `--spread` also prints PyTorch's run
on `--device` against its CPU run of the same job and steps: how far apart PyTorch's own two
devices are. The CNN references leave out fc1.weight (make_golden_precision.py says why).

On the H200 (bench/results/h200-2026-11-26-2/, call3/steps/ in runs.tar.xz), against the CPU:
after 6 steps of fp16_overflow (one update, at scale 2**20; the others skipped) the first Adam
step's sign differs on 1 of 32 conv1.bias, 3 of 288 conv1.weight and about 1.2% of conv2.weight
elements, gradients that nearly cancel, alike with Redline's kernels and with candle's ops.
"""

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file

HERE = Path(__file__).resolve().parent
PRECISION = {"fp16_mixed": "16-mixed", "fp16_overflow": "16-mixed", "bf16_mixed": "bf16-mixed",
             "bf16_true": "bf16-true"}


def reference(job: str, steps: int, device: str, cache: Path) -> dict:
    """PyTorch's CNN weights after `steps` steps of golden job `job`."""
    out = cache / f"{device}-{steps}"
    path = out / f"{job}_cnn_final.safetensors"
    if not path.exists():
        subprocess.run([sys.executable, str(HERE / "make_golden_precision.py"), "--models", "cnn",
                        "--precisions", PRECISION[job], "--steps", str(steps), "--device", device,
                        "--init", "testdata/golden", "--out", str(out)], check=True)
    return load_file(path)


def updates(got: dict, want: dict, init: dict) -> str:
    """Each tensor's update in `got` against `want`'s (relative L2), worst first."""
    rows = []
    for k, w in want.items():
        upd_w = w.float() - init[k].float()
        upd_g = got[k].float() - init[k].float()
        rows.append((float((upd_g - upd_w).norm() / upd_w.norm().clamp_min(1e-30)), k))
    rows.sort(reverse=True)
    return ", ".join(f"{k} {r:.2e}" for r, k in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--cache", type=Path, help="keep (and reuse) PyTorch's runs here")
    ap.add_argument("--spread", action="store_true", help="also PyTorch's device against its CPU")
    a = ap.parse_args()
    init = load_file("testdata/golden/cnn_init.safetensors")
    files = sorted(a.dir.glob("steps-*.safetensors"))
    if not files:
        sys.exit(f"no steps-*.safetensors in {a.dir}")
    spread = set()
    with tempfile.TemporaryDirectory() as tmp:
        cache = a.cache or Path(tmp)
        for f in files:
            m = re.fullmatch(r"steps-(\w+?)-(\w+)-(\d+)\.safetensors", f.name)
            if not m or m.group(2) not in PRECISION:
                print(f"{f.name}: not steps-<set>-<job>-<n>.safetensors, skipped")
                continue
            job, steps = m.group(2), int(m.group(3))
            want = reference(job, steps, a.device, cache)
            print(f"{f.name} against PyTorch {a.device}, {steps} steps: "
                  f"{updates(load_file(f), want, init)}")
            if a.spread and a.device != "cpu" and (job, steps) not in spread:
                spread.add((job, steps))
                cpu = reference(job, steps, "cpu", cache)
                print(f"PyTorch {a.device} against cpu, {job}, {steps} steps: "
                      f"{updates(want, cpu, init)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
