#!/usr/bin/env python3
"""Data-parallel scaling on one machine: Redline `--strategy ddp` under `mpirun -n W`
beside PyTorch DistributedDataParallel (gloo) with W processes, W = 1 and 2, MLP and CNN on
the shipped Fashion-MNIST, CPU, in one run, alternating the variants round by round.

    python3 bench/ddp.py [--rounds 3] [--worlds 1,2] [--mlp-steps 400] [--cnn-steps 60]
        [--batch 64] [--bin target/release/redline] [--python ~/.venvs/redline-ref/bin/python]
        [--out bench/results/<date>-<host>-ddp.md]

Both sides: `--batch` samples per rank per step (weak scaling: the global batch grows with
W, as DDP users run it), the same number of steps per rank, file order, Adam 1e-3, no
validation, each rank given the machine's cores divided by W as compute threads (ranks
unbound: `mpirun --bind-to none`). Reported per model and W: the median over rounds of the
training seconds per step (rank 0's; Redline's `train_s / steps`, PyTorch's timed loop
after a barrier), global samples/s, the scaling efficiency (samples/s at W over W times
samples/s at 1) and, for Redline, the share of wall time its breakdown puts in the gradient
all-reduce (`communication`). PyTorch's DDP overlaps its all-reduce with the backward, so
its share is not separable; its efficiency says what the overlap bought.

Needs `mpirun` (scripts/setup-test-tools.sh installs OpenMPI) and a release build with MPI:
`cargo build --release --features redline/mpi`.
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
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,vader,tcp",
    "OMPI_MCA_btl_tcp_if_include": "lo",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


def mpirun(world: int) -> list[str]:
    return ["mpirun", "--oversubscribe", "--bind-to", "none", "-n", str(world)]


def redline(binary: str, model: str, world: int, steps: int, batch: int, work: Path) -> dict:
    run_dir = work / f"run-{time.monotonic_ns()}"
    threads = max(1, (os.cpu_count() or 1) // world)
    cmd = mpirun(world) + [
        binary, "train", "--strategy", "ddp", "--model", model, "--device", "cpu",
        "--threads", str(threads), "--max-steps", str(steps), "--epochs", "0",
        "--batch-size", str(batch), "--no-shuffle", "--val-split", "0", "--no-validate",
        "--no-checkpoint", "--monitor-interval", "0", "--log-every", str(steps),
        "--run-dir", str(run_dir),
    ]
    p = subprocess.run(cmd, cwd=REPO, env={**os.environ, **MPI_ENV}, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    b = json.loads((run_dir / "breakdown.json").read_text())
    comm = next((c["percent"] for c in b["categories"] if c["name"] == "communication"), 0.0)
    return {"step_s": s["train_s"] / s["steps"], "samples_per_s": s["samples_per_s"],
            "comm_percent": comm}


def torch(python: str, model: str, world: int, steps: int, batch: int) -> dict:
    cmd = [python, str(REPO / "bench/ddp_torch.py"), "--model", model, "--world", str(world),
           "--steps", str(steps), "--batch", str(batch)]
    p = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-3000:]}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return {"step_s": r["step_s"], "samples_per_s": r["samples_per_s"], "comm_percent": None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target/release/redline"))
    ap.add_argument("--python", default=str(Path.home() / ".venvs/redline-ref/bin/python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--mlp-steps", type=int, default=400)
    ap.add_argument("--cnn-steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    worlds = [int(w) for w in a.worlds.split(",")]
    models = a.models.split(",")
    steps = {"mlp": a.mlp_steps, "cnn": a.cnn_steps}
    load = os.getloadavg()[0]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(a.rounds):
            for model in models:
                for world in worlds:
                    for side in ("redline", "pytorch"):
                        if side == "redline":
                            r = redline(a.bin, model, world, steps[model], a.batch, Path(tmp))
                        else:
                            r = torch(a.python, model, world, steps[model], a.batch)
                        results.setdefault((model, world, side), []).append(r)
                        print(f"round {rnd + 1} {model} W={world} {side}: "
                              f"{1e3 * r['step_s']:.2f} ms/step", file=sys.stderr)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE).stdout.strip()
    out = [
        "# Data-parallel scaling (CPU)",
        "",
        f"`python3 bench/ddp.py --rounds {a.rounds} --worlds {a.worlds} --mlp-steps "
        f"{a.mlp_steps} --cnn-steps {a.cnn_steps} --batch {a.batch}` on {platform.node()} "
        f"({os.cpu_count()} cores), load average {load:.2f} at start, commit {commit}. "
        f"Batch {a.batch} per rank; compute threads per rank = cores / W. Medians over rounds.",
        "",
        "| model | W | Redline ms/step | Redline samples/s | efficiency | all-reduce share | "
        "PyTorch ms/step | PyTorch samples/s | efficiency | Redline vs PyTorch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    med = lambda xs, k: statistics.median(x[k] for x in xs)  # noqa: E731
    for model in models:
        base = {side: med(results[(model, worlds[0], side)], "samples_per_s") / worlds[0]
                for side in ("redline", "pytorch")}
        for world in worlds:
            rl, pt = results[(model, world, "redline")], results[(model, world, "pytorch")]
            rs, ps = med(rl, "samples_per_s"), med(pt, "samples_per_s")
            out.append(
                f"| {model} | {world} | {1e3 * med(rl, 'step_s'):.2f} | {rs:,.0f} | "
                f"{100 * rs / (world * base['redline']):.0f}% | {med(rl, 'comm_percent'):.1f}% | "
                f"{1e3 * med(pt, 'step_s'):.2f} | {ps:,.0f} | "
                f"{100 * ps / (world * base['pytorch']):.0f}% | {rs / ps:.2f}x |"
            )
    text = "\n".join(out) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
