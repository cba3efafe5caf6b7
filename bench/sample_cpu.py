#!/usr/bin/env python3
"""Generation speed on the CPU: `redline sample` against transformers' `generate`, greedy,
on the same GPT-2 folder and threads, in one run (issue 50). The folder is GPT-2 124M's
shape (12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens) with transformers'
random initialisation, written by `save_pretrained` once into --dir (no download: the
weights' values do not change the work). Both decode greedily with a key/value cache from
the same prompt ids; the ids must agree (a check of the 124M-shaped model too).

    ~/.venvs/redline-ref/bin/python bench/sample_cpu.py --bin target/release/redline \\
        --threads 2 --prompt 64 --tokens 64

Redline's time is the generation it reports on stderr (prompt and new tokens, the model
already loaded); transformers' is `generate`'s wall time, median of --reps after one
warm-up. Prints both and the ratio.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def folder(path):
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(path, safe_serialization=True)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/redline")
    ap.add_argument("--dir", default="/tmp/redline-gpt2-random")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = folder(args.dir)
    ids = [(i * 7919 + 13) % 50257 for i in range(args.prompt)]

    model = GPT2LMHeadModel.from_pretrained(path).eval()
    x = torch.tensor([ids])

    def gen():
        with torch.no_grad():
            return model.generate(x, do_sample=False, max_new_tokens=args.tokens,
                                  min_new_tokens=args.tokens, pad_token_id=0,
                                  attention_mask=torch.ones_like(x))[0, len(ids):].tolist()

    theirs = gen()
    t_times = []
    for _ in range(args.reps):
        t = time.perf_counter()
        gen()
        t_times.append(time.perf_counter() - t)

    cmd = [args.bin, "sample", path, "--device", "cpu", "--temperature", "0", "--ids",
           "--tokens", str(args.tokens), "--prompt-ids", " ".join(map(str, ids))]
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    r_times, ours = [], None
    for _ in range(args.reps + 1):
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"failed: {p.stderr[-2000:]}")
        ours = [int(v) for v in p.stdout.split()]
        m = re.search(r"generated \d+ tokens in ([0-9.]+) s", p.stderr)
        if not m:
            sys.exit(f"no timing line in: {p.stderr[-1000:]}")
        r_times.append(float(m.group(1)))
    r_times = r_times[1:]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"torch {torch.__version__}, {args.threads} threads, prompt {args.prompt} ids, "
          f"{args.tokens} new tokens, median of {args.reps}")
    print("| | generate s | new tokens/s |")
    print("| --- | ---: | ---: |")
    for name, ts in (("Redline sample", r_times), ("transformers generate", t_times)):
        s = statistics.median(ts)
        print(f"| {name} | {s:.3f} | {args.tokens / s:.1f} |")
    print(f"ratio (transformers / Redline time): "
          f"{statistics.median(t_times) / statistics.median(r_times):.2f}x; "
          f"greedy ids equal: {same}/{len(theirs)}")


if __name__ == "__main__":
    main()
