#!/usr/bin/env python3
"""JPEG decode times, PIL (libjpeg-turbo) whole and with `draft` (its DCT-domain scaling, 1/2,
1/4, 1/8), one thread, on the JPEGs it writes (ImageNet-like sizes, quality 90, 4:2:0, a smooth
scene with texture and noise) or on files given; then runs Redline's example
(crates/redline-data/examples/jpeg_decode.rs: zune-jpeg through `image`, and `jpeg-decoder`
whole and scaled) on the same files, so the two tables are of one set of bytes (issue 48 item 3).

    ~/.venvs/redline-ref/bin/python bench/jpeg_decode.py --dir /tmp/jpg [--example BIN]
"""

import argparse
import io
import os
import statistics
import subprocess
import time

import numpy as np
from PIL import Image


def scene(w, h, seed=0):
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    fx, fy = x / w, y / h
    n = rng.integers(0, 24, (h, w)).astype(np.float32)
    r = 120 + 90 * np.sin(6 * fx + 2 * fy) + n
    g = 100 + 80 * np.cos(9 * fy) * fx + n
    b = 90 + 60 * (((x // 7) + (y // 5)) % 2) + n
    return np.clip(np.stack([r, g, b], -1), 0, 255).astype(np.uint8)


def timed(f, reps):
    v = []
    for _ in range(reps):
        t = time.perf_counter()
        f()
        v.append(1000 * (time.perf_counter() - t))
    return statistics.median(v)


def pil_decode(data, div):
    img = Image.open(io.BytesIO(data))
    if div > 1:
        img.draft("RGB", (img.width // div, img.height // div))
    img = img.convert("RGB")
    img.load()
    return img.size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/jpg")
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--example", default="target/release/examples/jpeg_decode")
    ap.add_argument("files", nargs="*")
    a = ap.parse_args()
    files = a.files
    if not files:
        os.makedirs(a.dir, exist_ok=True)
        for w, h in [(500, 375), (1024, 768), (2048, 1536)]:
            path = os.path.join(a.dir, f"scene_{w}x{h}_q90.jpg")
            Image.fromarray(scene(w, h)).save(path, quality=90, subsampling=2)
            files.append(path)
    import PIL
    print(f"PIL {PIL.__version__} (libjpeg-turbo), one thread, median of {a.reps}")
    print("| image | KB | PIL 1/1 ms | draft 1/2 ms | draft 1/4 ms | draft 1/8 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for f in files:
        data = open(f, "rb").read()
        row = [f"{timed(lambda: pil_decode(data, d), a.reps):.2f}" for d in (1, 2, 4, 8)]
        print(f"| {os.path.basename(f)} | {len(data) // 1024} | {' | '.join(row)} |", flush=True)
    if os.path.exists(a.example):
        print()
        subprocess.run([a.example, "--reps", str(a.reps)] + files, check=True)


if __name__ == "__main__":
    main()
