#!/usr/bin/env python3
"""The streamed image pipeline alone, Redline against torchvision, same cores.

Each row reads an ImageNet-like image folder (tools/datasets/make_imagelike.py),
decodes every JPEG, takes a RandomResizedCrop(SIZE), a random horizontal flip,
ToTensor and Normalize(ImageNet) into batches, with no model, and reports
images/s (median of --repeats runs, after two warm-up batches):

  redline      crates/redline-data/examples/pipeline.rs (release), --workers N
  tv-pil       torchvision ImageFolder + PIL + transforms v1, DataLoader(num_workers=N)
  tv-decode    torchvision.io.decode_jpeg + transforms v2 on uint8 tensors, DataLoader(num_workers=N)
  litdata      litdata's StreamingDataLoader(num_workers=N) over its own optimised copy of the
               folder (`litdata.optimize`: the JPEG bytes as they are, in 64 MB chunks, made once
               in DATA_DIR-litdata), decoded by litdata's JPEG serializer and transformed as
               tv-decode; left out (`-`) where litdata is not installed or with --no-litdata
  ffcv         FFCV's Loader(num_workers=N, order RANDOM, os_cache) over its own .beton copy
               (`DatasetWriter`, RGBImageField(write_mode="jpg", max_resolution=512,
               jpeg_quality=90), made once as DATA_DIR-ffcv.beton) with its
               RandomResizedCropRGBImageDecoder(SIZE) (OpenCV's INTER_AREA resize, not PIL's
               antialiased bilinear), RandomHorizontalFlip and NormalizeImage on uint8 batches;
               left out (`-`) where ffcv does not import or with --no-ffcv

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

import functools
import importlib.metadata

import torch
import torchvision
from torchvision import transforms as T
from torchvision.transforms import v2

try:
    import litdata
except ImportError:
    litdata = None
try:
    import numpy as np
    from ffcv.fields import IntField, RGBImageField
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader as FfcvLoader
    from ffcv.loader import OrderOption
    from ffcv.transforms import NormalizeImage, RandomHorizontalFlip, ToTensor, ToTorchImage
    from ffcv.writer import DatasetWriter
except ImportError:
    FfcvLoader = None

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


def _lit_item(samples, i):
    from PIL import Image
    path, label = samples[i]
    return {"image": Image.open(path), "class": label}


def litdata_copy(train, out):
    """litdata's optimised copy of the folder, made once (its index.json marks it whole)."""
    if not os.path.exists(os.path.join(out, "index.json")):
        samples = torchvision.datasets.ImageFolder(train).samples
        litdata.optimize(fn=functools.partial(_lit_item, samples), inputs=list(range(len(samples))),
                         output_dir=out, chunk_bytes="64MB", num_workers=min(4, os.cpu_count()),
                         mode="overwrite")
    return out


if litdata is not None:
    class LitImages(litdata.StreamingDataset):
        """litdata's copy, each sample transformed as tv-decode's (top level: its workers
        unpickle it)."""

        def __init__(self, out, tf):
            super().__init__(out, shuffle=True, drop_last=True)
            self.tf = tf

        def __getitem__(self, i):
            s = super().__getitem__(i)
            return self.tf(s["image"]), s["class"]


def rate(dl, batch, batches):
    """Images/s over `batches` batches of a loader, after two warm-up batches (epochs repeat)."""
    seen, t0, s0 = 0, None, 0
    while True:
        for x, _ in dl:
            seen += x.shape[0]
            if t0 is None and seen >= 2 * batch:
                t0, s0 = time.perf_counter(), seen
            if seen >= (batches + 2) * batch:
                return (seen - s0) / (time.perf_counter() - t0)


class _PilFolder(torch.utils.data.Dataset):
    """(PIL image, label) pairs of an image folder, for FFCV's writer."""

    def __init__(self, root):
        self.samples = torchvision.datasets.ImageFolder(root).samples

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        from PIL import Image
        path, label = self.samples[i]
        return Image.open(path).convert("RGB"), label


