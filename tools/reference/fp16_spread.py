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

Runs on a CUDA machine (bench/gpu.sh spread); prints each variant's losses.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--data", default="data/fashion-mnist")
    ap.add_argument("--init", default="testdata/golden")
    ap.add_argument("--models", default="cnn")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
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
                print(f"[{variant}] ", end="")
                mgp.run_fp16(name, a.data, out, prefix, settings, accumulate, clip)


if __name__ == "__main__":
    main()
