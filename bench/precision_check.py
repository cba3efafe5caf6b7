#!/usr/bin/env python3
"""Checks `redline train --precision ...` runs against the precision goldens of
tools/reference/make_golden_precision.py (PyTorch autocast, GradScaler, model.to(bfloat16)),
with the bounds crates/redline/tests/precision.rs holds the CPU to. bench/gpu.sh runs the
jobs on cuda:0 and then this; it runs anywhere (the CPU runs of the same jobs pass).

    python3 bench/precision_check.py RUNS_DIR [--golden testdata/golden] [--init testdata/golden]

--golden may name the CUDA reference of `make_golden_precision.py --device cuda` (the same
jobs under PyTorch's CUDA autocast), which `bench/gpu.sh precision` makes on the GPU; the
initial weights stay those of --init.

--also names a second reference (the CPU goldens beside the CUDA ones): each row then also
gives the run's distance to it and PyTorch's own distance between the two references, and a
job passes when it is within the CPU's bounds of either, or ("PASS (spread)") when it is as
close to the first reference (PyTorch's CUDA run) as PyTorch's two runs are to each other, with
the first's loss scales. PyTorch's CUDA and CPU autocast runs are both PyTorch; on an H200
they differ by more than the CPU bounds (the MLP's bf16-mixed update by 2.6e-2, the CNN's
fp16-mixed overflows at another step), and on an H100 PyTorch's CUDA run of the CNN's
fp16_overflow job flips as many signs of the first Adam step (the conv gradients that nearly
cancel) against its CPU run as Redline's does (tools/reference/precision_steps.py --spread;
bench/results/h100-2026-11-26/steps/), so a GPU run is held to the bounds against whichever of
the two it follows, or to PyTorch's own spread.

--spread (repeatable, with --also) names further PyTorch runs of the same jobs that differ
from the first reference only in the order their sums round (tools/reference/fp16_spread.py:
cudnn.benchmark, channels_last). PyTorch's own spread is then the widest distance from the
first reference to any of its other runs. On an H100 PyTorch's channels_last run of the CNN's
fp16_overflow job lands 6.7e-3 (loss) and 1.4e-1 (update) from its default run
(bench/results/h100-2026-11-27/): one pair, CPU against CUDA, is a single sample of that
spread, and it happened to be a narrow one (1.2e-3).

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


def distance(trace_a: dict, final_a: dict, trace_b: dict, final_b: dict, init: dict):
    """Loss (max rel over the steps) and update (worst rel L2) of run `a` against `b`; the
    tensor of the worst update; whether the loss-scale trajectories are equal (None without
    one)."""
    loss = max(abs(x - y) / abs(y) for x, y in zip(trace_a["losses"], trace_b["losses"]))
    worst, name = max((rel_l2(final_a[k] - init[k], final_b[k] - init[k]), k) for k in final_b)
    scales = trace_a["scales"] == trace_b["scales"] if "scales" in trace_b else None
    return loss, worst, name, scales


def reference(golden: Path, model: str, prefix: str):
    """A PyTorch reference's trace and final weights."""
    trace = json.loads((golden / f"{prefix}_{model}_trace.json").read_text())
    return trace, load(golden / f"{prefix}_{model}_final.safetensors")


def widest(distances):
    """PyTorch's own spread from its runs' distances to the first reference: the largest loss
    and update distance (and the update's tensor); the scales equal only if all are.

    >>> widest([(1e-3, 2e-2, "a", True), (6e-3, 1e-1, "b", True), (2e-3, 3e-1, "c", False)])
    (0.006, 0.3, 'c', False)
    """
    loss = max(d[0] for d in distances)
    update, name = max((d[1], d[2]) for d in distances)
    scales = [d[3] for d in distances if d[3] is not None]
    return loss, update, name, (all(scales) if scales else None)


def check(runs: Path, golden: Path, init_dir: Path, model: str, prefix: str, loss_tol: float,
          upd_tol: float, also: Path | None = None, spread_dirs: tuple = ()):
    run, saved = runs / f"run-prec-{model}-{prefix}", runs / f"prec-{model}-{prefix}.safetensors"
    steps = step_records(run)
    if steps is None or not saved.exists():
        return None
    ours = {"losses": [r["loss"] for r in steps], "scales": [r.get("loss_scale") for r in steps]}
    init = load(init_dir / f"{model}_init.safetensors")
    got = load(saved)
    refs = [reference(golden, model, prefix)] + ([reference(also, model, prefix)] if also else [])
    if any(len(ours["losses"]) != len(t["losses"]) for t, _ in refs):
        return {"error": f"{len(ours['losses'])} steps logged, PyTorch has "
                         f"{len(refs[0][0]['losses'])}"}
    rows = [distance(ours, got, t, f, init) for t, f in refs]
    # PyTorch's own spread: the first reference against the second and against each
    # further PyTorch run of this job (--spread: the same job, other summation orders).
    others = refs[1:] + [reference(d, model, prefix) for d in spread_dirs
                         if (d / f"{prefix}_{model}_trace.json").exists()]
    spread = widest([distance(*refs[0], *o, init) for o in others]) if also else None
    loss, worst, name, scales = rows[0]
    row = {"loss": loss, "update": worst, "tensor": name,
           "verdict": verdict(rows, spread, loss_tol, upd_tol)}
    if scales is not None:
        row["scales_equal"] = scales
    if also:
        row["also"] = rows[1]
        row["spread"] = spread
    return row


