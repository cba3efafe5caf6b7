#!/usr/bin/env python3
"""Summarises the raw outputs of bench/gpu.sh as one markdown table.

    python3 bench/gpu_table.py OUT_DIR

For each Redline run (OUT_DIR/run-<name>/): median epoch seconds and samples/s from the epoch
records of metrics.jsonl, test accuracy from summary.json, GPU util % as the median NVML
utilisation of the system samples taken while training (sampled every 100 ms by
--monitor-interval 0.1), GPU busy as kernel time over wall time with kernels per step
(summary.json gpu_busy, from CUPTI), and the CUDA-event share of wall time spent on compute
(profile.json, device_compute_percent). For each PyTorch run (OUT_DIR/torch-*.json): median
epoch seconds and samples/s. Ratios are PyTorch epoch time over Redline's, same model and batch.
A last table holds each run against the targets of issues 12 and 13 (the best of the runs
that may meet it) and GPU busy beside NVML's utilisation (within 10 points).
The precision column says how each run's fp32 products were computed (Redline's
--matmul-precision; PyTorch's TF32 flags for matmuls and cuDNN convolutions).
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from pathlib import Path

N_TRAIN = 60000


def records(run: Path) -> list[dict]:
    """The run's metrics records: metrics.jsonl, else metrics.csv (which has
    the step and epoch records but not the NVML samples)."""
    path = run / "metrics.jsonl"
    if path.exists():
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    path = run / "metrics.csv"
    if not path.exists():
        return []
    out = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            rec = {}
            for key, value in row.items():
                if value in ("", None):
                    continue
                try:
                    rec[key] = float(value)
                except ValueError:
                    rec[key] = value
            out.append(rec)
    return out


def redline_row(run: Path) -> dict:
    recs = records(run)
    epochs = [r["epoch_s"] for r in recs if r.get("kind") == "epoch"]
    steps = [r for r in recs if r.get("kind") == "step"]
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    # Samples taken while the loop ran: between the first and the last step record.
    t0 = min((r["elapsed_s"] for r in steps), default=0.0)
    t1 = max((r["elapsed_s"] for r in steps), default=float("inf"))
    util = [
        g["utilization_gpu_percent"]
        for r in recs
        if r.get("kind") == "system" and t0 <= r.get("t_s", -1) <= t1
        for g in r.get("gpus", [])
        if g.get("index") == 0 and g.get("utilization_gpu_percent") is not None
    ]
    prof_path = run / "profile.json"
    prof = json.loads(prof_path.read_text()) if prof_path.exists() else {}
    med = statistics.median(epochs) if epochs else float("nan")
    return {
        "epoch_s": med,
        "samples_per_s": N_TRAIN / med if epochs else float("nan"),
        "accuracy": summary.get("test_accuracy"),
        "gpu_busy": statistics.median(util) if util else None,
        "event_compute": prof.get("device_compute_percent"),
        "kernel_busy": (summary.get("gpu_busy") or {}).get("percent"),
        "kernels_per_step": (summary.get("gpu_busy") or {}).get("kernels_per_step"),
        "flops": summary.get("flops"),
        "status": summary.get("status", "missing"),
        "precision": (summary.get("matmul_precision") or "-").split(" ")[0],
        "kernels_load_s": summary.get("gpu_kernels_load_s"),
        "train_s": summary.get("train_s"),
        # "a graph of N nodes: K kernels, ...": what each replay walks, by kind.
        "graph": (re.search(r"graph of (\d+ nodes(?:: [^;)]*)?)", summary.get("cuda_graph") or "") or [None, None])[1],
    }


def torch_precision(t: dict) -> str:
    """PyTorch's fp32 products: TF32 for matmuls and/or cuDNN convolutions, or fp32."""
    if "matmul_tf32" not in t:
        return "-"
    tf32 = [k for k, on in (("matmul", t["matmul_tf32"]), ("conv", t["cudnn_tf32"])) if on]
    return "TF32 " + "+".join(tf32) if tf32 else "fp32"


