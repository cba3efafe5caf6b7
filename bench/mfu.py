#!/usr/bin/env python3
"""MFU on this machine's CPU (issue 49), Redline beside PyTorch in one run, on the same threads.

For each job (the zoo's MLP and CNN on the shipped Fashion-MNIST, fp32 and bf16-mixed):
Redline's run gives its FLOPs per sample (counted from the model), its samples/s and its MFU
against the peak it measured (the CPU's GEMM for the run's math, `summary.json` `flops`);
PyTorch's run of the same job (bench/torch_mnist.py, the whole split as one tensor) gives its
samples/s, and its MFU is read against the same peak with FlopCounterMode's count per sample
(testdata/golden/flops.json; equal to Redline's count). Then the CPU peak probe ten times
(crates/redline-kernels/examples/peak_probe.rs) for its repeatability.

    cargo build --release -p redline && cargo build --release -p redline-kernels --example peak_probe
    ~/.venvs/redline-ref/bin/python bench/mfu.py [--epochs 2] [--threads N]

The markdown table goes to stdout.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def redline(model, precision, epochs, threads, run):
    cmd = [str(ROOT / "target/release/redline"), "train", "--device", "cpu", "--model", model,
           "--precision", precision, "--epochs", str(epochs), "--threads", str(threads),
           "--monitor-interval", "0", "--no-checkpoint", "--run-dir", str(run)]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=sys.stderr)
    return json.loads((run / "summary.json").read_text())


def torch_run(model, precision, epochs, threads):
    cmd = [sys.executable, str(ROOT / "bench/torch_mnist.py"), "--device", "cpu", "--workload",
           "tensor", "--model", model, "--epochs", str(epochs), "--threads", str(threads),
           "--precision", precision]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    golden = json.loads((ROOT / "testdata/golden/flops.json").read_text())["cases"]
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"threads: {args.threads}\n")
    print("| job | precision | FLOPs/sample | Redline samples/s | Redline MFU % | PyTorch samples/s "
          "| PyTorch MFU % | peak GFLOP/s (source) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for model in ["mlp", "cnn"]:
            for precision in ["32-true", "bf16-mixed"]:
                s = redline(model, precision, args.epochs, args.threads,
                            Path(tmp) / f"{model}-{precision}")
                f = s["flops"]
                t = torch_run(model, precision, args.epochs, args.threads)
                per = golden[model]["forward"] + golden[model]["backward"]
                assert per == f["train_per_sample"], (per, f["train_per_sample"])
                torch_mfu = t["samples_per_s"] * per / f["peak_per_s"]
                print(f"| {model} b64 | {precision} | {per:,} | {s['samples_per_s']:,.0f} | "
                      f"{100 * f['mfu']:.1f} | {t['samples_per_s']:,.0f} | {100 * torch_mfu:.1f} | "
                      f"{f['peak_per_s'] / 1e9:.0f} ({f['peak_source']}) |", flush=True)
    probe = ROOT / "target/release/examples/peak_probe"
    if probe.exists():
        print("\nCPU peak probe, ten runs per row (spread = max / min - 1):\n")
        print("```")
        print(subprocess.run([str(probe), "1", str(args.threads)], capture_output=True, text=True,
                             check=True).stdout.rstrip())
        print("```")


if __name__ == "__main__":
    main()