def verdict(rows, spread, loss_tol: float, upd_tol: float) -> str:
    """PASS when a run is within the CPU bounds of any reference (`rows`: its distances to
    each); "PASS (spread)" when, beyond them, it is as close to the first as PyTorch's own
    runs are to it (`spread`, the widest of those distances), with the first's scales; else
    FAIL.

    >>> verdict([(1e-4, 1e-3, "w", True)], None, 1e-3, 5e-3)
    'PASS'
    >>> verdict([(2e-2, 1e-3, "w", True), (1e-4, 1e-3, "w", True)], None, 1e-3, 5e-3)
    'PASS'
    >>> verdict([(1e-4, 1e-3, "w", False)], None, 1e-3, 5e-3)
    'FAIL'
    >>> cuda, cpu = (4.5e-3, 4.8e-2, "w", True), (5.3e-2, 8.9e-2, "w", False)
    >>> verdict([cuda, cpu], (5.2e-2, 9.0e-2, "w", False), 1e-3, 5e-3)
    'PASS (spread)'
    >>> verdict([cuda, cpu], (1.2e-3, 2.6e-2, "w", True), 1e-3, 5e-3)
    'FAIL'
    >>> verdict([(4.5e-3, 4.8e-2, "w", False), cpu], (5.2e-2, 9.0e-2, "w", False), 1e-3, 5e-3)
    'FAIL'
    """
    if any(l < loss_tol and u < upd_tol and s is not False for l, u, _, s in rows):
        return "PASS"
    if spread is not None:
        loss, update, _, scales = rows[0]
        if loss <= spread[0] and update <= spread[1] and scales is not False:
            return "PASS (spread)"
    return "FAIL"


def fmt(loss: float, update: float, tensor: str, scales) -> str:
    """One distance as table cells: loss, update (tensor), scales."""
    eq = {True: "equal", False: "DIFFER"}.get(scales, "-")
    return f"{loss:.2e} | {update:.2e} ({tensor}) | {eq}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", type=Path)
    ap.add_argument("--golden", type=Path, default=Path("testdata/golden"))
    ap.add_argument("--init", type=Path, default=Path("testdata/golden"),
                    help="folder of <model>_init.safetensors")
    ap.add_argument("--flags", action="store_true",
                    help="print each job's name and flags (for the shell loop that runs them)")
    ap.add_argument("--also", type=Path,
                    help="a second PyTorch reference (the CPU goldens beside --golden's CUDA ones)")
    ap.add_argument("--spread", type=Path, action="append", default=[],
                    help="(with --also; repeatable) a folder of further PyTorch runs of the jobs "
                         "(tools/reference/fp16_spread.py's variants): PyTorch's own spread is "
                         "the widest distance from --golden to --also or to any of these")
    a = ap.parse_args()
    if a.spread and not a.also:
        ap.error("--spread needs --also")
    if a.flags:
        for model, prefix, _, _ in JOBS:
            print(model, prefix, " ".join(FLAGS[prefix]))
        return 0
    head = "| job | loss vs PyTorch (max rel) | update (rel L2, worst) | scales |"
    if a.also:
        more = "".join(f", {d}" for d in a.spread)
        print(f"Against {a.golden} and {a.also} (PASS: within the CPU bounds of either; "
              "PASS (spread): as close to the first as PyTorch's own runs are to it"
              f" (the second{more}): PyTorch's own is the widest of those distances):\n")
        head += (" loss vs the second | update vs the second | scales |"
                 " PyTorch's own: loss | update | scales |")
    else:
        print(f"Against {a.golden}:\n")
    print(head + " CPU bounds |")
    print("|" + " --- |" * head.count("|"))
    ok = True
    for model, prefix, loss_tol, upd_tol in JOBS:
        r = check(a.runs, a.golden, a.init, model, prefix, loss_tol, upd_tol, a.also,
                  tuple(a.spread))
        if r is None or "error" in r:
            ok = False
            print(f"| {model} {prefix} | {'missing' if r is None else r['error']} | | | FAIL |")
            continue
        ok &= r["verdict"] != "FAIL"
        cells = fmt(r["loss"], r["update"], r["tensor"], r.get("scales_equal"))
        if a.also:
            cells += " | " + fmt(*r["also"]) + " | " + fmt(*r["spread"])
        print(f"| {model} {prefix} | {cells} | {r['verdict']} (loss "
              f"{loss_tol:g}, update {upd_tol:g}) |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
