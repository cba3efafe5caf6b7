#!/usr/bin/env python3
"""Golden file for the zoo's GPT (`redline_models::Gpt`): nanoGPT's model structure
(`model.py`: token and position embeddings, pre-norm blocks of causal self-attention through
SDPA and a 4x MLP, final LayerNorm, lm_head tied to wte), with GPT-2's tanh GELU as the MLP's
activation (Hugging Face's `gelu_new`; nanoGPT's own `nn.GELU()` is the erf form), no
dropout, biases on. CPU, float64.

Config: n_layer 2, n_head 2, n_embd 16, block_size 8, vocab_size 11. Every entry of the
state dict is set by a formula the Rust test repeats (nothing but results is committed):
for NAME with n values, `b[i] = sin(0.7 i + 0.001 h(NAME))` with h the bytes of NAME
folded as `h = (31 h + byte) % 1000003`; a 2-D weight or embedding is `0.1 b`, a LayerNorm
weight `1 + 0.1 b`, every bias `0.05 b`. Ids `idx[i] = (3 i + 1) % 11` and targets
`(5 i + 2) % 11` over the flat (2, 8) index i.

Stored: `logits` (2, 8, 11), `loss` (the mean next-token cross-entropy) and the gradients
`grad.<NAME>` of the loss for every parameter.

gpt_adamw.safetensors: from the same weights, 20 steps of `torch.optim.AdamW` with nanoGPT's
`configure_optimizers` groups (2-D tensors decay by 0.1, biases and LayerNorms by 0), lr
1e-2, betas (0.9, 0.95), eps 1e-8, on batch s's ids `(3 i + 7 s + 1) % 11` and targets
`(5 i + 2 s + 2) % 11`: the 20 `losses` and every parameter after (`final.<NAME>`).

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_gpt.py --out testdata/golden
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_golden import write_safetensors  # noqa: E402

N_LAYER, N_HEAD, N_EMBD, BLOCK, VOCAB = 2, 2, 16, 8, 11


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(N_EMBD, 4 * N_EMBD)
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(N_EMBD)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, N_EMBD),
            wpe=nn.Embedding(BLOCK, N_EMBD),
            h=nn.ModuleList([Block() for _ in range(N_LAYER)]),
            ln_f=nn.LayerNorm(N_EMBD),
        ))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied, as nanoGPT

    def forward(self, idx):
        t = idx.size(1)
        x = self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def h(name):
    v = 0
    for byte in name.encode():
        v = (31 * v + byte) % 1000003
    return v


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/golden")
    args = ap.parse_args()
    model = GPT().double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            i = torch.arange(p.numel(), dtype=torch.float64)
            b = torch.sin(0.7 * i + 0.001 * h(name)).reshape(p.shape)
            if name.endswith(".bias"):
                p.copy_(0.05 * b)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * b)
            else:
                p.copy_(0.1 * b)
    i = torch.arange(2 * BLOCK)
    idx = ((3 * i + 1) % VOCAB).reshape(2, BLOCK)
    targets = ((5 * i + 2) % VOCAB).reshape(2, BLOCK)
    logits = model(idx)
    loss = F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))
    loss.backward()
    out = {"logits": logits.detach().float(), "loss": loss.detach().reshape(1).float()}
    for name, p in model.named_parameters():
        out[f"grad.{name}"] = p.grad.float()
    write_safetensors(out, os.path.join(args.out, "gpt.safetensors"))
    print("loss", loss.item())
    adamw_steps(args.out)


def formula_model():
    model = GPT().double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            i = torch.arange(p.numel(), dtype=torch.float64)
            b = torch.sin(0.7 * i + 0.001 * h(name)).reshape(p.shape)
            if name.endswith(".bias"):
                p.copy_(0.05 * b)
            elif p.dim() == 1:
                p.copy_(1 + 0.1 * b)
            else:
                p.copy_(0.1 * b)
    return model


def adamw_steps(out_dir):
    model = formula_model()
    params = dict(model.named_parameters())
    groups = [
        {"params": [p for p in params.values() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in params.values() if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    i = torch.arange(2 * BLOCK)
    losses = []
    for s in range(20):
        idx = ((3 * i + 7 * s + 1) % VOCAB).reshape(2, BLOCK)
        targets = ((5 * i + 2 * s + 2) % VOCAB).reshape(2, BLOCK)
        loss = F.cross_entropy(model(idx).view(-1, VOCAB), targets.view(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": torch.tensor(losses, dtype=torch.float32)}
    for name, p in model.named_parameters():
        out[f"final.{name}"] = p.detach().float()
    write_safetensors(out, os.path.join(out_dir, "gpt_adamw.safetensors"))
    print("adamw losses", losses[0], "->", losses[-1])


if __name__ == "__main__":
    main()
