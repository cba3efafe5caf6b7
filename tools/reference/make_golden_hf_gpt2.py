#!/usr/bin/env python3
"""A tiny Hugging Face GPT-2 folder, written by transformers itself, and what transformers
computes with it: the golden for `redline sample HF_DIR`, `--init HF_DIR` and
`redline export RUN_DIR --hf DIR` (crates/redline-models/tests/hf_gpt2.rs and
crates/redline/tests/sample.rs).

The folder (testdata/golden/hf-gpt2-tiny/): `config.json` and `model.safetensors` from
`GPT2LMHeadModel.save_pretrained` (Conv1D weights stored (in, out), the lm_head tied and
absent), and `tokenizer.json`, a byte-level BPE (GPT-2's pre-tokenizer and decoder) of 320
tokens trained on tools/reference/*.py, with `<|endoftext|>`. The model: 2 layers, 2 heads,
32 wide, 32 positions, trained for 300 AdamW steps on the same files (so that greedy
decoding writes varied text, not one repeated token), with no near-ties along the greedy
path: each step's top two logits differ by more than 1e-3 (checked here).

Expected (hf_gpt2_tiny.json): the prompt's ids under the tokenizer, transformers'
`generate(do_sample=False)` ids after it, the ids decoded, and the logits of the prompt's
last position. CPU, float32.

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_hf_gpt2.py --out testdata/golden
"""

import argparse
import glob
import json
import os

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel

PROMPT = "def forward(self, x):"
NEW = 16


def tokenizer(here):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(sorted(glob.glob(os.path.join(here, "*.py"))), trainer)
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    folder = os.path.join(args.out, "hf-gpt2-tiny")
    os.makedirs(folder, exist_ok=True)
    tok = tokenizer(here)
    tok.save(os.path.join(folder, "tokenizer.json"))

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=tok.get_vocab_size(),
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(cfg)
    text = "".join(open(p).read() for p in sorted(glob.glob(os.path.join(here, "*.py"))))
    data = torch.tensor(tok.encode(text).ids)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(300):
        at = torch.randint(len(data) - 33, (16,))
        x = torch.stack([data[i : i + 32] for i in at])
        y = torch.stack([data[i + 1 : i + 33] for i in at])
        loss = model(x, labels=None).logits.flatten(0, 1)
        loss = torch.nn.functional.cross_entropy(loss, y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("trained, loss", loss.item())
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    for extra in ("generation_config.json",):
        path = os.path.join(folder, extra)
        if os.path.exists(path):
            os.remove(path)

    ids = tok.encode(PROMPT).ids
    x = torch.tensor([ids])
    with torch.no_grad():
        logits = model(x).logits[0, -1]
        out = model.generate(
            x,
            do_sample=False,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            pad_token_id=0,
            attention_mask=torch.ones_like(x),
        )[0, len(ids):].tolist()
        # No near-ties along the greedy path.
        seq = x
        for _ in range(NEW):
            last = model(seq).logits[0, -1]
            top = torch.topk(last, 2).values
            assert (top[0] - top[1]).item() > 1e-3, top
            seq = torch.cat([seq, last.argmax().view(1, 1)], dim=1)
        assert seq[0, len(ids):].tolist() == out
    expect = {
        "prompt": PROMPT,
        "prompt_ids": ids,
        "greedy_ids": out,
        "greedy_text": tok.decode(out),
        "last_logits": [float(v) for v in logits],
    }
    with open(os.path.join(args.out, "hf_gpt2_tiny.json"), "w") as f:
        json.dump(expect, f, indent=1)
    print(folder, len(ids), "prompt ids ->", out)


if __name__ == "__main__":
    main()
