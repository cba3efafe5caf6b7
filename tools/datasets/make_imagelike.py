#!/usr/bin/env python3
"""ImageNet-like JPEGs for the streaming benchmarks and tests.

Writes OUT/train/<class>/<i>.JPEG and OUT/val/<class>/<i>.JPEG: RGB images of
about 500 x 375 (ImageNet's median size; a few portrait and odd sizes mixed in),
JPEG quality 90, with smooth structure plus fine texture so that they compress
to ImageNet's typical 100-150 KB rather than to a flat colour's 5 KB.

    python3 tools/datasets/make_imagelike.py OUT --classes 10 --train 200 --val 20
"""
import argparse
import os

import numpy as np
from PIL import Image


def image(rng, w, h):
    # Low-frequency colour fields (a few blobs), upsampled, plus fine noise.
    low = rng.random((h // 25 + 2, w // 25 + 2, 3)) * 255
    base = Image.fromarray(low.astype(np.uint8)).resize((w, h), Image.BICUBIC)
    arr = np.asarray(base).astype(np.float32)
    arr += rng.normal(0, 18, (h, w, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--train", type=int, default=100, help="images per class")
    ap.add_argument("--val", type=int, default=10, help="images per class")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    sizes = [(500, 375)] * 6 + [(375, 500), (500, 333), (640, 480), (400, 400)]
    total = 0
    for split, n in (("train", a.train), ("val", a.val)):
        for c in range(a.classes):
            d = os.path.join(a.out, split, f"n{c:08d}")
            os.makedirs(d, exist_ok=True)
            for i in range(n):
                w, h = sizes[rng.integers(len(sizes))]
                p = os.path.join(d, f"{split}_{c}_{i}.JPEG")
                image(rng, w, h).save(p, quality=90)
                total += os.path.getsize(p)
    print(f"{a.out}: {a.classes * (a.train + a.val)} images, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
