#!/usr/bin/env python3
"""Run Redline and the PyTorch reference workloads side by side and print a markdown report.

Normally started by bench/run.sh (which prepares the PyTorch venv and builds Redline); it can
be run directly with the venv's python:

    $VENV/bin/python bench/compare.py [--epochs 5] [--torch-epochs N] [--quick] ...

The report (markdown) goes to stdout; progress and child logs go to stderr. Only the Python
standard library is needed here; PyTorch runs in child processes (bench/torch_mnist.py),
started with --python (default: this interpreter).

Rows (see bench/README.md):
  (a) redline train --model mlp, Adam 1e-3, batch 64, --epochs E
  (b) PyTorch tutorial pipeline (torchvision FashionMNIST + DataLoader), same MLP, --torch-epochs
  (c) PyTorch, whole split as one pre-normalised tensor + randperm per epoch, same MLP, E epochs
  (d) CNN, --cnn-epochs (1): redline --model cnn vs PyTorch (c)-style
  (e) MLP batch 512: redline vs PyTorch (c)-style (--with-b512, on by default)
Every PyTorch workload runs once per --threads value (default 1 and 2) and the best median
is reported; the detail table shows all of them.

--before BIN adds a second Redline binary (say, built from an older commit): each Redline
workload then runs BIN and the current binary alternately, --rounds times each, and a
"Before / after" table gives both medians (over all epochs of all rounds) and their ratio.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
FULL_TRAIN = 60000


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


def sh(cmd: list[str], cwd: Path | None = None) -> str:
    """Output of a small informational command, or '' when it fails."""
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def busy_builds() -> list[str]:
    """cargo/rustc/redline processes running now (called only while none of ours runs)."""
    out = []
    for name in ("cargo", "rustc", "redline"):
        got = sh(["pgrep", "-a", "-x", name])
        for line in got.splitlines():
            parts = line.split()
            if not parts:
                continue
            # "PID /path/to/rustc --crate-name NAME ..." -> "PID rustc NAME"
            what = [parts[0], os.path.basename(parts[1]) if len(parts) > 1 else name]
            if "--crate-name" in parts[:-1]:
                what.append(parts[parts.index("--crate-name") + 1])
            elif len(parts) > 2:
                what.append(parts[2])
            out.append(" ".join(what))
    return out


def loadavg() -> tuple[float, float, float]:
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


# ----------------------------------------------------------------------------- jobs


@dataclass
class Job:
    key: str  # the comparable group: "mlp-b64", "cnn-b64", "mlp-b512"
    label: str  # "(a) MLP b64" ...
    impl: str  # "redline" | "pytorch"
    model: str
    batch_size: int
    epochs: int
    workload: str = ""  # pytorch: tutorial | tensor
    threads: int = 0  # pytorch only
    variant: str = ""  # redline only: "before" for the --before binary, "" for the current one
    round: int = 0  # redline only: 0-based repetition (--rounds)
    result: dict = field(default_factory=dict)
    error: str = ""
    busy_note: str = ""  # other heavy processes seen right before this run

    @property
    def name(self) -> str:
        if self.impl == "redline":
            who = "redline-before" if self.variant == "before" else "redline"
            again = f" #{self.round + 1}" if self.round else ""
            return f"{who} {self.model} b{self.batch_size}{again}"
        return f"pytorch-{self.workload} {self.model} b{self.batch_size} t{self.threads}"


def torch_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(threads)
    env["MKL_NUM_THREADS"] = str(threads)
    if threads >= 2:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        env.pop("OMP_WAIT_POLICY", None)
    return env


def wait_until_quiet(job: Job, args: argparse.Namespace) -> None:
    """Before each run: if a build or another redline started meanwhile, wait for it to end
    (up to --busy-wait s; not with --allow-busy) and note it in the report."""
    seen = busy_builds()
    if not seen:
        return
    job.busy_note = "; ".join(seen)
    if args.allow_busy:
        return
    log(f"busy before {job.name}: {job.busy_note}; waiting up to {args.busy_wait:.0f} s")
    t0 = time.monotonic()
    while seen and time.monotonic() - t0 < args.busy_wait:
        time.sleep(10)
        seen = busy_builds()
    if seen:
        job.busy_note += " (still running when this run started)"
    else:
        job.busy_note += f" (waited {time.monotonic() - t0:.0f} s for them to end)"
        time.sleep(5)


def run_torch(job: Job, args: argparse.Namespace, tv_root: Path) -> None:
    cmd = [
        args.python,
        str(BENCH / "torch_mnist.py"),
        "--workload", job.workload,
        "--model", job.model,
        "--threads", str(job.threads),
        "--epochs", str(job.epochs),
        "--batch-size", str(job.batch_size),
        "--lr", str(args.lr),
        "--seed", str(args.seed),
        "--data", str(args.data),
        "--tv-root", str(tv_root),
    ]
    if args.limit:
        cmd += ["--limit", str(args.limit)]
    log(f"\n=== {job.label}: {job.name}\n$ {shlex.join(cmd)}")
    p = subprocess.run(cmd, env=torch_env(job.threads), stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        job.error = f"exit {p.returncode}; stdout: {p.stdout[-500:]!r}"
        log(f"!!! {job.name} failed: {job.error}")
        return
    job.result = json.loads(lines[-1])


def parse_redline_metrics(path: Path) -> dict:
    """Median training epoch_s and final test accuracy from a `redline train --metrics` file.

    Test accuracy: the `{"kind":"test"}` record when the run wrote one (since the step contract),
    else the last epoch's `val_accuracy` (or `test_accuracy`, as older builds named it); on
    Fashion-MNIST validation is the test split, so all three are the same number."""
    epochs = []
    test = None
    with open(path) as f:
        for ln in f:
            ln = ln.strip()
            if not ln:
                continue
            rec = json.loads(ln)
            if rec.get("kind") == "epoch":
                epochs.append(rec)
            elif rec.get("kind") == "test":
                test = rec
    if not epochs:
        raise ValueError(f"no {{\"kind\":\"epoch\"}} lines in {path}")
    epochs.sort(key=lambda r: r.get("epoch", 0))
    epoch_s = [float(r["epoch_s"]) for r in epochs]
    if test is not None and "test_accuracy" in test:
        acc = float(test["test_accuracy"])
    else:
        last = epochs[-1]
        acc = float(last["val_accuracy"] if "val_accuracy" in last else last["test_accuracy"])
    if acc > 1.0:  # tolerate a percentage, the contract says a fraction
        acc /= 100.0
    med = statistics.median(epoch_s)
    return {
        "impl": "redline",
        "epochs_seen": len(epochs),
        "epoch_s": [round(s, 4) for s in epoch_s],
        "eval_s": [round(float(r.get("eval_s", 0.0)), 4) for r in epochs],
        "train_loss": [r.get("train_loss") for r in epochs],
        "median_epoch_s": med,
        "samples_per_s": FULL_TRAIN / med,
        "train_samples": FULL_TRAIN,
        "test_accuracy": acc,
    }


def run_redline(job: Job, args: argparse.Namespace, workdir: Path) -> None:
    stem = f"{job.variant or 'current'}-{job.model}-b{job.batch_size}-r{job.round}"
    metrics = workdir / f"metrics-{stem}.jsonl"
    logf = workdir / f"redline-{stem}.log"
    metrics.unlink(missing_ok=True)
    binary = args.before if job.variant == "before" else args.redline_bin
    cmd = [
        binary, "train",
        "--model", job.model,
        "--epochs", str(job.epochs),
        "--batch-size", str(job.batch_size),
        "--optimizer", "adam",
        "--lr", str(args.lr),
        "--seed", str(args.seed),
        "--device", "cpu",
        "--data", str(args.data),
        # All 60,000 training images, as PyTorch trains on: no validation hold-out.
        "--val-split", "0",
        "--metrics", str(metrics),
    ] + shlex.split(args.redline_args)
    log(f"\n=== {job.label}: {job.name}\n$ (cd {workdir}) {shlex.join(cmd)}")
    t0 = time.perf_counter()
    with open(logf, "w") as lf:
        # cwd = scratch dir, so any run folders/checkpoints redline writes stay out of the repo
        p = subprocess.run(cmd, cwd=workdir, stdout=lf, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        tail = logf.read_text(errors="replace")[-1500:]
        job.error = f"exit {p.returncode}; log tail:\n{tail}"
        log(f"!!! {job.name} failed: {job.error}")
        return
    try:
        res = parse_redline_metrics(metrics)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        job.error = f"cannot parse {metrics}: {e}"
        log(f"!!! {job.name}: {job.error}")
        return
    if res["epochs_seen"] != job.epochs:
        log(f"warning: {job.name}: expected {job.epochs} epoch lines, found {res['epochs_seen']}")
    res.update(model=job.model, batch_size=job.batch_size, epochs=job.epochs, process_wall_s=round(wall, 3))
    job.result = res
    log(f"[{job.name}] epochs {res['epoch_s']} s, acc {res['test_accuracy']:.4f}")


# ----------------------------------------------------------------------------- report


def fmt_s(x: float) -> str:
    return f"{x:.3f}" if x < 10 else f"{x:.2f}"


def best_of(jobs: list[Job]) -> Job | None:
    ok = [j for j in jobs if j.result]
    return min(ok, key=lambda j: j.result["median_epoch_s"]) if ok else None


def pooled(jobs: list[Job]) -> dict | None:
    """One Redline result from all rounds of a workload: the median over every epoch of every
    round (not the best round, which would favour whichever binary got the luckier run)."""
    ok = [j for j in jobs if j.result]
    if not ok:
        return None
    epoch_s = [s for j in ok for s in j.result["epoch_s"]]
    med = statistics.median(epoch_s)
    return {
        **ok[-1].result,
        "epoch_s": epoch_s,
        "median_epoch_s": med,
        "samples_per_s": FULL_TRAIN / med,
        "round_medians": [j.result["median_epoch_s"] for j in ok],
        "accuracies": sorted({round(j.result["test_accuracy"], 6) for j in ok}),
    }


def before_after(groups: dict[str, list[Job]]) -> list[str]:
    """The "Before / after" section (only with --before)."""
    out = [
        "",
        "## Before / after (Redline)",
        "",
        "Each Redline workload ran the --before binary and the current one alternately. Median = over",
        "every training epoch of every round; ratio = current / before (< 1: the current build is",
        "faster). The round columns give each round's own median, to show the spread.",
        "",
        "| workload | before median s | current median s | current / before | before, each round | current, each round | test acc before | test acc current |",
        "| --- | ---: | ---: | ---: | --- | --- | --- | --- |",
    ]
    for gj in groups.values():
        mine = [j for j in gj if j.impl == "redline"]
        if not mine:
            continue
        old = pooled([j for j in mine if j.variant == "before"])
        new = pooled([j for j in mine if j.variant != "before"])
        desc = f"{mine[0].model.upper()} b{mine[0].batch_size}"
        if old is None or new is None:
            out.append(f"| {desc} | {'FAILED' if old is None else fmt_s(old['median_epoch_s'])} | "
                       f"{'FAILED' if new is None else fmt_s(new['median_epoch_s'])} | n/a | | | | |")
            continue
        ratio = new["median_epoch_s"] / old["median_epoch_s"]

        def each(r: dict) -> str:
            return " ".join(f"{m:.4f}" for m in r["round_medians"])

        def accs(r: dict) -> str:
            return " ".join(f"{a * 100:.2f}%" for a in r["accuracies"])

        out.append(
            f"| {desc} | {old['median_epoch_s']:.4f} | {new['median_epoch_s']:.4f} | {ratio:.3f} | "
            f"{each(old)} | {each(new)} | {accs(old)} | {accs(new)} |"
        )
    return out


def header(args: argparse.Namespace, torch_ver: str, start: dict) -> list[str]:
    commit = sh(["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=REPO) or "(no commit yet)"
    dirty = sh(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO)
    if dirty:
        commit += " (+ uncommitted changes)"
    cpu = ""
    for ln in sh(["lscpu"]).splitlines():
        if ln.startswith("Model name:"):
            cpu = ln.split(":", 1)[1].strip()
    redline_ver = sh([args.redline_bin, "--version"]) if not args.skip_redline else "(skipped)"
    before = [f"before binary:   {args.before}  {sh([args.before, '--version'])}"] if args.before else []
    la = start["load"]
    builds = start["builds"]
    out = [
        f"# Redline vs PyTorch, CPU — {start['when']}",
        "",
        "```",
        f"uptime:          {start['uptime']}",
        f"nproc:           {sh(['nproc']) or os.cpu_count()}",
        f"cpu:             {cpu or platform.processor()}",
        f"host:            {socket.gethostname()}  ({platform.platform()})",
        f"redline commit:  {commit}",
        f"redline binary:  {args.redline_bin}  {redline_ver}",
        *before,
        f"torch:           {torch_ver}",
        f"python:          {args.python}",
        f"cargo/rustc/redline running at start: {'; '.join(builds) if builds else 'none'}",
        f"command:         {' '.join(shlex.quote(a) for a in sys.argv)}",
        "```",
    ]
    if args.limit:
        out += ["", f"**SMOKE RUN: PyTorch trains on only the first {args.limit} samples (--limit). "
                "Numbers are not comparable.**"]
    if args.quick:
        out += ["", "**QUICK RUN (--quick): 1 epoch everywhere; not a measurement.**"]
    if la[0] > 0.5:
        out += ["", f"**WARNING: 1-min load average {la[0]:.2f} at start (machine not idle).**"]
    return out


def report(args: argparse.Namespace, jobs: list[Job], torch_ver: str, start: dict) -> str:
    out = header(args, torch_ver, start)
    groups: dict[str, list[Job]] = {}
    for j in jobs:
        groups.setdefault(j.key, []).append(j)

    out += [
        "",
        "## Summary",
        "",
        "Median training seconds per epoch (validation excluded); samples/s = training samples / median;",
        "test accuracy on the 10k test split after the last epoch; ratio = PyTorch best median / Redline",
        "median for the same model and batch (> 1: Redline is faster). PyTorch rows: best over threads.",
        "",
        "| row | workload | implementation | threads | epochs | median epoch s | samples/s | test acc | PyTorch / Redline |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, gj in groups.items():
        red = pooled([j for j in gj if j.impl == "redline" and j.variant != "before"])
        red_med = red["median_epoch_s"] if red else None
        # one row per (label, workload): redline, then each pytorch workload's best thread count
        seen: list[tuple[str, str, str]] = []
        for j in gj:
            t = (j.label, j.impl, j.workload)
            if t not in seen:
                seen.append(t)
        for label, impl, workload in seen:
            cands = [j for j in gj if (j.label, j.impl, j.workload) == (label, impl, workload)]
            if impl == "redline":
                cands = [j for j in cands if j.variant != "before"]
                mine = pooled(cands)
                b = Job(**{**cands[0].__dict__, "result": mine}) if mine else None
            else:
                b = best_of(cands)
            if impl == "redline":
                what = f"`redline train --model {cands[0].model}`"
                threads = "default"
            else:
                what = {"tutorial": "PyTorch tutorial (torchvision + DataLoader)",
                        "tensor": "PyTorch one tensor + randperm"}[workload]
                threads = str(b.threads) if b else "-"
            desc = f"{cands[0].model.upper()} b{cands[0].batch_size}"
            if b is None:
                err = "; ".join(j.error.splitlines()[0] for j in cands if j.error) or "not run"
                out.append(f"| {label} | {desc} | {what} | {threads} | {cands[0].epochs} | FAILED | | | {err} |")
                continue
            r = b.result
            if impl == "redline":
                ratio = "1.00 (ref)"
            elif red_med:
                ratio = f"{r['median_epoch_s'] / red_med:.2f}"
            else:
                ratio = "n/a"
            out.append(
                f"| {label} | {desc} | {what} | {threads} | {b.epochs} | {fmt_s(r['median_epoch_s'])} | "
                f"{r['samples_per_s']:,.0f} | {r['test_accuracy'] * 100:.2f}% | {ratio} |"
            )

    out += [
        "",
        "## Detail (every run)",
        "",
        "| run | threads | OMP_WAIT_POLICY | epochs | per-epoch train s | median s | samples/s | test acc | train loss (last) |",
        "| --- | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for j in jobs:
        if not j.result:
            out.append(f"| {j.label} {j.name} | {j.threads or 'default'} | | {j.epochs} | FAILED | | | | |")
            continue
        r = j.result
        per = ", ".join(fmt_s(s) for s in r["epoch_s"])
        loss = r.get("train_loss") or [None]
        last_loss = f"{loss[-1]:.4f}" if isinstance(loss[-1], (int, float)) else "-"
        pol = ("PASSIVE" if j.threads >= 2 else "-") if j.impl == "pytorch" else "-"
        out.append(
            f"| {j.label} {j.name} | {j.threads or 'default'} | {pol} | {j.epochs} | {per} | "
            f"{fmt_s(r['median_epoch_s'])} | {r['samples_per_s']:,.0f} | {r['test_accuracy'] * 100:.2f}% | {last_loss} |"
        )

    if args.before:
        out += before_after(groups)

    noisy = [j for j in jobs if j.busy_note]
    if noisy:
        out += ["", "## Busy machine", "", "Other heavy processes were seen right before these runs:", ""]
        out += [f"- {j.label} {j.name}: {j.busy_note}" for j in noisy]

    errors = [j for j in jobs if j.error]
    if errors:
        out += ["", "## Failures", ""]
        for j in errors:
            out += [f"### {j.label} {j.name}", "", "```", j.error.strip(), "```", ""]

    out += ["", "```", f"uptime at end:   {sh(['uptime'])}", "```", "",
            "<details><summary>raw results (JSON lines)</summary>", "", "```"]
    for j in jobs:
        out.append(json.dumps({"label": j.label, "name": j.name, **j.result, **({"error": j.error} if j.error else {})}))
    out += ["```", "", "</details>", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5, help="MLP epochs for Redline and PyTorch (c)/(e)")
    p.add_argument("--torch-epochs", type=int, default=None,
                   help="epochs of the slow PyTorch tutorial workload (b); default = --epochs")
    p.add_argument("--cnn-epochs", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="1 epoch everywhere (smoke run)")
    p.add_argument("--threads", default="1,2", help="PyTorch thread counts to try (comma list)")
    p.add_argument("--with-b512", dest="b512", action="store_true", default=True,
                   help="also run MLP batch 512 (default on)")
    p.add_argument("--no-b512", dest="b512", action="store_false")
    p.add_argument("--no-cnn", dest="cnn", action="store_false", default=True)
    p.add_argument("--no-tutorial", dest="tutorial", action="store_false", default=True)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", type=Path, default=REPO / "data" / "fashion-mnist")
    p.add_argument("--python", default=sys.executable, help="python with torch+torchvision")
    p.add_argument("--redline-bin", default=str(REPO / "target" / "release" / "redline"))
    p.add_argument("--redline-args", default="", help="extra flags appended to every `redline train`")
    p.add_argument("--before", default="",
                   help="a second redline binary (an older build) to run alternately with --redline-bin")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each Redline workload (each binary with --before), alternating")
    p.add_argument("--skip-redline", action="store_true", help="PyTorch rows only (smoke tests)")
    p.add_argument("--limit", type=int, default=0,
                   help="SMOKE TESTS ONLY: PyTorch trains on the first N samples")
    p.add_argument("--pause", type=float, default=2.0, help="seconds of rest between runs")
    p.add_argument("--allow-busy", action="store_true",
                   help="run even if cargo/rustc/redline processes are running (numbers will be noisy)")
    p.add_argument("--busy-wait", type=float, default=600.0,
                   help="if a build starts mid-run, wait up to this many seconds before the next run")
    a = p.parse_args(argv)
    if a.quick:
        a.epochs = a.cnn_epochs = 1
        a.torch_epochs = 1
    if a.torch_epochs is None:
        a.torch_epochs = a.epochs
    a.thread_list = [int(t) for t in a.threads.split(",") if t.strip()]
    a.data = a.data.resolve()
    return a


def plan(args: argparse.Namespace) -> list[Job]:
    jobs: list[Job] = []

    def red(key: str, label: str, model: str, bs: int, ep: int) -> None:
        if args.skip_redline:
            return
        for r in range(max(args.rounds, 1)):
            if args.before:
                jobs.append(Job(key, label, "redline", model, bs, ep, variant="before", round=r))
            jobs.append(Job(key, label, "redline", model, bs, ep, round=r))

    def pt(key: str, label: str, workload: str, model: str, bs: int, ep: int) -> None:
        for t in args.thread_list:
            jobs.append(Job(key, label, "pytorch", model, bs, ep, workload=workload, threads=t))

    red("mlp-b64", "(a)", "mlp", 64, args.epochs)
    if args.tutorial:
        pt("mlp-b64", "(b)", "tutorial", "mlp", 64, args.torch_epochs)
    pt("mlp-b64", "(c)", "tensor", "mlp", 64, args.epochs)
    if args.cnn:
        red("cnn-b64", "(d)", "cnn", 64, args.cnn_epochs)
        pt("cnn-b64", "(d)", "tensor", "cnn", 64, args.cnn_epochs)
    if args.b512:
        red("mlp-b512", "(e)", "mlp", 512, args.epochs)
        pt("mlp-b512", "(e)", "tensor", "mlp", 512, args.epochs)
    return jobs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    builds = busy_builds()
    if builds and not args.allow_busy:
        log("refusing to benchmark while a build (or another redline) runs (use --allow-busy to override):\n  " + "\n  ".join(builds))
        return 3
    if not args.skip_redline and not os.access(args.redline_bin, os.X_OK):
        log(f"no executable redline binary at {args.redline_bin} (cargo build --release, or --skip-redline)")
        return 2
    if args.before and not os.access(args.before, os.X_OK):
        log(f"--before {args.before}: not an executable file")
        return 2
    torch_ver = sh([args.python, "-c", "import torch, torchvision; print('torch', torch.__version__, "
                    "'| torchvision', torchvision.__version__, '| default threads', torch.get_num_threads())"])
    if not torch_ver:
        log(f"{args.python} cannot import torch + torchvision")
        return 2
    start = {"uptime": sh(["uptime"]), "load": loadavg(), "builds": builds,
             "when": dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}
    log(f"uptime: {start['uptime']}\n{torch_ver}")

    jobs = plan(args)
    workdir = Path(tempfile.mkdtemp(prefix="redline-bench-"))  # outside the repo
    tv_root = workdir / "torchvision"
    try:
        for i, job in enumerate(jobs):
            if i and args.pause:
                time.sleep(args.pause)
            wait_until_quiet(job, args)
            if job.impl == "redline":
                run_redline(job, args, workdir)
            else:
                run_torch(job, args, tv_root)
        print(report(args, jobs, torch_ver, start), flush=True)
    finally:
        if not os.environ.get("REDLINE_BENCH_KEEP"):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            log(f"kept scratch folder {workdir}")
    return 1 if any(j.error for j in jobs) else 0


if __name__ == "__main__":
    sys.exit(main())