def fmt(v: object, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mfu_table(out: Path, rows: list) -> None:
    """Issue 49: each run's FLOPs counted from its model and MFU against the peak it names;
    PyTorch's runs of the zoo's MLP and CNN beside them, from their samples/s, FlopCounterMode's
    count per sample (testdata/golden/flops.json) and the fp32 peak Redline's fp32 run used."""
    with_flops = [(n, r) for n, r in rows if r.get("flops")]
    if not with_flops:
        return
    golden = json.loads(Path("testdata/golden/flops.json").read_text())["cases"]
    print()
    print("| run | FLOPs / sample | achieved TFLOP/s | peak TFLOP/s | MFU % | peak source |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    fp32_peak = None
    for name, r in with_flops:
        f = r["flops"]
        peak = f.get("peak_per_s")
        if "(fp32 dense)" in f.get("peak_source", ""):
            fp32_peak = peak
        mfu = f.get("mfu")
        print(
            f"| {name} | {f['train_per_sample']:,} | {f['achieved_per_s'] / 1e12:.3f} | "
            f"{fmt(peak and peak / 1e12, '.1f')} | {fmt(mfu and 100 * mfu, '.2f')} | {f['peak_source']} |"
        )
    for tj in sorted(out.glob("torch-mfu-*.json")):
        lines = tj.read_text().strip().splitlines()
        model = tj.stem.split("-")[2]
        if not lines or model not in golden or fp32_peak is None:
            continue
        t = json.loads(lines[-1])
        per = golden[model]["forward"] + golden[model]["backward"]
        achieved = t["samples_per_s"] * per
        print(
            f"| pytorch {tj.stem[6:]} ({torch_precision(t)}) | {per:,} | {achieved / 1e12:.3f} | "
            f"{fp32_peak / 1e12:.1f} | {100 * achieved / fp32_peak:.2f} | FlopCounterMode count, "
            f"Redline's fp32 peak |"
        )


def main(out: Path) -> int:
    rows = []
    for run in sorted(out.glob("run-*")):
        if run.name.startswith("run-prec-"):
            continue  # 20-step golden jobs: bench/precision_check.py's table
        r = redline_row(run)
        rows.append((f"redline {run.name[4:]}", r))
    for tj in sorted(out.glob("torch-*.json")):
        text = tj.read_text().strip().splitlines()
        if not text:
            continue
        t = json.loads(text[-1])
        rows.append(
            (
                f"pytorch {tj.stem[6:]}",
                {
                    "epoch_s": t["median_epoch_s"],
                    "samples_per_s": t["samples_per_s"],
                    "accuracy": t.get("test_accuracy"),
                    "gpu_busy": None,
                    "event_compute": None,
                    "kernel_busy": None,
                    "kernels_per_step": None,
                    "status": "finished",
                    "precision": torch_precision(t),
                },
            )
        )
    print(
        "| run | median epoch s | samples/s | test acc | GPU busy % (kernel time) | kernels/step "
        "| GPU util % (NVML) | compute % (events) | precision | status |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |")
    for name, r in rows:
        print(
            f"| {name} | {fmt(r['epoch_s'], '.3f')} | {fmt(r['samples_per_s'], ',.0f')} | "
            f"{fmt(r['accuracy'], '.4f')} | {fmt(r['kernel_busy'], '.1f')} | "
            f"{fmt(r['kernels_per_step'], '.1f')} | {fmt(r['gpu_busy'], '.0f')} | "
            f"{fmt(r['event_compute'], '.1f')} | {r['precision']} | {r['status']} |"
        )
    by = dict(rows)
    mfu_table(out, rows)
    print()
    for model, rl, ref in [
        ("mlp b64 defaults", "redline mlp-defaults", "pytorch graph-mlp-b64"),
        ("mlp b64 defaults", "redline mlp-defaults", "pytorch tensor-mlp"),
        ("mlp b64 eager", "redline mlp-eager", "pytorch tensor-mlp"),
        ("mlp b64 streaming", "redline mlp-streaming", "pytorch tensor-mlp"),
        ("mlp b512 defaults", "redline mlp-b512-defaults", "pytorch graph-mlp-b512"),
        ("cnn b64 defaults", "redline cnn-defaults", "pytorch graph-cnn-b64-highest"),
        ("cnn b64 eager", "redline cnn-eager", "pytorch tensor-cnn"),
        ("cnn b512 defaults", "redline cnn-b512-defaults", "pytorch graph-cnn-b512"),
        # The convolutions through cuDNN, as PyTorch's (fp32 math, no TF32).
        ("cnn b64 cudnn", "redline cnn-cudnn", "pytorch graph-cnn-b64-highest"),
        ("cnn b512 cudnn", "redline cnn-b512-cudnn", "pytorch graph-cnn-b512"),
        # Like for like on precision: PyTorch's default convolutions are TF32 (cuDNN).
        ("cnn b64, TF32 both", "redline cnn-tf32", "pytorch graph-cnn-b64"),
        ("cnn b512, TF32 both", "redline cnn-b512-tf32", "pytorch graph-cnn-b512"),
        # Earlier runs' names (bench/results of issues 12-13).
        ("mlp b64 graph+fused", "redline mlp-graph-fused", "pytorch graph-mlp-b64"),
        ("cnn b64 graph+fused", "redline cnn-graph-fused", "pytorch graph-cnn-b64"),
    ]:
        if rl in by and ref in by and by[rl]["epoch_s"] == by[rl]["epoch_s"]:
            print(f"- {model}: {ref} / {rl} = {by[ref]['epoch_s'] / by[rl]['epoch_s']:.2f}x")
    code = by.get("redline mlp-defaults", {}).get("kernels_load_s")
    jit = by.get("redline mlp-ptx-jit", {}).get("kernels_load_s")
    if code is not None and jit is not None:
        print(f"- first kernel load, JIT cache emptied: {code:.3g} s from candle's machine code "
              f"(mlp-defaults), {jit:.3g} s JIT-compiling its PTX (mlp-ptx-jit, REDLINE_CANDLE_PTX=1)")
    graphs = [(name[8:], r["graph"]) for name, r in rows if name.startswith("redline ") and r.get("graph")]
    if graphs:
        print()
        print("Captured steps (the summary's cuda_graph line):")
        for name, graph in graphs:
            print(f"- {name}: {graph}")
    print()
    targets(by)
    return 0


# Seconds of training a run needs before its GPU busy is held to NVML's utilisation.
LONG_RUN_S = 4.0

# The issues' targets: (issue, what, runs that may meet it (the best counts), key, bound, at most?).
TARGETS = [
    ("22", "MLP b64 s/epoch, defaults", ["mlp-defaults"], "epoch_s", 0.08, True),
    ("22", "MLP b512 s/epoch", ["mlp-b512-defaults"], "epoch_s", 0.015, True),
    ("22", "CNN b64 s/epoch", ["cnn-defaults", "cnn-tf32", "cnn-cudnn"], "epoch_s", 0.4, True),
    ("22", "CNN b512 s/epoch", ["cnn-b512-defaults", "cnn-b512-tf32", "cnn-b512-cudnn"], "epoch_s",
     0.1, True),
    ("22", "MLP b512 GPU busy %", ["mlp-b512-defaults", "busy-mlp-b512"], "kernel_busy", 90.0, False),
    # bench/gpu.sh empties the driver's JIT cache before mlp-defaults (from 2026-11-25 on).
    ("22", "first run's kernel load s (JIT cache emptied)", ["mlp-defaults"], "kernels_load_s", 1.0, True),
    ("13", "MLP kernels per step", ["mlp-defaults"], "kernels_per_step", 10.0, True),
]


def targets(by: dict) -> None:
    """Each target against the best of its runs, and GPU busy beside NVML (within 10 points)."""
    print("| issue | target | run | measured | bound | met |")
    print("| --- | --- | --- | ---: | ---: | --- |")
    for issue, what, runs, key, bound, at_most in TARGETS:
        have = [(by[f"redline {r}"][key], r) for r in runs if by.get(f"redline {r}", {}).get(key) is not None]
        have = [(v, r) for v, r in have if v == v]  # drop NaN
        if not have:
            print(f"| {issue} | {what} | - | - | {bound:g} | not run |")
            continue
        v, r = min(have) if at_most else max(have)
        met = v <= bound if at_most else v >= bound
        print(f"| {issue} | {what} | {r} | {v:.4g} | {'<=' if at_most else '>='} {bound:g} | {'yes' if met else 'NO'} |")
    for name, r in by.items():
        if not name.startswith("redline ") or r["kernel_busy"] is None or r["gpu_busy"] is None:
            continue
        gap = r["kernel_busy"] - r["gpu_busy"]
        # NVML's utilisation covers its own sample period (1/6 s to 1 s): only a run that
        # trains for seconds (bench/gpu.sh part `busy`) gives it a steady window to agree on.
        if (r.get("train_s") or 0.0) < LONG_RUN_S:
            print(f"| 22 | GPU busy within 10 points of NVML | {name[8:]} | {gap:+.1f} | 10 | "
                  f"not judged (trained {r.get('train_s') or 0:.2g} s < {LONG_RUN_S:g} s) |")
            continue
        print(f"| 22 | GPU busy within 10 points of NVML | {name[8:]} | {gap:+.1f} | 10 | {'yes' if abs(gap) <= 10 else 'NO'} |")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results/gpu-raw")))