def ffcv_copy(train, out):
    """FFCV's .beton copy of the folder, written once (to a temporary name, then renamed)."""
    if not os.path.exists(out):
        DatasetWriter(out + ".part", {
            "image": RGBImageField(write_mode="jpg", max_resolution=512, jpeg_quality=90),
            "label": IntField()}, num_workers=os.cpu_count()).from_indexed_dataset(_PilFolder(train))
        os.replace(out + ".part", out)
    return out


def ffcv_rate(beton, workers, size, batch, batches):
    mean, std = np.array(MEAN) * 255, np.array(STD) * 255
    dl = FfcvLoader(beton, batch_size=batch, num_workers=workers, order=OrderOption.RANDOM,
                    drop_last=True, os_cache=True, seed=0, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((size, size)),
                                  RandomHorizontalFlip(), NormalizeImage(mean, std, np.float32),
                                  ToTensor(), ToTorchImage()],
                        "label": [IntDecoder(), ToTensor()]})
    return rate(dl, batch, batches)


def torch_rate(ds, workers, batch, batches, loader=torch.utils.data.DataLoader):
    torch.manual_seed(0)
    if loader is torch.utils.data.DataLoader:
        dl = loader(ds, batch_size=batch, shuffle=True, num_workers=workers, drop_last=True,
                    persistent_workers=False)
    else:
        dl = loader(ds, batch_size=batch, num_workers=workers, drop_last=True)
    return rate(dl, batch, batches)


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
    ap.add_argument("--no-litdata", action="store_true", help="leave litdata's column out")
    ap.add_argument("--no-ffcv", action="store_true", help="leave FFCV's column out")
    a = ap.parse_args()
    torch.set_num_threads(1)
    train = os.path.join(a.data, "train")
    pil = torchvision.datasets.ImageFolder(train, T.Compose([
        T.RandomResizedCrop(a.size), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))
    tf = v2.Compose([
        v2.RandomResizedCrop(a.size, antialias=True), v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)])
    dec = DecodeJpeg(train, tf)
    lit = None
    if litdata is not None and not a.no_litdata:
        lit = (LitImages(litdata_copy(train, a.data.rstrip("/") + "-litdata"), tf),
               litdata.StreamingDataLoader, litdata.__version__)
    beton = None
    if FfcvLoader is not None and not a.no_ffcv:
        beton = ffcv_copy(train, a.data.rstrip("/") + "-ffcv.beton")
    print(f"# pipeline images/s: {a.data}, {len(pil)} training images, RandomResizedCrop({a.size}) + "
          f"flip + normalise, batch {a.batch}, {a.batches} timed batches, median of {a.repeats}")
    print(f"# torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.2f}"
          + (f"; litdata {lit[2]}" if lit else "; litdata not run")
          + (f"; ffcv {importlib.metadata.version('ffcv')}" if beton else "; ffcv not run"))
    print("| workers | redline | tv-pil | tv-decode | litdata | ffcv | redline / best torchvision "
          "| redline / litdata | redline / ffcv |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in [int(x) for x in a.workers.split(",")]:
        r = float("nan") if a.no_redline else statistics.median(
            redline(a.data, w, a.size, a.batch, a.batches) for _ in range(a.repeats))
        p = statistics.median(torch_rate(pil, w, a.batch, a.batches) for _ in range(a.repeats))
        d = statistics.median(torch_rate(dec, w, a.batch, a.batches) for _ in range(a.repeats))
        if lit is None:
            ld, vs_ld = "-", "-"
        else:
            rate = statistics.median(
                torch_rate(lit[0], w, a.batch, a.batches, lit[1]) for _ in range(a.repeats))
            ld, vs_ld = f"{rate:.1f}", f"{r / rate:.2f}x"
        if beton is None:
            fv, vs_fv = "-", "-"
        else:
            rate = statistics.median(
                ffcv_rate(beton, w, a.size, a.batch, a.batches) for _ in range(a.repeats))
            fv, vs_fv = f"{rate:.1f}", f"{r / rate:.2f}x"
        print(f"| {w} | {r:.1f} | {p:.1f} | {d:.1f} | {ld} | {fv} | {r / max(p, d):.2f}x "
              f"| {vs_ld} | {vs_fv} |", flush=True)

if __name__ == "__main__":
    sys.exit(main())
