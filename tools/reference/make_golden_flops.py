#!/usr/bin/env python3
"""FLOPs per training sample as PyTorch counts them (`torch.utils.flop_counter.FlopCounterMode`),
for the MFU issue's check of Redline's own count (`redline_models::flops`):

| name | model | input per sample | outputs |
| --- | --- | --- | --- |
| `mlp` | the zoo's MLP, 784-128-10 | (1, 28, 28), flattened | 10 |
| `mlp_wide` | an MLP 3072-512-256-10 (`--hidden 512,256`) | (3, 32, 32), flattened | 10 |
| `cnn` | the zoo's CNN (conv 1->32->64 3x3 pad 1, ReLU, max pool 2; fc 3136->128->10) | (1, 28, 28) | 10 |
| `small_cnn_cifar` | `examples/models/small-cnn.toml` (with its dropout) | (3, 32, 32) | 10 |
| `resnet18` | `torchvision.models.resnet18(num_classes=1000)` | (3, 224, 224) | 1000 |
| `resnet18_cifar` | `torchvision.models.resnet18(num_classes=10)` | (3, 32, 32) | 10 |
| `resnet50` | `torchvision.models.resnet50(num_classes=1000)` | (3, 224, 224) | 1000 |
| `gpt_char` | nanoGPT's structure (`make_golden_gpt.py`'s GPT) at shakespeare-char's 6/6/384, block 256, 65 tokens; next-token loss over every position | (256,) ids | 65 per token |
| `attention` | Linear 48->48, nanoGPT's `CausalSelfAttention` (4 heads, SDPA), Flatten, Linear | (32, 48) | 10 |
| `mbv2_block` | `bench/models/mbv2_block.toml`: a stride-2 stem, one MobileNetV2 inverted residual block (1x1 x6, 3x3 depthwise `groups=192`, 1x1, batch norms), pooling, Linear (forward only: FlopCounterMode's convolution backward ignores `groups`) | (3, 32, 32) | 10 |

Each model runs in train mode on a batch of 4 random inputs: the forward alone under
one counter, then forward, cross-entropy and backward under another; both totals are
divided by the batch. The input needs no gradient, as in training, so autograd computes
no input gradient for the first layer. Written to `testdata/golden/flops.json` with the
torch version:

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_flops.py --out testdata/golden
"""

import argparse
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.flop_counter import FlopCounterMode

BATCH = 4


def mlp(widths):
    layers = [nn.Flatten()]
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(nn.Linear(a, b))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def cnn():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def small_cnn(channels=3, side=32, classes=10):
    flat = 32 * (side // 4) ** 2
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 64), nn.ReLU(), nn.Dropout(0.25), nn.Linear(64, classes),
    )


class MbBlock(nn.Module):
    """bench/models/mbv2_block.toml (its grouped, depthwise convolution)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.body = nn.Sequential(
            nn.Conv2d(32, 192, 1, bias=False), nn.BatchNorm2d(192), nn.ReLU(),
            nn.Conv2d(192, 192, 3, 1, 1, groups=192, bias=False), nn.BatchNorm2d(192),
            nn.ReLU(), nn.Conv2d(192, 32, 1, bias=False), nn.BatchNorm2d(32))
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, 10))

    def forward(self, x):
        h = self.stem(x)
        return self.head(h + self.body(h))


class CausalSelfAttention(nn.Module):
    """nanoGPT's, without dropout: c_attn, the heads through SDPA (is_causal), c_proj."""

    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def count_gpt():
    import make_golden_gpt as g

    g.N_LAYER, g.N_HEAD, g.N_EMBD, g.BLOCK, g.VOCAB = 6, 6, 384, 256, 65
    model = g.GPT().train()
    idx = torch.randint(0, g.VOCAB, (BATCH, g.BLOCK))
    y = torch.randint(0, g.VOCAB, (BATCH, g.BLOCK))
    with FlopCounterMode(display=False) as fwd:
        model(idx)
    with FlopCounterMode(display=False) as full:
        F.cross_entropy(model(idx).view(-1, g.VOCAB), y.view(-1)).backward()
    forward, total = fwd.get_total_flops(), full.get_total_flops()
    return {"input": [g.BLOCK], "outputs": g.VOCAB, "forward": forward // BATCH,
            "backward": (total - forward) // BATCH}


def count(model, shape, classes):
    model.train()
    x = torch.randn(BATCH, *shape)
    y = torch.randint(0, classes, (BATCH,))
    with FlopCounterMode(display=False) as fwd:
        model(x)
    with FlopCounterMode(display=False) as full:
        F.cross_entropy(model(x), y).backward()
    forward = fwd.get_total_flops()
    total = full.get_total_flops()
    assert forward % BATCH == 0 and total % BATCH == 0
    return {
        "input": list(shape),
        "outputs": classes,
        "forward": forward // BATCH,
        "backward": (total - forward) // BATCH,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/golden")
    args = ap.parse_args()
    torch.manual_seed(0)
    cases = {
        "mlp": count(mlp([784, 128, 10]), (1, 28, 28), 10),
        "mlp_wide": count(mlp([3072, 512, 256, 10]), (3, 32, 32), 10),
        "cnn": count(cnn(), (1, 28, 28), 10),
        "small_cnn_cifar": count(small_cnn(), (3, 32, 32), 10),
        "resnet18": count(torchvision.models.resnet18(num_classes=1000), (3, 224, 224), 1000),
        "resnet18_cifar": count(torchvision.models.resnet18(num_classes=10), (3, 32, 32), 10),
        "resnet50": count(torchvision.models.resnet50(num_classes=1000), (3, 224, 224), 1000),
        "gpt_char": count_gpt(),
        "mbv2_block": count(MbBlock(), (3, 32, 32), 10),
        "attention": count(
            nn.Sequential(nn.Linear(48, 48), CausalSelfAttention(48, 4), nn.Flatten(), nn.Linear(32 * 48, 10)),
            (32, 48),
            10,
        ),
    }
    out = {
        "torch_version": torch.__version__,
        "torchvision_version": torchvision.__version__,
        "counter": "torch.utils.flop_counter.FlopCounterMode, per sample (batch of 4 / 4)",
        "cases": cases,
    }
    path = os.path.join(args.out, "flops.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for name, c in cases.items():
        print(f"{name:16} forward {c['forward']:>14,} backward {c['backward']:>14,}")


if __name__ == "__main__":
    main()
