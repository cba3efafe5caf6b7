#!/usr/bin/env python3
"""Golden outputs of torchvision's image transforms for the streamed pipeline.

Writes testdata/golden/transforms.png (a 61 x 43 RGB image of smooth colour and
noise; PNG, so the decode is exact) and testdata/golden/transforms.safetensors:

  eval       Resize(18) + CenterCrop(16) + ToTensor + Normalize(ImageNet)   (3, 16, 16)
  resize     Resize((20, 20)) + ToTensor + Normalize(ImageNet)              (3, 20, 20)
  crop       F.resized_crop(img, top=5, left=7, height=30, width=25, size=16)
             + ToTensor + Normalize(ImageNet)                               (3, 16, 16)
  crop_flip  the same, then F.hflip                                         (3, 16, 16)

all with PIL (torchvision's default for PIL images: antialiased bilinear).
crates/redline-data/tests/transforms_golden.rs compares Redline's transforms with them.

    ~/.venvs/redline-ref/bin/python tools/reference/make_golden_transforms.py --out testdata/golden
"""
import argparse
import os

import numpy as np
import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file
from torchvision import transforms as T
from torchvision.transforms import functional as F

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="testdata/golden")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    h, w = 43, 61
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 4, yy * 5, (xx + yy) * 2], -1).astype(np.float64)
    arr = np.clip(base + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
    png = os.path.join(a.out, "transforms.png")
    Image.fromarray(arr).save(png)
    img = Image.open(png).convert("RGB")
    tail = T.Compose([T.ToTensor(), T.Normalize(MEAN, STD)])
    crop = F.resized_crop(img, 5, 7, 30, 25, [16, 16])
    out = {
        "eval": tail(T.Compose([T.Resize(int(16 / 0.875)), T.CenterCrop(16)])(img)),
        "resize": tail(T.Resize((20, 20))(img)),
        "crop": tail(crop),
        "crop_flip": tail(F.hflip(crop)),
    }
    meta = {"torch": torch.__version__, "torchvision": torchvision.__version__}
    save_file({k: v.contiguous() for k, v in out.items()}, os.path.join(a.out, "transforms.safetensors"), meta)
    print({k: tuple(v.shape) for k, v in out.items()})


if __name__ == "__main__":
    main()
