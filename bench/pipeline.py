#!/usr/bin/env python3
"""The streamed image pipeline alone, Redline against torchvision, same cores.

Each row reads an ImageNet-like image folder (tools/datasets/make_imagelike.py),
decodes every JPEG, takes a RandomResizedCrop(SIZE), a random horizontal flip,
ToTensor and Normalize(ImageNet) into batches, with no model, and reports
images/s (median of --repeats runs, after two warm-up batches):

  redline      crates/redline-data/examples/pipeline.rs (release), --workers N
  tv-pil       torchvision ImageFolder + PIL + transforms v1, DataLoader(num_workers=N)
  tv-decode    torchvision.io.decode_jpeg + transforms v2 on uint8 tensors, DataLoader(num_workers=N)

    python3 bench/pipeline.py DATA_DIR [--workers 1,2] [--size 224] [--batch 64] [--batches 12]

DATA_DIR holds train/<class>/*.JPEG. Run it on a quiet machine (check `uptime`).
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import torch
import torchvision
from torchvision import transforms as T
from torchvision.transforms import v2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def redline(data, workers, size, batch, batches):
    exe = os.path.join(ROOT, "target", "release", "examples", "pipeline")
    out = subprocess.run([exe, data, str(workers), str(size), str(batch), str(batches)],
                         check=True, capture_output=True, text=True).stdout
    return float(re.search(r"= ([0-9.]+) images/s", out).group(1))


class DecodeJpeg(torch.utils.data.Dataset):
    """ImageFolder's samples read as bytes and decoded by torchvision.io."""

    def __init__(self, root, tf):
        self.samples = torchvision.datasets.ImageFolder(root).samples
        self.tf = tf

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        img = torchvision.io.decode_jpeg(torchvision.io.read_file(path),
                                         mode=torchvision.io.ImageReadMode.RGB)
        return self.tf(img), label


def torch_rate(ds, workers, batch, batches):
    torch.manual_seed(0)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                     drop_last=True, persistent_workers=False)
    seen, t0, s0 = 0, None, 0
    while True:
        for x, _ in dl:
            seen += x.shape[0]
            if t0 is None and seen >= 2 * batch:
                t0, s0 = time.perf_counter(), seen
            if seen >= (batches + 2) * batch:
                return (seen - s0) / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("data")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-redline", action="store_true",
                    help="torchvision's rows only (where the example binary is not built: "
                         "`redline tune workers` times Redline's)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    train = os.path.join(a.data, "train")
    pil = torchvision.datasets.ImageFolder(train, T.Compose([
        T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    dec = DecodeJpeg(train, v2.Compose([
        v2.RandomResizedCrop(a.size, antialias=True), v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]))
    print(f"# pipeline images/s: {a.data}, {len(pil)} training images, RandomResizedCrop({a.size}) + "
          f"flip + normalise, batch {a.batch}, {a.batches} timed batches, median of {a.repeats}")
    print(f"# torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}")
    print("| workers | redline | tv-pil | tv-decode | redline / best torchvision |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for w in [int(x) for x in a.workers.split(",")]:
        r = float("nan") if a.no_redline else statistics.median(
            redline(a.data, w, a.size, a.batch, a.batches) for _ in range(a.repeats))
        p = statistics.median(torch_rate(pil, w, a.batch, a.batches) for _ in range(a.repeats))
        d = statistics.median(torch_rate(dec, w, a.batch, a.batches) for _ in range(a.repeats))
        print(f"| {w} | {r:.1f} | {p:.1f} | {d:.1f} | {r / max(p, d):.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
