#!/usr/bin/env python3
"""GPT training tokens/s on the CPU, Redline against PyTorch on the same threads, in one run
(issue 50's CPU rows): nanoGPT's model structure (pre-norm blocks, causal SDPA, a 4x tanh-GELU
MLP, the head tied to wte, nanoGPT's four dropouts at the row's rate) in PyTorch eager and under `torch.compile`, and
Redline's `redline train --model <gpt>` on the same text's bytes (vocabulary 256), Adam 1e-3.

    ~/.venvs/redline-ref/bin/python bench/gpt_cpu.py --bin target/release/redline --threads 2 \\
        --rows gpt-char:8,small:16 [--no-compile]

Each row CONFIG:BATCH: `gpt-char` is nanoGPT's shakespeare-char model (6 layers, 6 heads, 384
wide, block 256, dropout 0.2), `small` a 4-layer, 4-head, 128-wide GPT at block 256 without
dropout (a model file written here). The text is synthetic (words drawn from a fixed list, 1 MB), the same file for both.
`--device cuda` runs both on cuda:0 (PyTorch synchronised after each step), and `--bf16` runs
both under bf16 autocast (Redline `--precision bf16-mixed`): bench/gpu.sh's part `gpt`.
Redline: the median wall time of STEPS steps after 2, from metrics.csv (`--log-every 1`);
PyTorch: the median of STEPS steps after 2 (compile's warm-up steps excluded the same way),
each step on a batch of random windows drawn as nanoGPT's `get_batch` does. Prints ms/step and
tokens/s (BATCH x 256 tokens a step).
"""

import argparse
import csv
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

CONFIGS = {
    "gpt-char": dict(n_layer=6, n_head=6, n_embd=384, block=256, dropout=0.2),
    "small": dict(n_layer=4, n_head=4, n_embd=128, block=256, dropout=0.0),
}
VOCAB = 256


class Attn(nn.Module):
    def __init__(self, c, heads, dropout):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(c, 3 * c), nn.Linear(c, c), heads
        self.p, self.resid = dropout, nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        p = self.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.resid(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class Block(nn.Module):
    def __init__(self, c, heads, dropout):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(c), Attn(c, heads, dropout), nn.LayerNorm(c)
        self.c_fc, self.c_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.drop(self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block, dropout):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(VOCAB, n_embd), nn.Embedding(block, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([Block(n_embd, n_head, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, VOCAB, bias=False)
        self.wte.weight = self.lm_head.weight

    def forward(self, idx, targets):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.size(1))))
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))


def text(path, n_bytes=1 << 20):
    rng = np.random.default_rng(0)
    words = ("the cat sat on a mat while the dog lay by the log and a bird sang to the "
             "king of the land in spring").split()
    out, size = [], 0
    while size < n_bytes:
        w = words[rng.integers(len(words))]
        out.append(w)
        size += len(w) + 1
    with open(path, "w") as f:
        f.write(" ".join(out))


def torch_ms(cfg, batch, steps, threads, data, compiled, device="cpu", bf16=False):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(**cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    step_fn = torch.compile(model) if compiled else model
    ids = torch.from_numpy(data.astype(np.int64))
    T = cfg["block"]
    times = []
    for i in range(steps + 2):
        t = time.perf_counter()
        ix = torch.randint(len(ids) - T, (batch,))
        x = torch.stack([ids[j:j + T] for j in ix]).to(device, non_blocking=True)
        y = torch.stack([ids[j + 1:j + 1 + T] for j in ix]).to(device, non_blocking=True)
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=bf16):
            loss = step_fn(x, y)
        loss.backward()
        opt.step()
        if device != "cpu":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - t)
    return 1000 * statistics.median(times)


def redline_ms(binary, row, cfg, batch, steps, threads, tmp, path, device="cpu", bf16=False):
    if row == "gpt-char":
        model = "gpt-char"
    else:
        model = os.path.join(tmp, f"{row}.toml")
        with open(model, "w") as f:
            f.write('[model]\nkind = "gpt"\n' + "".join(
                f"{k} = {v}\n" for k, v in [("n_layer", cfg["n_layer"]), ("n_head", cfg["n_head"]),
                                            ("n_embd", cfg["n_embd"]), ("block_size", cfg["block"]),
                                            ("dropout", cfg["dropout"])]))
    run = os.path.join(tmp, f"run_{row}_{batch}")
    cmd = [binary, "train", "--data", path, "--model", model, "--batch-size", str(batch),
           "--max-steps", str(steps + 2), "--threads", str(threads), "--log-every", "1",
           "--no-validate", "--monitor-interval", "0", "--device", device, "--no-checkpoint",
           "--lr", "1e-3", "--run-dir", run] + (["--precision", "bf16-mixed"] if bf16 else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{(p.stdout + p.stderr)[-3000:]}")
    with open(os.path.join(run, "metrics.csv")) as f:
        el = [float(r["elapsed_s"]) for r in csv.DictReader(f) if r["kind"] == "step"]
    dt = [b - a for a, b in zip([0.0] + el, el)]
    return 1000 * statistics.median(dt[2:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="target/release/redline")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rows", default="small:16,gpt-char:8")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda:0 for both)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast / --precision bf16-mixed")
    a = ap.parse_args()
    dev = "cuda:0" if a.device.startswith("cuda") else "cpu"
    print(f"torch {torch.__version__}, {a.threads} threads, {os.cpu_count()} logical cores, "
          f"device {dev}{', bf16' if a.bf16 else ''}")
    print("| model | batch | tokens/step | Redline ms/step | PyTorch eager ms/step | "
          "torch.compile ms/step | Redline tokens/s | eager tokens/s | compile tokens/s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input.txt")
        text(path)
        data = np.frombuffer(open(path, "rb").read(), dtype=np.uint8)
        for row in a.rows.split(","):
            name, batch = row.split(":")
            batch, cfg = int(batch), CONFIGS[name]
            tokens = batch * cfg["block"]
            ours = redline_ms(a.bin, name, cfg, batch, a.steps, a.threads, tmp, path, dev, a.bf16)
            eager = torch_ms(cfg, batch, a.steps, a.threads, data, False, dev, a.bf16)
            comp = math.nan if a.no_compile else torch_ms(
                cfg, batch, a.steps, a.threads, data, True, dev, a.bf16)
            tps = lambda ms: 1000 * tokens / ms
            print(f"| {name} | {batch} | {tokens} | {ours:.0f} | {eager:.0f} | {comp:.0f} | "
                  f"{tps(ours):.0f} | {tps(eager):.0f} | {tps(comp):.0f} |", flush=True)


if __name__ == "__main__":
    main()
