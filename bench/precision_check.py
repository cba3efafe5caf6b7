#!/usr/bin/env python3
"""Checks `redline train --precision ...` runs against the precision goldens of
tools/reference/make_golden_precision.py (PyTorch autocast, GradScaler, model.to(bfloat16)),
with the bounds crates/redline/tests/precision.rs holds the CPU to. bench/gpu.sh runs the
jobs on cuda:0 and then this; it runs anywhere (the CPU runs of the same jobs pass).

    python3 bench/precision_check.py RUNS_DIR [--golden testdata/golden] [--init testdata/golden]

--golden may name the CUDA reference of `make_golden_precision.py --device cuda` (the same
jobs under PyTorch's CUDA autocast), which `bench/gpu.sh precision` makes on the GPU; the
initial weights stay those of --init.

RUNS_DIR holds, per job, `run-prec-<model>-<golden prefix>/` (the run folder) and
`prec-<model>-<golden prefix>.safetensors` (its --save). Prints one row per job: the worst
loss and update against PyTorch's, the scale trajectory for 16-mixed, and PASS or FAIL
against the CPU's bounds; exits 1 when any job fails or is missing. Reads safetensors with
torch alone (the GPU image's PyTorch may lack the safetensors package).
"""

import argparse
import csv
import json
import struct
import sys
from pathlib import Path

import torch

# (model, golden prefix, loss bound, update bound): precision.rs's bounds.
JOBS = [
    ("mlp", "bf16_mixed", 2e-3, 5e-3),
    ("cnn", "bf16_mixed", 5e-3, 5e-2),
    ("mlp", "fp16_mixed", 1e-3, 5e-3),
    ("cnn", "fp16_mixed", 1e-3, 5e-3),
    ("mlp", "fp16_overflow", 1e-3, 5e-3),
    ("cnn", "fp16_overflow", 1e-3, 5e-3),
    ("mlp", "bf16_true", 2e-2, 0.1),
    ("cnn", "bf16_true", 2e-2, 0.15),
]

# The flags of each golden prefix (beside the shared golden job's).
FLAGS = {
    "bf16_mixed": ["--precision", "bf16-mixed"],
    "fp16_mixed": ["--precision", "16-mixed"],
    "fp16_overflow": ["--precision", "16-mixed", "--loss-scale", "dynamic:init=16777216:interval=3"],
    "bf16_true": ["--precision", "bf16-true"],
}

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def load(path: Path) -> dict:
    """A safetensors file's tensors as fp32."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        a, b = v["data_offsets"]
        t = torch.frombuffer(bytearray(data[a:b]), dtype=DTYPES[v["dtype"]])
        out[name] = t.reshape(v["shape"]).float()
    return out


def step_records(run: Path):
    """The run's step records (loss, loss_scale) from metrics.jsonl, else metrics.csv;
    None when it has neither."""
    if (run / "metrics.jsonl").exists():
        recs = [json.loads(l) for l in (run / "metrics.jsonl").read_text().splitlines() if l]
    elif (run / "metrics.csv").exists():
        with (run / "metrics.csv").open(newline="") as f:
            recs = [{k: (float(v) if k in ("loss", "loss_scale") and v else v) for k, v in r.items()}
                    for r in csv.DictReader(f)]
    else:
        return None
    return [r for r in recs if r.get("kind") == "step"]


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(runs: Path, golden: Path, init_dir: Path, model: str, prefix: str, loss_tol: float,
          upd_tol: float):
    run, saved = runs / f"run-prec-{model}-{prefix}", runs / f"prec-{model}-{prefix}.safetensors"
    steps = step_records(run)
    if steps is None or not saved.exists():
        return None
    trace = json.loads((golden / f"{prefix}_{model}_trace.json").read_text())
    ours = [r["loss"] for r in steps]
    theirs = trace["losses"]
    if len(ours) != len(theirs):
        return {"error": f"{len(ours)} steps logged, PyTorch has {len(theirs)}"}
    loss = max(abs(a - b) / abs(b) for a, b in zip(ours, theirs))
    init = load(init_dir / f"{model}_init.safetensors")
    want, got = load(golden / f"{prefix}_{model}_final.safetensors"), load(saved)
    worst, name = max((rel_l2(got[k] - init[k], want[k] - init[k]), k) for k in want)
    row = {"loss": loss, "update": worst, "tensor": name}
    if "scales" in trace:
        row["scales_equal"] = [r.get("loss_scale") for r in steps] == trace["scales"]
    row["pass"] = loss < loss_tol and worst < upd_tol and row.get("scales_equal", True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--golden", type=Path, default=Path("testdata/golden"))
    ap.add_argument("--init", type=Path, default=Path("testdata/golden"),
                    help="folder of <model>_init.safetensors")
    ap.add_argument("--flags", action="store_true",
                    help="print each job's name and flags (for the shell loop that runs them)")
    a = ap.parse_args()
    if a.flags:
        for model, prefix, _, _ in JOBS:
            print(model, prefix, " ".join(FLAGS[prefix]))
        return 0
    print(f"Against {a.golden}:\n")
    print("| job | loss vs PyTorch (max rel) | update (rel L2, worst) | scales | CPU bounds |")
    print("| --- | --- | --- | --- | --- |")
    ok = True
    for model, prefix, loss_tol, upd_tol in JOBS:
        r = check(a.runs, a.golden, a.init, model, prefix, loss_tol, upd_tol)
        if r is None or "error" in r:
            ok = False
            print(f"| {model} {prefix} | {'missing' if r is None else r['error']} | | | FAIL |")
            continue
        ok &= r["pass"]
        scales = {True: "equal", False: "DIFFER"}.get(r.get("scales_equal"), "-")
        print(f"| {model} {prefix} | {r['loss']:.2e} | {r['update']:.2e} ({r['tensor']}) | "
              f"{scales} | {'PASS' if r['pass'] else 'FAIL'} (loss {loss_tol:g}, update "
              f"{upd_tol:g}) |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
