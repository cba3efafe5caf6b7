#!/usr/bin/env python3
"""Where PyTorch's CPU training step of a torchvision ResNet goes, by operator and shape
class (torch.profiler, self CPU time per step), to set beside Redline's per-layer table
(`redline train --profiler detailed`, or bench/ab_layers.py). Convolutions are labelled by
kernel size and output side (`s2`: strided), batch norms by side.

    ~/.venvs/redline-ref/bin/python bench/torch_ops.py --model resnet50 --batch 16 --size 64 \\
        --precision bf16-true
"""

import argparse
import collections
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision
from torch.profiler import ProfilerActivity, profile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="resnet50")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--precision", default="bf16-true",
                    choices=["32-true", "bf16-mixed", "bf16-true"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    net = getattr(torchvision.models, a.model)(num_classes=10)
    true16 = a.precision == "bf16-true"
    if true16:
        net = net.to(torch.bfloat16)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    x = torch.randn(a.batch, 3, a.size, a.size)
    x = x.to(torch.bfloat16) if true16 else x
    y = torch.randint(0, 10, (a.batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16-mixed"):
            out = net(x)
        F.cross_entropy(out.float(), y).backward()
        opt.step()

    for _ in range(3):
        step()
    times = []
    for _ in range(5):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        for _ in range(a.steps):
            step()
    per_step = collections.Counter()
    for e in p.key_averages(group_by_input_shape=True):
        sh, name = e.input_shapes, e.key
        if name == "aten::convolution_backward":
            go, inp, w = sh[0], sh[1], sh[2]
            key = f"conv {w[2]}x{w[3]} backward, out {go[2]}{' s2' if inp[2] != go[2] else ''}"
        elif name == "aten::mkldnn_convolution":
            inp, w = sh[0], sh[1]
            key = f"conv {w[2]}x{w[3]} forward, in {inp[2]}"
        elif "batch_norm_backward" in name:
            key = f"batch norm backward, {sh[0][2]}"
        elif "native_batch_norm" in name:
            key = f"batch norm forward, {sh[0][2]}"
        else:
            key = name
        per_step[key] += e.self_cpu_time_total / a.steps / 1000
    print(f"torch {torch.__version__}, {a.model} b{a.batch} {a.size} px {a.precision}, "
          f"{a.threads} threads: median {1000 * statistics.median(times):.1f} ms/step unprofiled")
    print("| operator (shape class) | ms/step |\n| --- | ---: |")
    for k, v in per_step.most_common(40):
        print(f"| {k} | {v:.2f} |")


if __name__ == "__main__":
    main()
