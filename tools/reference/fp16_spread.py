#!/usr/bin/env python3
"""PyTorch's own spread on the 16-mixed golden jobs on a GPU: the same jobs as
`make_golden_precision.py --device cuda` (same init, data, 20 steps, autocast fp16 and
GradScaler), run under several PyTorch CUDA settings that change only the order in which
sums round, never the maths:

    det        deterministic algorithms, TF32 off (the reference bench/gpu.sh precision makes)
    bench      cudnn.benchmark on, nondeterministic algorithms allowed (cuDNN's fastest)
    nhwc       as `bench`, with the model and the inputs in channels_last (other cuDNN kernels)
    nosplitk   as `det`, with allow_fp16_reduced_precision_reduction off (cuBLAS's fp16 sums)

Each variant's traces and final weights go to OUT/<variant>/ under the goldens' names, so
`bench/precision_check.py RUNS --golden OUT/det --also OUT/<variant>` measures how far two
PyTorch runs that differ only in rounding order land apart, beside how far Redline's run is
from either. The CNN's fp16 jobs are chaotic (Adam's first step is the sign of gradients
that nearly cancel, and a 16-bit max-pool tie goes either way), so one pair of PyTorch runs
(CPU against CUDA) is a single sample of that spread; this gives several.

    python3 tools/reference/fp16_spread.py --out DIR [--models cnn] [--variants det,bench,nhwc,nosplitk]

Runs on a CUDA machine (bench/gpu.sh precision runs `bench` and `nhwc`); prints each
variant's losses. Anywhere, `--pairs` prints every pair's distance (bench/precision_check.py's:
loss max rel, update rel L2 and its worst tensor, scales equal) among PyTorch runs and Redline
runs of the 16-mixed jobs (a Redline run without its --save weights gives its losses alone):

    python3 tools/reference/fp16_spread.py --pairs cpu=testdata/golden cuda=DIR/det ... \
        --runs redline=RUNS_DIR ...
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_golden_precision as mgp  # noqa: E402

VARIANTS = ["det", "bench", "nhwc", "nosplitk"]


def configure(variant):
    """Sets PyTorch's CUDA flags for `variant` (TF32 stays off: the fp32 ops are fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    deterministic = variant in ("det", "nosplitk")
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = variant != "nosplitk"


def pairs(refs, runs, jobs):
    """Prints each pair's distance among PyTorch runs (`refs`: label -> golden-style folder)
    and Redline runs (`runs`: label -> precision_check RUNS_DIR) for each (model, prefix)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
    import precision_check as pc  # noqa: E402
    from pathlib import Path
    for model, prefix in jobs:
        init = pc.load(Path(mgp.INIT or "testdata/golden") / f"{model}_init.safetensors")
        items = {k: pc.reference(Path(d), model, prefix) for k, d in refs.items()}
        for k, d in runs.items():
            steps = pc.step_records(Path(d) / f"run-prec-{model}-{prefix}")
            if steps is None:
                continue
            saved = Path(d) / f"prec-{model}-{prefix}.safetensors"
            trace = {"losses": [float(r["loss"]) for r in steps],
                     "scales": [float(r["loss_scale"]) if r.get("loss_scale") else None for r in steps]}
            items[k] = (trace, pc.load(saved) if saved.exists() else None)
        print(f"\n{model} {prefix}: loss (max rel), update (rel L2, worst tensor), scales equal")
        names = list(items)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                (ta, fa), (tb, fb) = items[a], items[b]
                if fa is None or fb is None:
                    loss = max(abs(x - y) / abs(y) for x, y in zip(ta["losses"], tb["losses"]))
                    same = [float(x) for x in ta["scales"]] == [float(x) for x in tb["scales"]]
                    print(f"  {a:>14} vs {b:<14} {loss:.2e}  (losses only)  {same}")
                else:
                    common = fa.keys() & fb.keys()  # the CNN's PyTorch files lack fc1.weight
                    loss, upd, name, same = pc.distance(ta, {k: fa[k] for k in common}, tb,
                                                        {k: fb[k] for k in common}, init)
                    print(f"  {a:>14} vs {b:<14} {loss:.2e}  {upd:.2e} ({name})  {same}")


def labelled(specs):
    """LABEL=DIR arguments as an ordered dict."""
    out = {}
    for spec in specs:
        label, _, path = spec.partition("=")
        if not path:
            sys.exit(f"fp16_spread.py: {spec!r} is not LABEL=DIR")
        out[label] = path
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--pairs", nargs="+", metavar="LABEL=DIR",
                    help="print the pairwise distances of these PyTorch runs (no GPU needed)")
    ap.add_argument("--runs", nargs="*", default=[], metavar="LABEL=DIR",
                    help="with --pairs: Redline runs (precision_check.py RUNS_DIR) beside them")
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--init", default="testdata/golden")
    ap.add_argument("--models", default="cnn")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    if a.pairs:
        mgp.INIT = a.init
        jobs = [(m, prefix) for m in a.models.split(",") for prefix, _, acc, _ in mgp.FP16_RUNS
                if acc == 1]
        pairs(labelled(a.pairs), labelled(a.runs), jobs)
        return
    if not a.out:
        ap.error("--out is needed to run the jobs")
    if not torch.cuda.is_available():
        sys.exit("fp16_spread.py: torch sees no CUDA device")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.set_num_threads(1)
    mgp.DEVICE, mgp.INIT = "cuda", a.init
    plain_start = mgp.start
    for variant in a.variants.split(","):
        if variant not in VARIANTS:
            sys.exit(f"fp16_spread.py: unknown variant {variant!r} (known: {', '.join(VARIANTS)})")
        configure(variant)
        if variant == "nhwc":
            def start(name, data):
                x, y, model = plain_start(name, data)
                if x.dim() == 4:
                    x = x.contiguous(memory_format=torch.channels_last)
                    model = model.to(memory_format=torch.channels_last)
                return x, y, model
            mgp.start = start
        else:
            mgp.start = plain_start
        out = os.path.join(a.out, variant)
        os.makedirs(out, exist_ok=True)
        for name in a.models.split(","):
            for prefix, settings, accumulate, clip in mgp.FP16_RUNS:
                if accumulate > 1 and name != "mlp":
                    continue  # run_fp16 accumulates on the MLP alone
                print(f"[{variant}] ", end="")
                mgp.run_fp16(name, a.data, out, prefix, settings, accumulate, clip)


if __name__ == "__main__":
    main()
